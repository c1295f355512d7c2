"""The ``flashinfer-compat`` bench points of the ops beside attention: they build anywhere and their runners run on a
CPU at small sizes (the reference kernels; FlashInfer, absent here, simply gives no row)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernel_switchboard import bench
from kernel_switchboard.bench import flashinfer as bench_flashinfer

#: each point's params shrunk to CPU sizes
SMALL = {"flashinfer.fused_add_rmsnorm": {"rows": 4, "hidden": 64}, "flashinfer.rope": {"tokens": 8},
         "flashinfer.append_kv": {"batch": 2, "new": 3, "kv_len": 40},
         "flashinfer.fp8_block_gemm": {"m": 8, "n": 256, "k": 256},
         "flashinfer.sampling_defaults": {"batch": 4, "vocab": 64}}


def test_op_points_are_in_the_preset_on_a_gpu_and_build_anywhere() -> None:
    points = bench_flashinfer.op_points()
    assert {p.op for p in points} == set(SMALL)
    assert all(isinstance(p, bench.RunPoint) and p.runner is bench_flashinfer._RUNNERS[p.op] for p in points)
    labels = [p.label for p in points]
    assert len(set(labels)) == len(labels)
    assert {"8192x8192 bf16", "8192x8192x8192 fp8 block", "128x128256 top-p, default arguments"} <= set(labels)
    assert [p.label for p in bench.PRESETS["flashinfer-ops"]()] == labels
    if torch.cuda.is_available():
        assert {p.label for p in bench.PRESETS["flashinfer-compat"]()} >= set(labels)


@pytest.mark.parametrize("point", bench_flashinfer.op_points(), ids=lambda p: f"{p.op}-{p.label}")
def test_op_point_runs_on_cpu(point: bench.RunPoint) -> None:
    small = dataclasses.replace(point, params={**point.params, **SMALL[point.op]})
    rows = bench.run_point("flashinfer-compat", small, torch.device("cpu"), 1.0)
    errors = [(r.kernel, r.error) for r in rows if r.error and not r.kernel.startswith("torch._scaled_mm")]
    assert not errors, errors
    ours = [r for r in rows if r.kernel.startswith("kernel_switchboard")]
    assert len(ours) == 1 and ours[0].ms is not None and ours[0].ms > 0 and "->" in ours[0].kernel
    assert f"ksb kernel {ours[0].kernel.split('-> ')[-1]}" in {r.kernel for r in rows}  # the chosen one, forced
    auto = next(r for r in rows if r.kernel == "auto vs best kernel")
    assert auto.metric is not None and auto.metric > 0
    extra = {k: v for r in rows for k, v in r.extra.items()}
    if point.op == "flashinfer.fp8_block_gemm":
        assert extra["rel_err kernel_switchboard"] < 1e-2
    if point.op == "flashinfer.sampling_defaults":
        assert extra["tokens_in_support"] is True
        assert any(r.kernel == "ksb check_nan=True (host check)" and r.ms for r in rows)
    from kernel_switchboard.bench.report import print_table

    print_table(rows, {"copy_tbs": 3.0, "mm_tflops": 700.0})  # ratio rows (no time) print too


def test_the_table_prints_ratio_rows_without_a_time_or_a_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    from kernel_switchboard.bench.points import Row
    from kernel_switchboard.bench.report import print_table

    rows = [Row("p", "flashinfer.decode", "B=16", "ours", 0.0648, 2.07, "TB/s"),
            Row("p", "flashinfer.decode", "B=16", "ratio vs FlashInfer", None, 1.006, "x")]
    print_table(rows, {"copy_tbs": 3.0, "mm_tflops": 700.0})
    ours, ratio = capsys.readouterr().out.splitlines()[2:]
    assert "0.0648" in ours and "69%" in ours
    assert "1.01 x" in ratio and "%" not in ratio


@pytest.mark.parametrize(("op", "params"), [
    ("flashinfer.decode", {"batch": 2, "kv_len": 40}),
    ("flashinfer.decode", {"batch": 2, "kv_len": 40, "kv_dtype": "e4m3"}),
    ("flashinfer.ragged_prefill", {"batch": 2, "q_len": 24, "soft_cap": 30.0}),
], ids=["decode-bf16", "decode-fp8", "ragged-prefill-soft-cap"])
def test_attention_points_of_the_compat_preset_run_on_cpu(op: str, params: dict[str, object]) -> None:
    """The GPU preset's attention points (fp8 pages, soft cap) at CPU sizes: the compat layer's row is timed, names
    the kernel its plan chose and has a rate."""
    rows = bench.run_point("flashinfer-compat", bench_flashinfer._point(op, params, "small"), torch.device("cpu"), 1.0)
    assert [r.error for r in rows if r.error] == []
    ours = [r for r in rows if r.kernel.startswith("kernel_switchboard")]
    assert len(ours) == 1 and ours[0].ms is not None and ours[0].ms > 0 and "->" in ours[0].kernel
    assert ours[0].metric is not None and ours[0].metric > 0
