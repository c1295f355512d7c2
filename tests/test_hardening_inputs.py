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
    with pytest.raises(InvalidArgumentError, match=r"^top_k="):
        ksb.sampling.renorm(probs, torch.full((4,), k, dtype=torch.int64))
