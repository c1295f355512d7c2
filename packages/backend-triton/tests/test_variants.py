"""Custom attention variants in the Triton kernels (the shipped ones run in the attention conformance
cases): routing and explain, a variant defined here end to end, plans, split-KV rules, and on a
GPU the cost of a variant against the plain kernel."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernel_switchboard as ksb
from kernel_switchboard import variants_lib as lib
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.attention import AttnSpec, indptr, paged_kv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
HQ, HKV, D = 4, 2, 64


@triton.jit
def _temp_score(s, q_pos, kv_pos, head, batch, args):
    return s / tl.load(args[0] + batch)


#: a variant defined in a few lines: a per-request softmax temperature
TEMPERATURE = ksb.Variant("temperature", score_mod=_temp_score, params=("temperature",),
                          torch_score_mod=lambda s, q_pos, kv_pos, head, batch, args: s / args[0][batch])


def _paged(kv_lens: tuple[int, ...] = (37, 5), seed: int = 0):
    spec = AttnSpec(torch.float16, "NHD", 16, HQ, HKV, D, kv_lens=kv_lens)
    g = torch.Generator().manual_seed(seed)
    cache, table = paged_kv(g, spec, DEV)
    q = torch.randn(len(kv_lens), HQ, D, generator=g).to(DEV, torch.float16)
    return q, cache, table


def _both(fn, *args, **kw):
    return fn(*args, backend="triton", **kw), fn(*args, backend="reference", **kw)


def test_new_variant_end_to_end_decode_and_prefill():
    q, cache, table = _paged()
    temps = torch.tensor([0.5, 3.0], device=DEV)
    got, want = _both(ksb.attention.decode, q, cache, table, variant=TEMPERATURE, variant_args=(temps,),
                      return_lse=True)
    for g, w in zip(got, want):
        assert_close(g, w, atol=2e-3, rtol=2e-3)
    qp = torch.randn(9, HQ, D, generator=torch.Generator().manual_seed(1)).to(DEV, torch.float16)
    qo = indptr((6, 3), DEV)
    got, want = _both(ksb.attention.prefill, qp, qo, cache, table, variant=TEMPERATURE, variant_args=(temps,))
    assert_close(got, want, atol=2e-3, rtol=2e-3)
    plain = ksb.attention.prefill(qp, qo, cache, table, backend="triton")
    assert not torch.allclose(got.float(), plain.float(), atol=1e-2)  # the hook really ran


def _assert_triton_chosen(sel) -> None:
    """Triton is eligible; it is chosen on a GPU (on the CPU the interpreter ranks after the reference)."""
    eligible = [c.kernel.backend for c in sel.candidates if c.eligible]
    assert set(eligible) == {"triton", "reference"}, str(sel)
    if DEV == "cuda":
        assert sel.kernel.backend == "triton", str(sel)


def test_variant_routes_to_triton_and_explain_says_why():
    q, cache, table = _paged()
    sel = ksb.explain("attention.decode", q, cache, table, variant=lib.ALIBI,
                      variant_args=(lib.alibi_slopes(HQ, DEV),))
    _assert_triton_chosen(sel)
    assert "custom_variant" in sel.problem.features and sel.problem.variant == lib.ALIBI.key
    assert "alibi[score_mod=" in str(sel)
    for kernel in registry.kernels("attention.decode"):  # what explain prints for them once installed
        if kernel.backend not in ("triton", "reference"):
            reasons = kernel.capability.reasons(sel.problem)
            assert any("features {custom_variant} not supported" in r for r in reasons), (kernel.id, reasons)


def test_non_triton_kernels_reject_variants_in_every_op():
    q, cache, table = _paged()
    qp, qo = q, indptr((1, 1), DEV)
    k = torch.randn(42, HKV, D, device=DEV, dtype=torch.float16)
    kw = {"variant": lib.SOFT_CAP, "variant_args": (4.0,)}
    problems = {
        "attention.decode": ksb.explain("attention.decode", q, cache, table, **kw).problem,
        "attention.prefill": ksb.explain("attention.prefill", qp, qo, cache, table, **kw).problem,
        "attention.prefill_ragged": ksb.explain("attention.prefill_ragged", qp, k, k, qo, indptr((37, 5), DEV),
                                                **kw).problem,
    }
    for op, problem in problems.items():
        _assert_triton_chosen(ksb.select(op, problem))
        for kernel in registry.kernels(op):
            if kernel.backend not in ("triton", "reference"):
                assert any("custom_variant" in r for r in kernel.capability.reasons(problem)), kernel.id


def test_split_kv_rules():
    """Score / mask hooks keep split-KV decode; output transforms and sigmoid run in one split."""
    q, cache, table = _paged((300 if DEV == "cuda" else 40, 5))
    common = dict(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=torch.float16, page_size=16, backend="triton",
                  capturable=False)
    alibi = ksb.attention.plan_decode(table, variant=lib.ALIBI, variant_args=(lib.alibi_slopes(HQ, DEV),), **common)
    sinks_args = (torch.randn(HQ, device=DEV),)
    sinks = ksb.attention.plan_decode(table, variant=lib.SINKS, variant_args=sinks_args, **common)
    if DEV == "cpu":
        assert alibi._runner.plan.cfg.num_splits == 2
    assert sinks._runner.plan.cfg.num_splits == 1
    want = ksb.attention.decode(q, cache, table, variant=lib.SINKS, variant_args=sinks_args, backend="reference")
    assert_close(sinks.run(q, cache), want, atol=2e-3, rtol=2e-3)
    want = ksb.attention.decode(q, cache, table, variant=lib.ALIBI, variant_args=(lib.alibi_slopes(HQ, DEV),),
                                backend="reference")
    assert_close(alibi.run(q, cache), want, atol=2e-3, rtol=2e-3)


def test_prefill_plan_reads_variant_tensors_at_run():
    _, cache, table = _paged()
    qo = indptr((4, 2), DEV)
    qp = torch.randn(6, HQ, D, generator=torch.Generator().manual_seed(2)).to(DEV, torch.float16)
    table_bias = torch.randn(HQ, 9, device=DEV)
    plan = ksb.attention.plan_prefill(table, qo, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=torch.float16,
                                      page_size=16, variant=lib.REL_POS_BIAS, variant_args=(table_bias, 8),
                                      backend="triton", capturable=False)
    for _ in range(2):
        want = ksb.attention.prefill(qp, qo, cache, table, variant=lib.REL_POS_BIAS, variant_args=(table_bias, 8),
                                     backend="reference")
        assert_close(plan.run(qp, cache), want, atol=2e-3, rtol=2e-3)
        table_bias.mul_(-3.0)
