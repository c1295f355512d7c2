"""Triton jit kernels of the norm family (launchers live in :mod:`.norm`).

Two shapes of kernel per op: a *block* kernel that holds ``BLOCK_M`` whole rows in registers
(``BLOCK_N = next_pow2(hidden)``; one read and one write of every element; the weights are loaded beside the rows,
before the reduction, so their latency hides under the rows'; rows are streamed, the weights kept in L2), and a *looped* kernel
for rows too wide for registers, which walks the row in ``BLOCK_N`` chunks (the second pass reads
the row again, mostly from L2). Statistics are float32; outputs are cast to the output's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gdc import after_prior


@triton.jit
def _rms_norm_block(
    x_ptr,  # (rows, N) input, unit stride in the last dim
    y_ptr,  # (rows, N) output
    w_ptr,  # (N,) weight
    rows,  # number of rows
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_y,  # row stride of y, elements
    eps,  # added to the mean square
    GEMMA: tl.constexpr,  # scale by (1 + w) instead of w
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < N)
    r64 = r.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + c[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    if GEMMA:
        w = w + 1.0
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + r64 * stride_y + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_looped(
    x_ptr,  # (rows, N) input, unit stride in the last dim
    y_ptr,  # (rows, N) output
    w_ptr,  # (N,) weight
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_y,  # row stride of y, elements
    eps,  # added to the mean square
    GEMMA: tl.constexpr,  # scale by (1 + w) instead of w
    BLOCK_N: tl.constexpr,  # chunk width
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        if GEMMA:
            w = w + 1.0
        tl.store(y_row + c, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=c < N)


@triton.jit
def _fused_add_rms_norm_block(
    x_ptr,  # (rows, N) input, overwritten with the normalised sum
    r_ptr,  # (rows, N) residual, overwritten with x + residual
    w_ptr,  # (N,) weight
    rows,  # number of rows
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_r,  # row stride of the residual, elements
    eps,  # added to the mean square
    GEMMA: tl.constexpr,  # scale by (1 + w) instead of w
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < N)
    r64 = r.to(tl.int64)[:, None]
    x_ptrs = x_ptr + r64 * stride_x + c[None, :]
    r_ptrs = r_ptr + r64 * stride_r + c[None, :]
    s = (tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
         + tl.load(r_ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32))
    w = tl.load(w_ptr + c, mask=c < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(r_ptrs, s.to(r_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
    if GEMMA:
        w = w + 1.0
    tl.store(x_ptrs, (s * rstd[:, None] * w[None, :]).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_add_rms_norm_looped(
    x_ptr,  # (rows, N) input, overwritten with the normalised sum
    r_ptr,  # (rows, N) residual, overwritten with x + residual
    w_ptr,  # (N,) weight
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_r,  # row stride of the residual, elements
    eps,  # added to the mean square
    GEMMA: tl.constexpr,  # scale by (1 + w) instead of w
    BLOCK_N: tl.constexpr,  # chunk width
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    r_row = r_ptr + row * stride_r
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        s = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32) + tl.load(r_row + c, mask=c < N, other=0.0).to(
            tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    # second pass recomputes the float32 sum (nothing was overwritten yet), then writes both outputs
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        s = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32) + tl.load(r_row + c, mask=c < N, other=0.0).to(
            tl.float32)
        w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        if GEMMA:
            w = w + 1.0
        tl.store(r_row + c, s.to(r_ptr.dtype.element_ty), mask=c < N)
        tl.store(x_row + c, (s * rstd * w).to(x_ptr.dtype.element_ty), mask=c < N)


@triton.jit
def _layer_norm_block(
    x_ptr,  # (rows, N) input, unit stride in the last dim
    y_ptr,  # (rows, N) output
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias (unused when HAS_BIAS is False)
    rows,  # number of rows
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_y,  # row stride of y, elements
    eps,  # added to the variance
    HAS_BIAS: tl.constexpr,  # add the bias
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < N)
    r64 = r.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + c[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + c, mask=c < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += bias[None, :]
    tl.store(y_ptr + r64 * stride_y + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_looped(
    x_ptr,  # (rows, N) input, unit stride in the last dim
    y_ptr,  # (rows, N) output
    w_ptr,  # (N,) weight
    b_ptr,  # (N,) bias (unused when HAS_BIAS is False)
    N,  # hidden size
    stride_x,  # row stride of x, elements
    stride_y,  # row stride of y, elements
    eps,  # added to the variance
    HAS_BIAS: tl.constexpr,  # add the bias
    BLOCK_N: tl.constexpr,  # chunk width
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        acc += tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
        xc = tl.where(c < N, x - mean, 0.0)
        acc += xc * xc
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
        tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=c < N)
