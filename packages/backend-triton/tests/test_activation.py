"""Triton gated activations against torch formulations (and the conformance cases once the core has them)."""

from __future__ import annotations

import pytest
import torch

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, conformance_test, tolerance
from kernel_switchboard_triton import activation

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test(
    "triton", ops=("activation.silu_and_mul", "activation.gelu_and_mul", "activation.gelu_tanh_and_mul",
                   "activation.swiglu_oai_and_mul"))

TORCH_ACT = {
    "silu_and_mul": torch.nn.functional.silu,
    "gelu_and_mul": lambda g: torch.nn.functional.gelu(g, approximate="none"),
    "gelu_tanh_and_mul": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
}


def _want(x: torch.Tensor, name: str) -> torch.Tensor:
    d = x.shape[-1] // 2
    x64 = x.double()
    return (TORCH_ACT[name](x64[:, :d]) * x64[:, d:]).to(x.dtype)


@pytest.mark.parametrize("name", sorted(TORCH_ACT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2 * 40), (2, 2 * 2500)])
def test_matches_torch(name: str, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(*shape, generator=g)).to(DEVICE, dtype)
    y = getattr(activation, name)(x)
    assert y.shape == (shape[0], shape[1] // 2) and y.dtype == dtype
    assert_close(y, _want(x, name), *(), atol=tolerance(dtype)[0], rtol=tolerance(dtype)[1])


def test_row_stride_and_extreme_values() -> None:
    base = torch.tensor([[-100.0, -20.0, 0.0, 20.0, 100.0, 1e-3, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0, 0]] * 3, device=DEVICE)
    x = base[:, :12]  # row stride 14, unit inner stride
    for name in TORCH_ACT:
        y = getattr(activation, name)(x)
        assert torch.isfinite(y).all(), name
        assert_close(y, _want(x.contiguous(), name), atol=1e-5, rtol=1e-5)


def _swiglu_oai(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU as its reference model writes it, in float64."""
    gate, up = x.double()[..., ::2], x.double()[..., 1::2]
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + 1)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("alpha", "limit"), [(1.702, 7.0), (0.5, 2.0)])
def test_swiglu_oai_matches_the_gpt_oss_formula(dtype: torch.dtype, alpha: float, limit: float) -> None:
    g = torch.Generator().manual_seed(2)
    x = (5 * torch.randn(5, 2 * 300, generator=g)).to(DEVICE, dtype)
    assert bool(((x[:, 0::2] > limit) | (x[:, 1::2].abs() > limit)).any())  # the clamps are exercised
    want = _swiglu_oai(x, alpha, limit)
    assert_close(activation.swiglu_oai_and_mul(x, alpha, limit), want, atol=tolerance(dtype)[0],
                 rtol=tolerance(dtype)[1])
    strided = torch.cat((x, x[:, :8]), dim=1)[:, : x.shape[1]]  # row stride 608, unit inner stride
    assert_close(activation.swiglu_oai_and_mul(strided, alpha, limit), want, atol=tolerance(dtype)[0],
                 rtol=tolerance(dtype)[1])


def test_empty_batch() -> None:
    assert activation.silu_and_mul(torch.empty(0, 8, device=DEVICE)).shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(TORCH_ACT))
@pytest.mark.parametrize("shape", [(8192, 2 * 14336), (1, 2 * 11008), (257, 2 * 4096)])
def test_gpu_real_sizes(name: str, shape: tuple[int, int]) -> None:
    x = torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16)
    assert_close(getattr(activation, name)(x), _want(x, name), atol=2e-2, rtol=2e-2)
