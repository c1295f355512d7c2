"""Triton rotary position embedding: NeoX halves or GPT-J pairs, from ``inv_freq`` or a cos/sin cache.

Signatures (see :mod:`kernel_switchboard.ops.rope`): ``run(q, k, positions, inv_freq | cos_sin_cache,
interleaved, inplace) -> (q_out, k_out)``; q (T, Hq, D), k (T, Hk, D) (k may be None); the first
``rotary_dim`` dims of each head rotate, the rest pass through. Angles and rotation are float32.

Grid: (tokens, head blocks of q then of k); a program computes its token's cos/sin once and
rotates ``BLOCK_H`` heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: heads per program: 8 rotates 8192 tokens of 32 + 8 heads (d 128, bf16) 12% faster than 4 on the H100 (one cos/sin
#: per 8 heads, half the programs); 16 is slower again from position ids
BLOCK_H = 8


@triton.jit
def _rotate_heads(
    src_ptr,  # (T, H, D) input
    dst_ptr,  # (T, H, D) output (may equal src_ptr: in place)
    tok,  # token index (int64)
    h0,  # first head of this tile
    H,  # heads of this tensor
    D,  # head dim
    stride_st, stride_sh,  # input strides: token, head (elements; the dim stride is 1)
    stride_dt, stride_dh,  # output strides: token, head
    cos, sin,  # (HALF_BLOCK,) float32 rotation of each frequency
    HALF,  # rotary_dim / 2
    INTERLEAVED: tl.constexpr,  # GPT-J pairs (2i, 2i+1); else NeoX halves (i, i + HALF)
    COPY_REST: tl.constexpr,  # copy dims [2 * HALF, D) to the output (out of place with partial rotary)
    BLOCK_H: tl.constexpr,  # heads per tile
    HALF_BLOCK: tl.constexpr,  # next power of two >= HALF
    REST_BLOCK: tl.constexpr,  # next power of two >= D - 2 * HALF
):
    h = h0 + tl.arange(0, BLOCK_H)
    i = tl.arange(0, HALF_BLOCK)
    mask = (h[:, None] < H) & (i[None, :] < HALF)
    src = src_ptr + tok * stride_st + h[:, None].to(tl.int64) * stride_sh
    dst = dst_ptr + tok * stride_dt + h[:, None].to(tl.int64) * stride_dh
    if INTERLEAVED:
        first = 2 * i[None, :]
        second = first + 1
    else:
        first = i[None, :]
        second = first + HALF
    x1 = tl.load(src + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + second, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst + first, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + second, y2.to(dst_ptr.dtype.element_ty), mask=mask)
    if COPY_REST:
        j = 2 * HALF + tl.arange(0, REST_BLOCK)
        rmask = (h[:, None] < H) & (j[None, :] < D)
        tl.store(dst + j[None, :], tl.load(src + j[None, :], mask=rmask), mask=rmask)


@triton.jit
def _rope_kernel(
    q_ptr, q_out_ptr,  # (T, Hq, D) query in and out
    k_ptr, k_out_ptr,  # (T, Hk, D) key in and out (unused when Hk == 0)
    pos_ptr,  # (T,) int32/int64 positions
    freq_ptr,  # (HALF,) float32 inv_freq, or (max_pos, 2 * HALF) float32 cos/sin cache
    Hq, Hk, D,  # query heads, key heads, head dim
    stride_qt, stride_qh, stride_qot, stride_qoh,  # query in/out strides (token, head)
    stride_kt, stride_kh, stride_kot, stride_koh,  # key in/out strides (token, head)
    stride_cache,  # row stride of the cos/sin cache (unused with inv_freq)
    max_position,  # rows of the cos/sin cache (unused with inv_freq)
    HALF,  # rotary_dim / 2
    USE_CACHE: tl.constexpr,  # freq_ptr is a cos/sin cache
    INTERLEAVED: tl.constexpr,  # GPT-J pairs; else NeoX halves
    COPY_REST: tl.constexpr,  # copy the pass-through dims (out of place, partial rotary)
    BLOCK_H: tl.constexpr,  # heads per program
    HALF_BLOCK: tl.constexpr,  # next power of two >= HALF
    REST_BLOCK: tl.constexpr,  # next power of two >= D - 2 * HALF (>= 1)
):
    tok = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    i = tl.arange(0, HALF_BLOCK)
    pos = tl.load(pos_ptr + tok)
    if USE_CACHE:
        # a position outside the table (unchecked calls) reads nothing and turns its token's rotated dims NaN
        inside = (pos >= 0) & (pos < max_position)
        row = freq_ptr + tl.where(inside, pos, 0).to(tl.int64) * stride_cache
        used = i < tl.where(inside, HALF, 0)
        cos = tl.load(row + i, mask=used, other=float("nan")).to(tl.float32)
        sin = tl.load(row + HALF + i, mask=used, other=float("nan")).to(tl.float32)
    else:
        angle = pos.to(tl.float32) * tl.load(freq_ptr + i, mask=i < HALF, other=0.0).to(tl.float32)
        # reduce to [-pi, pi] first (Cody-Waite with fma: 2 pi = fp32(2 pi) + 2 pi's float32 residue), so
        # cos/sin stay accurate at long-context positions even if they lower to approximate instructions
        k = tl.floor(angle * 0.15915494309189535 + 0.5)
        angle = tl.fma(-k, 6.2831854820251465, angle)
        angle = tl.fma(-k, -1.7484556025237907e-07, angle)
        cos = tl.cos(angle)
        sin = tl.sin(angle)
    q_blocks = tl.cdiv(Hq, BLOCK_H)
    if hb < q_blocks:
        _rotate_heads(q_ptr, q_out_ptr, tok, hb * BLOCK_H, Hq, D, stride_qt, stride_qh, stride_qot, stride_qoh,
                      cos, sin, HALF, INTERLEAVED, COPY_REST, BLOCK_H, HALF_BLOCK, REST_BLOCK)
    else:
        _rotate_heads(k_ptr, k_out_ptr, tok, (hb - q_blocks) * BLOCK_H, Hk, D, stride_kt, stride_kh, stride_kot,
                      stride_koh, cos, sin, HALF, INTERLEAVED, COPY_REST, BLOCK_H, HALF_BLOCK, REST_BLOCK)


def _launch(q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, freq: torch.Tensor, half: int,
            use_cache: bool, interleaved: bool, inplace: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    tokens, hq, d = q.shape
    hk = 0 if k is None else k.shape[1]
    q_out = q if inplace else torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = k if (inplace or k is None) else torch.empty_like(k, memory_format=torch.contiguous_format)
    if tokens == 0:
        return q_out, k_out
    kk, ko = (q, q_out) if k is None or k_out is None else (k, k_out)  # no k: q's heads stand in (hk = 0)
    rest = d - 2 * half
    grid = (tokens, triton.cdiv(hq, BLOCK_H) + triton.cdiv(hk, BLOCK_H))
    _rope_kernel[grid](
        q, q_out, kk, ko, positions, freq, hq, hk, d,
        q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
        kk.stride(0), kk.stride(1), ko.stride(0), ko.stride(1),
        freq.stride(0), freq.shape[0], half,
        USE_CACHE=use_cache, INTERLEAVED=interleaved, COPY_REST=(not inplace and rest > 0), BLOCK_H=BLOCK_H,
        HALF_BLOCK=triton.next_power_of_2(half), REST_BLOCK=triton.next_power_of_2(max(rest, 1)), num_warps=4,
    )
    return q_out, k_out


def apply(q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool,
          inplace: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _launch(q, k, positions, inv_freq, inv_freq.shape[0], False, interleaved, inplace)


def apply_cos_sin_cache(q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                        interleaved: bool, inplace: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _launch(q, k, positions, cos_sin_cache, cos_sin_cache.shape[1] // 2, True, interleaved, inplace)
