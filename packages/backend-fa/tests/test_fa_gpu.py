"""FlashAttention backend on a GPU: conformance of every available provider against the reference at
real sizes, FA4's page-table split-KV and page-128 path, CUDA-graph capture and replay.

Providers not installed on the machine are skipped with their reasons (the H200 image has FA4 and
torch's flash backend; FA2/FA3 run where they are installed).
"""

from __future__ import annotations

import time

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Kernel
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import Case, assert_close, conformance_test, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, prefill_case, ragged_case, write_positions
from kernel_switchboard.testing.conformance import LazyCase, lazy_kernel_cases
from kernel_switchboard.testing.invariance import invariance_cases

BF16, F16 = torch.bfloat16, torch.float16

test_conformance = conformance_test("fa", ops=("attention.decode", "attention.prefill"))


def _kernels(op: str) -> list[Kernel]:
    backend = registry.all_backends().get("fa")
    return [k for k in (backend.kernels if backend else []) if k.op == op]


def _one_request_cases() -> list[Case]:
    """Dense single-request prefills (the torch-flash kernel's declared space; FA4 runs them too)."""
    specs = [AttnSpec(BF16, kv_lens=(4096,), q_lens=(4096,), q_heads=32, kv_heads=8, head_dim=128, lse=True),
             AttnSpec(F16, kv_lens=(3000,), q_lens=(700,), q_heads=32, kv_heads=8, head_dim=128),
             AttnSpec(BF16, kv_lens=(2048,), q_lens=(2048,), q_heads=16, kv_heads=16, head_dim=64, causal=False,
                      lse=True),
             AttnSpec(BF16, kv_lens=(5000,), q_lens=(1200,), q_heads=32, kv_heads=4, head_dim=128, lse=True)]
    return [ragged_case(s, "cuda", seed=i) for i, s in enumerate(specs)]


def _ragged_params() -> list[object]:
    """(kernel, case) pairs; the cases are built when their test runs (collection keeps no GPU memory)."""
    params: list[object] = []
    if not torch.cuda.is_available():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="needs a CUDA GPU"))]
    kernels = _kernels("attention.prefill_ragged")
    eligible = lazy_kernel_cases([k for k in kernels if k.unavailable is None], torch.device("cuda"), "large",
                                 extra=_one_request_cases)
    for k in kernels:
        if k.unavailable is not None:
            params.append(pytest.param(k, None, id=f"{k.id}-unavailable",
                                       marks=pytest.mark.skip(reason=f"{k.id}: {k.unavailable}")))
            continue
        cases = eligible[k.id]
        params.extend(pytest.param(k, c, id=f"{k.id}-{c.id}") for c in cases)
        if not cases:
            params.append(pytest.param(k, None, id=f"{k.id}-nocase"))
    return params


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "case"), _ragged_params())
def test_conformance_prefill_ragged(kernel: Kernel, case: LazyCase | None) -> None:
    """Core's ragged cases plus one-request cases (torch-flash declares batch 1 only)."""
    if case is None:
        pytest.fail(f"{kernel.id}: no case inside its declared capability")
    case.load().compare(kernel.id)


def _fa4(op: str) -> Kernel:
    for k in _kernels(op):
        if k.name.startswith("fa4@") and k.unavailable is None:
            return k
    pytest.skip(f"FA4 is unavailable here: {[k.unavailable for k in _kernels(op) if k.name.startswith('fa4@')]}")


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_fa4_page_table_split_kv(splits: int) -> None:
    """Forced split counts over small batches match the reference (incl. empty chunks and requests)."""
    from kernel_switchboard_fa import fa4

    kernel = _fa4("attention.decode")
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(8192, 1, 0, 3000), lse=True)
    q, cache, table = decode_case(spec, "cuda", seed=5).args
    plan = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, page_size=16,
                                     return_lse=True, backend=kernel.id)
    plan._runner.splits = splits  # type: ignore[attr-defined]  # the kernel's own plan object
    assert isinstance(plan._runner, fa4.DecodePlan)  # type: ignore[attr-defined]
    out, lse = plan.run(q, cache)  # type: ignore[misc]
    want, want_lse = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
    atol, rtol = tolerance(BF16)
    assert_close(out, want, atol=atol, rtol=rtol, what=f"split {splits} out")
    assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, what=f"split {splits} lse")


@pytest.mark.gpu
def test_fa4_page_128_fast_path_and_first_call_time() -> None:
    kernel = _fa4("attention.decode")
    spec = AttnSpec(BF16, "NHD", 128, 32, 8, 128, kv_lens=(4096, 129, 128, 1), lse=True)
    case = decode_case(spec, "cuda", seed=6)
    start = time.perf_counter()
    case.compare(kernel.id, finite_stale_slots=kernel.reads_stale_slots)
    print(f"\n{kernel.id}: first page-128 decode (compile + run + reference) {time.perf_counter() - start:.1f} s")


def _capture(fn: object) -> tuple[torch.cuda.CUDAGraph, object]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # type: ignore[operator]  # warm-up: JIT compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()  # type: ignore[operator]
    return graph, result


@pytest.mark.gpu
def test_fa4_decode_plan_captures_and_replays_new_inputs() -> None:
    kernel = _fa4("attention.decode")
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(2048, 1, 77, 1024), lse=True)
    q, cache, table = decode_case(spec, "cuda").args
    plan = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, page_size=16,
                                     return_lse=True, backend=kernel.id)
    static_q = q.clone()
    graph, (out, lse) = _capture(lambda: plan.run(static_q, cache))  # type: ignore[misc]
    static_q.copy_(torch.randn_like(q))
    write_positions(cache, table, 2, 77, 80)  # request 2 grows by three appended tokens
    table.seq_lens.copy_(torch.tensor([2000, 0, 80, 512], dtype=torch.int32, device="cuda"))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    fresh = ksb.PageTable(table.block_table, table.seq_lens.clone())
    want, want_lse = ksb.attention.decode(static_q, cache, fresh, return_lse=True, backend="reference")
    atol, rtol = tolerance(BF16)
    assert_close(out, want, atol=atol, rtol=rtol, what="replayed out")
    assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, what="replayed lse")


@pytest.mark.gpu
def test_fa4_prefill_plan_captures_and_replays_new_inputs() -> None:
    kernel = _fa4("attention.prefill")
    spec = AttnSpec(F16, "NHD", 16, 32, 8, 128, kv_lens=(900, 300, 40), q_lens=(900, 20, 1), lse=True)
    q, qo_indptr, cache, table = prefill_case(spec, "cuda").args
    plan = ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=F16,
                                      page_size=16, return_lse=True, backend=kernel.id)
    static_q = q.clone()
    graph, (out, lse) = _capture(lambda: plan.run(static_q, cache))  # type: ignore[misc]
    static_q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want, want_lse = ksb.attention.prefill(static_q, qo_indptr, cache, table, return_lse=True, backend="reference")
    atol, rtol = tolerance(F16)
    assert_close(out, want, atol=atol, rtol=rtol, what="replayed out")
    assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, what="replayed lse")


RAGGED_PLANS = [  # uniform batches take FA4's dense entry, the others its varlen one
    AttnSpec(BF16, kv_lens=(2048,) * 4, q_lens=(2048,) * 4, q_heads=32, kv_heads=8, head_dim=128, lse=True),
    AttnSpec(F16, kv_lens=(1500,) * 3, q_lens=(300,) * 3, q_heads=32, kv_heads=8, head_dim=128, window=256),
    AttnSpec(BF16, kv_lens=(1024,) * 2, q_lens=(1024,) * 2, q_heads=16, kv_heads=16, head_dim=64, causal=False,
             lse=True, soft_cap=30.0),
    AttnSpec(BF16, kv_lens=(2048, 700, 64), q_lens=(2048, 700, 1), q_heads=32, kv_heads=8, head_dim=128, lse=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("spec", RAGGED_PLANS, ids=lambda s: s.tag("ragged-plan"))
def test_fa4_ragged_plan_against_the_reference(spec: AttnSpec) -> None:
    kernel = _fa4("attention.prefill_ragged")
    q, k, v, qo_indptr, kv_indptr = (case := ragged_case(spec, "cuda")).args
    plan = ksb.attention.plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=spec.q_heads, num_kv_heads=spec.kv_heads,
                                             head_dim=spec.head_dim, dtype=spec.dtype, backend=kernel.id, **case.kwargs)
    got = plan.run(q, k, v)
    want = ksb.attention.prefill_ragged(q, k, v, qo_indptr, kv_indptr, backend="reference", **case.kwargs)
    atol, rtol = tolerance(spec.dtype)
    for name, g, w in zip(("out", "lse"), got if spec.lse else (got,), want if spec.lse else (want,)):
        assert_close(g, w, atol=atol if name == "out" else 1e-3, rtol=rtol if name == "out" else 1e-3, what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["attention.prefill", "attention.prefill_ragged"])
def test_fa4_prefill_is_batch_invariant_on_hopper(op: str) -> None:
    """One request's outputs and LSE have the same bits alone, between two others and last of five (decode rows, an
    empty request, requests longer than it), FA4 forced; they match the reference; and the scope picks FA4."""
    kernel = _fa4(op)
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FA4 declares batch invariance on sm_90 only")
    cases = [c for c in invariance_cases(op, "cuda", "large", BF16) if "-NHD-" in c.id]  # FA4 serves NHD pages
    assert cases
    for case in cases:
        found = case.check(kernel.id)
        want = case.outputs("reference")
        for got, ref in zip(found, want):
            atol, rtol = tolerance(BF16)
            assert_close(got[0], ref[0], atol=atol, rtol=rtol, what=f"{case.id} out")
            assert_close(got[1], ref[1], atol=1e-3, rtol=1e-3, what=f"{case.id} lse")
        batch = case.batches[-1]
        with ksb.batch_invariant():
            assert ksb.explain(op, *batch.args, **batch.kwargs).kernel.id == kernel.id


@pytest.mark.gpu
def test_untuned_dispatch_ranking_is_printed() -> None:
    """Prints the untuned ranking for the benchmark shapes (diagnostics for the lead); FA4 must be
    eligible for NHD page-128 decode when it is available."""
    spec = AttnSpec(BF16, "NHD", 128, 32, 8, 128, kv_lens=(8192,) * 128)
    q, cache, table = decode_case(spec, "cuda").args
    sel = ksb.explain("attention.decode", q, cache, table)
    print("\n" + str(sel))
    fa4 = [c for c in sel.candidates if c.kernel.name.startswith("fa4@") and c.kernel.unavailable is None]
    assert all(c.eligible for c in fa4), [c.reasons for c in fa4]
