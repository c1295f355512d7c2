"""The Triton POD kernel (prefill and decode requests in one launch) against the reference: both schedules under the
interpreter (CPU), the benchmark's shape and a CUDA graph on a GPU (``gpu``), and a compile for Hopper of the new
kernels through their launchers (MLA prefill, POD, the batch-invariant decode, fp8 prefill; shared memory within an
SM's, the co-resident POD tile within half of it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, pod_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                  reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
F16, BF16 = torch.float16, torch.bfloat16


def _check(case: Any, runner_kw: dict[str, Any] | None = None) -> None:
    """The Triton runner (with ``runner_kw``: a PODConfig of pod_config's arguments) against the reference."""
    from kernel_switchboard_triton import _pod

    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    problem = ksb.explain("attention.pod", *case.args, **case.kwargs, backend="triton").problem
    from kernel_switchboard.ops.attention_problems import pod_call

    _, p, _ = pod_call(*case.args, **case.kwargs)
    config = None
    if runner_kw is not None:
        config = _pod.pod_config(q.device, problem.head_dim, problem.head_dim_v, problem.group_size, 2048, **runner_kw)
    runner = _pod.PODRunner(problem, prefill_table, p, qo_indptr=qo, decode_table=decode_table, config=config)
    got = runner.run(q, q_decode, cache, torch.full((*q.shape[:2], cache.head_dim_v), float("nan"), dtype=q.dtype,
                                                    device=q.device), None, None, None)
    want = ksb.attention.pod(*case.args, **case.kwargs, backend="reference")
    atol, rtol = case.tol or tolerance(case.dtype)
    for i, (g, w) in enumerate(zip(got, want)):
        if g is not None:
            assert_close(g, w, atol=atol, rtol=rtol, what=f"{case.id} output {i}")


@needs_triton
@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter shapes")
@pytest.mark.parametrize("schedule", ["decode_first", "interleave"])
@pytest.mark.parametrize(("spec", "decode"), [
    (AttnSpec(F16, "NHD", 16, 4, 2, kv_lens=(40,), q_lens=(40,), lse=True), (9, 1, 0, 33, 17)),  # more decode units
    (AttnSpec(BF16, "HND", 4, 8, 2, kv_lens=(30, 12), q_lens=(25, 3), soft_cap=5.0), (7,)),  # more prefill units
], ids=["decode-heavy", "prefill-heavy"])
def test_pod_schedules_match_reference(spec: AttnSpec, decode: tuple[int, ...], schedule: str) -> None:
    _check(pod_case(spec, decode, DEVICE, seed=5), {"schedule": schedule})


@needs_triton
def test_plan_pod_selects_triton_and_serves_two_layers() -> None:
    case = pod_case(AttnSpec(F16, "NHD", 16, 4, 1, kv_lens=(25,), q_lens=(9,), lse=True), (30, 2), DEVICE, seed=2)
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    plan = ksb.attention.plan_pod(prefill_table, qo, decode_table, num_q_heads=4, num_kv_heads=1, head_dim=64,
                                  dtype=F16, page_size=16, return_lse=True, capturable=False, backend="triton")
    assert plan.kernel.id == "triton:pod"
    for layer in range(2):
        layer_cache = ksb.PagedKVCache(cache.k_pages * (0.5 + layer), cache.v_pages, "NHD")
        got = plan.run(q, q_decode, layer_cache)
        want = ksb.attention.pod(q, qo, q_decode, layer_cache, prefill_table, decode_table, return_lse=True,
                                 backend="reference")
        for g, w in zip(got, want):
            assert_close(g, w, atol=2e-3, rtol=2e-3, what=f"layer {layer}")


@pytest.mark.skipif(DEVICE != "cpu", reason="compiles on a CPU machine through a fake Hopper driver")
def test_new_attention_kernels_compile_for_hopper() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("hopper_compile.py")
    done = subprocess.run([sys.executable, str(script), "beyond"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["problem"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    assert len(results) == 7
    assert {k["name"] for k in results["decode-batch-invariant"]["kernels"]} == {"_decode_split_kernel",
                                                                                "_merge_splits_ordered_kernel"}
    for result in results.values():
        assert "error" not in result, result
        assert all(k["arch"] == 90 and k["shared"] <= 227 * 1024 for k in result["kernels"]), result
    assert results["pod-interleave-co_resident"]["kernels"][0]["shared"] <= 113 * 1024  # two programs per SM


# -- GPU --------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("schedule", "co_resident"), [("decode_first", False), ("interleave", False),
                                                       ("interleave", True)], ids=str)
def test_pod_benchmark_shape_matches_reference(schedule: str, co_resident: bool) -> None:
    """1 prefill of 2048 tokens (its whole sequence) and 64 decodes, Llama-3-8B heads: every schedule."""
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(2048,), q_lens=(2048,), lse=True)
    lens = tuple(int(n) for n in torch.randint(1, 4096, (64,), generator=torch.Generator().manual_seed(0)))
    _check(pod_case(spec, lens, "cuda", seed=1), {"schedule": schedule, "co_resident": co_resident})


@pytest.mark.gpu
def test_pod_plan_cuda_graph_capture_and_replay() -> None:
    spec = AttnSpec(BF16, "HND", 64, 32, 8, 128, kv_lens=(1500, 700), q_lens=(512, 700), lse=True)
    case = pod_case(spec, (3000, 1, 64, 2048), "cuda", seed=3)
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    plan = ksb.attention.plan_pod(prefill_table, qo, decode_table, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                  dtype=BF16, layout="HND", page_size=64, return_lse=True, backend="triton")
    outs = plan.run(q, q_decode, cache)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, q_decode, cache, out_prefill=outs[0], out_decode=outs[1], lse_prefill=outs[2],
                 lse_decode=outs[3])
    for step in range(2):
        q_decode.copy_(torch.randn_like(q_decode, dtype=torch.float32).to(BF16))
        outs[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = ksb.attention.pod(*case.args, return_lse=True, backend="reference")
        for i, (g, w) in enumerate(zip(outs, want)):
            assert_close(g, w, atol=2e-2, rtol=2e-2, what=f"replay {step} output {i}")
