"""Triton normalisation kernels: rms_norm (and Gemma's 1 + w), fused_add_rms_norm in place, layer_norm.

One pass over memory: each program holds whole rows in registers (``BLOCK_N = next_pow2(hidden)``,
several narrow rows per program); rows wider than :data:`MAX_BLOCK` use a looped kernel.
Signatures: see :mod:`kernel_switchboard.ops.norm`.
"""

from __future__ import annotations

import functools

import torch
import triton

from kernel_switchboard.invariance import active as invariant_scope

from . import _norm_kernels as K
from ._common import pdl_launch
from .catalog.norm import MAX_BLOCK

#: chunk width of the looped kernels
LOOP_BLOCK = 4096


@functools.lru_cache(maxsize=256)
def block_config(rows: int, n: int) -> tuple[int, int, int] | None:
    """(BLOCK_M, BLOCK_N, num_warps) of the block kernel, or None when the row needs the looped one."""
    block_n = triton.next_power_of_2(n)
    if block_n > MAX_BLOCK:
        return None
    block_m = min(max(1, 2048 // block_n), 16, triton.next_power_of_2(max(rows, 1)))
    elems = block_m * block_n
    num_warps = 4 if elems <= 2048 else 8 if elems <= 8192 else 16
    return block_m, block_n, num_warps


def _rows_per_program(rows: int) -> int:
    """The row count the block shape is chosen for: the batch's (up to 16), or 16 whatever the batch in the
    batch-invariant scope (the tile, and so the reduction layout of a row, must not change with the batch)."""
    return 16 if invariant_scope() else min(rows, 16)


def _looped_warps() -> int:
    return 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    rows, n = x.shape
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    cfg = block_config(_rows_per_program(rows), n)
    if cfg is None:
        K._rms_norm_looped[(rows,)](x, y, weight, n, x.stride(0), y.stride(0), eps, GEMMA=gemma, BLOCK_N=LOOP_BLOCK,
                                    num_warps=_looped_warps(), **pdl_launch(x.device))
    else:
        bm, bn, nw = cfg
        K._rms_norm_block[(triton.cdiv(rows, bm),)](x, y, weight, rows, n, x.stride(0), y.stride(0), eps, GEMMA=gemma,
                                                    BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, **pdl_launch(x.device))
    return y


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> None:
    rows, n = x.shape
    if rows == 0:
        return
    cfg = block_config(_rows_per_program(rows), n)
    if cfg is None:
        K._fused_add_rms_norm_looped[(rows,)](x, residual, weight, n, x.stride(0), residual.stride(0), eps, GEMMA=gemma,
                                              BLOCK_N=LOOP_BLOCK, num_warps=_looped_warps(), **pdl_launch(x.device))
    else:
        bm, bn, nw = cfg
        K._fused_add_rms_norm_block[(triton.cdiv(rows, bm),)](x, residual, weight, rows, n, x.stride(0), residual.stride(0),
                                                              eps, GEMMA=gemma, BLOCK_M=bm, BLOCK_N=bn, num_warps=nw,
                                                              **pdl_launch(x.device))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    rows, n = x.shape
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    has_bias = bias is not None
    b = bias if has_bias else weight
    cfg = block_config(_rows_per_program(rows), n)
    if cfg is None:
        K._layer_norm_looped[(rows,)](x, y, weight, b, n, x.stride(0), y.stride(0), eps, HAS_BIAS=has_bias,
                                      BLOCK_N=LOOP_BLOCK, num_warps=_looped_warps(), **pdl_launch(x.device))
    else:
        bm, bn, nw = cfg
        K._layer_norm_block[(triton.cdiv(rows, bm),)](x, y, weight, b, rows, n, x.stride(0), y.stride(0), eps,
                                                      HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, num_warps=nw,
                                                      **pdl_launch(x.device))
    return y
