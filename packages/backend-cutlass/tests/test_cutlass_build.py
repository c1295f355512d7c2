"""Emit one CUTLASS 3 sm_90a GEMM, compile it with nvcc (no GPU needed), and hit the disk cache.

Needs nvcc >= 12.3 and the CUTLASS headers (``pip install --no-deps nvidia-cutlass`` is enough; or
``KSB_CUTLASS_DIR``). Without them the test is skipped with the reason. One compile takes ~40 s on
two cores.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from kernel_switchboard.ops.gemm import GemmProblem
from kernel_switchboard_cutlass import build, configs, emit, gemm, toolchain


def _missing() -> str | None:
    toolchain.reset()
    return toolchain.missing_headers() or toolchain.missing_nvcc()


pytestmark = pytest.mark.skipif(_missing() is not None, reason=f"cannot compile CUTLASS kernels here: {_missing()}")


def test_compile_one_gemm_then_hit_the_disk_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KSB_CUTLASS_CACHE", str(tmp_path / "cache"))
    build.forget()
    problem = GemmProblem("cuda", (9, 0), torch.bfloat16, torch.bfloat16, 1024, 1024, 1024, "RR", 16, None, None,
                          frozenset())
    kernel = next(k for k in gemm.kernels("test") if k.name == "mm")
    cfg = gemm._mm_config_of_problem(problem)
    assert cfg == configs.GemmConfig("mm", "bf16", "bf16", "row", "row", (128, 128, 64), (1, 2, 1), "cooperative")
    assert kernel.needs_build(problem) is True

    kernel.build(problem)  # emit + nvcc

    art = build.artifact(cfg)
    assert art.built and art.so.with_suffix(".cu").is_file()
    meta = json.loads(art.meta.read_text())
    assert meta["arch"] == "sm_90a" and meta["cutlass"] == toolchain.headers().version
    assert meta["serialized_wgmma"] is False, meta["log_tail"]  # -DNDEBUG keeps the wgmma pipeline intact
    lib = ctypes.CDLL(str(art.so))  # loads without a GPU (cudart is linked statically)
    assert hasattr(lib, "ksb_gemm") and hasattr(lib, "ksb_workspace")

    # second request, also from a fresh lookup: served from disk, nvcc never runs
    def no_nvcc(*args, **kwargs):
        raise AssertionError(f"nvcc ran again: {args}")

    monkeypatch.setattr(subprocess, "run", no_nvcc)
    build.forget()
    assert kernel.needs_build(problem) is False
    assert build.compile_config(cfg).so == art.so
    assert build.compile_many([cfg, cfg]) == [art]
    assert sorted(p.suffix for p in art.so.parent.iterdir()) == [".cu", ".json", ".so"]  # no temporary leftovers


def test_fp8_kernels_with_two_accumulators_compile_without_spills(monkeypatch, tmp_path: Path) -> None:
    """The fp8 kernels that keep a second accumulator per thread build for sm_90a with no register spills and their
    wgmma pipeline intact (ptxas's report, in the build record): the per-tensor default for large M (its 128x256
    predecessor spilled 1,412 bytes) and both kernels with our own mainloop (``overlap_promotion.hpp``: three
    accumulators). Their numbers are checked by the GPU tests."""
    monkeypatch.setenv("KSB_CUTLASS_CACHE", str(tmp_path / "cache"))
    build.forget()
    overlapped = configs.fp8_block_config("bf16", 4096, "coop_c2x1_ovl")
    cfgs = [overlapped, configs.fp8_tensor_config("bf16", 4096), configs.fp8_tensor_config("bf16", 4096, "coop_c2x1_ovl")]
    for art in build.compile_many(cfgs, jobs=2):
        meta = json.loads(art.meta.read_text())
        assert re.search(r"Used \d+ registers", meta["log_tail"]), meta["log_tail"]  # ptxas -v reported the kernel
        assert meta["spill_bytes"] == 0 and meta["serialized_wgmma"] is False, (meta["config"], meta["log_tail"])
        assert hasattr(ctypes.CDLL(str(art.so)), emit.entry_point(art.config.kind))
    assert "struct OverlappedBlockScaled" in build.artifact(overlapped).so.with_suffix(".cu").read_text()
