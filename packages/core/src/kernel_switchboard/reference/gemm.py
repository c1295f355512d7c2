"""Reference gemm kernels (see :mod:`kernel_switchboard.ops.gemm` for signatures).

float32 operands and accumulation (fp8 is dequantised to float32 first). ``mm`` and ``mm_fp8`` do no host
synchronisation (capturable); ``grouped_mm`` reads the offsets on the host.
"""

from __future__ import annotations

import torch

from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY, REFERENCE
from ._rows import rowwise

BLOCK = 128


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 product without TF32, whatever the global matmul precision setting."""
    if a.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return torch.mm(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return torch.mm(a, b)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _mm32(a.float(), b.float()).to(a.dtype)


def dequantize_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   scale_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``a * scale_a`` (M, K) and ``b * scale_b`` (K, N) for any scale mode."""
    k, n = a.shape[1], b.shape[1]
    if scale_mode == "block":
        scale_a = scale_a.repeat_interleave(BLOCK, dim=1)[:, :k]
        scale_b = scale_b.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:k, :n]
    return a.float() * scale_a, b.float() * scale_b


def mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, scale_mode: str,
           out_dtype: torch.dtype) -> torch.Tensor:
    da, db = dequantize_fp8(a, b, scale_a, scale_b, scale_mode)
    return _mm32(da, db).to(out_dtype)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    c = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype, device=a.device)
    bounds = offsets.tolist()
    for g in range(b.shape[0]):
        lo, hi = bounds[g], bounds[g + 1]
        if hi > lo:
            c[lo:hi] = _mm32(a[lo:hi].float(), b[g].float()).to(a.dtype)
    return c


KERNELS = [
    Kernel("gemm.mm", "mm", "reference", INVARIANT_CAPTURABLE, rowwise(mm, rows=(0,)), priority=PRIORITY),
    # scale_a: a row's scales ("row_col", "block") come with it; a 0-d per-tensor scale is shared
    Kernel("gemm.mm_fp8", "mm_fp8", "reference", INVARIANT_CAPTURABLE, rowwise(mm_fp8, rows=(0, 2)), priority=PRIORITY),
    # a row's group follows from its position: no batch-invariant form
    Kernel("gemm.grouped_mm", "grouped_mm", "reference", REFERENCE, grouped_mm, priority=PRIORITY),
]
