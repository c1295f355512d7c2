"""``switchboard bench --preset beyond`` on tiny shapes on the CPU: every point runs its comparison and reports rows
with their checks (the reference kernels stand in for the GPU kernels; FlashInfer is absent)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernel_switchboard.bench import PRESETS, RunPoint, run_point
from kernel_switchboard.bench import beyond as bench_beyond

SMALL = {  # in the preset's order (POD last: FlashInfer's POD module compiles for minutes on first use)
    "batch-invariant decode B=64 L=4096": {"batch": 3, "kv_len": 40},
    "batch-invariant prefill 1x8192": {"batch": 1, "q_len": 24},
    "fp8 prefill 1x8192 p128": {"batch": 1, "q_len": 24},
    "fp8 prefill 4x4096 p128": {"batch": 2, "q_len": 16},
    "MLA prefill 1x4096 H=128": {"batch": 1, "q_len": 8, "kv_len": 8},
    "MLA chunk 1024 after 7168 H=128": {"batch": 1, "q_len": 4, "kv_len": 12},
    "1x4096 prefill + 64 decodes L=4096": {"prefill": 24, "decodes": 3, "kv_len": 40},
}


def test_the_preset_is_registered() -> None:
    labels = [p.label for p in PRESETS["beyond"]()]
    assert labels == list(SMALL)


@pytest.mark.parametrize("point", bench_beyond.points(), ids=lambda p: p.label)
def test_each_point_runs_its_comparison(point: RunPoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_BENCH_FLASHINFER", "0")
    rows = run_point("beyond", replace(point, params=SMALL[point.label]), torch.device("cpu"), 1.0)
    assert rows and all(r.error is None for r in rows), [(r.kernel, r.error) for r in rows if r.error]
    assert all(r.ms is not None and r.ms > 0 for r in rows)
    extras = {k for r in rows for k in r.extra}
    if point.op == "attention.pod":
        pod = next(r for r in rows if r.kernel.startswith("plan_pod"))
        assert pod.extra["max_diff_prefill"] == 0 and pod.extra["max_diff_decode"] == 0
        assert "time_over_ksb_prefill_then_decode" in extras
    elif "invariant" in point.label:
        assert all(r.extra.get("request_bits_same_alone_and_in_batch",
                                r.extra.get("request_bits_same_alone_and_beside_a_decode")) is True
                   for r in rows if r.kernel.startswith("batch-invariant"))
        assert any(k.startswith("cost_over") for k in extras)
    elif "fp8" in point.label:
        fp8 = next(r for r in rows if r.kernel.startswith("fp8"))
        assert fp8.extra["max_err"] < 0.2 and any(k.startswith("tflops_over") for k in fp8.extra)


def test_build_and_tune_skip_points_that_run_their_own_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    from kernel_switchboard.bench.cli import explained_points, points_parser

    args = points_parser("switchboard build").parse_args(["--preset", "beyond"])
    failed: list[str] = []
    assert list(explained_points("build", args, torch.device("cpu"), failed)) == [] and failed == []
    assert capsys.readouterr().err.count("runs its own comparison") == len(SMALL)
