"""``ksb.batch_invariant()``: the feature it adds to every problem, the ranking inside it, and the reference kernels'
bits for one request across batches of other sizes and compositions."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl
from kernel_switchboard.capability import FEATURES
from kernel_switchboard.invariance import FEATURE, active, mark
from kernel_switchboard.reference._cap import PER_REQUEST
from kernel_switchboard.testing.invariance import OPS, InvarianceCase, invariance_cases

CASES = [case for op in OPS for case in invariance_cases(op, "cpu")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_gives_a_request_the_same_bits_in_every_batch(case: InvarianceCase) -> None:
    case.check("reference")


def test_the_checks_see_a_batch_dependence_outside_the_scope() -> None:
    """The reference prefill pads a request to its batch's longest lengths: outside the scope a request's bits change
    with its batch (so the invariance checks can fail), inside they do not."""
    case = next(c for c in CASES if c.op == "attention.prefill")
    found = case.outputs("reference", invariant=False)
    assert any(not torch.equal(a, b) for outs in found[1:] for a, b in zip(found[0], outs))
    case.check("reference")


def test_the_scope_adds_the_feature_and_explain_shows_it() -> None:
    x, w = torch.randn(3, 64), torch.randn(64)
    assert not active()
    assert FEATURE not in ksb.explain("norm.rms_norm", x, w).problem.features
    with ksb.batch_invariant():
        assert active()
        sel = ksb.explain("norm.rms_norm", x, w)
        with ksb.batch_invariant(False):
            assert not active() and FEATURE not in ksb.explain("norm.rms_norm", x, w).problem.features
    assert not active()
    assert FEATURE in sel.problem.features and "batch-invariant scope" in str(sel)
    assert FEATURE in FEATURES


def test_the_scope_ends_on_an_exception() -> None:
    with pytest.raises(RuntimeError), ksb.batch_invariant():
        raise RuntimeError("inside")
    assert not active()


def _plugin(name: str, kernels: list[Kernel]) -> Any:
    @hookimpl
    def ksb_backend() -> Backend:
        return Backend(name, "9.9", kernels)

    return types.SimpleNamespace(__name__=f"test_{name}", ksb_backend=ksb_backend)


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    from kernel_switchboard.reference.norm import rms_norm

    return rms_norm(x, w, eps, gemma)


def test_kernels_without_the_feature_are_rejected_with_the_reason(register: Any) -> None:
    cpu = frozenset({"cpu"})
    register(_plugin("fastnorm", [Kernel("norm.rms_norm", "rms", "fastnorm", Capability(devices=cpu), _norm,
                                         priority=50)]))
    x, w = torch.randn(3, 64), torch.randn(64)
    assert ksb.explain("norm.rms_norm", x, w).kernel.id == "fastnorm:rms"
    with ksb.batch_invariant():
        sel = ksb.explain("norm.rms_norm", x, w)
        assert sel.kernel.id == "reference:rms_norm"
        assert "features {batch_invariant} not supported" in str(sel)
        with pytest.raises(ksb.KernelUnavailableError, match="batch_invariant"):
            ksb.norm.rms_norm(x, w, backend="fastnorm")


def test_the_ranking_inside_the_scope_is_by_priority_for_every_batch(register: Any) -> None:
    """Outside the scope the cost estimate (which follows the batch) decides; inside, priority alone, so every batch
    size of a problem runs the same kernel."""
    cap = Capability(devices=frozenset({"cpu"}), features=frozenset({FEATURE}))
    register(_plugin("costly", [
        Kernel("norm.rms_norm", "small_rows", "costly", cap, _norm, priority=1, cost=lambda p: p.rows * 1e-6),
        Kernel("norm.rms_norm", "big_rows", "costly", cap, _norm, priority=2, cost=lambda p: 1e-4),
    ]))
    w = torch.randn(64)
    assert ksb.explain("norm.rms_norm", torch.randn(2, 64), w).kernel.id == "costly:small_rows"
    assert ksb.explain("norm.rms_norm", torch.randn(512, 64), w).kernel.id == "costly:big_rows"
    with ksb.batch_invariant():
        chosen = {ksb.explain("norm.rms_norm", torch.randn(rows, 64), w).kernel.id for rows in (1, 2, 512)}
        assert chosen == {"costly:big_rows"}
        assert ksb.explain("norm.rms_norm", torch.randn(2, 64), w, backend="costly:small_rows").kernel.id == \
            "costly:small_rows"


def test_plans_made_in_the_scope_stay_invariant() -> None:
    case = next(c for c in CASES if c.op == "attention.decode")
    q, cache, table = case.batches[2].args
    kw = dict(num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=q.shape[2], dtype=q.dtype,
              page_size=cache.page_size, return_lse=True)
    with ksb.batch_invariant():
        plan = ksb.attention.plan_decode(table, **kw)
    assert plan.params.batch_invariant and FEATURE in plan.problem.features
    with ksb.batch_invariant():
        want = ksb.attention.decode(q, cache, table, return_lse=True)
    got = plan.run(q, cache)  # outside the scope: the plan keeps its mode
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not ksb.attention.plan_decode(table, **kw).params.batch_invariant


def test_draws_take_a_batch_of_one_request_in_the_scope() -> None:
    probs = torch.softmax(torch.randn(2, 50), dim=-1)
    with ksb.batch_invariant():
        with pytest.raises(ksb.NoEligibleKernelError, match="batch of one request"):
            ksb.sampling.top_k_top_p(probs, top_k=10)
        one = ksb.sampling.top_k_top_p(probs[1:], top_k=10, generator=torch.Generator().manual_seed(3))
        draft = torch.softmax(torch.randn(2, 3, 50), dim=-1)
        with pytest.raises(ksb.NoEligibleKernelError, match="batch of one request"):
            ksb.sampling.chain_speculative(draft, torch.randint(0, 50, (2, 3)), torch.softmax(torch.randn(2, 4, 50), -1))
    assert torch.equal(one, ksb.sampling.top_k_top_p(probs[1:], top_k=10, generator=torch.Generator().manual_seed(3)))


def test_grouped_mm_is_refused_in_the_scope() -> None:
    a, b = torch.randn(6, 8), torch.randn(2, 8, 4)
    offsets = torch.tensor([0, 2, 6], dtype=torch.int32)
    ksb.gemm.grouped_mm(a, b, offsets)
    with ksb.batch_invariant(), pytest.raises(ksb.NoEligibleKernelError, match="batch_invariant"):
        ksb.gemm.grouped_mm(a, b, offsets)


def test_reference_attention_is_not_captured_in_the_scope() -> None:
    problem = ksb.explain("attention.decode", *next(c for c in CASES if c.op == "attention.decode").batches[0].args
                          ).problem
    assert PER_REQUEST.reasons(problem) == []
    assert PER_REQUEST.reasons(mark(problem)) == []
    captured = mark(problem)._replace(features=mark(problem).features | {"cuda_graph"})
    assert "CUDA graph" in " ".join(PER_REQUEST.reasons(captured))
