"""Arguments that used to be accepted although meaningless, or converted into another value, are refused by name
(or keep their meaning exactly)."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import InvalidArgumentError


@pytest.mark.parametrize("eps", [float("inf"), float("nan"), None, 0.0, -1e-6, "1e-6", True, float("-inf")])
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm"])
def test_norm_eps_must_be_a_finite_positive_float(op: str, eps: object) -> None:
    x, w = torch.randn(3, 8), torch.rand(8)
    args = (x, x.clone(), w) if op == "fused_add_rms_norm" else (x, w)
    with pytest.raises(InvalidArgumentError, match=r"^eps="):
        getattr(ksb.norm, op)(*args, eps=eps)


def test_all_reduce_fused_rms_norm_eps_is_checked_like_rms_norm() -> None:
    x, w = torch.randn(3, 8), torch.rand(8)
    for eps in (float("inf"), None):
        with pytest.raises(InvalidArgumentError, match=r"^eps="):
            ksb.comm.all_reduce_fused_rms_norm(x, x.clone(), w, eps=eps)  # type: ignore[arg-type]


def test_norm_accepts_an_int_eps() -> None:
    x, w = torch.randn(3, 8), torch.rand(8)
    torch.testing.assert_close(ksb.norm.rms_norm(x, w, eps=1), ksb.norm.rms_norm(x, w, eps=1.0), atol=0, rtol=0)


@pytest.mark.parametrize("k", [2**32 + 2, 2**40, 2**63 - 1])
def test_int64_top_k_past_int32_keeps_its_meaning_instead_of_wrapping(k: int) -> None:
    """k >= V keeps every token, whatever its width: 2**32 + 2 must not become k = 2."""
    probs = torch.softmax(torch.randn(4, 50), -1)
    rows = torch.full((4,), k, dtype=torch.int64)
    got = ksb.sampling.renorm(probs, rows)
    torch.testing.assert_close(got, probs / probs.sum(-1, keepdim=True))
    torch.testing.assert_close(got, ksb.sampling.renorm(probs, rows.clamp(max=2**31 - 1).int()), atol=0, rtol=0)


@pytest.mark.parametrize("k", [-1, -(2**32) + 2, -(2**63)])
def test_negative_int64_top_k_is_refused_not_wrapped(k: int) -> None:
    probs = torch.softmax(torch.randn(4, 50), -1)
    assert bool(ksb.sampling.renorm(probs, torch.full((4,), k, dtype=torch.int64)).isnan().all())  # invalid rows
    with pytest.raises(InvalidArgumentError, match=r"^top_k="):
        ksb.sampling.renorm(probs, torch.full((4,), k, dtype=torch.int64), check_nan=True)


# -- found by the sweep (tests/test_sweep.py); each reproduced directly -----------------------------
def test_fused_add_rms_norm_refuses_a_non_tensor_x_by_name() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^x="):
        ksb.norm.fused_add_rms_norm([[1.0]], torch.ones(1, 1), torch.ones(1))  # type: ignore[arg-type]


@pytest.mark.parametrize("rotary_dim", ["x", 4.0, True])
def test_rope_rotary_dim_must_be_an_int(rotary_dim: object) -> None:
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    with pytest.raises(InvalidArgumentError, match=r"^rotary_dim="):
        ksb.rope.apply(q, k, torch.arange(3), rotary_dim=rotary_dim)  # type: ignore[arg-type]


def test_fused_moe_names_route_backend() -> None:
    from kernel_switchboard.testing.cases.moe import example

    case = example("moe.fused_moe", torch.device("cpu"), tokens=2, hidden=128, inter=64, dtype="float32")
    for bad in ("bogus", 3):
        with pytest.raises(InvalidArgumentError, match=r"^route_backend="):
            ksb.moe.fused_moe(*case.args, **case.kwargs | {"route_backend": bad})


def test_mismatched_pairs_name_both_arguments() -> None:
    """When two arguments disagree, the message names both: the one it blames and the one it compares with."""
    from kernel_switchboard.testing.cases.kv_cache import example as kv_example
    from kernel_switchboard.testing.cases.sampling import example as sampling_example

    a, b = torch.randn(4, 16).to(torch.float8_e4m3fn), torch.randn(16, 32).to(torch.float8_e4m3fn).t().contiguous().t()
    with pytest.raises(InvalidArgumentError, match=r"^scale_a.shape=.* for a \(M, K\) = \(4, 16\)"):
        ksb.gemm.mm_fp8(a, b, torch.ones(5, 1), torch.ones(1, 32))
    ckv, kpe, ckv_pages, kpe_pages, *rest = kv_example("kv_cache.append_mla", "cpu", batch=2, kv_len=5,
                                                       head_dim=16, head_dim_pe=8, page_size=4).args
    with pytest.raises(InvalidArgumentError, match=r"^kpe.shape=.*kpe_pages"):
        ksb.kv_cache.append_mla(ckv, kpe, ckv_pages, kpe_pages[..., :-1], *rest)
    draft, ids, target = sampling_example("sampling.chain_speculative", torch.device("cpu"), batch=2, draft=2,
                                          vocab=8).args
    with pytest.raises(InvalidArgumentError, match=r"^target_probs.shape=.*draft_probs"):
        ksb.sampling.chain_speculative(torch.cat([draft, draft[:1]]), torch.cat([ids, ids[:1]]), target)
