"""cuDNN backend on a GPU with cuDNN: conformance against the reference at real sizes, the HND
capability space, graph-cache reuse, CUDA-graph capture and replay.

Failures print the cuDNN/frontend versions and the graph-cache counters (``-s`` shows them too).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import KernelUnavailableError
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import Case, assert_close, conformance_test, finite_stale, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, prefill_case, ragged_case

BF16, F16 = torch.bfloat16, torch.float16

test_conformance = conformance_test("cudnn")


def _available() -> bool:
    backend = registry.all_backends().get("cudnn")
    return backend is not None and backend.available


needs_cudnn = pytest.mark.skipif(not torch.cuda.is_available() or not _available(),
                                 reason="needs a GPU and cuDNN (the backend is unavailable here)")
pytestmark = [pytest.mark.gpu, needs_cudnn]


def _versions() -> str:
    from kernel_switchboard_cudnn import graphs

    try:
        backend_version, frontend = graphs.versions()
        return f"cuDNN {backend_version} frontend {frontend} graph cache {graphs.stats}"
    except Exception as exc:  # pragma: no cover - diagnostics only
        return f"versions unavailable: {exc}"


DECODE = [
    AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(2048, 1, 0, 777, 1500), lse=True),
    AttnSpec(F16, "HND", 32, 32, 4, 128, kv_lens=(300, 4096, 65)),
    AttnSpec(BF16, "HND", 64, 16, 16, 64, kv_lens=(129, 1, 1000)),
    AttnSpec(BF16, "HND", 128, 32, 8, 128, kv_lens=(8192, 128, 129), lse=True),
    AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(2048, 300, 5), window=255, lse=True),
    AttnSpec(F16, "HND", 16, 16, 2, 256, kv_lens=(1024, 3)),
]
PREFILL = [
    AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(2048, 600, 1, 0), q_lens=(2048, 100, 1, 0), lse=True),
    AttnSpec(F16, "HND", 64, 32, 4, 128, kv_lens=(1000, 513), q_lens=(1000, 513), causal=False, lse=True),
    AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(1500, 700), q_lens=(300, 700), window=127),
    AttnSpec(BF16, "HND", 32, 16, 16, 64, kv_lens=(333, 64, 1), q_lens=(1, 64, 1)),
]
RAGGED = [*PREFILL, AttnSpec(BF16, "NHD", 16, 16, 16, 192, head_dim_v=128, kv_lens=(1024, 77), q_lens=(1024, 10),
                             lse=True)]


def _compare(case: Case) -> None:
    """Compare with the reference, unless this cuDNN/GPU does not declare the case (version-dependent rows)."""
    try:
        kernel = ksb.explain(case.op, *case.args, backend="cudnn", **case.kwargs).kernel
    except KernelUnavailableError as exc:
        pytest.skip(f"not declared for this cuDNN/GPU: {exc}")
    try:
        case.compare("cudnn", finite_stale_slots=kernel.reads_stale_slots)
    except Exception as exc:
        raise AssertionError(f"{case.id}: {exc}\n{_versions()}") from exc


@pytest.mark.parametrize("spec", DECODE, ids=lambda s: s.tag("decode"))
def test_decode_hnd_space(spec: AttnSpec) -> None:
    _compare(decode_case(spec, "cuda", seed=1))


@pytest.mark.parametrize("spec", PREFILL, ids=lambda s: s.tag("prefill"))
def test_prefill_hnd_space(spec: AttnSpec) -> None:
    _compare(prefill_case(spec, "cuda", seed=2))


@pytest.mark.parametrize("spec", RAGGED, ids=lambda s: s.tag("ragged"))
def test_ragged_space(spec: AttnSpec) -> None:
    _compare(ragged_case(spec, "cuda", seed=3))


def test_graph_cache_is_reused_per_shape() -> None:
    from kernel_switchboard_cudnn import graphs

    spec = AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(100, 200, 300))
    q, cache, table = decode_case(spec, "cuda").args
    graphs.clear()
    builds = graphs.stats["builds"]
    first = ksb.attention.decode(q, cache, table, backend="cudnn")
    again = ksb.attention.decode(q, cache, table, backend="cudnn")
    assert graphs.stats["builds"] == builds + 1, _versions()
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    q2, cache2, table2 = decode_case(replace(spec, kv_lens=(100, 200, 300, 5)), "cuda").args
    ksb.attention.decode(q2, cache2, table2, backend="cudnn")
    assert graphs.stats["builds"] == builds + 2, "a new batch size builds its own graph"
    print(f"\ncuDNN graph builds {graphs.stats['builds']}, {graphs.stats['build_seconds']:.2f} s in all; {_versions()}")


def _capture(fn: object) -> tuple[torch.cuda.CUDAGraph, object]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # type: ignore[operator]  # warm-up: builds the graph outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()  # type: ignore[operator]
    return graph, result


def test_decode_plan_captures_and_replays_new_inputs() -> None:
    spec = AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(2048, 1, 77, 1024), lse=True)
    q, cache, table = decode_case(spec, "cuda").args
    plan = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, layout="HND",
                                     page_size=16, return_lse=True, backend="cudnn")
    assert plan.kernel.id == "cudnn:sdpa_paged_decode"
    static_q = q.clone()
    graph, (out, lse) = _capture(lambda: plan.run(static_q, cache))  # type: ignore[misc]
    static_q.copy_(torch.randn_like(q))
    table.seq_lens.copy_(torch.tensor([2000, 0, 80, 512], dtype=torch.int32, device="cuda"))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    fresh = ksb.PageTable(table.block_table, table.seq_lens.clone())
    want, want_lse = ksb.attention.decode(static_q, cache, fresh, return_lse=True, backend="reference")
    atol, rtol = tolerance(BF16)
    assert_close(out, want, atol=atol, rtol=rtol, what="replayed out")
    assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, what="replayed lse")


def test_prefill_plan_captures_and_replays_new_inputs() -> None:
    spec = AttnSpec(F16, "HND", 16, 32, 8, 128, kv_lens=(900, 300, 40), q_lens=(900, 20, 1), lse=True)
    q, qo_indptr, cache, table = prefill_case(spec, "cuda").args
    cache = finite_stale(cache)  # cuDNN's paged prefill reads stale slots with a zero weight (reads_stale_slots)
    plan = ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=F16,
                                      layout="HND", page_size=16, return_lse=True, backend="cudnn")
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


RAGGED_PLANS = [*RAGGED, AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(2048,) * 4, q_lens=(2048,) * 4, lse=True),
                AttnSpec(F16, "NHD", 16, 32, 8, 128, kv_lens=(4096,), q_lens=(4096,)),
                AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(1000, 1000), q_lens=(100, 100), causal=False, lse=True)]


@pytest.mark.parametrize("spec", RAGGED_PLANS, ids=lambda s: s.tag("ragged-plan"))
def test_ragged_plan_space(spec: AttnSpec) -> None:
    """Planned ragged prefill (uniform batches take the dense graph without padding mask) against the reference."""
    case = ragged_case(spec, "cuda")
    q, k, v, qo_indptr, kv_indptr = case.args
    plan = ksb.attention.plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=spec.q_heads, num_kv_heads=spec.kv_heads,
                                             head_dim=spec.head_dim, head_dim_v=v.shape[2], dtype=spec.dtype,
                                             backend="cudnn", **case.kwargs)
    want = ksb.attention.prefill_ragged(q, k, v, qo_indptr, kv_indptr, backend="reference", **case.kwargs)
    got = plan.run(q, k, v)
    atol, rtol = tolerance(spec.dtype)
    for name, g, w in zip(("out", "lse"), got if spec.lse else (got,), want if spec.lse else (want,)):
        assert_close(g, w, atol=atol if name == "out" else 1e-3, rtol=rtol if name == "out" else 1e-3,
                     what=f"{name} {_versions()}")


def test_uniform_ragged_plan_captures_and_replays_new_inputs() -> None:
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(1024,) * 3, q_lens=(1024,) * 3, lse=True)
    q, k, v, qo_indptr, kv_indptr = ragged_case(spec, "cuda").args
    plan = ksb.attention.plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                             dtype=BF16, return_lse=True, backend="cudnn")
    static_q = q.clone()
    graph, (out, lse) = _capture(lambda: plan.run(static_q, k, v))  # type: ignore[misc]
    static_q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want, want_lse = ksb.attention.prefill_ragged(static_q, k, v, qo_indptr, kv_indptr, return_lse=True,
                                                  backend="reference")
    atol, rtol = tolerance(BF16)
    assert_close(out, want, atol=atol, rtol=rtol, what="replayed out")
    assert_close(lse, want_lse, atol=1e-3, rtol=1e-3, what="replayed lse")


def test_untuned_dispatch_ranks_cudnn_decode() -> None:
    """cuDNN's paged decode is eligible for HND bf16 decode and ranks above the reference (printed: the ranking)."""
    spec = AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(2048,) * 16)
    q, cache, table = decode_case(spec, "cuda").args
    sel = ksb.explain("attention.decode", q, cache, table)
    print("\n" + str(sel))
    ranked = [c.kernel.id for c in sel.candidates if c.eligible]
    assert ranked.index("cudnn:sdpa_paged_decode") < ranked.index("reference:decode")
