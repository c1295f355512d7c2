"""Triton gated activations: ``silu_and_mul``, ``gelu_and_mul`` (erf), ``gelu_tanh_and_mul`` and
``swiglu_oai_and_mul`` (gpt-oss's clamped SwiGLU over interleaved gate/up pairs).

x (N, 2d) with unit stride in the last dim -> y (N, d) = act(x[:, :d]) * x[:, d:] (the clamped SwiGLU: gate
x[:, 0::2], up x[:, 1::2]), computed in float32, stored in x's dtype. Grid: (rows, column blocks); each program
moves ``BLOCK`` contiguous output elements (2 * ``BLOCK`` contiguous inputs for the interleaved pairs).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

SILU, GELU, GELU_TANH = 0, 1, 2
#: grid dim 1 (column blocks) is limited to 65535 programs
_MAX_COL_BLOCKS = 65535


@triton.jit
def _act_and_mul_kernel(
    x_ptr,  # (N, 2d) input: gate half then up half, unit stride in the last dim
    y_ptr,  # (N, d) output, contiguous
    d,  # width of one half
    stride_x,  # row stride of x, elements
    ACT: tl.constexpr,  # 0 silu, 1 gelu (erf), 2 gelu (tanh approximation)
    BLOCK: tl.constexpr,  # columns per program
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < d
    x_row = x_ptr + row * stride_x
    gate = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + c, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        act = gate / (1.0 + tl.exp(-gate))
    elif ACT == 1:
        act = 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476))
    else:
        u = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0))  # tanh(u) = 2 sigmoid(2u) - 1
    tl.store(y_ptr + row * d + c, (act * up).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_oai_kernel(
    x_ptr,  # (N, 2d) input: interleaved (gate, up) pairs, unit stride in the last dim
    y_ptr,  # (N, d) output, contiguous
    d,  # pairs per row
    stride_x,  # row stride of x, elements
    alpha,  # gate scale inside the sigmoid
    limit,  # clamp: gate <= limit, -limit <= up <= limit
    BLOCK: tl.constexpr,  # output columns per program
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < d
    x_row = x_ptr + row * stride_x
    gate = tl.load(x_row + 2 * c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + 2 * c + 1, mask=mask, other=0.0).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    act = gate / (1.0 + tl.exp(-alpha * gate))
    tl.store(y_ptr + row * d + c, (act * (up + 1.0)).to(y_ptr.dtype.element_ty), mask=mask)


def _block(d: int) -> tuple[int, int]:
    block = min(triton.next_power_of_2(max(d, 1)), 2048)
    while triton.cdiv(d, block) > _MAX_COL_BLOCKS:
        block *= 2
    return block, 4 if block <= 1024 else 8


def _launch(kernel: Any, x: torch.Tensor, *scalars: float, **meta: Any) -> torch.Tensor:
    """y (N, D) from x (N, 2D) through ``kernel`` (one program per row and column block), ``scalars`` after the
    strides; an empty x launches nothing."""
    n, two_d = x.shape
    d = two_d // 2
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    if n == 0 or d == 0:
        return y
    block, warps = _block(d)
    kernel[(n, triton.cdiv(d, block))](x, y, d, x.stride(0), *scalars, BLOCK=block, num_warps=warps, **meta)
    return y


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _launch(_act_and_mul_kernel, x, ACT=SILU)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _launch(_act_and_mul_kernel, x, ACT=GELU)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _launch(_act_and_mul_kernel, x, ACT=GELU_TANH)


def swiglu_oai_and_mul(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    return _launch(_swiglu_oai_kernel, x, alpha, limit)
