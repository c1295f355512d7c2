"""Triton GEMM kernels: bf16/fp16 ``mm``, fp8 ``mm_fp8`` (per-tensor, row/column and DeepSeek 128x128
block scales, applied per K block inside the accumulation loop) and ``grouped_mm`` over row segments.

Signatures: :mod:`kernel_switchboard.ops.gemm`. Operands TMA can describe (unit stride along a row of a, of c and
of b or of b's transpose; 16-byte aligned rows; at least ``TMA_MIN_M`` rows) on Hopper or newer take persistent TMA
kernels, one program per SM; other strides take the pointer kernels. On sm_90 the 128x128 block-scaled fp8
matmul with such operands (b K-major) runs the warp-specialised Gluon kernel (``_gemm_gluon``, ``GLUON_FP8``).
Fixed tile configurations chosen by shape (no autotuning at run time); float32 accumulation; any operand
strides. float32 operands use exact float32 products (``input_precision="ieee"``, CUDA cores, no TF32), so they
rank below cuBLAS. ``grouped_mm`` launches ``ceil(T / BLOCK_M) + G`` row tiles, which bounds the tiles of any
split of T rows into G groups, so it needs no host sync; extra programs exit at once.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.invariance import active as invariant_scope

from . import _gemm_kernels as K
from ._common import gluon_hopper, has_tma, row_major_for_tma
from ._gemm_tiles import Tiles, fp8_tiles, mm_tiles

#: upcast dot operands to float32: the interpreter's bf16 (and fp8) dot is wrong or slow
UPCAST = triton_interpreting()


def _launch_grid(m: int, n: int, t: Tiles) -> tuple[int]:
    return (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)


# -- TMA path: persistent kernels over tensor descriptors (row-major or K-major operands) ---------------------
#: rows below which the pointer kernels' small-M tiles are used (decode-sized GEMMs are memory-bound)
TMA_MIN_M = 16 if triton_interpreting() else 65


@functools.lru_cache(maxsize=8)
def _programs(device_index: int | None) -> int:
    """Persistent programs: one per SM (four when interpreted)."""
    if triton_interpreting() or device_index is None:
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _b_layout(b: torch.Tensor) -> bool | None:
    """True when b (K, N) is K-major (its transpose is TMA-ready), False when b itself is, None otherwise."""
    if row_major_for_tma(b.t()):
        return True
    if row_major_for_tma(b):
        return False
    return None


def _tma_grid(m: int, n: int, t: Tiles, device: torch.device) -> tuple[int]:
    return (min(_programs(device.index if device.type == "cuda" else None),
                triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n)),)


def _descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, t: Tiles, b_kmajor: bool) -> tuple[Any, Any, Any]:
    b_desc = (TensorDescriptor.from_tensor(b.t(), [t.block_n, t.block_k]) if b_kmajor
              else TensorDescriptor.from_tensor(b, [t.block_k, t.block_n]))
    return (TensorDescriptor.from_tensor(a, [t.block_m, t.block_k]), b_desc,
            TensorDescriptor.from_tensor(c, [t.block_m, t.block_n]))


#: the row count whose tiles every matmul takes in the batch-invariant scope, with the pointer kernel: a row's K
#: steps (and the MMA shapes) must not change with the number of rows
INVARIANT_M = 4096


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    invariant = invariant_scope()
    t = mm_tiles(INVARIANT_M if invariant else m, n, k, a.dtype)
    b_kmajor = _b_layout(b)
    if not invariant and a.dtype != torch.float32 and m >= TMA_MIN_M and b_kmajor is not None and row_major_for_tma(a) \
            and row_major_for_tma(c) and has_tma(a.device):
        a_desc, b_desc, c_desc = _descriptors(a, b, c, t, b_kmajor)
        grid = _tma_grid(m, n, t, a.device)
        K._mm_tma_kernel[grid](a_desc, b_desc, c_desc, m, n, k, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                               BLOCK_K=t.block_k, GROUP_M=t.group_m, B_KMAJOR=b_kmajor, NUM_PROGRAMS=grid[0],
                               UPCAST=UPCAST, num_warps=t.num_warps, num_stages=t.num_stages)
        return c
    K._mm_kernel[_launch_grid(m, n, t)](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                                        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
                                        UPCAST=UPCAST, IEEE=a.dtype == torch.float32, num_warps=t.num_warps,
                                        num_stages=t.num_stages)
    return c


_MODES = {"tensor": 0, "row_col": 1, "block": 2}
#: block-scaled fp8 on sm_90 takes the warp-specialised Gluon kernel (faster than this module's TMA kernel on the
#: H200); the benchmark switches it off for comparison
GLUON_FP8 = True


def mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, scale_mode: str,
           out_dtype: torch.dtype) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    sa = scale_a.reshape(1, 1) if scale_mode == "tensor" else scale_a
    sb = scale_b.reshape(1, 1) if scale_mode == "tensor" else scale_b
    invariant = invariant_scope()  # fixed tiles, the pointer kernel (see INVARIANT_M)
    tma = not invariant and m >= TMA_MIN_M and _b_layout(b) is True and row_major_for_tma(a) and row_major_for_tma(c) \
        and has_tma(a.device)
    if tma and scale_mode == "block" and GLUON_FP8 and gluon_hopper(a.device):
        from . import _gemm_gluon

        return _gemm_gluon.mm_fp8_block(a, b, sa, sb, c)
    t = fp8_tiles(INVARIANT_M if invariant else m, n, k, scale_mode, tma)
    if tma:
        a_desc, b_desc, c_desc = _descriptors(a, b, c, t, True)
        grid = _tma_grid(m, n, t, a.device)
        K._mm_fp8_tma_kernel[grid](
            a_desc, b_desc, c_desc, sa, sb, m, n, k, sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
            MODE=_MODES[scale_mode], BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
            NUM_PROGRAMS=grid[0], UPCAST=UPCAST, num_warps=t.num_warps, num_stages=t.num_stages,
        )
        return c
    K._mm_fp8_kernel[_launch_grid(m, n, t)](
        a, b, c, sa, sb, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        MODE=_MODES[scale_mode], BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
        UPCAST=UPCAST, num_warps=t.num_warps, num_stages=t.num_stages,
    )
    return c


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    rows, k = a.shape
    groups, _, n = b.shape
    c = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    if rows == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    t = mm_tiles(max(rows // max(groups, 1), 1), n, k, a.dtype)
    grid = (triton.cdiv(rows, t.block_m) + groups, triton.cdiv(n, t.block_n))
    K._grouped_mm_kernel[grid](a, b, c, offsets, groups, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                               b.stride(2), c.stride(0), BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                               GROUPS_P2=triton.next_power_of_2(groups), UPCAST=UPCAST,
                               IEEE=a.dtype == torch.float32, num_warps=t.num_warps, num_stages=t.num_stages)
    return c
