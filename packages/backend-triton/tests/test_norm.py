"""Triton norm kernels against the reference: conformance cases, wide rows, strides, GPU sizes."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, conformance_test, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test("triton", ops=("norm.rms_norm", "norm.fused_add_rms_norm", "norm.layer_norm"))


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def _check_all(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    atol, rtol = tolerance(x.dtype)
    for gemma in (False, True):
        want = ksb.norm.rms_norm(x, w, 1e-6, gemma=gemma, backend="reference")
        assert_close(ksb.norm.rms_norm(x, w, 1e-6, gemma=gemma, backend="triton"), want, atol=atol, rtol=rtol)
    assert_close(ksb.norm.layer_norm(x, w, b, 1e-5, backend="triton"),
                 ksb.norm.layer_norm(x, w, b, 1e-5, backend="reference"), atol=atol, rtol=rtol)
    r = _randn(*x.shape, dtype=x.dtype, seed=7)
    xt, rt, xr, rr = x.clone(), r.clone(), x.clone(), r.clone()
    ksb.norm.fused_add_rms_norm(xt, rt, w, 1e-6, backend="triton")
    ksb.norm.fused_add_rms_norm(xr, rr, w, 1e-6, backend="reference")
    assert_close(rt, rr, atol=atol, rtol=rtol)
    assert_close(xt, xr, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_rows_take_the_looped_kernel(dtype: torch.dtype) -> None:
    # 20000 > MAX_BLOCK (16384) and not a multiple of the 4096 chunk
    x, w, b = _randn(2, 20000, dtype=dtype), _randn(20000, seed=1).abs() + 0.5, _randn(20000, seed=2)
    _check_all(x, w.to(dtype), b.to(dtype))


def test_narrow_rows_packed_with_a_ragged_last_program() -> None:
    # hidden 48 packs 16 rows per program; 37 rows leave a partial last program
    x = _randn(37, 48, dtype=torch.float16)
    _check_all(x, _randn(48, dtype=torch.float16, seed=1), None)


def test_row_stride_and_float32_weight_with_bf16_input() -> None:
    base = _randn(6, 160, dtype=torch.bfloat16)
    x = base[:, :100]  # row stride 160, unit stride in the last dim
    w = _randn(100, seed=3).abs() + 0.5  # float32 weight, bf16 activations
    atol, rtol = tolerance(torch.bfloat16)
    assert_close(ksb.norm.rms_norm(x, w, backend="triton"), ksb.norm.rms_norm(x, w, backend="reference"),
                 atol=atol, rtol=rtol)
    assert_close(ksb.norm.layer_norm(x, w, backend="triton"), ksb.norm.layer_norm(x, w, backend="reference"),
                 atol=atol, rtol=rtol)


def test_three_d_input_and_empty_batch() -> None:
    x, w = _randn(2, 3, 64), _randn(64, seed=1)
    y = ksb.norm.rms_norm(x, w, backend="triton")
    assert y.shape == x.shape
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (64,), w, 1e-6), rtol=1e-5, atol=1e-5)
    empty = _randn(0, 64)
    assert ksb.norm.rms_norm(empty, w, backend="triton").shape == (0, 64)
    ksb.norm.fused_add_rms_norm(empty, empty.clone(), w, backend="triton")


def test_capability_declares_cpu_only_when_interpreting() -> None:
    kernel = ksb.explain("norm.rms_norm", _randn(2, 64), _randn(64), backend="triton").kernel
    assert kernel.id == "triton:rms_norm"
    assert ("cpu" in kernel.capability.devices) == triton_interpreting()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8192, 8192), (4096, 4096), (1000, 5120), (33, 128), (3, 40000)])
def test_gpu_real_sizes(shape: tuple[int, int], dtype: torch.dtype) -> None:
    x = _randn(*shape, dtype=dtype)
    _check_all(x, (_randn(shape[1], seed=1).abs() + 0.5).to(dtype), _randn(shape[1], seed=2).to(dtype))
