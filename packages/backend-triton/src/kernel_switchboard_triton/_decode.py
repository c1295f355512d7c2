"""Paged decode attention: split-KV (flash-decoding) with GQA packing, plus the split merge.

One program handles all query heads of one KV head (``BLOCK_H >= group`` rows, at least 16 for
``tl.dot``) for one split of one request, so each KV page is read once. Splits divide a request's KV
evenly (their count chosen per batch to fill the GPU); in the batch-invariant scope they take a fixed
number of tokens each (:data:`INVARIANT_SPLIT_TOKENS`), whatever the batch, and the partials are merged
in split order by ``_merge_splits_ordered_kernel``, so a request's bits depend on the request alone. K/V tiles of ``BLOCK_N``
tokens are gathered through the block table (token j -> page ``block_table[b, j // page_size]``,
slot ``j % page_size``), which works for any page size and, through strides, for NHD and HND.
Scores are kept in log2 units (``exp2``); LSE outputs are natural log, float32.

fp8 K/V with bf16 queries compute in fp16 (``F16_MATH``): an fp8 pair becomes an fp16 pair in one conversion
instruction on sm_89+, but a bf16 pair in four (via fp16 and float32); fp16 loses nothing here: every e4m3 value is
exact in fp16, softmax weights in [0, 1] round finer in fp16 than in bf16, and the queries are scaled into fp16's
range first. Measured on an H100 (B=128 L=8192 page 16): fp16 math 2.02 TB/s against 1.93 with bf16 math; fp8 pages
then take 128-key tiles (the bytes in flight of the 16-bit tiles): 2.69 TB/s.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.attention_runner import buffers

from ._attn_common import (
    FP8_KV,
    _tanh,
    cc_major,
    choose_splits,
    fp16_range_factor,
    interpreting,
    resident_ctas,
    scale_args,
    sm_count,
    soft_cap_args,
)
from ._common import pdl_launch
from ._gdc import after_prior
from ._launch import Relaunch
from ._prefill import variant_finish, variant_launch, variant_scores


@triton.jit
def _decode_split_kernel(
    q_ptr,  # (B, Hq, D) queries
    k_ptr,  # K pages; addressed by (page, slot, head) strides, so NHD or HND
    v_ptr,  # V pages; same addressing as K
    block_table_ptr,  # (B, max_pages) int32 page ids
    seq_lens_ptr,  # (B,) int32 tokens in the cache per request
    o_ptr,  # out: (B, Hq, Dv) final when NUM_SPLITS == 1, else float32 partials (B, Hq, NUM_SPLITS, Dv)
    lse_ptr,  # float32 LSE: (B, Hq) final (natural, or base 2: LSE_BASE2) or (B, Hq, NUM_SPLITS) natural partials
    stride_qb,  # q stride over batch
    stride_qh,  # q stride over heads
    stride_kp,  # K stride over pages
    stride_ks,  # K stride over slots in a page
    stride_kh,  # K stride over kv heads
    stride_vp,  # V stride over pages
    stride_vs,  # V stride over slots in a page
    stride_vh,  # V stride over kv heads
    stride_bt,  # block_table row stride
    stride_ob,  # out stride over batch
    stride_oh,  # out stride over heads
    stride_os,  # out stride over splits (unused when NUM_SPLITS == 1)
    stride_lb,  # lse stride over batch
    stride_lh,  # lse stride over heads (the split stride is 1)
    qk_scale,  # log2-unit scale of q.k (sm_scale * k_scale * log2 e), or sm_scale * k_scale / cap with SOFT_CAP
    cap_log2,  # soft cap * log2 e (SOFT_CAP only)
    v_scale,  # output multiplier (fp8 V scale, else 1.0)
    k_scale_ptr,  # fp8 K scale tensor, () or (Hkv,) float32 (K_SCALE_STRIDE >= 0)
    v_scale_ptr,  # fp8 V scale tensor (V_SCALE_STRIDE >= 0)
    window_left,  # keep KV positions >= seq_len - 1 - window_left; negative = no window
    vargs,  # variant call-time args tuple (a trailing 0 keeps it non-empty)
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_H: tl.constexpr,  # query-head rows per program (>= GROUP, >= 16)
    HEAD_DIM: tl.constexpr,  # q/k head dim
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_D: tl.constexpr,  # next power of two of HEAD_DIM
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    PAGE_SIZE: tl.constexpr,  # tokens per page
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    NUM_SPLITS: tl.constexpr,  # KV splits per request (grid dim 2)
    SPLIT_TOKENS: tl.constexpr,  # KV tokens per split (a multiple of BLOCK_N), or 0: the span divided by NUM_SPLITS
    SOFT_CAP: tl.constexpr,  # apply the logits soft cap
    DOT_FP32: tl.constexpr,  # upcast dot operands to float32 (interpreter)
    F16_MATH: tl.constexpr,  # fp8 K/V with bf16 queries: dot operands in fp16 (see the module docstring)
    SCORE_MOD: tl.constexpr,  # variant score hook (kernel_switchboard.variants) or None
    MASK_MOD: tl.constexpr,  # variant mask hook or None
    OUTPUT_MOD: tl.constexpr,  # variant output hook or None (needs NUM_SPLITS == 1)
    HAS_SCORE_MOD: tl.constexpr,  # apply SCORE_MOD
    HAS_MASK_MOD: tl.constexpr,  # apply MASK_MOD
    HAS_OUTPUT_MOD: tl.constexpr,  # apply OUTPUT_MOD
    SOFTMAX: tl.constexpr,  # softmax weights (else the variant's scores are the weights; NUM_SPLITS == 1)
    K_SCALE_STRIDE: tl.constexpr,  # K scale tensor stride over KV heads (0: one scale), -1: in qk_scale
    V_SCALE_STRIDE: tl.constexpr,  # V scale tensor stride over KV heads, -1: in v_scale
    LSE_BASE2: tl.constexpr,  # the final LSE (NUM_SPLITS == 1, no SPLIT_TOKENS) in base 2; partials stay natural
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if K_SCALE_STRIDE >= 0:
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh * K_SCALE_STRIDE)
    if V_SCALE_STRIDE >= 0:
        v_scale = v_scale * tl.load(v_scale_ptr + kvh * V_SCALE_STRIDE)

    seq_len = tl.load(seq_lens_ptr + b)
    lo = tl.where(window_left >= 0, tl.maximum(seq_len - 1 - window_left, 0), 0)
    span = seq_len - lo
    if SPLIT_TOKENS > 0:
        chunk = SPLIT_TOKENS
    else:
        chunk = tl.cdiv(tl.cdiv(span, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    mask_dv = offs_dv < HEAD_DIM_V
    heads = kvh * GROUP + offs_h
    head2 = tl.where(mask_h, heads, 0)[:, None]  # (BLOCK_H, 1) for variant hooks; padding rows read head 0
    q_pos2 = tl.zeros([BLOCK_H, 1], dtype=tl.int32) + (seq_len - 1)

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    if F16_MATH:
        # fp16 holds every bf16 query exactly except magnitudes past its range: scale the rows down by one
        # factor when the largest |q| needs it, and fold the factor back into the score scale
        q32 = q.to(tl.float32)
        q_max = tl.max(tl.max(tl.abs(q32), 1), 0)
        q_mul = fp16_range_factor(q_max)
        q = (q32 * q_mul).to(tl.float16)
        qk_scale = qk_scale / q_mul

    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile keeps alpha finite
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    bt_row = block_table_ptr + b.to(tl.int64) * stride_bt
    k_base = k_ptr + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + kvh.to(tl.int64) * stride_vh
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        mask_n = tok < end
        page = tl.load(bt_row + tok // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        slot = tok % PAGE_SIZE
        k = tl.load(k_base + (page * stride_kp + slot * stride_ks)[:, None] + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        v = tl.load(v_base + (page * stride_vp + slot * stride_vs)[:, None] + offs_dv[None, :],
                    mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
        k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if SOFT_CAP:
            s = cap_log2 * _tanh(s)
        s = variant_scores(s, q_pos2, tok[None, :], head2, b, vargs, SCORE_MOD, HAS_SCORE_MOD, SOFTMAX)
        keep = mask_n[None, :]
        if HAS_MASK_MOD:
            keep = keep & MASK_MOD(q_pos2, tok[None, :], head2, b, vargs)
        if SOFTMAX:
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if DOT_FP32:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
            m_i = m_new
        else:
            p = tl.where(keep, s, 0.0)
            l_i = l_i + tl.sum(p, 1)
            if DOT_FP32:
                acc = acc + tl.dot(p, v.to(tl.float32))
            else:
                acc = acc + tl.dot(p.to(q.dtype), v.to(q.dtype))

    out, lse = variant_finish(acc, m_i, l_i, head2, b, vargs, v_scale, OUTPUT_MOD, HAS_OUTPUT_MOD, SOFTMAX,
                              LSE_BASE2)
    o_ptrs = o_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_dv[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_h[:, None] & mask_dv[None, :])
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _merge_splits_kernel(
    po_ptr,  # partial outputs (B, H, NUM_SPLITS, Dv), float32 or the output's dtype
    plse_ptr,  # float32 partial LSE (B, H, NUM_SPLITS), natural log; -inf for empty splits
    o_ptr,  # out (B, H, Dv), the query dtype
    lse_ptr,  # float32 out LSE (B, H), natural log or base 2 (LSE_BASE2)
    stride_pb,  # partial out stride over batch
    stride_ph,  # partial out stride over heads
    stride_ps,  # partial out stride over splits
    stride_plb,  # partial LSE stride over batch
    stride_plh,  # partial LSE stride over heads (split stride 1)
    stride_ob,  # out stride over batch
    stride_oh,  # out stride over heads
    stride_lb,  # out LSE stride over batch
    stride_lh,  # out LSE stride over heads
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    NUM_SPLITS: tl.constexpr,  # partials per (batch, head)
    BLOCK_S: tl.constexpr,  # next power of two of NUM_SPLITS
    LSE_BASE2: tl.constexpr,  # write the LSE in base 2
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc): the partials' kernel just before
):
    after_prior(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_s = offs_s < NUM_SPLITS
    mask_dv = offs_dv < HEAD_DIM_V
    lse = tl.load(plse_ptr + b * stride_plb + h * stride_plh + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2((lse - m_safe) * 1.4426950408889634)
    denom = tl.sum(w, 0)
    po = tl.load(po_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_dv[None, :],
                 mask=mask_s[:, None] & mask_dv[None, :], other=0.0)
    out = tl.sum(po * w[:, None], 0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_dv, out.to(o_ptr.dtype.element_ty), mask=mask_dv)
    lse_out = tl.where(denom > 0.0, m_safe + tl.log(tl.where(denom > 0.0, denom, 1.0)), float("-inf"))
    if LSE_BASE2:
        lse_out = lse_out * 1.4426950408889634
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, lse_out)


@triton.jit
def _merge_splits_ordered_kernel(
    po_ptr,  # partial outputs (B, H, NUM_SPLITS, Dv), float32 or the output's dtype
    plse_ptr,  # float32 partial LSE (B, H, NUM_SPLITS), natural log; -inf for empty splits
    o_ptr,  # out (B, H, Dv), the query dtype
    lse_ptr,  # float32 out LSE (B, H), natural log or base 2 (LSE_BASE2)
    stride_pb,  # partial out stride over batch
    stride_ph,  # partial out stride over heads
    stride_ps,  # partial out stride over splits
    stride_plb,  # partial LSE stride over batch
    stride_plh,  # partial LSE stride over heads (split stride 1)
    stride_ob,  # out stride over batch
    stride_oh,  # out stride over heads
    stride_lb,  # out LSE stride over batch
    stride_lh,  # out LSE stride over heads
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    NUM_SPLITS: tl.constexpr,  # partials per (batch, head)
    LSE_BASE2: tl.constexpr,  # write the LSE in base 2
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc): the partials' kernel just before
):
    """The merge of the batch-invariant scope: the partials added one by one in split order, empty splits skipped,
    so a request's result does not depend on how many (empty) splits its batch launched."""
    after_prior(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < HEAD_DIM_V
    lse_row = plse_ptr + b * stride_plb + h * stride_plh
    m = tl.full([], float("-inf"), dtype=tl.float32)
    for s in range(NUM_SPLITS):
        m = tl.maximum(m, tl.load(lse_row + s))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s in range(NUM_SPLITS):
        lse_s = tl.load(lse_row + s)
        keep = lse_s > float("-inf")
        w = tl.exp2((lse_s - m_safe) * 1.4426950408889634)
        po = tl.load(po_ptr + b * stride_pb + h * stride_ph + s * stride_ps + offs_dv, mask=mask_dv, other=0.0)
        denom = tl.where(keep, denom + w, denom)
        acc = tl.where(keep, acc + po * w, acc)
    out = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_dv, out.to(o_ptr.dtype.element_ty), mask=mask_dv)
    lse_out = tl.where(denom > 0.0, m_safe + tl.log(tl.where(denom > 0.0, denom, 1.0)), float("-inf"))
    if LSE_BASE2:
        lse_out = lse_out * 1.4426950408889634
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, lse_out)


# -- launchers -----------------------------------------------------------------------------------
class DecodeConfig(NamedTuple):
    """Static launch choices of one decode shape."""

    block_h: int
    block_n: int
    num_splits: int
    num_warps: int
    num_stages: int
    #: interpreter: float32 dot operands for bf16 inputs (its bf16 tl.dot is wrong; fp16 runs natively)
    dot_fp32: bool
    #: KV tokens per split (a multiple of block_n), merged in split order; 0: the span divided into num_splits
    split_tokens: int = 0


#: KV tokens per split in the batch-invariant scope (SGLang's deterministic FlashInfer decode uses 2048 too):
#: a request of L tokens takes cdiv(L, 2048) splits whatever its batch (the interpreter: 32, so tiny tests split)
INVARIANT_SPLIT_TOKENS = 2048
INTERPRETED_SPLIT_TOKENS = 32


@functools.lru_cache(maxsize=256)
def invariant_decode_config(device: torch.device, group: int, head_dim: int, kv_len: int) -> DecodeConfig:
    """The batch-invariant scope's decode configuration: tiles by head dims only and splits of
    :data:`INVARIANT_SPLIT_TOKENS` (as many as the longest request needs), never by batch size."""
    block_h = max(16, triton.next_power_of_2(group))
    if interpreting():
        splits = max(1, triton.cdiv(kv_len, INTERPRETED_SPLIT_TOKENS))
        return DecodeConfig(block_h, 16, splits, 1, 1, True, INTERPRETED_SPLIT_TOKENS)
    splits = max(1, triton.cdiv(kv_len, INVARIANT_SPLIT_TOKENS))
    block_n = 64 if head_dim <= 128 else 32  # divides the split
    return DecodeConfig(block_h, block_n, splits, 4, 3 if cc_major(device) >= 9 else 2, False, INVARIANT_SPLIT_TOKENS)


@functools.lru_cache(maxsize=1024)
def decode_config(device: torch.device, batch: int, kv_heads: int, group: int, head_dim: int, kv_len: int,
                  num_splits: int | None = None, kv_bytes: int = 2) -> DecodeConfig:
    """Tiles, warps and the split count for a decode shape (``kv_len``: the longest KV length, rounded;
    ``kv_bytes``: bytes per K/V element, 1 for fp8 pages)."""
    block_h = max(16, triton.next_power_of_2(group))
    if interpreting():
        block_n = 16
        splits = num_splits or (2 if kv_len > 2 * block_n else 1)
        return DecodeConfig(block_h, block_n, splits, 1, 1, True)
    block_n = 64 if head_dim <= 128 else 32
    if kv_bytes == 1:
        # fp8 pages: twice the keys per tile keeps the bytes in flight of the 16-bit tiles (H100, B=128 L=8192
        # page 16: 2.69 TB/s of fp8 pages with 128-key tiles against 2.02 with 64)
        block_n *= 2
    warps, stages = 4, (3 if cc_major(device) >= 9 else 2)
    if num_splits is None:
        # Triton's pipeliner keeps stages - 2 K/V tiles in flight (ptxas, sm_90, d128 BN64: 39 KB, 113 regs)
        d = triton.next_power_of_2(head_dim)
        smem = max(1, stages - 2) * block_n * 2 * d * kv_bytes + block_h * d * 2
        slots = sm_count(device) * resident_ctas(device, smem, warps, 128 if d <= 128 else 168)
        num_splits = choose_splits(batch * kv_heads, kv_len, block_n, slots)
        if block_n == 64 and num_splits == kv_len // (2 * block_n) and 2 * batch * kv_heads * num_splits <= slots:
            # every split already down to two tiles and still half the slots empty (batch 1): 32-key tiles
            # allow twice the splits (one more stage in the same shared memory): at batch 1 that is faster in a
            # CUDA graph on the H200 than half as many splits of 64-key tiles.
            block_n, stages = 32, stages + 1
            num_splits = choose_splits(batch * kv_heads, kv_len, block_n, slots)
    return DecodeConfig(block_h, block_n, num_splits, warps, stages, False)


class DecodePlan:
    """A decode launch prepared once: launch config, split workspace and (with ``dtype``) an output.

    ``run(q, cache, out=None, lse=None)`` only passes arguments and launches (no host sync, no
    allocation), so it can be captured in a CUDA graph. It writes ``out`` (B, Hq, Dv) (default: the
    plan's own output, overwritten by every run) and ``lse`` (B, Hq) float32, natural log or with
    ``lse_base2`` base 2 (default: the plan's own scratch) and returns ``(out, lse)``.
    """

    def __init__(self, table: Any, *, num_q_heads: int, num_kv_heads: int, head_dim: int, head_dim_v: int,
                 sm_scale: float, logits_soft_cap: float | None, window_left: int, max_kv_len: int,
                 num_splits: int | None = None, cfg: DecodeConfig | None = None,
                 dtype: torch.dtype | None = None, variant: Any = None, invariant: bool = False,
                 kv_dtype: torch.dtype | None = None, lse_base2: bool = False) -> None:
        device = table.block_table.device
        self.variant = variant
        if variant is not None and variant.variant.needs_single_split:
            num_splits = 1  # an output transform / non-softmax state cannot be merged by LSE
        batch = table.block_table.shape[0]
        self.table = table
        self.group = num_q_heads // num_kv_heads
        if invariant and num_splits != 1:  # fixed split size (one split: the whole KV, invariant as it is)
            cfg = invariant_decode_config(device, self.group, head_dim, max_kv_len)
        elif cfg is None or (num_splits == 1 and cfg.num_splits != 1):
            cfg = decode_config(device, batch, num_kv_heads, self.group, head_dim, round_len(max_kv_len), num_splits,
                                kv_dtype.itemsize if kv_dtype is not None else 2)
        self.cfg = cfg
        self.sm_scale, self.soft_cap, self.window_left = sm_scale, logits_soft_cap, window_left
        self.lse_base2 = lse_base2
        s = self.cfg.num_splits
        partials = s > 1 or self.cfg.split_tokens > 0  # the batch-invariant merge runs even for one split
        #: LSE scratch for runs that do not ask for it (the kernels always write one)
        self.lse_scratch = torch.empty(batch, num_q_heads, device=device, dtype=torch.float32)
        #: output of runs that pass none (only when the plan knows the query dtype)
        self.out = None if dtype is None else torch.empty(batch, num_q_heads, head_dim_v, device=device, dtype=dtype)
        self.part_out = torch.empty(batch, num_q_heads, s, head_dim_v, device=device, dtype=torch.float32) if partials \
            else None
        self.part_lse = torch.empty(batch, num_q_heads, s, device=device, dtype=torch.float32) if partials else None
        #: the last run's launches, which later runs repeat with their own tensors when they can
        self._launch: DecodeLaunch | None = None

    def run(self, q: torch.Tensor, cache: Any, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.out if out is None else out
        lse = self.lse_scratch if lse is None else lse
        if out is None:
            raise fail("out", None, "an output tensor (B, Hq, Dv), or a plan made with dtype=")
        kept = self._launch
        if kept is None or not kept(q, cache, out, lse):
            self._launch = launch_decode(q, cache, self.table, out, lse, self.part_out, self.part_lse, self.cfg,
                                         self.group, self.sm_scale, self.soft_cap, self.window_left, self.variant,
                                         self.lse_base2)
        return out, lse


def round_len(n: int) -> int:
    """Round a KV length up to a multiple of 256 (the split model needs no more; bounds the config cache)."""
    return max(256, triton.cdiv(n, 256) * 256)


#: a cache scale that is a tensor, in a :class:`DecodeLaunch` key (its dtype and strides are the launch's to check)
_SCALE_TENSOR = object()
#: where the split kernel takes the tensors a run brings: q, k, v, the output and LSE (or the partials), the scales
_SPLIT_SLOTS = (0, 1, 2, 5, 6, 24, 25)
#: where the merge takes the run's output and LSE
_MERGE_SLOTS = (2, 3)


def _scale_key(scale: Any) -> Any:
    """A cache scale as a launch depends on it: a float's value (folded into the kernel's scale arguments), None,
    or that it is a tensor."""
    return _SCALE_TENSOR if isinstance(scale, torch.Tensor) else scale


class DecodeLaunch:
    """A decode run's launches (split kernel, merge), kept so that the plan's later runs launch them directly
    (:class:`~._launch.Relaunch`). ``__call__(q, cache, out, lse)`` launches them with this run's tensors, or
    returns False (launching nothing) when the run differs in what the kept arguments fixed: device, shapes, layout,
    float scales, or a tensor's dtype, strides or alignment."""

    __slots__ = ("direct", "key", "merge", "parts", "split")

    def __init__(self, key: tuple[Any, ...], direct: bool, parts: tuple[Any, Any], split: Relaunch,
                 merge: Relaunch | None) -> None:
        self.key, self.direct, self.parts, self.split, self.merge = key, direct, parts, split, merge

    def __call__(self, q: torch.Tensor, cache: Any, out: torch.Tensor, lse: torch.Tensor) -> bool:
        if _launch_key(q, cache) != self.key:
            return False
        o, lp = (out, lse) if self.direct else self.parts
        # the scale slots as launch_decode fills them: a tensor scale, or q as an unused pointer
        split = self.split.bind(q, cache.k_pages, cache.v_pages, o, lp, scale_args(cache.k_scale, q)[1],
                                scale_args(cache.v_scale, q)[1])
        merge = None if self.merge is None else self.merge.bind(out, lse)
        if split is None or (self.merge is not None and merge is None):
            return False
        self.split.launch(split)
        if self.merge is not None:
            self.merge.launch(merge)  # type: ignore[arg-type]
        return True


def _launch_key(q: torch.Tensor, cache: Any) -> tuple[Any, ...]:
    return (q.device, q.shape, cache.k_pages.shape[1:], cache.v_pages.shape[1:], cache.layout,
            _scale_key(cache.k_scale), _scale_key(cache.v_scale))


def launch_decode(q: torch.Tensor, cache: Any, table: Any, out: torch.Tensor, lse: torch.Tensor,
                  part_out: torch.Tensor | None, part_lse: torch.Tensor | None, cfg: DecodeConfig, group: int,
                  sm_scale: float, soft_cap: float | None, window_left: int, variant: Any = None,
                  lse_base2: bool = False) -> DecodeLaunch | None:
    """Launch the split kernel (writing ``out``/``lse`` directly when there is one split) and the merge; ``lse`` in
    base 2 with ``lse_base2``, else natural log. Returns the launches kept for later runs of the same plan (None for
    an empty batch, which launches nothing)."""
    if q.shape[0] == 0:
        return None
    k, v = cache.k_pages, cache.v_pages
    nhd = cache.layout == "NHD"
    ks, kh = (k.stride(1), k.stride(2)) if nhd else (k.stride(2), k.stride(1))
    vs, vh = (v.stride(1), v.stride(2)) if nhd else (v.stride(2), v.stride(1))
    k_scale, k_scale_t, k_stride = scale_args(cache.k_scale, q)
    v_scale, v_scale_t, v_stride = scale_args(cache.v_scale, q)
    qk_scale, cap_log2 = soft_cap_args(sm_scale, soft_cap, k_scale)
    batch, kv_heads, splits = q.shape[0], cache.num_kv_heads, cfg.num_splits
    head_dim, head_dim_v = q.shape[2], v.shape[-1]
    bt = table.block_table
    direct = splits == 1 and not cfg.split_tokens
    if direct:
        o, lp = out, lse
        osb, osh, oss, lsb, lsh = out.stride(0), out.stride(1), 0, lse.stride(0), lse.stride(1)
    elif part_out is None or part_lse is None:
        raise ValueError(f"launch_decode: {splits} splits need the partial buffers part_out and part_lse")
    else:
        o, lp = part_out, part_lse
        osb, osh, oss = part_out.stride(0), part_out.stride(1), part_out.stride(2)
        lsb, lsh = part_lse.stride(0), part_lse.stride(1)
    vargs, hooks = variant_launch(variant)
    # softmax weights only: a variant's own weights (not SOFTMAX) are not bounded to fp16's range
    f16_math = k.dtype in FP8_KV and q.dtype == torch.bfloat16 and hooks["SOFTMAX"]
    split = Relaunch(_decode_split_kernel, (batch, kv_heads, splits), (
        q, k, v, bt, table.seq_lens, o, lp,
        q.stride(0), q.stride(1), k.stride(0), ks, kh, v.stride(0), vs, vh, bt.stride(0),
        osb, osh, oss, lsb, lsh,
        qk_scale, cap_log2, v_scale, k_scale_t, v_scale_t, window_left, vargs,
    ), dict(
        GROUP=group, BLOCK_H=cfg.block_h, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_DV=triton.next_power_of_2(head_dim_v),
        PAGE_SIZE=cache.page_size, BLOCK_N=cfg.block_n, NUM_SPLITS=splits, SPLIT_TOKENS=cfg.split_tokens,
        SOFT_CAP=soft_cap is not None, F16_MATH=f16_math,
        DOT_FP32=cfg.dot_fp32 and q.dtype == torch.bfloat16 and not f16_math, K_SCALE_STRIDE=k_stride,
        V_SCALE_STRIDE=v_stride, LSE_BASE2=direct and lse_base2, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **hooks,
    ), _SPLIT_SLOTS)
    merge = None
    if cfg.split_tokens or splits > 1:  # batch invariant: always the partials, merged in split order
        merge = Relaunch(*_merge_launch(o, lp, out, lse, ordered=bool(cfg.split_tokens), lse_base2=lse_base2),
                         _MERGE_SLOTS)
    return DecodeLaunch(_launch_key(q, cache), direct, (o, lp), split, merge)


def _merge_launch(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  ordered: bool, lse_base2: bool) -> tuple[Any, tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(kernel, grid, args, keywords) of :func:`launch_merge_splits`."""
    batch, heads, splits, dv = part_out.shape
    po, pl, o, ls = part_out.stride(), part_lse.stride(), out.stride(), lse.stride()
    args = (part_out, part_lse, out, lse, po[0], po[1], po[2], pl[0], pl[1], o[0], o[1], ls[0], ls[1])
    block_dv = 1 << (dv - 1).bit_length()
    options = dict(HEAD_DIM_V=dv, BLOCK_DV=block_dv, NUM_SPLITS=splits, LSE_BASE2=lse_base2,
                   num_warps=4 if dv >= 256 else 2, **pdl_launch(out.device))
    if ordered:
        return _merge_splits_ordered_kernel, (batch, heads), args, options
    return _merge_splits_kernel, (batch, heads), args, {**options, "BLOCK_S": max(2, 1 << (splits - 1).bit_length())}


def launch_merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                        ordered: bool = False, lse_base2: bool = False) -> None:
    """Merge (B, H, S, Dv) float32 partials with their (B, H, S) natural-log LSE into ``out`` (B, H, Dv) and ``lse``
    (B, H), natural log or, with ``lse_base2``, base 2; ``ordered``: add them one by one in split order (the
    batch-invariant merge)."""
    kernel, grid, args, options = _merge_launch(part_out, part_lse, out, lse, ordered, lse_base2)
    kernel[grid](*args, **options)


def decode(q: torch.Tensor, cache: Any, table: Any, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``attention.decode`` kernel: q (B, Hq, D) -> (out (B, Hq, Dv), lse (B, Hq) float32 or None)."""
    plan = DecodePlan(table, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=q.shape[2],
                      head_dim_v=cache.head_dim_v, sm_scale=p.sm_scale, logits_soft_cap=p.logits_soft_cap,
                      window_left=p.window_left, max_kv_len=p.max_kv_len, variant=getattr(p, "variant", None),
                      invariant=getattr(p, "batch_invariant", False), kv_dtype=cache.k_pages.dtype,
                      lse_base2=getattr(p, "lse_base2", False))
    out = q.new_empty(q.shape[0], q.shape[1], cache.head_dim_v)
    lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32) if p.return_lse else None
    plan.run(q, cache, out, lse)
    return out, lse


class DecodeRunner:
    """``Kernel.plan`` of the decode kernel: a :class:`DecodePlan` (the split schedule and workspace for this table)
    whose runs write the given ``out`` / ``lse`` or new ones (the core's runner contract)."""

    def __init__(self, problem: Any, table: Any, p: Any, num_splits: int | None = None, **_: Any) -> None:
        self.plan = DecodePlan(table, num_q_heads=problem.num_q_heads, num_kv_heads=problem.num_kv_heads,
                               head_dim=problem.head_dim, head_dim_v=problem.head_dim_v, sm_scale=p.sm_scale,
                               logits_soft_cap=p.logits_soft_cap, window_left=p.window_left, max_kv_len=p.max_kv_len,
                               num_splits=num_splits, variant=getattr(p, "variant", None),
                               invariant=getattr(p, "batch_invariant", False), kv_dtype=problem.kv_dtype,
                               lse_base2=getattr(p, "lse_base2", False))
        self.head_dim_v, self.want_lse = problem.head_dim_v, p.return_lse

    def run(self, q: torch.Tensor, cache: Any, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = buffers(out, lse, q, q.shape[:2], self.head_dim_v, self.want_lse)
        self.plan.run(q, cache, out, lse)
        return out, lse


plan_decode = DecodeRunner
