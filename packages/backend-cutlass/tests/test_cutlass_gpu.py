"""CUTLASS kernels on a Hopper GPU against the reference: odd shapes, every layout, fp8 scale modes,
grouped GEMM with empty groups, CUDA-graph capture and replay, the first call from a warm disk cache, and
`explain` on a cold one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.reference import gemm as ref
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.gemm import quantize_fp8
from kernel_switchboard_cutlass import build, plugin

pytestmark = pytest.mark.gpu

BF16, F16 = torch.bfloat16, torch.float16
#: (M, N, K, layout): odd extents take the zero-padding path, aligned ones run in place
MM_SHAPES = [(1, 4096, 4096, "RC"), (33, 40, 24, "RR"), (127, 33, 24, "RC"), (1000, 1000, 1000, "CR"),
             (2048, 2048, 512, "CC"), (8192, 8192, 8192, "RR")]
# each scale mode's default tiles (configs.fp8_role): the overlapped 2x1-cluster tile (4096 rows; 1100 cut a
# cluster), 128-row tiles without a cluster (333 rows: a partial tile), 64-row tiles (128 rows: two tile rows; 64 and
# 7: one)
FP8_SHAPES = [(4096, 4096, 4096, "block"), (1100, 2112, 7168, "block"), (333, 2112, 7168, "block"),
              (128, 2048, 1024, "block"), (64, 7168, 2048, "block"),
              (4096, 4096, 4096, "tensor"), (333, 2112, 7168, "tensor"), (128, 2048, 1024, "tensor"),
              (7, 136, 256, "tensor")]
GROUPS = [(0, 512, 3, 0, 1024, 77), (128,) * 8]


def _mat(rows: int, cols: int, order: str, dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(rows * 7919 + cols)
    if order == "C":
        return (scale * torch.randn(cols, rows, generator=g, device=device)).to(dtype).t()
    return (scale * torch.randn(rows, cols, generator=g, device=device)).to(dtype)


def _mm_args(m: int, n: int, k: int, layout: str, dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    return _mat(m, k, layout[0], dtype, device), _mat(k, n, layout[1], dtype, device, k**-0.5)


def _fp8_args(m: int, n: int, k: int, mode: str, device: torch.device) -> tuple[Any, ...]:
    a = _mat(m, k, "R", torch.float32, device)
    b = _mat(n, k, "R", torch.float32, device, k**-0.5).t()  # (K, N) column-major: K-major weights
    ga, gb = ((m, k), (k, n)) if mode == "tensor" else ((1, 128), (128, 128))
    qa, sa = quantize_fp8(a, *ga)
    qb, sb = quantize_fp8(b, *gb)
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(())
    return qa, qb, sa, sb


def _grouped_args(sizes: tuple[int, ...], n: int, k: int, order: str, device: torch.device) -> tuple[Any, ...]:
    a = _mat(sum(sizes), k, "R", BF16, device)
    b = torch.randn(len(sizes), k, n, device=device) * k**-0.5
    if order == "C":
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    offsets = torch.tensor([0, *sizes], device=device).cumsum(0).to(torch.int32)
    return a, b.to(BF16) if order == "R" else b.transpose(1, 2).to(BF16).transpose(1, 2), offsets


def gpu_calls(device: torch.device) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """Every call these tests make (the conftest compiles their kernels up front, in parallel)."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for m, n, k, lay in MM_SHAPES:
        for dtype in (BF16, F16):
            calls.append(("gemm.mm", _mm_args(m, n, k, lay, dtype, device), {}))
    for m, n, k, mode in FP8_SHAPES:
        calls.append(("gemm.mm_fp8", _fp8_args(m, n, k, mode, device), {"out_dtype": BF16}))
    for sizes in GROUPS:
        for order in "RC":
            calls.append(("gemm.grouped_mm", _grouped_args(sizes, 2816, 1024, order, device), {}))
    return calls


@pytest.fixture(scope="module")
def device() -> torch.device:
    reason, _ = plugin.unavailable_reason()
    if reason is not None:
        pytest.skip(f"CUTLASS GEMMs unavailable: {reason}")
    return torch.device("cuda")


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
@pytest.mark.parametrize(("m", "n", "k", "layout"), MM_SHAPES)
def test_mm(device: torch.device, m: int, n: int, k: int, layout: str, dtype: torch.dtype) -> None:
    a, b = _mm_args(m, n, k, layout, dtype, device)
    got = ksb.gemm.mm(a, b, backend="cutlass")
    assert got.is_contiguous()
    tol = 2e-2 if dtype == BF16 else 2e-3
    assert_close(got, ref.mm(a, b), atol=tol, rtol=tol, what=f"mm {m}x{n}x{k} {layout}")


@pytest.mark.parametrize(("m", "n", "k", "mode"), FP8_SHAPES)
def test_mm_fp8(device: torch.device, m: int, n: int, k: int, mode: str) -> None:
    args = _fp8_args(m, n, k, mode, device)
    got = ksb.gemm.mm_fp8(*args, out_dtype=BF16, backend="cutlass")
    want = ref.mm_fp8(*args, mode, BF16)
    assert_close(got, want, atol=2e-2, rtol=2e-2, what=f"mm_fp8 {mode} {m}x{n}x{k}")


#: fp8 tiles the benchmark forces that no shape takes by default (the conftest compiles them up front), by scale mode
FORCED_FP8_TILES = {"block": ("coop", "coop_c1x1", "coop_c2x1", "coop_sk2"), "tensor": ("coop_c1x1", "coop_c2x1")}
_FORCING = {"block": "KSB_CUTLASS_FP8_BLOCK_TILE", "tensor": "KSB_CUTLASS_FP8_TENSOR_TILE"}


@pytest.mark.parametrize(("mode", "tile"), [(mode, t) for mode, tiles in FORCED_FP8_TILES.items() for t in tiles])
@pytest.mark.parametrize(("m", "n", "k"), [(333, 2112, 7168), (4096, 4096, 4096), (256, 384, 128), (200, 256, 384),
                                           (1100, 512, 640)])
def test_mm_fp8_forced_tile(device: torch.device, mode: str, tile: str, m: int, n: int, k: int,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A tile forced by ``KSB_CUTLASS_FP8_{BLOCK,TENSOR}_TILE`` where the problem's edge cuts a tile and where it does
    not, over 1, 3, 5, 32 and 56 K tiles (each way the ``_ovl`` mainloops can end), with several output tiles per CTA
    (4096^2: the persistent scheduler reuses the pipeline across tiles)."""
    monkeypatch.setenv(_FORCING[mode], tile)
    args = _fp8_args(m, n, k, mode, device)
    got = ksb.gemm.mm_fp8(*args, out_dtype=BF16, backend="cutlass")
    assert_close(got, ref.mm_fp8(*args, mode, BF16), atol=2e-2, rtol=2e-2, what=f"mm_fp8 {mode} {tile} {m}x{n}x{k}")


def test_mm_fp8_unaligned_k_is_refused_with_the_reason(device: torch.device) -> None:
    """K=200 fp8 rows are 8-byte aligned; TMA needs 16: the explicit choice fails loudly, never pads silently."""
    args = _fp8_args(7, 136, 200, "tensor", device)
    with pytest.raises(ksb.KernelUnavailableError, match="align_bytes=8: TMA needs 16-byte"):
        ksb.gemm.mm_fp8(*args, out_dtype=BF16, backend="cutlass")


@pytest.mark.parametrize("order", ["R", "C"])
@pytest.mark.parametrize("sizes", GROUPS, ids=lambda s: f"G{len(s)}")
def test_grouped_mm(device: torch.device, sizes: tuple[int, ...], order: str) -> None:
    a, b, offsets = _grouped_args(sizes, 2816, 1024, order, device)
    got = ksb.gemm.grouped_mm(a, b, offsets, backend="cutlass")
    assert_close(got, ref.grouped_mm(a, b, offsets), atol=2e-2, rtol=2e-2, what=f"grouped {sizes} {order}")


def test_each_kind_captures_in_a_cuda_graph_and_replays_on_new_inputs(device: torch.device) -> None:
    """mm, mm_fp8 (block scales with padded rows, per-tensor) and grouped_mm (empty groups), each loaded by one
    eager call, captured once, then replayed on inputs rewritten in place: every replay matches the reference on
    the new inputs."""
    mm_args = _mm_args(1000, 1000, 1000, "CR", BF16, device)
    block = _fp8_args(333, 2112, 7168, "block", device)
    tensor = _fp8_args(7, 136, 256, "tensor", device)
    grouped = _grouped_args(GROUPS[0], 2816, 1024, "R", device)
    calls = {
        "mm": (lambda: ksb.gemm.mm(*mm_args, backend="cutlass"), lambda: ref.mm(*mm_args)),
        "mm_fp8 block": (lambda: ksb.gemm.mm_fp8(*block, out_dtype=BF16, backend="cutlass"),
                         lambda: ref.mm_fp8(*block, "block", BF16)),
        "mm_fp8 tensor": (lambda: ksb.gemm.mm_fp8(*tensor, out_dtype=BF16, backend="cutlass"),
                          lambda: ref.mm_fp8(*tensor, "tensor", BF16)),
        "grouped_mm": (lambda: ksb.gemm.grouped_mm(*grouped, backend="cutlass"), lambda: ref.grouped_mm(*grouped)),
    }
    for run, _ in calls.values():
        run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = {name: run() for name, (run, _) in calls.items()}
    for seed in (1, 2):
        g = torch.Generator(device=device).manual_seed(seed)
        mm_args[0].copy_(torch.randn(mm_args[0].shape, generator=g, device=device))
        qa, sa = quantize_fp8(torch.randn(block[0].shape, generator=g, device=device), 1, 128)
        block[0].copy_(qa)
        block[2].copy_(sa)
        tensor[0].copy_(torch.randn(tensor[0].shape, generator=g, device=device).to(tensor[0].dtype))
        grouped[0].copy_(torch.randn(grouped[0].shape, generator=g, device=device))
        for out in outs.values():
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, (_, want) in calls.items():
            assert_close(outs[name], want(), atol=2e-2, rtol=2e-2, what=f"{name}, replay {seed}")


def test_a_new_process_loads_the_warm_disk_cache_without_nvcc(device: torch.device, monkeypatch) -> None:
    a, b = _mm_args(4096, 4096, 4096, "RR", BF16, device)
    ksb.gemm.mm(a, b, backend="cutlass")  # compiled (or cached) and loaded
    build._loaded.clear()  # forget the loaded library, as a new process would: the next call reloads it from disk

    def no_nvcc(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"nvcc ran although the disk cache holds the kernel: {args[0] if args else kwargs}")

    monkeypatch.setattr(build.subprocess, "run", no_nvcc)
    assert_close(ksb.gemm.mm(a, b, backend="cutlass"), ref.mm(a, b), atol=2e-2, rtol=2e-2, what="reloaded")


def test_explain_ranks_an_uncompiled_kernel_after_compiled_ones(device: torch.device, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("KSB_CUTLASS_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "_loaded", {})  # as in a fresh process
    build.forget()
    ksb.clear_cache()
    try:
        a, b = _mm_args(256, 256, 256, "RR", BF16, device)
        sel = ksb.explain("gemm.mm", a, b)
        cand = next(c for c in sel.candidates if c.kernel.id == "cutlass:mm")
        assert cand.eligible and cand.needs_build
        assert "not compiled yet" in str(sel)
        assert sel.kernel.id != "cutlass:mm" or all(c.needs_build for c in sel.candidates if c.eligible)
    finally:
        build.forget()
        ksb.clear_cache()
