"""Prefill / append attention over paged or ragged KV (FlashAttention-2 style), one launch per batch.

Rows of a q tile are (token, query head) pairs of one KV head, packed token-major: row r of
request b is token ``r // group``, head ``kv_head * group + r % group``. Each program takes
``BLOCK_M`` packed rows of one request and streams K/V tiles of ``BLOCK_N`` tokens with an online
softmax. GQA packing reads every K/V tile once per KV head, and decode requests (qo_len 1) of a
mixed batch cost one small tile each.

Work items need no host work: request b owns the slots ``[start(b), start(b+1))`` with
``start(b) = (qo_indptr[b] * group) // BLOCK_M + b`` (enough for its ``cdiv(qo_len * group,
BLOCK_M)`` tiles; extra slots exit at once). A program finds its request by binary search over
``qo_indptr``; the grid is ``((Tq * group // BLOCK_M + B) * num_kv_heads,)``, known on the host, with the
KV head varying fastest so that the heavy (late causal) tiles of every head run before the light ones.

The KV loop runs in three parts: masked tiles at the window's start, unmasked tiles, then
masked tiles at the causal diagonal / the end of the sequence.

A row's result depends on its request and on the tile shape alone (tiles never mix requests, and a request's tiles
start at its first row). The tile shape follows the batch's longest query (short tiles for decode rows) except in the
batch-invariant scope, where it is the one of :data:`INVARIANT_ROWS` rows whatever the batch.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernel_switchboard.ops.attention_problems import out_dtype
from kernel_switchboard.ops.attention_runner import buffers

from ._attn_common import (
    FP8_KV,
    _exp2_fma,
    _tanh,
    cc_major,
    fixed_max,
    fp16_range_factor,
    interpreting,
    scale_args,
    soft_cap_args,
    soft_cap_mode,
    split_dim,
)
from ._common import gluon_hopper, has_tma, row_major_for_tma
from ._moe_kernels import _round_e4m3


def variant_launch(bound: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Kernel arguments of a custom variant (``AttnParams.variant``, a BoundVariant or None):
    (the ``vargs`` tuple: its call-time args plus a trailing 0, so it is never empty; the hook
    constexprs). Triton compiles one kernel per set of hook functions and caches it."""
    if bound is None:
        return (0,), {"SCORE_MOD": None, "MASK_MOD": None, "OUTPUT_MOD": None, "HAS_SCORE_MOD": False,
                      "HAS_MASK_MOD": False, "HAS_OUTPUT_MOD": False, "SOFTMAX": True}
    var = bound.variant
    return (*bound.args, 0), {"SCORE_MOD": var.score_mod, "MASK_MOD": var.mask_mod, "OUTPUT_MOD": var.output_mod,
                              "HAS_SCORE_MOD": var.score_mod is not None, "HAS_MASK_MOD": var.mask_mod is not None,
                              "HAS_OUTPUT_MOD": var.output_mod is not None, "SOFTMAX": var.softmax}


@triton.jit
def variant_scores(s, q_pos, kv_pos, head, batch, vargs, SCORE_MOD: tl.constexpr, HAS_SCORE_MOD: tl.constexpr,
                   SOFTMAX: tl.constexpr):
    """log2-unit scores -> the variant's scores: log2 units (SOFTMAX) or natural weights (not SOFTMAX)."""
    if HAS_SCORE_MOD or not SOFTMAX:
        s = s * 0.6931471805599453
        if HAS_SCORE_MOD:
            s = SCORE_MOD(s, q_pos, kv_pos, head, batch, vargs)
        if SOFTMAX:
            s = s * 1.4426950408889634
    return s


@triton.jit
def variant_finish(acc, m_i, l_i, head, batch, vargs, v_scale, OUTPUT_MOD: tl.constexpr,
                   HAS_OUTPUT_MOD: tl.constexpr, SOFTMAX: tl.constexpr, LSE_BASE2: tl.constexpr):
    """Final (out, lse) of one row block from the running state (acc, m_i log2 units, l_i); lse in natural log, or
    in base 2 with ``LSE_BASE2``."""
    empty = l_i == 0.0
    if SOFTMAX:
        m_out = m_i
    else:
        m_out = tl.zeros_like(m_i)
    if HAS_OUTPUT_MOD:
        out = OUTPUT_MOD(acc * v_scale, l_i[:, None], (m_out * 0.6931471805599453)[:, None], head, batch, vargs)
        out = tl.where(empty[:, None], 0.0, out)
    elif SOFTMAX:
        out = acc * (v_scale / tl.where(empty, 1.0, l_i))[:, None]
    else:
        out = acc * v_scale
    lse = m_out + tl.log2(tl.where(empty, 1.0, l_i))
    if not LSE_BASE2:
        lse = lse * 0.6931471805599453
    return out, tl.where(empty, float("-inf"), lse)


@triton.jit
def _tile(
    acc,  # (BLOCK_M, BLOCK_DV) float32 running output
    m_i,  # (BLOCK_M,) float32 running max, log2 units
    l_i,  # (BLOCK_M,) float32 running denominator
    q,  # (BLOCK_M, HEAD_MAIN) query tile
    q_tail,  # (BLOCK_M, HEAD_TAIL) query tail (ignored when HEAD_TAIL == 0)
    k_base,  # K base pointer at this KV head
    v_base,  # V base pointer at this KV head
    k_desc,  # TMA descriptor of K as token rows (TMA only; see tma_descriptors)
    v_desc,  # TMA descriptor of V as token rows (TMA only)
    kvh,  # this program's KV head (TMA row / column offsets)
    bt_row,  # block-table row of this request (PAGED)
    kv_start,  # first KV token of this request in k/v (ragged)
    n0,  # first KV position of this tile
    kv_len,  # KV tokens of this request
    row_pos,  # (BLOCK_M,) KV position of each row's query
    window_left,  # window size (WINDOW only)
    stride_kp,  # K stride over pages (PAGED)
    stride_ks,  # K stride over tokens (slots in a page when PAGED)
    stride_vp,  # V stride over pages (PAGED)
    stride_vs,  # V stride over tokens (slots in a page when PAGED)
    qk_scale,  # log2-unit score scale, or sm_scale / cap with SOFT_CAP
    cap_log2,  # soft cap * log2 e (SOFT_CAP only)
    head2,  # (BLOCK_M, 1) query head of each row (variant hooks)
    batch_id,  # request index (variant hooks)
    vargs,  # variant call-time args tuple (variant hooks)
    SCORE_MOD: tl.constexpr,  # variant score hook (HAS_SCORE_MOD)
    MASK_MOD: tl.constexpr,  # variant mask hook (HAS_MASK_MOD)
    HAS_SCORE_MOD: tl.constexpr,  # apply SCORE_MOD
    HAS_MASK_MOD: tl.constexpr,  # apply MASK_MOD
    SOFTMAX: tl.constexpr,  # softmax weights (else the variant's scores are the weights)
    MASK: tl.constexpr,  # apply length / causal / window masks in this tile
    CAUSAL: tl.constexpr,  # causal mask
    WINDOW: tl.constexpr,  # sliding-window mask
    SOFT_CAP: tl.constexpr,  # logits soft cap: 0 none, 1 exact tanh, 2 approximate tanh (soft_cap_mode)
    FIXED_MAX: tl.constexpr,  # 0 running maximum, 1 softmax against the soft cap, 2 and exp2 on FMAs (fixed_max)
    PAGED: tl.constexpr,  # paged (else ragged) K/V
    TMA: tl.constexpr,  # K/V tiles loaded by TMA (HEAD_TAIL 0, HEAD_DIM_V a power of two; paged: BLOCK_N | PAGE_SIZE)
    HND: tl.constexpr,  # paged HND pages: TMA rows are (page, kv head, slot)
    NUM_KV_HEADS: tl.constexpr,  # KV heads (HND TMA rows)
    PAGE_SIZE: tl.constexpr,  # tokens per page (PAGED)
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    HEAD_MAIN: tl.constexpr,  # power-of-two part of the qk head dim
    HEAD_TAIL: tl.constexpr,  # rest of the qk head dim (0 or a power of two)
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
    P_ROUND: tl.constexpr,  # round P to float8_e4m3fn's grid before the PV dot (the interpreter's fp8 queries)
):
    tok = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_MAIN)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_len = tok < kv_len
    if TMA:
        # whole tiles: rows past this request's KV (the rest of its page, the next request's rows, the descriptor's
        # zero fill) may hold anything: masked tiles mask their scores and zero their V rows (0 x NaN never arises)
        if PAGED:  # a tile never crosses a page (BLOCK_N divides PAGE_SIZE, tiles start at multiples of BLOCK_N)
            page = tl.load(bt_row + n0 // PAGE_SIZE)
            if HND:
                row, k_col, v_col = (page * NUM_KV_HEADS + kvh) * PAGE_SIZE + n0 % PAGE_SIZE, 0, 0
            else:
                row, k_col, v_col = page * PAGE_SIZE + n0 % PAGE_SIZE, kvh * HEAD_MAIN, kvh * HEAD_DIM_V
        else:
            row, k_col, v_col = kv_start + n0, kvh * HEAD_MAIN, kvh * HEAD_DIM_V
        k = k_desc.load([row, k_col])
        v = v_desc.load([row, v_col])
        if MASK:
            v = tl.where(in_len[:, None], v, 0.0)
    else:
        if PAGED:
            if MASK:
                page = tl.load(bt_row + tok // PAGE_SIZE, mask=in_len, other=0).to(tl.int64)
            else:
                page = tl.load(bt_row + tok // PAGE_SIZE).to(tl.int64)
            slot = tok % PAGE_SIZE
            k_rows = page * stride_kp + slot * stride_ks
            v_rows = page * stride_vp + slot * stride_vs
        else:
            k_rows = (kv_start + tok).to(tl.int64) * stride_ks
            v_rows = (kv_start + tok).to(tl.int64) * stride_vs
        if MASK:
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=in_len[:, None], other=0.0)
            v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :],
                        mask=in_len[:, None] & (offs_dv < HEAD_DIM_V)[None, :], other=0.0)
        else:
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :])
            v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :], mask=(offs_dv < HEAD_DIM_V)[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k.to(q.dtype)))
    if HEAD_TAIL > 0:
        offs_t = HEAD_MAIN + tl.arange(0, HEAD_TAIL)
        if MASK:
            kt = tl.load(k_base + k_rows[:, None] + offs_t[None, :], mask=in_len[:, None], other=0.0)
        else:
            kt = tl.load(k_base + k_rows[:, None] + offs_t[None, :])
        s += tl.dot(q_tail, tl.trans(kt.to(q.dtype)))
    s = s * qk_scale
    if SOFT_CAP:
        s = cap_log2 * _tanh(s, SOFT_CAP == 2)
    s = variant_scores(s, row_pos[:, None], tok[None, :], head2, batch_id, vargs, SCORE_MOD, HAS_SCORE_MOD, SOFTMAX)
    keep = in_len[None, :]
    if MASK:
        if CAUSAL:
            keep = keep & (tok[None, :] <= row_pos[:, None])
        if WINDOW:
            keep = keep & (tok[None, :] >= row_pos[:, None] - window_left)
    if HAS_MASK_MOD:
        keep = keep & MASK_MOD(row_pos[:, None], tok[None, :], head2, batch_id, vargs)
    if SOFTMAX and FIXED_MAX:  # m_i holds the cap, which no score exceeds: s - m_i lies in [-120, 0]
        m_new = m_i
        if FIXED_MAX == 2:  # masked keys at -127, which _exp2_fma takes to 0
            if MASK or HAS_MASK_MOD:
                s = tl.where(keep, s, m_i[:, None] - 127.0)
            # every other key's exponential on the FMA pipe: with the tanh the SFU would run two per score
            x_fma, x_sfu = tl.split(tl.reshape(s - m_i[:, None], [s.shape[0], BLOCK_N // 2, 2]))
            p = tl.reshape(tl.join(_exp2_fma(x_fma), tl.exp2(x_sfu)), [s.shape[0], BLOCK_N])
        else:
            if MASK or HAS_MASK_MOD:
                s = tl.where(keep, s, float("-inf"))
            p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        acc = acc + tl.dot(p.to(q.dtype), v.to(q.dtype))
    elif SOFTMAX:
        if MASK or HAS_MASK_MOD:
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if P_ROUND:  # as the GPU's p.to(float8e4nv) rounds it (fp8 queries: the PV dot on fp8 operands too)
            p = _round_e4m3(p)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    else:
        m_new = m_i
        if MASK or HAS_MASK_MOD:
            s = tl.where(keep, s, 0.0)
        l_i = l_i + tl.sum(s, 1)
        acc = acc + tl.dot(s.to(q.dtype), v.to(q.dtype))
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr,  # (Tq, Hq, D) packed queries
    k_ptr,  # K: pages (PAGED, any layout through strides) or (Tk, Hkv, D) ragged
    v_ptr,  # V: like K with head dim Dv
    k_desc,  # TMA descriptor of K as token rows, block (BLOCK_N, D) (TMA; else k_ptr again): see tma_descriptors
    v_desc,  # TMA descriptor of V as token rows, block (BLOCK_N, Dv) (TMA; else v_ptr again)
    kd_desc,  # K descriptor of the diagonal tiles, block (DIAG_N, D) (TMA; else k_desc again)
    vd_desc,  # V descriptor of the diagonal tiles, block (DIAG_N, Dv) (TMA; else v_desc again)
    qo_indptr_ptr,  # (B+1,) int32 query offsets
    kv_indptr_ptr,  # (B+1,) int32 KV offsets (ragged only)
    block_table_ptr,  # (B, max_pages) int32 (PAGED only)
    seq_lens_ptr,  # (B,) int32 KV lengths (PAGED only)
    o_ptr,  # (Tq, Hq, Dv) output, q's dtype
    lse_ptr,  # (Tq, Hq) float32 LSE, natural log or base 2 (RETURN_LSE only)
    stride_qt,  # q stride over tokens
    stride_qh,  # q stride over heads
    stride_kp,  # K stride over pages (PAGED)
    stride_ks,  # K stride over tokens (in-page slots when PAGED)
    stride_kh,  # K stride over kv heads
    stride_vp,  # V stride over pages (PAGED)
    stride_vs,  # V stride over tokens (in-page slots when PAGED)
    stride_vh,  # V stride over kv heads
    stride_bt,  # block_table row stride
    stride_ot,  # out stride over tokens
    stride_oh,  # out stride over heads
    stride_lt,  # lse stride over tokens
    stride_lh,  # lse stride over heads
    qk_scale,  # log2-unit score scale, or sm_scale / cap with SOFT_CAP
    cap_log2,  # soft cap * log2 e (SOFT_CAP only)
    v_scale,  # output multiplier (fp8 V scale, else 1.0)
    k_scale_ptr,  # fp8 K scale tensor, () or (Hkv,) float32 (K_SCALE_STRIDE >= 0)
    v_scale_ptr,  # fp8 V scale tensor (V_SCALE_STRIDE >= 0)
    window_left,  # window size (WINDOW only)
    batch,  # requests B
    vargs,  # variant call-time args tuple (a trailing 0 keeps it non-empty)
    GROUP: tl.constexpr,  # query heads per KV head
    NUM_KV_HEADS: tl.constexpr,  # KV heads (the fast-varying part of the grid)
    BLOCK_M: tl.constexpr,  # packed (token, head) rows per program
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    DIAG_N: tl.constexpr,  # KV tokens per tile in the last (causal diagonal / sequence end) part, divides BLOCK_N
    HEAD_MAIN: tl.constexpr,  # power-of-two part of the qk head dim
    HEAD_TAIL: tl.constexpr,  # rest of the qk head dim (0 or a power of two)
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    PAGE_SIZE: tl.constexpr,  # tokens per page (PAGED)
    PAGED: tl.constexpr,  # paged (else ragged) K/V
    TMA: tl.constexpr,  # K/V tiles by TMA (k_desc / v_desc)
    HND: tl.constexpr,  # paged HND pages (TMA rows)
    CAUSAL: tl.constexpr,  # causal mask
    WINDOW: tl.constexpr,  # sliding-window mask
    SOFT_CAP: tl.constexpr,  # logits soft cap: 0 none, 1 exact tanh, 2 approximate tanh (soft_cap_mode)
    FIXED_MAX: tl.constexpr,  # 0 running maximum, 1 softmax against the soft cap, 2 and exp2 on FMAs (fixed_max)
    RETURN_LSE: tl.constexpr,  # write lse
    LSE_BASE2: tl.constexpr,  # lse in base 2 (else natural log)
    LOG_B: tl.constexpr,  # binary-search steps, >= log2(B) + 1
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
    P_ROUND: tl.constexpr,  # round P to float8_e4m3fn's grid before the PV dot (the interpreter's fp8 queries)
    F16_MATH: tl.constexpr,  # fp8 K/V with bf16 queries: dot operands in fp16 (see _decode's module docstring)
    SCORE_MOD: tl.constexpr,  # variant score hook (kernel_switchboard.variants) or None
    MASK_MOD: tl.constexpr,  # variant mask hook or None
    OUTPUT_MOD: tl.constexpr,  # variant output hook or None
    HAS_SCORE_MOD: tl.constexpr,  # apply SCORE_MOD
    HAS_MASK_MOD: tl.constexpr,  # apply MASK_MOD
    HAS_OUTPUT_MOD: tl.constexpr,  # apply OUTPUT_MOD
    SOFTMAX: tl.constexpr,  # softmax weights (else the variant's scores are the weights)
    K_SCALE_STRIDE: tl.constexpr,  # K scale tensor stride over KV heads (0: one scale), -1: folded into qk_scale
    V_SCALE_STRIDE: tl.constexpr,  # V scale tensor stride over KV heads, -1: folded into v_scale
):
    # the KV head varies fastest: every head's heavy (late causal) tiles run before the light ones
    _prefill_program(tl.program_id(0) // NUM_KV_HEADS, tl.program_id(0) % NUM_KV_HEADS,
                     q_ptr, k_ptr, v_ptr, k_desc, v_desc, kd_desc, vd_desc, qo_indptr_ptr, kv_indptr_ptr,
                     block_table_ptr, seq_lens_ptr, o_ptr, lse_ptr, stride_qt, stride_qh, stride_kp, stride_ks,
                     stride_kh, stride_vp, stride_vs, stride_vh, stride_bt, stride_ot, stride_oh, stride_lt,
                     stride_lh, qk_scale, cap_log2, v_scale, k_scale_ptr, v_scale_ptr, window_left, batch, vargs, GROUP,
                     NUM_KV_HEADS, BLOCK_M,
                     BLOCK_N, DIAG_N, HEAD_MAIN, HEAD_TAIL, HEAD_DIM_V, BLOCK_DV, PAGE_SIZE, PAGED, TMA, HND, CAUSAL,
                     WINDOW, SOFT_CAP, FIXED_MAX, RETURN_LSE, LSE_BASE2, LOG_B, DOT_FP32, P_ROUND, F16_MATH, SCORE_MOD, MASK_MOD,
                     OUTPUT_MOD, HAS_SCORE_MOD, HAS_MASK_MOD, HAS_OUTPUT_MOD, SOFTMAX, K_SCALE_STRIDE, V_SCALE_STRIDE)


@triton.jit
def _prefill_program(
    slot_id,  # work slot of this program (see the module docstring)
    kvh,  # KV head of this program
    q_ptr,  # (Tq, Hq, D) packed queries
    k_ptr,  # K: pages (PAGED, any layout through strides) or (Tk, Hkv, D) ragged
    v_ptr,  # V: like K with head dim Dv
    k_desc,  # TMA descriptor of K as token rows, block (BLOCK_N, D) (TMA; else k_ptr again): see tma_descriptors
    v_desc,  # TMA descriptor of V as token rows, block (BLOCK_N, Dv) (TMA; else v_ptr again)
    kd_desc,  # K descriptor of the diagonal tiles, block (DIAG_N, D) (TMA; else k_desc again)
    vd_desc,  # V descriptor of the diagonal tiles, block (DIAG_N, Dv) (TMA; else v_desc again)
    qo_indptr_ptr,  # (B+1,) int32 query offsets
    kv_indptr_ptr,  # (B+1,) int32 KV offsets (ragged only)
    block_table_ptr,  # (B, max_pages) int32 (PAGED only)
    seq_lens_ptr,  # (B,) int32 KV lengths (PAGED only)
    o_ptr,  # (Tq, Hq, Dv) output, q's dtype
    lse_ptr,  # (Tq, Hq) float32 LSE, natural log or base 2 (RETURN_LSE only)
    stride_qt,  # q stride over tokens
    stride_qh,  # q stride over heads
    stride_kp,  # K stride over pages (PAGED)
    stride_ks,  # K stride over tokens (in-page slots when PAGED)
    stride_kh,  # K stride over kv heads
    stride_vp,  # V stride over pages (PAGED)
    stride_vs,  # V stride over tokens (in-page slots when PAGED)
    stride_vh,  # V stride over kv heads
    stride_bt,  # block_table row stride
    stride_ot,  # out stride over tokens
    stride_oh,  # out stride over heads
    stride_lt,  # lse stride over tokens
    stride_lh,  # lse stride over heads
    qk_scale,  # log2-unit score scale, or sm_scale / cap with SOFT_CAP
    cap_log2,  # soft cap * log2 e (SOFT_CAP only)
    v_scale,  # output multiplier (fp8 V scale, else 1.0)
    k_scale_ptr,  # fp8 K scale tensor, () or (Hkv,) float32 (K_SCALE_STRIDE >= 0)
    v_scale_ptr,  # fp8 V scale tensor (V_SCALE_STRIDE >= 0)
    window_left,  # window size (WINDOW only)
    batch,  # requests B
    vargs,  # variant call-time args tuple (a trailing 0 keeps it non-empty)
    GROUP: tl.constexpr,  # query heads per KV head
    NUM_KV_HEADS: tl.constexpr,  # KV heads (the fast-varying part of the grid)
    BLOCK_M: tl.constexpr,  # packed (token, head) rows per program
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    DIAG_N: tl.constexpr,  # KV tokens per tile in the last (causal diagonal / sequence end) part, divides BLOCK_N
    HEAD_MAIN: tl.constexpr,  # power-of-two part of the qk head dim
    HEAD_TAIL: tl.constexpr,  # rest of the qk head dim (0 or a power of two)
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    PAGE_SIZE: tl.constexpr,  # tokens per page (PAGED)
    PAGED: tl.constexpr,  # paged (else ragged) K/V
    TMA: tl.constexpr,  # K/V tiles by TMA (k_desc / v_desc)
    HND: tl.constexpr,  # paged HND pages (TMA rows)
    CAUSAL: tl.constexpr,  # causal mask
    WINDOW: tl.constexpr,  # sliding-window mask
    SOFT_CAP: tl.constexpr,  # logits soft cap: 0 none, 1 exact tanh, 2 approximate tanh (soft_cap_mode)
    FIXED_MAX: tl.constexpr,  # 0 running maximum, 1 softmax against the soft cap, 2 and exp2 on FMAs (fixed_max)
    RETURN_LSE: tl.constexpr,  # write lse
    LSE_BASE2: tl.constexpr,  # lse in base 2 (else natural log)
    LOG_B: tl.constexpr,  # binary-search steps, >= log2(B) + 1
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
    P_ROUND: tl.constexpr,  # round P to float8_e4m3fn's grid before the PV dot (the interpreter's fp8 queries)
    F16_MATH: tl.constexpr,  # fp8 K/V with bf16 queries: dot operands in fp16 (see _decode's module docstring)
    SCORE_MOD: tl.constexpr,  # variant score hook (kernel_switchboard.variants) or None
    MASK_MOD: tl.constexpr,  # variant mask hook or None
    OUTPUT_MOD: tl.constexpr,  # variant output hook or None
    HAS_SCORE_MOD: tl.constexpr,  # apply SCORE_MOD
    HAS_MASK_MOD: tl.constexpr,  # apply MASK_MOD
    HAS_OUTPUT_MOD: tl.constexpr,  # apply OUTPUT_MOD
    SOFTMAX: tl.constexpr,  # softmax weights (else the variant's scores are the weights)
    K_SCALE_STRIDE: tl.constexpr,  # K scale tensor stride over KV heads (0: one scale), -1: folded into qk_scale
    V_SCALE_STRIDE: tl.constexpr,  # V scale tensor stride over KV heads, -1: folded into v_scale
):
    """One program of the prefill kernel: the tile ``slot_id`` of its request, for KV head ``kvh`` (also the
    prefill and decode parts of the POD kernel, ``_pod.py``, each with its own tile shape)."""
    if K_SCALE_STRIDE >= 0:
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh * K_SCALE_STRIDE)
    if V_SCALE_STRIDE >= 0:
        v_scale = v_scale * tl.load(v_scale_ptr + kvh * V_SCALE_STRIDE)

    # request of this slot: the last b with start(b) <= slot_id
    lo = 0
    hi = batch
    for _ in tl.static_range(LOG_B):
        mid = (lo + hi) // 2
        start_mid = tl.load(qo_indptr_ptr + mid) * GROUP // BLOCK_M + mid
        go = start_mid <= slot_id
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    b = lo
    q_start = tl.load(qo_indptr_ptr + b)
    qo_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    first_slot = q_start * GROUP // BLOCK_M + b
    n_slots = (tl.load(qo_indptr_ptr + b + 1) * GROUP // BLOCK_M + b + 1) - first_slot
    tile = n_slots - 1 - (slot_id - first_slot)  # heavy (late causal) tiles first
    rows = qo_len * GROUP
    if tile * BLOCK_M < rows:
        if PAGED:
            kv_len = tl.load(seq_lens_ptr + b)
            kv_start = 0
        else:
            kv_start = tl.load(kv_indptr_ptr + b)
            kv_len = tl.load(kv_indptr_ptr + b + 1) - kv_start
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < rows
        tok_q = offs_m // GROUP
        head = kvh * GROUP + offs_m % GROUP
        head2 = head[:, None]
        row_pos = kv_len - qo_len + tok_q
        q_rows = (q_start + tok_q).to(tl.int64) * stride_qt + head * stride_qh
        offs_d = tl.arange(0, HEAD_MAIN)
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=mask_m[:, None], other=0.0)
        if HEAD_TAIL > 0:
            offs_t = HEAD_MAIN + tl.arange(0, HEAD_TAIL)
            q_tail = tl.load(q_ptr + q_rows[:, None] + offs_t[None, :], mask=mask_m[:, None], other=0.0)
        else:
            q_tail = q
        if DOT_FP32:
            q = q.to(tl.float32)
            q_tail = q_tail.to(tl.float32)
        if F16_MATH:
            # as in decode: one factor brings the largest |q| into fp16's range, folded back into the score scale
            q_max = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
            if HEAD_TAIL > 0:
                q_max = tl.maximum(q_max, tl.max(tl.max(tl.abs(q_tail.to(tl.float32)), 1), 0))
            q_mul = fp16_range_factor(q_max)
            q = (q.to(tl.float32) * q_mul).to(tl.float16)
            q_tail = (q_tail.to(tl.float32) * q_mul).to(tl.float16)
            qk_scale = qk_scale / q_mul

        if FIXED_MAX:
            m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + cap_log2
        else:
            m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        last_row = tl.minimum(tile * BLOCK_M + BLOCK_M, rows) - 1
        pos_first = kv_len - qo_len + (tile * BLOCK_M) // GROUP
        pos_last = kv_len - qo_len + last_row // GROUP
        end = kv_len
        if CAUSAL:
            end = tl.minimum(kv_len, pos_last + 1)
        begin = 0
        full_lo = 0
        if WINDOW:
            begin = tl.maximum(pos_first - window_left, 0) // BLOCK_N * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(pos_last - window_left, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(full_lo, tl.maximum(end, 0))
        full_hi = kv_len
        if CAUSAL:
            full_hi = tl.minimum(kv_len, pos_first + 1)
        full_hi = tl.maximum(full_hi // BLOCK_N * BLOCK_N, full_lo)

        bt_row = block_table_ptr + b.to(tl.int64) * stride_bt  # type: ignore[attr-defined]  # b: a Triton scalar
        k_base = k_ptr + kvh.to(tl.int64) * stride_kh
        v_base = v_ptr + kvh.to(tl.int64) * stride_vh
        for n0 in range(begin, full_lo, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, q_tail, k_base, v_base, k_desc, v_desc, kvh, bt_row, kv_start, n0,
                                  kv_len, row_pos, window_left, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                                  cap_log2, head2, b, vargs, SCORE_MOD, MASK_MOD, HAS_SCORE_MOD, HAS_MASK_MOD, SOFTMAX,
                                  True, CAUSAL, WINDOW, SOFT_CAP, FIXED_MAX, PAGED, TMA, HND, NUM_KV_HEADS, PAGE_SIZE, BLOCK_N,
                                  HEAD_MAIN, HEAD_TAIL,
                                  HEAD_DIM_V, BLOCK_DV, DOT_FP32, P_ROUND)
        for n0 in range(full_lo, full_hi, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, q_tail, k_base, v_base, k_desc, v_desc, kvh, bt_row, kv_start, n0,
                                  kv_len, row_pos, window_left, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                                  cap_log2, head2, b, vargs, SCORE_MOD, MASK_MOD, HAS_SCORE_MOD, HAS_MASK_MOD, SOFTMAX,
                                  False, CAUSAL, WINDOW, SOFT_CAP, FIXED_MAX, PAGED, TMA, HND, NUM_KV_HEADS, PAGE_SIZE, BLOCK_N,
                                  HEAD_MAIN, HEAD_TAIL,
                                  HEAD_DIM_V, BLOCK_DV, DOT_FP32, P_ROUND)
        # narrower tiles here (DIAG_N) skip most of the keys past the diagonal that a BLOCK_N tile would mask
        for n0 in range(full_hi, end, DIAG_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, q_tail, k_base, v_base, kd_desc, vd_desc, kvh, bt_row, kv_start,
                                  n0, kv_len, row_pos, window_left, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                                  cap_log2, head2, b, vargs, SCORE_MOD, MASK_MOD, HAS_SCORE_MOD, HAS_MASK_MOD, SOFTMAX,
                                  True, CAUSAL, WINDOW, SOFT_CAP, FIXED_MAX, PAGED, TMA, HND, NUM_KV_HEADS, PAGE_SIZE, DIAG_N,
                                  HEAD_MAIN, HEAD_TAIL,
                                  HEAD_DIM_V, BLOCK_DV, DOT_FP32, P_ROUND)

        out, lse = variant_finish(acc, m_i, l_i, head2, b, vargs, v_scale, OUTPUT_MOD, HAS_OUTPUT_MOD, SOFTMAX,
                                  LSE_BASE2)
        offs_dv = tl.arange(0, BLOCK_DV)
        o_rows = (q_start + tok_q).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(o_ptr + o_rows[:, None] + offs_dv[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_dv < HEAD_DIM_V)[None, :])
        if RETURN_LSE:
            tl.store(lse_ptr + (q_start + tok_q).to(tl.int64) * stride_lt + head * stride_lh, lse, mask=mask_m)


# -- launchers -----------------------------------------------------------------------------------
class PrefillConfig(NamedTuple):
    """Static launch choices of one prefill shape."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    #: interpreter: float32 dot operands for bf16 inputs (its bf16 tl.dot is wrong; fp16 runs natively)
    dot_fp32: bool
    #: K/V tiles by TMA where :func:`tma_descriptors` can describe them (else pointer loads)
    tma: bool = False
    #: KV tokens per tile at the causal diagonal and the sequence end (0: block_n); divides block_n
    diag_n: int = 0
    #: where the softmax subtracts the soft cap (``_attn_common.fixed_max``), every other key's exponential by a
    #: polynomial on the FMA pipe rather than on the SFU, which the cap's tanh also occupies (sm_90 SASS of the
    #: 128x128 tile loop: 96 SFU instructions instead of 128, 797 instructions in all instead of 604). On Hopper,
    #: where an SM's SFU runs 16 exponentials or tanhs a clock against 4096 bf16 MMA flops (512 per score), so two
    #: per score keep it as busy as the tensor cores: H100, cap 30, 1x8192 / 8x2048: 435-439 / 309-314 TFLOP/s
    #: against 391-399 / 287-295 with both on the SFU; every exponential on the FMA pipe: 375-409 / 292-296
    exp2_fma: bool = False
    #: the warp-specialised Gluon kernel (``_prefill_gluon_ws``) for the calls it serves (:func:`gluon_ws_descriptors`)
    gluon_ws: bool = False


#: the packed rows the tile shape is chosen for in the batch-invariant scope (128-row tiles on Hopper at head dims up
#: to 128, as a long prefill takes; 64 elsewhere)
INVARIANT_ROWS = 128


def rows_bucket(p: Any, group: int) -> int:
    """The ``rows_bucket`` of :func:`prefill_config` for a call: its longest query's packed rows, or
    :data:`INVARIANT_ROWS` in the batch-invariant scope."""
    if getattr(p, "batch_invariant", False):
        return INVARIANT_ROWS
    return triton.next_power_of_2(max(1, p.max_q_len) * group)


@functools.lru_cache(maxsize=1024)
def prefill_config(device: torch.device, head_dim: int, head_dim_v: int, rows_bucket: int) -> PrefillConfig:
    """Tiles for a prefill shape; ``rows_bucket`` = max_q_len * group, bucketed (small for decode rows)."""
    if interpreting():
        return PrefillConfig(max(16, min(32, rows_bucket)), 16, 1, 1, True, diag_n=8)  # GPU-like: half-width diagonal tiles
    big = max(head_dim, head_dim_v) > 128
    hopper = cc_major(device) >= 9
    # sm_90, d128: BLOCK_M 128 x BLOCK_N 128, 8 warps, 3 stages (wgmma) measured fastest on the H200, with K/V
    # tiles by TMA where the layout allows (ragged; pages that hold whole tiles), faster than pointer loads.
    # ptxas (sm_90, on the host): 212 registers and no stack with TMA; 255 and 632 B (ragged) / 1224 B (paged)
    # of stack with pointer loads. sm_80 spills at BLOCK_M 128, so Ampere takes 64-row tiles.
    # 64-key tiles at the causal diagonal (diag_n) skip the keys past it: about 5-9% faster than 128-key tiles
    # there, and faster than 32-key ones, on the H200. ptxas sm_90 with TMA: 210 registers, no stack.
    block_m = max(16, min(64 if big or not hopper else 128, rows_bucket))
    block_n = 32 if big else (128 if hopper and block_m >= 128 else 64)
    warps = 8 if block_m >= 128 or big else 4
    return PrefillConfig(block_m, block_n, warps, 3 if hopper and not big else 2, False, tma=hopper,
                         diag_n=64 if block_n == 128 else 0, exp2_fma=hopper, gluon_ws=hopper and block_m == 128)


def _token_rows(t: torch.Tensor, layout: str | None) -> torch.Tensor | None:
    """``t`` as the 2-D rows the TMA kernel addresses, or None when its strides do not allow it:
    ragged (T, H, D) -> (T, H * D); NHD pages (P, S, H, D) -> (P * S, H * D); HND pages (P, H, S, D) -> (P * H * S, D)."""
    d = t.shape[-1]
    if t.stride(-1) != 1 or d > 256 or d & (d - 1):
        return None
    if layout is None and t.stride(1) == d:
        return t.as_strided((t.shape[0], t.shape[1] * d), (t.stride(0), 1))
    if layout == "NHD" and t.stride(2) == d and t.stride(0) == t.shape[1] * t.stride(1):
        return t.as_strided((t.shape[0] * t.shape[1], t.shape[2] * d), (t.stride(1), 1))
    if layout == "HND" and t.stride(1) == t.shape[2] * t.stride(2) and t.stride(0) == t.shape[1] * t.stride(1):
        return t.as_strided((t.shape[0] * t.shape[1] * t.shape[2], d), (t.stride(2), 1))
    return None


def _tma_rows(k: torch.Tensor, v: torch.Tensor, layout: str | None, page_size: int, block_n: int
              ) -> list[torch.Tensor] | None:
    """K and V as the token rows TMA addresses (:func:`_token_rows`), or None where TMA cannot describe them or a
    page would not hold whole ``block_n``-key tiles."""
    if layout is not None and page_size % block_n:
        return None
    rows = [r for r in (_token_rows(k, layout), _token_rows(v, layout)) if r is not None and row_major_for_tma(r)]
    return rows if len(rows) == 2 else None


def tma_descriptors(k: torch.Tensor, v: torch.Tensor, layout: str | None, page_size: int,
                    cfg: PrefillConfig) -> tuple[Any, Any, Any, Any] | None:
    """TMA descriptors of K and V as token rows (:func:`_token_rows`), blocks (BLOCK_N, D), then blocks
    (DIAG_N, D) for the diagonal tiles: None unless ``cfg.tma``, the GPU has TMA, head dims are powers of two
    up to 256 (one box), pages hold whole tiles (BLOCK_N divides the page size) and TMA can describe the rows."""
    rows = _tma_rows(k, v, layout, page_size, cfg.block_n) if cfg.tma and has_tma(k.device) else None
    if rows is None:
        return None
    kd, vd = k.shape[-1], v.shape[-1]
    diag = cfg.diag_n or cfg.block_n
    return (TensorDescriptor.from_tensor(rows[0], [cfg.block_n, kd]), TensorDescriptor.from_tensor(rows[1], [cfg.block_n, vd]),
            TensorDescriptor.from_tensor(rows[0], [diag, kd]), TensorDescriptor.from_tensor(rows[1], [diag, vd]))


def gluon_ws_descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str | None, page_size: int,
                         cfg: PrefillConfig, p: Any, hooks: dict[str, Any], scaled: bool) -> tuple[Any, Any] | None:
    """Gluon TMA descriptors of K and V for ``_prefill_gluon_ws`` when ``cfg.gluon_ws`` and it serves the call: an sm_90
    GPU, bfloat16 queries and K/V of head dim 128, a soft cap the softmax can subtract (``fixed_max``), no window, no
    variant hook, no cache or query scale, rows TMA can describe (pages of a multiple of its 128-key tiles), query
    rows cp.async copies in 16-byte pieces (aligned, strides of whole 8 elements); else None."""
    if not (cfg.gluon_ws and q.dtype == k.dtype == v.dtype == torch.bfloat16 and q.shape[-1] == v.shape[-1] == 128
            and q.stride(2) == 1 and q.stride(0) % 8 == q.stride(1) % 8 == 0 and q.data_ptr() % 16 == 0
            and p.window_left < 0 and not scaled and not any(hooks[h] for h in ("HAS_MASK_MOD", "HAS_OUTPUT_MOD"))
            and fixed_max(p.logits_soft_cap, q.dtype, False, hooks) and gluon_hopper(q.device)):
        return None
    from . import _prefill_gluon_ws  # Gluon: imported once the GPU is known to run it

    rows = _tma_rows(k, v, layout, page_size, _prefill_gluon_ws.BLOCK_N.value)
    return None if rows is None else _prefill_gluon_ws.descriptors(rows[0], rows[1], q.shape[-1])


def launch_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor,
                   kv_indptr: torch.Tensor | None, block_table: torch.Tensor | None, seq_lens: torch.Tensor | None,
                   layout: str | None, page_size: int, out: torch.Tensor, lse: torch.Tensor | None, p: Any,
                   cfg: PrefillConfig | None = None, k_scale: Any = 1.0, v_scale: Any = 1.0) -> None:
    """Launch the prefill kernel. Paged when ``block_table`` is given (k/v are pages in ``layout``),
    else ragged (k (Tk, Hkv, D), v (Tk, Hkv, Dv) packed by ``kv_indptr``). ``k_scale`` / ``v_scale``: fp8 scales,
    floats or tensors () / (Hkv,)."""
    tq, hq, d = q.shape
    paged = block_table is not None
    if block_table is not None:
        nhd = layout == "NHD"
        kv_heads = k.shape[2] if nhd else k.shape[1]
        kp, vp = k.stride(0), v.stride(0)
        ks, kh = (k.stride(1), k.stride(2)) if nhd else (k.stride(2), k.stride(1))
        vs, vh = (v.stride(1), v.stride(2)) if nhd else (v.stride(2), v.stride(1))
        bt, bt_stride, lens, kvi = block_table, block_table.stride(0), seq_lens, seq_lens
    elif kv_indptr is None:
        raise ValueError("launch_prefill: ragged K/V (no block_table) need kv_indptr")
    else:
        kv_heads = k.shape[1]
        kp, vp, ks, kh, vs, vh = 0, 0, k.stride(0), k.stride(1), v.stride(0), v.stride(1)
        bt, bt_stride, lens, kvi = kv_indptr, 0, kv_indptr, kv_indptr
    group = hq // kv_heads
    batch = qo_indptr.shape[0] - 1
    dv = v.shape[-1]
    if cfg is None:
        cfg = prefill_config(q.device, d, dv, rows_bucket(p, group))
    main, tail = split_dim(d)
    k_factor, k_scale_t, k_stride = scale_args(k_scale, q)
    v_factor, v_scale_t, v_stride = scale_args(v_scale, q)
    q_scale = getattr(p, "q_scale", None)  # fp8 queries: q = stored * q_scale, folded into the score scale
    qk_scale, cap_log2 = soft_cap_args(p.sm_scale, p.logits_soft_cap, k_factor * (q_scale or 1.0))
    fp8_q = q.dtype == torch.float8_e4m3fn
    slots = tq * group // cfg.block_m + batch
    if tq == 0:
        return
    lse_t = lse if lse is not None else out
    vargs, hooks = variant_launch(getattr(p, "variant", None))
    f16_math = k.dtype in FP8_KV and q.dtype == torch.bfloat16 and hooks["SOFTMAX"]
    scaled = k_factor != 1.0 or v_factor != 1.0 or k_stride >= 0 or v_stride >= 0 or q_scale is not None
    ws = gluon_ws_descriptors(q, k, v, layout if paged else None, page_size, cfg, p, hooks, scaled)
    if ws is not None:
        from . import _prefill_gluon_ws

        _prefill_gluon_ws.launch(q, *ws, qo_indptr, kv_indptr, block_table, seq_lens, out, lse, kv_heads=kv_heads,
                                 page_size=page_size, paged=paged, hnd=paged and layout == "HND",
                                 causal=bool(p.causal), qk_scale=qk_scale, cap_log2=cap_log2,
                                 lse_base2=getattr(p, "lse_base2", False))
        return
    descriptors = None if tail else tma_descriptors(k, v, layout if paged else None, page_size, cfg)
    launch = functools.partial(
        _prefill_kernel[(slots * kv_heads,)],
        q, k, v, *(descriptors or (k, v, k, v)), qo_indptr, kvi, bt, lens, out, lse_t,
        q.stride(0), q.stride(1), kp, ks, kh, vp, vs, vh, bt_stride,
        out.stride(0), out.stride(1), lse_t.stride(0), lse_t.stride(1),
        qk_scale, cap_log2, v_factor, k_scale_t, v_scale_t, p.window_left, batch, vargs,
        GROUP=group, NUM_KV_HEADS=kv_heads, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DIAG_N=cfg.diag_n or cfg.block_n,
        HEAD_MAIN=main, HEAD_TAIL=tail, HEAD_DIM_V=dv, BLOCK_DV=triton.next_power_of_2(dv), PAGE_SIZE=page_size, PAGED=paged,
        TMA=descriptors is not None, HND=paged and layout == "HND", CAUSAL=bool(p.causal),
        WINDOW=p.window_left >= 0, SOFT_CAP=soft_cap_mode(p.logits_soft_cap, q.dtype),
        FIXED_MAX=fixed_max(p.logits_soft_cap, q.dtype, f16_math, hooks, cfg.exp2_fma), RETURN_LSE=lse is not None,
        LSE_BASE2=getattr(p, "lse_base2", False),
        LOG_B=max(1, batch.bit_length()), DOT_FP32=cfg.dot_fp32 and (q.dtype == torch.bfloat16 or fp8_q) and not f16_math,
        P_ROUND=cfg.dot_fp32 and fp8_q, F16_MATH=f16_math, K_SCALE_STRIDE=k_stride, V_SCALE_STRIDE=v_stride,
        num_warps=cfg.num_warps, **hooks,
    )
    try:
        launch(num_stages=cfg.num_stages)
    except triton.runtime.errors.OutOfResources:
        # 128x128 tiles in 3 stages use ~224 KB of the 227 KB of shared memory: a variant's extra loads may not
        # fit; one stage fewer does (the failed compile stays cached, so the retry costs no compile)
        if cfg.num_stages <= 1:
            raise
        launch(num_stages=cfg.num_stages - 1)


def prefill(q: torch.Tensor, qo_indptr: torch.Tensor, cache: Any, table: Any, p: Any
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``attention.prefill`` kernel: q (Tq, Hq, D) -> out (Tq, Hq, Dv), lse (Tq, Hq) float32 or None."""
    out = q.new_empty(q.shape[0], q.shape[1], cache.head_dim_v, dtype=out_dtype(q.dtype))
    lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32) if p.return_lse else None
    launch_prefill(q, cache.k_pages, cache.v_pages, qo_indptr, None, table.block_table, table.seq_lens, cache.layout,
                   cache.page_size, out, lse, p, k_scale=cache.k_scale, v_scale=cache.v_scale)
    return out, lse


def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``attention.prefill_ragged`` kernel: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) -> (out, lse)."""
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32) if p.return_lse else None
    launch_prefill(q, k, v, qo_indptr, kv_indptr, None, None, None, 1, out, lse, p)
    return out, lse


class PrefillPlan:
    """A paged prefill launch prepared once for a table and ``qo_indptr`` (``Kernel.plan``); ``run(q, cache, out,
    lse)`` only launches (no host sync; it allocates only the outputs it is not given), so it can be captured in a
    CUDA graph."""

    def __init__(self, problem: Any, table: Any, p: Any, *, qo_indptr: torch.Tensor, **_: Any) -> None:
        self.table, self.p, self.qo_indptr = table, p, qo_indptr
        self.cfg = prefill_config(table.block_table.device, problem.head_dim, problem.head_dim_v,
                                  rows_bucket(p, problem.group_size))

    def run(self, q: torch.Tensor, cache: Any, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if out is None:  # fp8 queries give a bfloat16 out
            out = q.new_empty(*q.shape[:2], cache.head_dim_v, dtype=out_dtype(q.dtype))
        out, lse = buffers(out, lse, q, q.shape[:2], cache.head_dim_v, self.p.return_lse)
        launch_prefill(q, cache.k_pages, cache.v_pages, self.qo_indptr, None, self.table.block_table,
                       self.table.seq_lens, cache.layout, cache.page_size, out, lse, self.p, self.cfg,
                       k_scale=cache.k_scale, v_scale=cache.v_scale)
        return out, lse
