"""Absorbed multi-head latent attention (MLA) decode over paged latent KV, split-KV.

Each program takes ``BLOCK_H`` query heads of one request and one KV split; every latent tile
``ckv (BLOCK_N, Dc)`` serves as K (with ``kpe (BLOCK_N, Dr)``) and as V. Head tiles of the same
request and split are adjacent in launch order (grid dim 0), so a latent tile read from HBM by
one is found in L2 by the others. Partials are merged by the decode merge kernel.

Two kernels: ``_mla_split_kernel`` gathers tiles with pointer loads (any page size);
``_mla_tma_kernel`` loads whole page tiles with TMA (Hopper, tiles that never cross a page), so the loads
run asynchronously ahead of the dots and no address tensors occupy registers.

Compute bound at 128 heads (~240 FLOP per KV byte): Triton lays out the score dot, whose result feeds the PV
dot, with every warp along M, so with 64 heads and 8 warps both warpgroups compute the whole score tile (the
PV dot splits the 512 outputs between them and each needs all of P). Passing P through an L2 scratch behind a
CTA barrier gives each warpgroup half of the score tile but ran slower on the H200.
On Hopper the default is therefore Gluon with explicit layouts (``MLAConfig.gluon``): ``_mla_gluon_ws``, where
warp-specialised warpgroups take whole score tiles in turn (``gluon_ws``), else ``_mla_gluon``, the same tiles
split between both warpgroups. At 128 heads the warp-specialised kernel is the fastest of the three on the H200,
close to FlashInfer's MLA decode (docs/benchmarks.md); this module's Triton kernels serve where Gluon cannot run.
FlashMLA's paired-tile ("seesaw") schedule ran slower than the default on Hopper and is not offered.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernel_switchboard.ops.attention_runner import buffers

from ._attn_common import LOG2E, cc_major, choose_splits, interpreting, resident_ctas, sm_count
from ._common import gluon_clusters, gluon_hopper, has_tma, row_major_for_tma
from ._decode import launch_merge_splits, round_len


@triton.jit
def _split_bounds(seq_lens_ptr, b, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Token range [start, end) of one KV split of request ``b``; splits take whole BLOCK_N tiles."""
    seq_len = tl.load(seq_lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    return start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _finish(m_i, l_i):
    """(1 / l, natural-log LSE) of an online-softmax state (log2 domain); an empty one gives (1, -inf)."""
    empty = l_i == 0.0
    safe = tl.where(empty, 1.0, l_i)
    return 1.0 / safe, tl.where(empty, float("-inf"), (m_i + tl.log2(safe)) * 0.6931471805599453)


@triton.jit
def _mla_split_kernel(
    qn_ptr,  # (B, H, Dc) q_nope
    qp_ptr,  # (B, H, Dr) q_pe
    ckv_ptr,  # (P, S, Dc) latent pages
    kpe_ptr,  # (P, S, Dr) rope-key pages
    block_table_ptr,  # (B, max_pages) int32
    seq_lens_ptr,  # (B,) int32
    o_ptr,  # out: (B, H, Dc) final when NUM_SPLITS == 1, else float32 partials (B, H, NUM_SPLITS, Dc)
    lse_ptr,  # float32 natural-log LSE: (B, H) or partials (B, H, NUM_SPLITS)
    heads,  # H
    stride_qnb,  # q_nope stride over batch
    stride_qnh,  # q_nope stride over heads
    stride_qpb,  # q_pe stride over batch
    stride_qph,  # q_pe stride over heads
    stride_cp,  # ckv stride over pages
    stride_cs,  # ckv stride over slots
    stride_pp,  # kpe stride over pages
    stride_ps,  # kpe stride over slots
    stride_bt,  # block_table row stride
    stride_ob,  # out stride over batch
    stride_oh,  # out stride over heads
    stride_os,  # out stride over splits
    stride_lb,  # lse stride over batch
    stride_lh,  # lse stride over heads (split stride 1)
    qk_scale,  # sm_scale * log2 e
    HEAD_DIM: tl.constexpr,  # Dc (latent dim, 512)
    HEAD_DIM_PE: tl.constexpr,  # Dr (rope dim, 64)
    BLOCK_H: tl.constexpr,  # heads per program (>= 16)
    PAGE_SIZE: tl.constexpr,  # tokens per page
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    NUM_SPLITS: tl.constexpr,  # KV splits per request (grid dim 2)
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
):
    offs_h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    b = tl.program_id(1)
    split = tl.program_id(2)
    start, end = _split_bounds(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)

    offs_c = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, HEAD_DIM_PE)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < heads
    qn = tl.load(qn_ptr + b.to(tl.int64) * stride_qnb + offs_h[:, None] * stride_qnh + offs_c[None, :],
                 mask=mask_h[:, None], other=0.0)
    qp = tl.load(qp_ptr + b.to(tl.int64) * stride_qpb + offs_h[:, None] * stride_qph + offs_r[None, :],
                 mask=mask_h[:, None], other=0.0)
    if DOT_FP32:
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    bt_row = block_table_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        mask_n = tok < end
        page = tl.load(bt_row + tok // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        slot = tok % PAGE_SIZE
        ckv = tl.load(ckv_ptr + (page * stride_cp + slot * stride_cs)[:, None] + offs_c[None, :],
                      mask=mask_n[:, None], other=0.0).to(qn.dtype)
        kpe = tl.load(kpe_ptr + (page * stride_pp + slot * stride_ps)[:, None] + offs_r[None, :],
                      mask=mask_n[:, None], other=0.0).to(qn.dtype)
        s = tl.dot(qn, tl.trans(ckv))
        s += tl.dot(qp, tl.trans(kpe))
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(qn.dtype), ckv)
        m_i = m_new

    inv_l, lse = _finish(m_i, l_i)
    tl.store(o_ptr + b.to(tl.int64) * stride_ob + offs_h[:, None] * stride_oh + split * stride_os + offs_c[None, :],
             (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty), mask=mask_h[:, None])
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + offs_h * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _mla_tma_step(qn, qp, ckv_desc, kpe_desc, row, valid, m_i, l_i, acc, qk_scale,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """One latent tile (rows ``row .. row+BLOCK_N`` of the flattened pages) of the online softmax.

    MASKED: only the first ``valid`` rows are keys; the rest (unwritten slots, possibly NaN) are zeroed.
    """
    ckv = ckv_desc.load([row, 0]).to(qn.dtype)
    pe = kpe_desc.load([row, 0]).to(qn.dtype)
    if MASKED:
        keep = tl.arange(0, BLOCK_N) < valid
        ckv = tl.where(keep[:, None], ckv, 0.0)
        pe = tl.where(keep[:, None], pe, 0.0)
    s = tl.dot(qn, tl.trans(ckv))
    s = tl.dot(qp, tl.trans(pe), s) * qk_scale
    if MASKED:
        s = tl.where(keep[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(qn.dtype), ckv, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _mla_tma_kernel(
    qn_ptr,  # (B, H, Dc) q_nope
    qp_ptr,  # (B, H, Dr) q_pe
    ckv_desc,  # TMA descriptor of the latent pages flattened to (P * S, Dc), block (BLOCK_N, Dc)
    kpe_desc,  # TMA descriptor of the rope-key pages flattened to (P * S, Dr), block (BLOCK_N, Dr)
    block_table_ptr,  # (B, max_pages) int32
    seq_lens_ptr,  # (B,) int32
    o_ptr,  # out: (B, H, Dc) final when NUM_SPLITS == 1, else float32 partials (B, H, NUM_SPLITS, Dc)
    lse_ptr,  # float32 natural-log LSE: (B, H) or partials (B, H, NUM_SPLITS)
    heads,  # H
    stride_qnb,  # q_nope stride over batch
    stride_qnh,  # q_nope stride over heads
    stride_qpb,  # q_pe stride over batch
    stride_qph,  # q_pe stride over heads
    stride_bt,  # block_table row stride
    stride_ob,  # out stride over batch
    stride_oh,  # out stride over heads
    stride_os,  # out stride over splits
    stride_lb,  # lse stride over batch
    stride_lh,  # lse stride over heads (split stride 1)
    qk_scale,  # sm_scale * log2 e
    HEAD_DIM: tl.constexpr,  # Dc (latent dim, 512)
    HEAD_DIM_PE: tl.constexpr,  # Dr (rope dim, 64)
    BLOCK_H: tl.constexpr,  # heads per program (>= 16)
    PAGE_SIZE: tl.constexpr,  # tokens per page, a multiple of BLOCK_N
    BLOCK_N: tl.constexpr,  # KV tokens per tile
    NUM_SPLITS: tl.constexpr,  # KV splits per request (grid dim 2)
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
):
    offs_h = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    b = tl.program_id(1)
    split = tl.program_id(2)
    start, end = _split_bounds(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N

    offs_c = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, HEAD_DIM_PE)
    mask_h = offs_h < heads
    qn = tl.load(qn_ptr + b.to(tl.int64) * stride_qnb + offs_h[:, None] * stride_qnh + offs_c[None, :],
                 mask=mask_h[:, None], other=0.0)
    qp = tl.load(qp_ptr + b.to(tl.int64) * stride_qpb + offs_h[:, None] * stride_qph + offs_r[None, :],
                 mask=mask_h[:, None], other=0.0)
    if DOT_FP32:
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    bt_row = block_table_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, full_end, BLOCK_N):
        row = tl.load(bt_row + n0 // PAGE_SIZE) * PAGE_SIZE + n0 % PAGE_SIZE
        m_i, l_i, acc = _mla_tma_step(qn, qp, ckv_desc, kpe_desc, row, BLOCK_N, m_i, l_i, acc, qk_scale, BLOCK_N,
                                      False)
    if full_end < end:
        row = tl.load(bt_row + full_end // PAGE_SIZE) * PAGE_SIZE + full_end % PAGE_SIZE
        m_i, l_i, acc = _mla_tma_step(qn, qp, ckv_desc, kpe_desc, row, end - full_end, m_i, l_i, acc, qk_scale,
                                      BLOCK_N, True)

    inv_l, lse = _finish(m_i, l_i)
    o_rows = o_ptr + b.to(tl.int64) * stride_ob + offs_h[:, None] * stride_oh + split * stride_os
    tl.store(o_rows + offs_c[None, :], (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty), mask=mask_h[:, None])
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + offs_h * stride_lh + split, lse, mask=mask_h)


class MLAConfig(NamedTuple):
    """Static launch choices of one MLA decode shape."""

    block_h: int
    block_n: int
    num_splits: int
    num_warps: int
    num_stages: int
    #: interpreter: float32 dot operands for bf16 inputs (its bf16 tl.dot is wrong; fp16 runs natively)
    dot_fp32: bool
    #: load page tiles with TMA where the pages allow it (see ``_tma_descriptors``)
    tma: bool = False
    #: a Gluon kernel where TMA can load the pages: Hopper (sm_90 wgmma), 64 heads x 64-key tiles
    gluon: bool = False
    #: with ``gluon``: the warp-specialised ``_mla_gluon_ws`` (the default), else ``_mla_gluon``
    gluon_ws: bool = False
    #: with ``gluon_ws``: 2-CTA clusters of 128 heads, each latent tile loaded once into both CTAs (TMA multicast;
    #: Triton >= 3.9). Off by default: correct on the H200 but slightly slower than one CTA at 128 heads
    cluster: bool = False


@functools.lru_cache(maxsize=512)
def mla_config(device: torch.device, batch: int, heads: int, kv_len: int, page_size: int,
               num_splits: int | None = None) -> MLAConfig:
    """Tiles and split count for an MLA decode shape (``kv_len``: the longest KV length, rounded)."""
    if interpreting():
        splits = num_splits or (2 if kv_len > 32 else 1)
        return MLAConfig(16, 16, splits, 1, 1, True, True)
    hopper = cc_major(device) >= 9
    # sm_90: 64 heads per program run the dots on wgmma; below 64 rows Triton falls back to mma.sync and
    # every latent tile is re-read more often. Two stages of 64-token tiles (216 KB of shared memory with
    # the queries) let the next tile's loads (TMA where pages allow) run under this tile's dots: on the H200, TMA
    # with two stages beat one stage, pointer loads, 32-token tiles and 32-head tiles, and the Gluon kernels beat
    # them all. Fewer than 64 heads (DeepSeek-V3 on 8-way tensor parallelism has 16) take the Gluon kernel's 64-row
    # tiles too, rows past the heads computed on zero queries and never stored: about 1.45x the 16-row tiles on
    # mma.sync, on a par with FlashInfer. The Gluon kernels load 64-token tiles with TMA: pages of a multiple of 64
    # tokens.
    gluon = gluon_hopper(device) and page_size % 64 == 0
    block_h = 64 if gluon or (hopper and heads >= 64) else (32 if heads >= 32 else 16)
    block_n, warps, stages = (64, 8, 2) if hopper else (32, 8, 1)
    if num_splits is None:
        smem = stages * block_n * (512 + 64) * 2 + block_h * (512 + 64) * 2
        slots = sm_count(device) * resident_ctas(device, smem, warps, 255 if block_h == 64 else 192)
        num_splits = choose_splits(batch * triton.cdiv(heads, block_h), kv_len, block_n, slots)
    return MLAConfig(block_h, block_n, num_splits, warps, stages, False, has_tma(device), gluon, gluon)


def _flat_rows(ckv: torch.Tensor, kpe: torch.Tensor, cfg: MLAConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The pages flattened to token rows, (P * S, Dc) and (P * S, Dr), when TMA tiles can load them: None when a
    tile would cross a page, Dc is not a power of two (a whole latent row is one tile), or TMA cannot describe
    the pages' strides."""
    pages, page_size, dc = ckv.shape
    if not cfg.tma or page_size % cfg.block_n or dc & (dc - 1) or not has_tma(ckv.device):
        return None
    rows = []
    for t in (ckv, kpe):
        if t.stride(2) != 1 or t.stride(0) != page_size * t.stride(1):
            return None
        flat = t.as_strided((pages * page_size, t.shape[2]), (t.stride(1), 1))
        if not row_major_for_tma(flat):
            return None
        rows.append(flat)
    return rows[0], rows[1]


def _tma_descriptors(ckv: torch.Tensor, kpe: torch.Tensor, cfg: MLAConfig) -> tuple[Any, Any] | None:
    """TMA descriptors of :func:`_flat_rows`, block (BLOCK_N, D), or None."""
    rows = _flat_rows(ckv, kpe, cfg)
    if rows is None:
        return None
    return (TensorDescriptor.from_tensor(rows[0], [cfg.block_n, ckv.shape[2]]),
            TensorDescriptor.from_tensor(rows[1], [cfg.block_n, kpe.shape[2]]))


class PageOperands(NamedTuple):
    """How a launch reads one pair of page tensors: a Gluon kernel's TMA descriptors (``gluon``) and its launch
    function (``gluon_launch``), else the Triton TMA kernel's descriptors (``tma``), else neither (pointer
    gathers)."""

    gluon: tuple[Any, Any] | None
    gluon_launch: Any
    tma: tuple[Any, Any] | None


def page_operands(ckv: torch.Tensor, kpe: torch.Tensor, cfg: MLAConfig) -> PageOperands:
    """The :class:`PageOperands` of ``ckv`` / ``kpe`` for the kernels ``cfg`` names."""
    rows = _flat_rows(ckv, kpe, cfg) if cfg.gluon else None  # None: pages TMA cannot load, the Triton kernels
    if rows is None:
        return PageOperands(None, None, _tma_descriptors(ckv, kpe, cfg))
    from . import _mla_gluon, _mla_gluon_ws

    if cfg.gluon_ws:
        ctas = 2 if cfg.cluster else 1
        return PageOperands(_mla_gluon_ws.descriptors(rows[0], rows[1], ctas),
                            functools.partial(_mla_gluon_ws.launch, ctas=ctas), None)
    return PageOperands(_mla_gluon.descriptors(rows[0], rows[1]), _mla_gluon.launch, None)


def check_config(cfg: MLAConfig) -> None:
    """Refuse a configuration no kernel here launches."""
    if (cfg.gluon and (cfg.block_h, cfg.block_n) != (64, 64)) or (cfg.gluon_ws and not cfg.gluon):
        raise ValueError(f"launch_mla: the Gluon kernels take 64 heads x 64-key tiles (gluon_ws only with gluon), "
                         f"got {cfg}")
    if cfg.cluster and not (cfg.gluon_ws and gluon_clusters()):
        raise ValueError(f"launch_mla: cluster=True needs gluon_ws and Triton >= 3.9 (have {triton.__version__}), "
                         f"got {cfg}")


def launch_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor, table: Any,
               sm_scale: float, out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor | None,
               part_lse: torch.Tensor | None, cfg: MLAConfig, operands: PageOperands | None = None) -> None:
    """Launch the MLA split kernel (and the merge when there are several splits); ``operands``: the pages'
    :func:`page_operands` for ``cfg`` when the caller keeps them (made here otherwise)."""
    batch, heads, dc = q_nope.shape
    splits = cfg.num_splits
    if splits == 1:
        o, lp, oss = out, lse, 0
    elif part_out is None or part_lse is None:
        raise ValueError(f"launch_mla: {splits} splits need the partial buffers part_out and part_lse")
    else:
        o, lp, oss = part_out, part_lse, part_out.stride(2)
    if operands is None:
        check_config(cfg)
        operands = page_operands(ckv, kpe, cfg)
    bt = table.block_table
    if operands.gluon is not None:
        operands.gluon_launch(q_nope, q_pe, *operands.gluon, bt, table.seq_lens, ckv.shape[1], o, lp, oss, splits,
                              sm_scale * LOG2E)
    else:
        grid = (-(-heads // cfg.block_h), batch, splits)
        shared = dict(HEAD_DIM=dc, HEAD_DIM_PE=q_pe.shape[2], BLOCK_H=cfg.block_h, PAGE_SIZE=ckv.shape[1],
                      BLOCK_N=cfg.block_n, NUM_SPLITS=splits,
                      DOT_FP32=cfg.dot_fp32 and q_nope.dtype == torch.bfloat16, num_warps=cfg.num_warps,
                      num_stages=cfg.num_stages)
        if operands.tma is not None:
            _mla_tma_kernel[grid](
                q_nope, q_pe, *operands.tma, bt, table.seq_lens, o, lp, heads,
                q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), bt.stride(0),
                o.stride(0), o.stride(1), oss, lp.stride(0), lp.stride(1), sm_scale * LOG2E, **shared)
        else:
            _mla_split_kernel[grid](
                q_nope, q_pe, ckv, kpe, bt, table.seq_lens, o, lp, heads,
                q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
                ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1), bt.stride(0),
                o.stride(0), o.stride(1), oss, lp.stride(0), lp.stride(1), sm_scale * LOG2E, **shared)
    if splits > 1:
        launch_merge_splits(o, lp, out, lse)


class MLAPlan:
    """An MLA decode launch prepared once for a table: the split schedule (``cfg``) and its workspace.

    ``run(q_nope, q_pe, ckv_pages, kpe_pages, out, lse)`` only launches (no host synchronisation, no allocation),
    so it can be captured in a CUDA graph; one plan serves every layer of a step. It writes ``out`` (B, H, Dc) and
    ``lse`` (B, H) float32 (default: the plan's own scratch).

    The TMA descriptors of each layer's pages are made at its first run and kept by the plan (keyed by the pages'
    address, shape, strides and dtype; at most ``MAX_PAGE_OPERANDS`` pairs): a decode step runs one plan over every
    layer, and remaking them cost more host time per run than the rest of the launch. The plan thereby keeps those
    page tensors alive while it lives, as it keeps its table."""

    MAX_PAGE_OPERANDS = 256

    def __init__(self, table: Any, heads: int, dc: int, page_size: int, sm_scale: float, max_kv_len: int,
                 cfg: MLAConfig | None = None) -> None:
        device = table.block_table.device
        batch = table.block_table.shape[0]
        self.table, self.sm_scale = table, sm_scale
        self.cfg = cfg or mla_config(device, batch, heads, round_len(max_kv_len), page_size)
        check_config(self.cfg)
        s = self.cfg.num_splits
        self.lse_scratch = torch.empty(batch, heads, device=device, dtype=torch.float32)
        self.part_out = torch.empty(batch, heads, s, dc, device=device, dtype=torch.float32) if s > 1 else None
        self.part_lse = torch.empty(batch, heads, s, device=device, dtype=torch.float32) if s > 1 else None
        self._operands: dict[tuple[Any, ...], PageOperands] = {}

    def operands(self, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor) -> PageOperands:
        """The :func:`page_operands` of these pages, made once per pair of page tensors."""
        key = (ckv_pages.data_ptr(), kpe_pages.data_ptr(), ckv_pages.dtype, kpe_pages.dtype, ckv_pages.shape,
               kpe_pages.shape, ckv_pages.stride(), kpe_pages.stride())
        found = self._operands.get(key)
        if found is None:
            if len(self._operands) >= self.MAX_PAGE_OPERANDS:
                self._operands.clear()
            found = self._operands[key] = page_operands(ckv_pages, kpe_pages, self.cfg)
        return found

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        lse = self.lse_scratch if lse is None else lse
        if q_nope.shape[0]:
            launch_mla(q_nope, q_pe, ckv_pages, kpe_pages, self.table, self.sm_scale, out, lse, self.part_out,
                       self.part_lse, self.cfg, self.operands(ckv_pages, kpe_pages))
        return out, lse


class MLARunner:
    """``Kernel.plan`` of the MLA decode kernel: an :class:`MLAPlan` (the split schedule and workspace for this
    table) whose runs write the given ``out`` / ``lse`` or new ones (the core's runner contract)."""

    def __init__(self, problem: Any, table: Any, p: Any, **_: Any) -> None:
        self.plan = MLAPlan(table, problem.num_q_heads, problem.head_dim, problem.page_size, p.sm_scale, p.max_kv_len,
                            invariant_config(table, problem, p))
        self.want_lse = p.return_lse

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
            out: torch.Tensor | None, lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = buffers(out, lse, q_nope, q_nope.shape[:2], q_nope.shape[2], self.want_lse)
        self.plan.run(q_nope, q_pe, ckv_pages, kpe_pages, out, lse)
        return out, lse


plan_mla = MLARunner


def invariant_config(table: Any, problem: Any, p: Any) -> MLAConfig | None:
    """In the batch-invariant scope (``p.batch_invariant``), one KV split whatever the batch: each (request, head
    tile) streams its whole KV, so its bits depend on the request alone; None otherwise (the split count is
    chosen for the batch)."""
    if not getattr(p, "batch_invariant", False):
        return None
    return mla_config(table.block_table.device, table.block_table.shape[0], problem.num_q_heads,
                      round_len(p.max_kv_len), problem.page_size, 1)


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
               table: Any, p: Any, cfg: MLAConfig | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``attention.mla_decode`` kernel: q_nope (B, H, 512), q_pe (B, H, 64) -> out (B, H, 512), lse (B, H)."""
    if cfg is None and getattr(p, "batch_invariant", False):
        cfg = mla_config(table.block_table.device, q_nope.shape[0], q_nope.shape[1], round_len(p.max_kv_len),
                         ckv_pages.shape[1], 1)
    plan = MLAPlan(table, q_nope.shape[1], q_nope.shape[2], ckv_pages.shape[1], p.sm_scale, p.max_kv_len, cfg)
    out, lse = plan.run(q_nope, q_pe, ckv_pages, kpe_pages, q_nope.new_empty(q_nope.shape))
    return out, (lse if p.return_lse else None)
