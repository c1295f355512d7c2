"""Triton jit kernels of the comm family (the launcher and the symmetric-memory exchange live in :mod:`.comm`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _sum_add_rms_norm_block(
    peers_ptr,  # (WORLD,) int64: the address of every rank's (rows, N) contribution, in rank order
    r_ptr,  # (rows, N) residual, contiguous
    w_ptr,  # (N,) weight
    y_ptr,  # (rows, N) out: rms_norm(sum + residual) * w
    s_ptr,  # (rows, N) out: sum + residual
    rows,  # number of rows
    N,  # hidden size
    eps,  # added to the mean square
    WORLD: tl.constexpr,  # ranks in the group
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N
):
    """One-shot all-reduce fused with the residual add and RMSNorm: each program reads its rows from every rank's
    buffer (peer memory) and sums them in float32 in rank order, so every rank computes bit-identical outputs."""
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < N)
    offs = r.to(tl.int64)[:, None] * N + c[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for rank in tl.static_range(WORLD):
        peer = tl.load(peers_ptr + rank).to(tl.pointer_type(r_ptr.dtype.element_ty))
        acc += tl.load(peer + offs, mask=mask, other=0.0).to(tl.float32)
    acc += tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(s_ptr + offs, acc.to(s_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(acc * acc, axis=1) / N + eps)
    w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (acc * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_block(
    peers_ptr,  # (WORLD,) int64: the address of every rank's contribution of `numel` elements, in rank order
    out_ptr,  # (numel,) out: the sum
    numel,  # elements per contribution
    WORLD: tl.constexpr,  # ranks in the group
    BLOCK: tl.constexpr,  # elements per program
):
    """One-shot all-reduce: each program sums its elements of every rank's buffer in float32, in rank order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for rank in tl.static_range(WORLD):
        peer = tl.load(peers_ptr + rank).to(tl.pointer_type(out_ptr.dtype.element_ty))
        acc += tl.load(peer + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
