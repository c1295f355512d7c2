"""Dispatch on a GPU: automatic tuning on first call, and no tuning inside CUDA-graph capture."""

from __future__ import annotations

import types

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl, tuning

pytestmark = pytest.mark.gpu


@pytest.fixture
def slow_and_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("KSB_TUNE_CACHE", str(tmp_path / "tune.json"))
    tuning._state["entries"] = None
    from kernel_switchboard.reference.norm import rms_norm

    def slow(x, w, eps, gemma):  # the same result, ten times the work
        for _ in range(9):
            rms_norm(x, w, eps, gemma)
        return rms_norm(x, w, eps, gemma)

    cap = Capability(devices=frozenset({"cuda"}))

    @hookimpl
    def ksb_backend() -> Backend:
        # the cost model prefers the slow kernel: only measurement finds the fast one
        return Backend("gt", "1", [Kernel("norm.rms_norm", "slow", "gt", cap, slow, cost=lambda p: 1e-6),
                                   Kernel("norm.rms_norm", "fast", "gt", cap, rms_norm, cost=lambda p: 1e-3)])

    plugin = types.SimpleNamespace(__name__="gt", ksb_backend=ksb_backend)
    ksb.registry.register(plugin)
    yield
    ksb.registry.unregister(plugin)
    tuning._state["entries"] = None


def test_autotune_on_first_call_stores_the_measured_winner(slow_and_fast) -> None:
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    assert ksb.explain("norm.rms_norm", x, w).kernel.id == "gt:slow"
    with ksb.autotune():
        y = ksb.norm.rms_norm(x, w)
        sel = ksb.explain("norm.rms_norm", x, w)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (4096,), w, 1e-6), atol=2e-2, rtol=2e-2)
    # the winner is gt:fast, or an installed backend's kernel faster still (triton on the H200): never gt:slow
    assert sel.kernel.id != "gt:slow" and sel.source == "tuned"
    assert tuning.lookup("norm.rms_norm", sel.problem) == sel.kernel.id


def test_no_tuning_inside_graph_capture(slow_and_fast) -> None:
    x = torch.randn(64, 256, device="cuda")
    w = torch.randn(256, device="cuda")
    with ksb.autotune():
        ksb.norm.rms_norm(x, w, backend="gt:fast")  # warm the kernel outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = ksb.norm.rms_norm(x, w)
        graph.replay()
    assert tuning.entries() == {}
    sel = ksb.select("norm.rms_norm", ksb.explain("norm.rms_norm", x, w).problem._replace(features=frozenset({"cuda_graph"})))
    assert "cuda_graph" in sel.problem.features
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (256,), w, 1e-6))


def test_switchboard_tune_stores_the_graph_winner_that_plan_decode_then_picks(tmp_path, monkeypatch, capsys) -> None:
    from kernel_switchboard.bench import tune_main
    from kernel_switchboard.testing.cases.attention import example

    monkeypatch.setenv("KSB_TUNE_CACHE", str(tmp_path / "tune.json"))
    tuning._state["entries"] = None
    try:
        params = {"batch": 4, "kv_len": 512, "page_size": 16}
        assert tune_main(["--op", "attention.decode", *(f"--param={k}={v}" for k, v in params.items()),
                          "--reps-ms", "5"]) == 0
        assert "(plan in a CUDA graph)" in capsys.readouterr().out
        q, cache, table = example("attention.decode", torch.device("cuda"), **params).args
        plan = ksb.attention.plan_decode(table, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads,
                                         head_dim=cache.head_dim, dtype=q.dtype, layout=cache.layout,
                                         page_size=cache.page_size)
        assert "cuda_graph" in plan.problem.features and plan.selection.source == "tuned"
        assert tuning.lookup("attention.decode", plan.problem) == plan.kernel.id
    finally:
        tuning._state["entries"] = None
