"""Absorbed multi-head latent attention (MLA) over paged latent KV for several query tokens per request: chunked
prefill, append and mixed prefill/decode batches of DeepSeek-style models, one launch per batch.

Every query head of a request reads the same latent KV head, so the rows of a program's q tile are (token, head)
pairs packed token-major (row r of request b is token ``r // H``, head ``r % H``), as the GQA prefill kernel packs
a KV head's query heads: at H = 128 a 64-row tile is half the heads of one token, at H = 16 it is four tokens. Each
program takes ``BLOCK_M`` rows of one request and streams latent tiles ``ckv (BLOCK_N, Dc)``, ``kpe (BLOCK_N, Dr)``
through the block table (any page size): ckv serves as K (with kpe) and as V. Online softmax in float32, scores in
log2 units.

Work items need no host work (the scheme of ``_prefill.py``): request b owns slots ``[start(b), start(b+1))`` with
``start(b) = (qo_indptr[b] * H) // BLOCK_M + b``; a program finds its request by binary search over ``qo_indptr``
and takes the request's tiles heaviest (latest causal rows) first. The KV loop runs unmasked tiles, then masked
tiles at the causal diagonal / the end of the sequence. No split-KV: a row's result does not depend on the batch
(batch invariant as it is).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from kernel_switchboard.ops.attention_runner import buffers

from ._attn_common import LOG2E, cc_major, interpreting


@triton.jit
def _latent_tile(
    acc,  # (BLOCK_M, HEAD_DIM) float32 running output
    m_i,  # (BLOCK_M,) float32 running max, log2 units
    l_i,  # (BLOCK_M,) float32 running denominator
    qn,  # (BLOCK_M, HEAD_DIM) latent query tile
    qp,  # (BLOCK_M, HEAD_DIM_PE) rope query tile
    ckv_ptr,  # latent pages (P, S, Dc)
    kpe_ptr,  # rope-key pages (P, S, Dr)
    bt_row,  # block-table row of this request
    n0,  # first KV position of this tile
    kv_len,  # KV tokens of this request
    row_pos,  # (BLOCK_M,) KV position of each row's query
    stride_cp,  # ckv stride over pages
    stride_cs,  # ckv stride over slots
    stride_pp,  # kpe stride over pages
    stride_ps,  # kpe stride over slots
    qk_scale,  # sm_scale * log2 e
    MASK: tl.constexpr,  # apply the length / causal masks in this tile
    CAUSAL: tl.constexpr,  # causal mask
    PAGE_SIZE: tl.constexpr,  # tokens per page
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    HEAD_DIM: tl.constexpr,  # Dc
    HEAD_DIM_PE: tl.constexpr,  # Dr
):
    tok = n0 + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, HEAD_DIM_PE)
    in_len = tok < kv_len
    if MASK:  # slots past the request's length may hold anything (NaN): never loaded
        page = tl.load(bt_row + tok // PAGE_SIZE, mask=in_len, other=0).to(tl.int64)
    else:
        page = tl.load(bt_row + tok // PAGE_SIZE).to(tl.int64)
    slot = tok % PAGE_SIZE
    c_rows = page * stride_cp + slot * stride_cs
    p_rows = page * stride_pp + slot * stride_ps
    if MASK:
        ckv = tl.load(ckv_ptr + c_rows[:, None] + offs_c[None, :], mask=in_len[:, None], other=0.0)
        kpe = tl.load(kpe_ptr + p_rows[:, None] + offs_r[None, :], mask=in_len[:, None], other=0.0)
    else:
        ckv = tl.load(ckv_ptr + c_rows[:, None] + offs_c[None, :])
        kpe = tl.load(kpe_ptr + p_rows[:, None] + offs_r[None, :])
    ckv = ckv.to(qn.dtype)
    s = tl.dot(qn, tl.trans(ckv))
    s = tl.dot(qp, tl.trans(kpe.to(qn.dtype)), s) * qk_scale
    if MASK:
        keep = in_len[None, :]
        if CAUSAL:
            keep = keep & (tok[None, :] <= row_pos[:, None])
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(qn.dtype), ckv, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _mla_prefill_kernel(
    qn_ptr,  # (Tq, H, Dc) q_nope, packed by qo_indptr
    qp_ptr,  # (Tq, H, Dr) q_pe
    ckv_ptr,  # (P, S, Dc) latent pages
    kpe_ptr,  # (P, S, Dr) rope-key pages
    qo_indptr_ptr,  # (B+1,) int32 query offsets
    block_table_ptr,  # (B, max_pages) int32
    seq_lens_ptr,  # (B,) int32 KV lengths
    o_ptr,  # (Tq, H, Dc) output, q's dtype
    lse_ptr,  # (Tq, H) float32 natural-log LSE (RETURN_LSE only)
    stride_qnt,  # q_nope stride over tokens
    stride_qnh,  # q_nope stride over heads
    stride_qpt,  # q_pe stride over tokens
    stride_qph,  # q_pe stride over heads
    stride_cp,  # ckv stride over pages
    stride_cs,  # ckv stride over slots
    stride_pp,  # kpe stride over pages
    stride_ps,  # kpe stride over slots
    stride_bt,  # block_table row stride
    stride_ot,  # out stride over tokens
    stride_oh,  # out stride over heads
    stride_lt,  # lse stride over tokens
    stride_lh,  # lse stride over heads
    qk_scale,  # sm_scale * log2 e
    batch,  # requests B
    HEADS: tl.constexpr,  # query heads H (rows per token)
    BLOCK_M: tl.constexpr,  # packed (token, head) rows per program
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    HEAD_DIM: tl.constexpr,  # Dc (latent dim, a power of two)
    HEAD_DIM_PE: tl.constexpr,  # Dr (rope dim, a power of two)
    PAGE_SIZE: tl.constexpr,  # tokens per page
    CAUSAL: tl.constexpr,  # causal mask
    RETURN_LSE: tl.constexpr,  # write lse
    LOG_B: tl.constexpr,  # binary-search steps, >= log2(B) + 1
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
):
    slot_id = tl.program_id(0)
    # request of this slot: the last b with start(b) <= slot_id
    lo = 0
    hi = batch
    for _ in tl.static_range(LOG_B):
        mid = (lo + hi) // 2
        go = tl.load(qo_indptr_ptr + mid) * HEADS // BLOCK_M + mid <= slot_id
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    b = lo
    q_start = tl.load(qo_indptr_ptr + b)
    q_end = tl.load(qo_indptr_ptr + b + 1)
    qo_len = q_end - q_start
    first_slot = q_start * HEADS // BLOCK_M + b
    n_slots = (q_end * HEADS // BLOCK_M + b + 1) - first_slot
    tile = n_slots - 1 - (slot_id - first_slot)  # heavy (late causal) tiles first
    rows = qo_len * HEADS
    if tile * BLOCK_M < rows:
        kv_len = tl.load(seq_lens_ptr + b)
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < rows
        tok_q = offs_m // HEADS
        head = offs_m % HEADS
        row_pos = kv_len - qo_len + tok_q
        offs_c = tl.arange(0, HEAD_DIM)
        offs_r = tl.arange(0, HEAD_DIM_PE)
        tok64 = (q_start + tok_q).to(tl.int64)
        qn = tl.load(qn_ptr + (tok64 * stride_qnt + head * stride_qnh)[:, None] + offs_c[None, :], mask=mask_m[:, None],
                     other=0.0)
        qp = tl.load(qp_ptr + (tok64 * stride_qpt + head * stride_qph)[:, None] + offs_r[None, :], mask=mask_m[:, None],
                     other=0.0)
        if DOT_FP32:
            qn = qn.to(tl.float32)
            qp = qp.to(tl.float32)

        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile keeps alpha finite
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        last_row = tl.minimum(tile * BLOCK_M + BLOCK_M, rows) - 1
        pos_first = kv_len - qo_len + (tile * BLOCK_M) // HEADS
        pos_last = kv_len - qo_len + last_row // HEADS
        end = kv_len
        full_hi = kv_len
        if CAUSAL:
            end = tl.minimum(kv_len, pos_last + 1)
            full_hi = tl.minimum(kv_len, pos_first + 1)
        full_hi = tl.maximum(full_hi, 0) // BLOCK_N * BLOCK_N
        bt_row = block_table_ptr + b.to(tl.int64) * stride_bt  # type: ignore[attr-defined]  # b: a Triton scalar
        for n0 in range(0, full_hi, BLOCK_N):
            acc, m_i, l_i = _latent_tile(acc, m_i, l_i, qn, qp, ckv_ptr, kpe_ptr, bt_row, n0, kv_len, row_pos,
                                         stride_cp, stride_cs, stride_pp, stride_ps, qk_scale, False, CAUSAL,
                                         PAGE_SIZE, BLOCK_N, HEAD_DIM, HEAD_DIM_PE)
        for n0 in range(full_hi, end, BLOCK_N):
            acc, m_i, l_i = _latent_tile(acc, m_i, l_i, qn, qp, ckv_ptr, kpe_ptr, bt_row, n0, kv_len, row_pos,
                                         stride_cp, stride_cs, stride_pp, stride_ps, qk_scale, True, CAUSAL,
                                         PAGE_SIZE, BLOCK_N, HEAD_DIM, HEAD_DIM_PE)

        empty = l_i == 0.0
        out = acc * (1.0 / tl.where(empty, 1.0, l_i))[:, None]
        o_rows = tok64 * stride_ot + head * stride_oh
        tl.store(o_ptr + o_rows[:, None] + offs_c[None, :], out.to(o_ptr.dtype.element_ty), mask=mask_m[:, None])
        if RETURN_LSE:
            lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
            tl.store(lse_ptr + tok64 * stride_lt + head * stride_lh, lse, mask=mask_m)


class MLAPrefillConfig(NamedTuple):
    """Static launch choices of the MLA prefill kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    #: interpreter: float32 dot operands for bf16 inputs (its bf16 tl.dot is wrong; fp16 runs natively)
    dot_fp32: bool


@functools.lru_cache(maxsize=16)
def mla_prefill_config(device: torch.device) -> MLAPrefillConfig:
    """Tiles for MLA prefill on ``device``: the MLA decode kernel's shapes (64 rows x 64 keys in two stages on Hopper,
    ~216 KB of shared memory with the query tile; 32 x 32 in one stage on Ampere). They depend on the device only,
    never on the batch."""
    if interpreting():
        return MLAPrefillConfig(16, 16, 1, 1, True)
    if cc_major(device) >= 9:
        return MLAPrefillConfig(64, 64, 8, 2, False)
    return MLAPrefillConfig(32, 32, 8, 1, False)


def launch_mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, qo_indptr: torch.Tensor, ckv: torch.Tensor,
                       kpe: torch.Tensor, table: Any, sm_scale: float, causal: bool, out: torch.Tensor,
                       lse: torch.Tensor | None, cfg: MLAPrefillConfig) -> None:
    """Launch the MLA prefill kernel over the whole batch (one launch, no host synchronisation)."""
    tq, heads, dc = q_nope.shape
    if tq == 0:
        return
    batch = qo_indptr.shape[0] - 1
    bt = table.block_table
    lse_t = lse if lse is not None else out
    slots = tq * heads // cfg.block_m + batch
    _mla_prefill_kernel[(slots,)](
        q_nope, q_pe, ckv, kpe, qo_indptr, bt, table.seq_lens, out, lse_t,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1), bt.stride(0),
        out.stride(0), out.stride(1), lse_t.stride(0), lse_t.stride(1), sm_scale * LOG2E, batch,
        HEADS=heads, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=dc, HEAD_DIM_PE=q_pe.shape[2],
        PAGE_SIZE=ckv.shape[1], CAUSAL=causal, RETURN_LSE=lse is not None, LOG_B=max(1, batch.bit_length()),
        DOT_FP32=cfg.dot_fp32 and q_nope.dtype == torch.bfloat16, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


class MLAPrefillRunner:
    """``Kernel.plan`` of the MLA prefill kernel: the launch configuration for a table and ``qo_indptr``; ``run``
    only launches (no host synchronisation; it allocates only the outputs it is not given), so it can be captured
    in a CUDA graph, and one runner serves every layer of a step."""

    def __init__(self, problem: Any, table: Any, p: Any, *, qo_indptr: torch.Tensor, **_: Any) -> None:
        self.table, self.p, self.qo_indptr = table, p, qo_indptr
        self.cfg = mla_prefill_config(table.block_table.device)

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
            out: torch.Tensor | None, lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = buffers(out, lse, q_nope, q_nope.shape[:2], q_nope.shape[2], self.p.return_lse)
        launch_mla_prefill(q_nope, q_pe, self.qo_indptr, ckv_pages, kpe_pages, self.table, self.p.sm_scale,
                           self.p.causal, out, lse, self.cfg)
        return out, lse


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, qo_indptr: torch.Tensor, ckv_pages: torch.Tensor,
                kpe_pages: torch.Tensor, table: Any, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``attention.mla_prefill`` kernel: q_nope (Tq, H, Dc), q_pe (Tq, H, Dr) -> out (Tq, H, Dc), lse (Tq, H)."""
    runner = MLAPrefillRunner(None, table, p, qo_indptr=qo_indptr)
    return runner.run(q_nope, q_pe, ckv_pages, kpe_pages, None, None)
