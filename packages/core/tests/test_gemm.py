"""Gemm reference kernels against float64 formulations, and the gemm public API."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.gemm import quantize_fp8

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("gemm.mm", "gemm.mm_fp8", "gemm.grouped_mm"))

FP8 = torch.float8_e4m3fn
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


# -- mm --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["RR", "CR", "RC", "CC", "strided"])
def test_mm_matches_float64(dtype: torch.dtype, layout: str) -> None:
    m, n, k = 19, 45, 37
    a = torch.randn(k, m).t() if layout[0] == "C" else torch.randn(m, k)
    b = torch.randn(n, k).t() if layout[1] == "C" else torch.randn(k, n)
    if layout == "strided":
        a, b = torch.randn(2 * m, k + 3)[::2, :k], torch.randn(k, 3 * n)[:, ::3]
    a, b = a.to(dtype), b.to(dtype)
    want = a.double() @ b.double()
    got = ksb.gemm.mm(a, b)
    assert got.shape == (m, n) and got.dtype == dtype and got.is_contiguous()
    # operands are exact in float64: only float32 accumulation and the final rounding differ
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


def test_mm_empty_inner_dim_is_zero() -> None:
    got = ksb.gemm.mm(torch.randn(3, 0), torch.randn(0, 4))
    assert torch.equal(got, torch.zeros(3, 4))


def test_mm_bad_inputs_name_the_argument() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 5)
    for pattern, call in [
        (r"b\.shape", lambda: ksb.gemm.mm(a, torch.randn(7, 5))),
        (r"b\.dtype", lambda: ksb.gemm.mm(a, b.half())),
        (r"a\.dtype", lambda: ksb.gemm.mm(a.double(), b.double())),
        (r"a\.shape", lambda: ksb.gemm.mm(a[None], b)),
        (r"b\.shape", lambda: ksb.gemm.mm(a, b[None])),
        (r"\bb\b", lambda: ksb.gemm.mm(a, 3.0)),  # type: ignore[arg-type]
    ]:
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()


def test_mm_problem_layout_and_alignment() -> None:
    a = torch.randn(64, 32, dtype=torch.bfloat16)
    b = torch.randn(48, 32, dtype=torch.bfloat16).t()
    p = ksb.explain("gemm.mm", a, b).problem
    assert (p.layout, p.align_bytes, p.m, p.n, p.k, p.dtype) == ("RC", 16, 64, 64, 32, torch.bfloat16)
    p = ksb.explain("gemm.mm", torch.randn(5, 3, dtype=torch.bfloat16), torch.randn(3, 7, dtype=torch.bfloat16)).problem
    assert p.layout == "RR" and p.align_bytes == 2


# -- mm_fp8 ----------------------------------------------------------------------------------------------
def _dequantized_float64(q: torch.Tensor, scale: torch.Tensor, rows_per: int, cols_per: int) -> torch.Tensor:
    """q * scale in float64 with one scale per (rows_per x cols_per) tile, tile by tile."""
    out = q.double().clone()
    for i in range(0, q.shape[0], rows_per):
        for j in range(0, q.shape[1], cols_per):
            out[i : i + rows_per, j : j + cols_per] *= float(scale[i // rows_per, j // cols_per])
    return out


MODES = {"tensor": lambda m, n, k: ((m, k), (k, n)), "row_col": lambda m, n, k: ((1, k), (k, 1)),
         "block": lambda m, n, k: ((1, 128), (128, 128))}


@pytest.mark.parametrize("mode", ["tensor", "row_col", "block"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_mm_fp8_matches_dequantize_then_float64_matmul(mode: str, out_dtype: torch.dtype) -> None:
    m, n, k = 20, 200, 300
    x, w = torch.randn(m, k), torch.randn(k, n) * 0.05
    ga, gb = MODES[mode](m, n, k)
    qa, sa = quantize_fp8(x, *ga)
    qb, sb = quantize_fp8(w.t().contiguous().t(), *gb)
    assert qa.dtype == FP8 and qb.stride(0) == 1  # b stays column-major
    want = _dequantized_float64(qa, sa, *ga) @ _dequantized_float64(qb, sb, *gb)
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(1)  # 0-d and 1-element both mean per-tensor
    got = ksb.gemm.mm_fp8(qa, qb, sa, sb, out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == (m, n)
    tol = 1e-5 if out_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # and the quantisation is faithful: close to the unquantised product
    assert _rel_err(got, x.double() @ w.double()) < 0.1


def test_mm_fp8_scale_mode_from_shapes() -> None:
    m, n, k = 8, 300, 260
    qa, qb = torch.randn(m, k).to(FP8), torch.randn(k, n).to(FP8)
    one = torch.ones(())
    modes = {
        "tensor": (one, torch.ones(1, 1)),
        "row_col": (torch.ones(m, 1), torch.ones(1, n)),
        "block": (torch.ones(m, 3), torch.ones(3, 3)),
    }
    for mode, (sa, sb) in modes.items():
        assert ksb.explain("gemm.mm_fp8", qa, qb, sa, sb).problem.scale_mode == mode


def test_mm_fp8_bad_inputs_name_the_argument() -> None:
    m, n, k = 8, 300, 260
    qa, qb = torch.randn(m, k).to(FP8), torch.randn(k, n).to(FP8)
    one = torch.ones(())
    for pattern, call in [
        (r"scale_b\.shape", lambda: ksb.gemm.mm_fp8(qa, qb, torch.ones(m, 1), torch.ones(1, 3))),
        (r"scale_b\.shape", lambda: ksb.gemm.mm_fp8(qa, qb, torch.ones(m, 3), torch.ones(3, n))),
        (r"scale_b\.shape", lambda: ksb.gemm.mm_fp8(qa, qb, one, torch.ones(1, n))),
        (r"scale_a\.shape", lambda: ksb.gemm.mm_fp8(qa, qb, torch.ones(m, 2), torch.ones(3, 3))),
        (r"scale_a\.dtype", lambda: ksb.gemm.mm_fp8(qa, qb, one.half(), one)),
        (r"a\.dtype", lambda: ksb.gemm.mm_fp8(qa.float(), qb.float(), one, one)),
        (r"b\.dtype", lambda: ksb.gemm.mm_fp8(qa, qb.to(torch.float8_e5m2), one, one)),
        (r"out_dtype", lambda: ksb.gemm.mm_fp8(qa, qb, one, one, out_dtype=torch.int32)),
        (r"b\.shape", lambda: ksb.gemm.mm_fp8(qa, qb[:-1], one, one)),
    ]:
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()


# -- grouped_mm ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grouped_mm_matches_per_group_loop(dtype: torch.dtype) -> None:
    sizes = [5, 0, 11, 1, 0, 7]
    t, k, n = sum(sizes), 24, 40
    a = torch.randn(t, k).to(dtype)
    b = torch.randn(len(sizes), n, k).transpose(1, 2).to(dtype)  # column-major slices
    offsets = torch.tensor([0, *sizes]).cumsum(0).to(torch.int32)
    got = ksb.gemm.grouped_mm(a, b, offsets)
    want = torch.empty(t, n, dtype=torch.float64)
    row = 0
    for g, size in enumerate(sizes):
        want[row : row + size] = a[row : row + size].double() @ b[g].double()
        row += size
    assert got.shape == (t, n) and got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 10)


def test_grouped_mm_bad_inputs_name_the_argument() -> None:
    a, b = torch.randn(10, 8), torch.randn(3, 8, 4)
    good = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    for pattern, call in [
        (r"offsets\.dtype", lambda: ksb.gemm.grouped_mm(a, b, good.long())),
        (r"offsets\.shape", lambda: ksb.gemm.grouped_mm(a, b, good[:3])),
        (r"offsets=", lambda: ksb.gemm.grouped_mm(a, b, torch.tensor([0, 5, 4, 10], dtype=torch.int32))),
        (r"offsets=", lambda: ksb.gemm.grouped_mm(a, b, torch.tensor([0, 4, 4, 9], dtype=torch.int32))),
        (r"offsets=", lambda: ksb.gemm.grouped_mm(a, b, torch.tensor([1, 4, 4, 10], dtype=torch.int32))),
        (r"b\.shape", lambda: ksb.gemm.grouped_mm(a, torch.randn(3, 7, 4), good)),
        (r"b\.shape", lambda: ksb.gemm.grouped_mm(a, torch.randn(8, 4), good)),
        (r"b\.dtype", lambda: ksb.gemm.grouped_mm(a, b.half(), good)),
    ]:
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()


def test_grouped_mm_problem_and_capture_skips_offset_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard.ops import gemm

    a, b = torch.randn(10, 8), torch.randn(5, 8, 4)
    offsets = torch.tensor([0, 2, 4, 6, 8, 10], dtype=torch.int32)
    assert ksb.explain("gemm.grouped_mm", a, b, offsets).problem.groups == 8
    monkeypatch.setattr(gemm, "graph_features", lambda dev: frozenset({"cuda_graph"}))
    monkeypatch.setattr(gemm, "_check_offsets", lambda *_: pytest.fail("offsets read on the host during capture"))
    with pytest.raises(ksb.NoEligibleKernelError, match=r"cuda_graph"):  # the reference syncs: not capturable
        ksb.gemm.grouped_mm(a, b, offsets)


# -- torch.compile and custom ops ------------------------------------------------------------------------
def test_torch_compile_fullgraph_traces_gemm_ops() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    qa, qb = a.to(FP8), b.to(FP8)
    sa, sb = torch.rand(8, 1) + 0.5, torch.rand(1, 12) + 0.5
    bg = torch.randn(2, 16, 12)
    offsets = torch.tensor([0, 3, 8], dtype=torch.int32)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = ksb.gemm.mm(a, b) + ksb.gemm.mm_fp8(qa, qb, sa, sb, out_dtype=torch.float32)
        return c + ksb.gemm.grouped_mm(a, bg, offsets)

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(a, b), f(a, b))


def test_opcheck_gemm_ops() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    torch.library.opcheck(torch.ops.ksb.mm.default, (a, b, None))
    # test_schema compares inputs before/after with arithmetic that torch's CPU fp8 lacks: the other three checks
    torch.library.opcheck(torch.ops.ksb.mm_fp8.default,
                          (a.to(FP8), b.to(FP8), torch.ones(8, 1), torch.ones(1, 12), torch.bfloat16, None),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.ksb.grouped_mm.default,
                          (a, torch.randn(3, 16, 12), torch.tensor([0, 2, 2, 8], dtype=torch.int32), None))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_mm_and_mm_fp8_capture_in_cuda_graph() -> None:
    dev = torch.device("cuda")
    a, b = torch.randn(256, 512, device=dev), torch.randn(512, 384, device=dev)
    qa, sa = quantize_fp8(a, 1, 128)
    qb, sb = quantize_fp8(b, 128, 128)
    want = ksb.gemm.mm(a.bfloat16(), b.bfloat16(), backend="reference")
    want8 = ksb.gemm.mm_fp8(qa, qb, sa, sb, backend="reference")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    ab, bb = a.bfloat16(), b.bfloat16()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        got = ksb.gemm.mm(ab, bb, backend="reference")
        got8 = ksb.gemm.mm_fp8(qa, qb, sa, sb, backend="reference")
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got8, want8)
