"""Triton GEMMs against the reference: conformance cases, strides, ragged edges, fp8 scale modes, groups."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, conformance_test, tolerance
from kernel_switchboard.testing.cases.gemm import quantize_fp8
from kernel_switchboard_triton import gemm
from kernel_switchboard_triton._common import row_major_for_tma

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test("triton", ops=("gemm.mm", "gemm.mm_fp8", "gemm.grouped_mm"))


def _randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(DEVICE)


def _check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = tolerance(dtype)
    assert_close(got, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mm_strided_views_and_ragged_edges(dtype: torch.dtype) -> None:
    # a: every other column of a wider matrix; b: a transposed view; sizes off the tile grid
    base = _randn(70, 2 * 45, seed=1).to(dtype)
    a = base[:, ::2]
    b = _randn(33, 45, seed=2, scale=45**-0.5).to(dtype).t()
    got = ksb.gemm.mm(a, b, backend="triton")
    assert got.is_contiguous() and got.dtype == dtype
    _check(got, ksb.gemm.mm(a, b, backend="reference"), dtype)
    torch.testing.assert_close(got.float(), (a.double() @ b.double()).float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b_kmajor", [True, False])
def test_mm_tma_path_off_the_tile_grid(dtype: torch.dtype, b_kmajor: bool) -> None:
    # 16-byte aligned rows: the persistent TMA kernel, whose edge tiles are zero-filled loads and clipped stores
    m, n, k = 100, 72, 56
    a = _randn(m, k, seed=3).to(dtype)
    b = _randn(n, k, seed=4, scale=k**-0.5).to(dtype).t() if b_kmajor else _randn(k, n, seed=4, scale=k**-0.5).to(dtype)
    assert gemm._b_layout(b) is b_kmajor and row_major_for_tma(a) and m >= gemm.TMA_MIN_M
    got = ksb.gemm.mm(a, b, backend="triton")
    _check(got, ksb.gemm.mm(a, b, backend="reference"), dtype)


def test_mm_empty_and_k_zero() -> None:
    a, b = _randn(0, 8).half(), _randn(8, 5).half()
    assert ksb.gemm.mm(a, b, backend="triton").shape == (0, 5)
    z = ksb.gemm.mm(_randn(4, 0).half(), _randn(0, 6).half(), backend="triton")
    assert z.shape == (4, 6) and not z.any()


@pytest.mark.parametrize("mode", ["tensor", "row_col", "block"])
@pytest.mark.parametrize(("m", "n", "k"), [(33, 200, 300), (5, 130, 129)])
def test_fp8_scale_modes_off_the_128_grid(mode: str, m: int, n: int, k: int) -> None:
    groups = {"tensor": ((m, k), (k, n)), "row_col": ((1, k), (k, 1)), "block": ((1, 128), (128, 128))}[mode]
    qa, sa = quantize_fp8(_randn(m, k, seed=3), *groups[0])
    qb, sb = quantize_fp8(_randn(k, n, seed=4, scale=k**-0.5), *groups[1])
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(())
    for out in (torch.bfloat16, torch.float32):
        got = ksb.gemm.mm_fp8(qa, qb, sa, sb, out_dtype=out, backend="triton")
        want = ksb.gemm.mm_fp8(qa, qb, sa, sb, out_dtype=out, backend="reference")
        _check(got, want, torch.float8_e4m3fn if out == torch.float32 else out)


@pytest.mark.parametrize("mode", ["tensor", "row_col", "block"])
def test_fp8_column_major_b_as_from_a_transposed_weight(mode: str) -> None:
    # b = w.t() with 16-byte aligned rows of w: the persistent TMA kernel, N and K off the 128 grid
    m, n, k = 40, 208, 272
    groups = {"tensor": ((m, k), (n, k)), "row_col": ((1, k), (1, k)), "block": ((1, 128), (128, 128))}[mode]
    qa, sa = quantize_fp8(_randn(m, k, seed=5), *groups[0])
    qw, sw = quantize_fp8(_randn(n, k, seed=6, scale=k**-0.5), *groups[1])  # (N, K) weight, used as b = w.t()
    if mode == "tensor":
        sa, sw = sa.reshape(()), sw.reshape(())
    assert gemm._b_layout(qw.t()) is True and m >= gemm.TMA_MIN_M
    got = ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), backend="triton")
    _check(got, ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), backend="reference"), torch.bfloat16)


@pytest.mark.parametrize("sizes", [(0, 0, 40, 0, 3), (1, 1, 1, 1, 1, 1, 1), (70,)])
def test_grouped_mm_empty_groups_and_tiny_groups(sizes: tuple[int, ...]) -> None:
    t, k, n = sum(sizes), 24, 40
    a = _randn(t, k, seed=7).half()
    b = _randn(len(sizes), n, k, seed=8, scale=k**-0.5).half().transpose(1, 2)  # (G, K, N) column-major slices
    offsets = torch.tensor([0, *sizes]).cumsum(0).to(torch.int32).to(DEVICE)
    got = ksb.gemm.grouped_mm(a, b, offsets, backend="triton")
    _check(got, ksb.gemm.grouped_mm(a, b, offsets, backend="reference"), torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (1, 4096, 4096), (77, 11008, 4096), (4096, 1000, 333)])
def test_gpu_mm_real_sizes(shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    a, b = _randn(m, k, seed=1).bfloat16(), _randn(k, n, seed=2, scale=k**-0.5).bfloat16()
    got = ksb.gemm.mm(a, b, backend="triton")
    want = (a.float() @ b.float())
    rel = ((got.float() - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tensor", "row_col", "block"])
def test_gpu_fp8_real_sizes(mode: str) -> None:
    m = n = k = 4096
    groups = {"tensor": ((m, k), (k, n)), "row_col": ((1, k), (k, 1)), "block": ((1, 128), (128, 128))}[mode]
    qa, sa = quantize_fp8(_randn(m, k, seed=3), *groups[0])
    w = _randn(n, k, seed=4, scale=k**-0.5)
    qw, sw = quantize_fp8(w, *groups[1][::-1])
    qb, sb = qw.t(), sw.t()
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(())
    got = ksb.gemm.mm_fp8(qa, qb, sa, sb, backend="triton").float()
    want = ksb.gemm.mm_fp8(qa, qb, sa, sb, out_dtype=torch.float32, backend="reference")
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel


def test_gluon_fp8_block_kernel_compiles_for_hopper() -> None:
    # the Gluon kernel (sm_90's block-scaled default) runs only on a GPU; here it is compiled for sm_90 (ptxas) so an API
    # change of Triton's Gluon shows in CI
    pytest.importorskip("triton.experimental.gluon")
    from gluon_compile import compile_for_hopper

    sig = {"a_desc": "", "b_desc": "", "c_desc": "", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "stride_sam": "i32", "stride_sak": "i32", "stride_sbk": "i32", "stride_sbn": "i32"}
    kernel = compile_for_hopper("kernel_switchboard_triton._gemm_gluon", "mm_fp8_block_kernel", sig,
                                {"a_desc": ("float8e4nv", [128, 128]), "b_desc": ("float8e4nv", [128, 128]),
                                 "c_desc": ("bfloat16", [64, 128])}, {"GROUP_M": 8, "STAGES": 4, "num_warps": 4}, 4,
                                maxnreg=168)
    ptx = kernel["ptx"]
    assert "setmaxnreg.dec.sync.aligned.u32 \t40" in ptx  # the loader / storer warps give registers back
    assert ptx.count("wgmma.mma_async") == 8  # two consumer warpgroups, four m64n128k32 MMAs per K step each
    assert kernel["spill_stores"] == 0, kernel | {"ptx": "..."}
    assert kernel["shared"] <= 227 * 1024
    # each K step's three scale loads (two rows of scale_a, scale_b) are issued after its MMAs, before their wait:
    # loaded first, they held back the MMAs' issue by a global load every step
    issued_to_wait = [chunk.split("wgmma.wait_group")[0] for chunk in ptx.split("wgmma.commit_group")[1:]]
    assert sum(part.count("ld.global") for part in issued_to_wait) == 6


def test_gluon_fp8_block_descriptors_match_the_kernel_tiles() -> None:
    # the host half of the launch (descriptors take plain ints, not the kernel's constexpr globals) runs on a CPU
    pytest.importorskip("triton.experimental.gluon")
    from kernel_switchboard_triton import _gemm_gluon

    a = torch.zeros(130, 256, dtype=torch.float8_e4m3fn)
    b = torch.zeros(384, 256, dtype=torch.float8_e4m3fn).t()
    c = torch.empty(130, 384, dtype=torch.bfloat16)
    shapes = [list(d.block_shape) for d in _gemm_gluon._descriptors(a, b, c)]
    assert shapes == [[128, 128], [128, 128], [64, 128]]


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k", "stages", "out"), [
    (4000, 4000, 2064, 4, torch.bfloat16), (256, 384, 1024, 3, torch.float16), (130, 128, 128, 4, torch.float32),
    (1000, 3000, 7168, 5, torch.bfloat16), (65, 256, 512, 4, torch.bfloat16)], ids=str)
def test_gpu_fp8_block_gluon(m: int, n: int, k: int, stages: int, out: torch.dtype) -> None:
    # edge tiles in M and N, a partial last K step, one K step, fewer tiles than SMs and several tiles per program
    # (the ring and the store buffers carry on across tiles); every output dtype; the smallest M mm_fp8 routes here
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon fp8 kernel uses Hopper's wgmma (sm_90 only)")
    from kernel_switchboard_triton import _gemm_gluon

    qa, sa = quantize_fp8(_randn(m, k, seed=3), 1, 128)
    qw, sw = quantize_fp8(_randn(n, k, seed=4, scale=k**-0.5), 128, 128)
    c = _gemm_gluon.mm_fp8_block(qa, qw.t(), sa, sw.t(), torch.empty(m, n, dtype=out, device="cuda"), stages=stages)
    want = ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), out_dtype=torch.float32, backend="reference")
    rel = ((c.float() - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel
    if stages == 4:  # the default: mm_fp8 routes TMA-ready block-scaled operands on sm_90 to this kernel
        routed = ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), out_dtype=out, backend="triton")
        assert torch.equal(routed, c)


@pytest.mark.gpu
def test_gpu_gemms_capture_in_cuda_graph() -> None:
    """Each Triton GEMM (the Gluon kernel for fp8 block scales on sm_90) captured once and replayed on inputs
    rewritten in place."""
    m, n, k = 512, 384, 1024
    a, w = _randn(m, k, seed=1), _randn(n, k, seed=2, scale=k**-0.5)
    qa, sa = quantize_fp8(a, 1, 128)
    qw, sw = quantize_fp8(w, 128, 128)
    ab, bb = a.bfloat16(), w.bfloat16().t()
    offsets = torch.tensor([0, 100, 100, m], dtype=torch.int32, device=DEVICE)
    bg = _randn(3, k, n, seed=3, scale=k**-0.5).bfloat16()
    calls = {
        "mm": lambda backend: ksb.gemm.mm(ab, bb, backend=backend),
        "mm_fp8 block": lambda backend: ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), backend=backend),
        "grouped_mm": lambda backend: ksb.gemm.grouped_mm(ab, bg, offsets, backend=backend),
    }
    for call in calls.values():
        call("triton")  # warm-up compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = {name: call("triton") for name, call in calls.items()}
    for seed in (5, 6):
        fresh = _randn(m, k, seed=seed)
        ab.copy_(fresh.bfloat16())
        qa.copy_(quantize_fp8(fresh, 1, 128)[0])
        for out in outs.values():
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, call in calls.items():
            want = call("reference").float()
            rel = ((outs[name].float() - want).norm() / want.norm()).item()
            assert rel < 1e-2, (name, rel)


def test_gluon_block_fp8_cost_counts_the_sms_its_tiles_leave_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """128 rows x 8192 columns make 64 output tiles for 132 SMs: the estimate of the Gluon block-fp8 kernel rises
    above that of twice the rows (128 tiles, nearly a full wave), as measured (H100: 68 us at 128 rows, where
    CUTLASS, which the roofline alone ranked below it, took 46 us)."""
    from kernel_switchboard.ops.gemm import GemmProblem
    from kernel_switchboard_triton.catalog import gemm as catalog

    monkeypatch.setattr(catalog, "_gluon_block_fp8", lambda problem: True)  # as on an sm_90 GPU
    kernel = next(k for k in catalog.kernels() if k.op == "gemm.mm_fp8")

    def problem(m: int) -> GemmProblem:
        return GemmProblem("cuda", (9, 0), torch.float8_e4m3fn, torch.bfloat16, m, 8192, 8192, "RC", 16, "block",
                           None, frozenset())

    assert catalog._grid_fill("mm_fp8", problem(128)) == pytest.approx(64 / 132)
    assert catalog._grid_fill("mm_fp8", problem(8192)) == 1.0
    assert kernel.cost(problem(128)) > kernel.cost(problem(256))


@pytest.mark.parametrize("mode", ["tensor", "block"])
def test_small_m_fp8_cost_counts_the_sms_its_tiles_leave_idle(mode: str) -> None:
    """Below 65 rows every fp8 call takes the pointer kernel, one program per 64x128 output tile: 64 rows x 8192
    columns make 64 programs for 132 SMs (16 rows as many: one tile row), so its estimate is the roofline's over
    64/132; 32768 columns fill the SMs."""
    from kernel_switchboard.ops.gemm import GemmProblem
    from kernel_switchboard_triton.catalog import gemm as catalog

    def problem(m: int, n: int = 8192, device: str = "cuda") -> GemmProblem:
        return GemmProblem(device, (9, 0), torch.float8_e4m3fn, torch.bfloat16, m, n, 8192, "RC", 16, mode, None,
                           frozenset())

    assert catalog._grid_fill("mm_fp8", problem(64)) == pytest.approx(64 / 132)
    assert catalog._grid_fill("mm_fp8", problem(16)) == pytest.approx(64 / 132)
    assert catalog._grid_fill("mm_fp8", problem(64, n=32768)) == 1.0
    assert catalog._grid_fill("mm_fp8", problem(64, device="cpu")) == 1.0


def test_per_tensor_fp8_cost_counts_the_sms_the_tma_kernels_tiles_leave_idle() -> None:
    """From 65 rows per-tensor fp8 calls with TMA-ready operands take the persistent TMA kernel: 256 rows x 8192
    columns make 64 tiles of 256x128 for 132 SMs, so its estimate is the roofline's over 64/132 (H100: 68 us there,
    where CUTLASS took 43); operands TMA cannot take run the pointer kernel's 128x128 tiles (128 of them)."""
    from kernel_switchboard.ops.gemm import GemmProblem
    from kernel_switchboard_triton.catalog import gemm as catalog

    def problem(m: int, layout: str = "RC", n: int = 8192) -> GemmProblem:
        return GemmProblem("cuda", (9, 0), torch.float8_e4m3fn, torch.bfloat16, m, n, 8192, layout, 16, "tensor",
                           None, frozenset())

    assert catalog._grid_fill("mm_fp8", problem(256)) == pytest.approx(64 / 132)
    assert catalog._grid_fill("mm_fp8", problem(128)) == pytest.approx(64 / 132)  # 128x128 tiles up to 128 rows
    assert catalog._grid_fill("mm_fp8", problem(256, "RR")) == pytest.approx(128 / 132)
    assert catalog._grid_fill("mm_fp8", problem(1024)) == 1.0
    assert catalog._grid_fill("mm_fp8", problem(256, n=2112)) == pytest.approx(2 * 17 / 132)  # 128x128: m*n < 1M
