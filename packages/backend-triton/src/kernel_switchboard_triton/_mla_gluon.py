"""Absorbed MLA decode in Gluon (Triton's explicit-layout dialect), Hopper, 64 heads x 64 keys per tile.

Why a second kernel: Triton lays the 64 x 64 score tile out with every warp along M (``warpsPerCTA [8, 1]``)
because the score feeds the PV dot, so both warpgroups compute the whole score tile and a third of the tensor-core
time is duplicated. Here the layouts are explicit: each warpgroup computes the scores of half
of the tile's keys (``[4, 2]``, n32) and half of the 512 output columns (``[4, 2]``, n256); P goes through shared
memory between the two. K / V latent tiles arrive by TMA through a ring of ``STAGES`` slots. The scores of the
next tile are issued before this tile's PV MMA, and their softmax runs while that MMA does (FlashAttention-3's
order), so the tensor cores see S(t + 1) and PV(t) back to back.

Used on Hopper when ``MLAConfig.gluon_ws`` is off (the warp-specialised ``_mla_gluon_ws`` is the default; it
shares this module's launch and tile helpers and runs faster on the H200). Max error against the reference
1.2e-4 at B=128 L=8192 H=128 page 64; host ptxas sm_90 (Triton 3.6): 255 registers, no spills, 225 KB of shared
memory.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: TMA loads: Triton 3.6 (the H200 image) names them async_copy_global_to_shared; 3.7+ async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
#: a barrier over the program's warps: thread_barrier in Triton 3.6, barrier in 3.9
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

BLOCK_H = 64  # heads per program: one wgmma M tile per warpgroup
BLOCK_N = 64  # keys per tile
STAGES = 2  # TMA ring slots (224 KB of shared memory with the queries and P)


@gluon.jit
def _split_tiles(seq_lens_ptr, b, split, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr):
    """(start, end, tiles) of KV split ``split`` of request ``b``: splits take whole BLOCK_N tiles."""
    seq_len = gl.load(seq_lens_ptr + b)
    chunk = gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    return start, end, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)


@gluon.jit
def _tile_row(bt_row, token, PAGE_SIZE: gl.constexpr):
    """Row of token ``token`` in the pages flattened to (P * S, D)."""
    return gl.load(bt_row + token // PAGE_SIZE) * PAGE_SIZE + token % PAGE_SIZE


@gluon.jit
def _issue_tile(ckv_desc, kpe_desc, ckv_smem, kpe_smem, ready, tile, start, bt_row, PAGE_SIZE: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA loads of KV tile ``tile`` (tokens start + tile * BLOCK_N ...) into its ring slot."""
    slot = tile % STAGES
    row = _tile_row(bt_row, start + tile * BLOCK_N, PAGE_SIZE)
    bar = ready.index(slot)
    mbarrier.expect(bar, ckv_desc.block_type.nbytes + kpe_desc.block_type.nbytes)
    _tma_load(ckv_desc, [row, 0], bar, ckv_smem.index(slot))
    _tma_load(kpe_desc, [row, 0], bar, kpe_smem.index(slot))


@gluon.jit
def _zero_rows_from(smem, valid, layout: gl.constexpr):
    """Zero the rows >= ``valid`` of a (BLOCK_N, D) tile in shared memory (unwritten slots may hold NaN), 64
    columns at a time (few registers: the output accumulator is live)."""
    COLS: gl.constexpr = 64
    for c in gl.static_range(smem.shape[1] // COLS):
        part = smem.slice(c * COLS, COLS, dim=1)
        t = part.load(layout)
        keep = gl.arange(0, t.shape[0], layout=gl.SliceLayout(1, layout)) < valid
        part.store(gl.where(keep[:, None], t, gl.zeros_like(t)))


@gluon.jit
def _scores(qn_smem, qp_smem, ckv_smem, kpe_smem, ready, s_zero, tile, start, end, qk_scale, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, ld_layout: gl.constexpr, ASYNC: gl.constexpr):
    """Scores of KV tile ``tile`` once its slot landed: (BLOCK_H, BLOCK_N) float32, scaled when not ASYNC; ASYNC
    returns the MMA in flight (unscaled). Rows of a partial tile past the request's end are zeroed first."""
    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), phase=(tile // STAGES) & 1)
    ckv = ckv_smem.index(slot)
    kpe = kpe_smem.index(slot)
    valid = end - (start + tile * BLOCK_N)
    if valid < BLOCK_N:  # the last, partial tile: unwritten slots may hold NaN
        _zero_rows_from(ckv, valid, ld_layout)
        _zero_rows_from(kpe, valid, ld_layout)
        fence_async_shared()
        _cta_barrier()
    s = warpgroup_mma(qn_smem, ckv.permute((1, 0)), s_zero, use_acc=False, is_async=ASYNC)
    s = warpgroup_mma(qp_smem, kpe.permute((1, 0)), s, is_async=ASYNC)
    if not ASYNC:
        s = s * qk_scale
    return s


@gluon.jit
def _softmax_to(p_smem, s, m_i, l_i, start, end, tile, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Online-softmax step of tile ``tile``'s scaled scores: P into ``p_smem`` (both warpgroups' halves in place
    on return); returns (m, l, alpha)."""
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s = gl.where((keys < end - (start + tile * BLOCK_N))[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    p_smem.store(p.to(p_smem.dtype))
    fence_async_shared()
    _cta_barrier()
    return m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def mla_decode_kernel(
    qn_ptr, qp_ptr, ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, o_ptr, lse_ptr, heads,
    stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_bt, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    qk_scale,
    PAGE_SIZE: gl.constexpr,  # tokens per page, a multiple of BLOCK_N
    NUM_SPLITS: gl.constexpr,  # KV splits per request (grid dim 2)
    STAGES: gl.constexpr,  # TMA ring slots
    num_warps: gl.constexpr,  # 8: two warpgroups
):
    """Arguments as ``_mla._mla_tma_kernel``'s (the descriptors are Gluon's, block (64, Dc) and (64, Dr)); 64 heads
    and 64-key tiles per program, fixed."""
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    DC: gl.constexpr = ckv_desc.block_type.shape[1]
    DR: gl.constexpr = kpe_desc.block_type.shape[1]
    BLOCK_H: gl.constexpr = 64
    dtype: gl.constexpr = ckv_desc.dtype
    # scores (BLOCK_H, BLOCK_N): warpgroup w takes keys [w * BLOCK_N / 2, (w + 1) * BLOCK_N / 2)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    # output (BLOCK_H, DC): warpgroup w takes columns [w * DC / 2, (w + 1) * DC / 2)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, DC // 2, 16])
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_h = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    start, end, tiles = _split_tiles(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)
    bt_row = block_table_ptr + b.to(gl.int64) * stride_bt

    # the KV ring first, so its loads run while the queries are staged
    ckv_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DC], ckv_desc.layout)
    kpe_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DR], kpe_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        if i < tiles:
            _issue_tile(ckv_desc, kpe_desc, ckv_smem, kpe_smem, ready, i, start, bt_row, PAGE_SIZE, BLOCK_N, STAGES)

    offs_h = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_layout))
    h_ok = offs_h < heads
    offs_c = gl.arange(0, DC, layout=gl.SliceLayout(0, ld_layout))
    offs_r = gl.arange(0, DR, layout=gl.SliceLayout(0, ld_layout))
    qn = gl.load(qn_ptr + b.to(gl.int64) * stride_qnb + offs_h[:, None] * stride_qnh + offs_c[None, :],
                 mask=h_ok[:, None], other=0.0)
    qp = gl.load(qp_ptr + b.to(gl.int64) * stride_qpb + offs_h[:, None] * stride_qph + offs_r[None, :],
                 mask=h_ok[:, None], other=0.0)
    qn_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DC], gl.NVMMASharedLayout.get_default_for([BLOCK_H, DC], dtype),
                                        qn)
    qp_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, DR], gl.NVMMASharedLayout.get_default_for([BLOCK_H, DR], dtype),
                                        qp)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype))
    fence_async_shared()
    _cta_barrier()

    # Software pipeline (FlashAttention-3's order): while tile t's PV MMA runs, the scores of tile t + 1 are
    # already done and their softmax is computed. The tensor cores run S(t + 1) and PV(t) back to back.
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, DC], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    if tiles > 0:
        s = _scores(qn_smem, qp_smem, ckv_smem, kpe_smem, ready, s_zero, 0, start, end, qk_scale, BLOCK_N, STAGES,
                    ld_layout, False)
        m_i, l_i, alpha = _softmax_to(p_smem, s, m_i, l_i, start, end, 0, BLOCK_N, s_layout)
    for t in range(tiles - 1):
        s_next = _scores(qn_smem, qp_smem, ckv_smem, kpe_smem, ready, s_zero, t + 1, start, end, qk_scale, BLOCK_N,
                         STAGES, ld_layout, True)
        pv = warpgroup_mma(p_smem, ckv_smem.index(t % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))  # S(t + 1) done; PV(t) may still run
        s = s * qk_scale
        keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where((keys < end - (start + (t + 1) * BLOCK_N))[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
        _cta_barrier()  # both warpgroups are done with P(t) and with tile t's slot
        if t + STAGES < tiles:
            _issue_tile(ckv_desc, kpe_desc, ckv_smem, kpe_smem, ready, t + STAGES, start, bt_row, PAGE_SIZE,
                        BLOCK_N, STAGES)
        p_smem.store(p.to(dtype))
        fence_async_shared()
        _cta_barrier()  # both halves of P(t + 1) are in place
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    if tiles > 0:
        acc = warpgroup_mma(p_smem, ckv_smem.index((tiles - 1) % STAGES), acc)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    empty = l_i == 0.0
    safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(safe)) * 0.6931471805599453)
    out = acc * gl.convert_layout(1.0 / safe, row_o)[:, None]
    oh = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    oc = gl.arange(0, DC, layout=gl.SliceLayout(0, o_layout))
    o_rows = o_ptr + b.to(gl.int64) * stride_ob + oh[:, None] * stride_oh + split * stride_os
    gl.store(o_rows + oc[None, :], out.to(o_ptr.dtype.element_ty), mask=(oh < heads)[:, None])
    lh = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    gl.store(lse_ptr + b.to(gl.int64) * stride_lb + lh * stride_lh + split, lse, mask=lh < heads)


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@functools.lru_cache(maxsize=64)
def _smem_layout(cols: int, dtype: torch.dtype, ctas: int = 1) -> Any:
    """The shared-memory layout of a (BLOCK_N, cols) TMA block (built once: it is on every call's host path); with
    ``ctas`` 2, whole in each CTA of the cluster (a multicast load's destination)."""
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, cols], _GL_DTYPES[dtype])
    return layout if ctas == 1 else dataclasses.replace(layout, cga_layout=[[0, 0]])


def descriptors(ckv_rows: torch.Tensor, kpe_rows: torch.Tensor, ckv_cols: int | None = None,
                ctas: int = 1) -> tuple[TensorDescriptor, TensorDescriptor]:
    """Gluon TMA descriptors of the pages flattened to token rows, (P * S, Dc) and (P * S, Dr); a latent block
    is ``ckv_cols`` columns wide (default: the whole row), for programs of ``ctas`` CTAs."""
    cols = ckv_cols or ckv_rows.shape[1]
    dr = kpe_rows.shape[1]
    return (TensorDescriptor.from_tensor(ckv_rows, [BLOCK_N, cols], _smem_layout(cols, ckv_rows.dtype, ctas)),
            TensorDescriptor.from_tensor(kpe_rows, [BLOCK_N, dr], _smem_layout(dr, kpe_rows.dtype, ctas)))


def launch(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_desc: TensorDescriptor, kpe_desc: TensorDescriptor,
           block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, o: torch.Tensor, lse: torch.Tensor,
           stride_os: int, splits: int, qk_scale: float, kernel: Any = None, ctas: int = 1, **options: Any) -> None:
    """One launch over (head blocks, batch, splits) reading the pages through :func:`descriptors`; o / lse as in
    ``_mla._mla_tma_kernel``. ``kernel``, ``ctas`` and ``options``: another Gluon kernel with this argument list
    (``_mla_gluon_ws``), the CTAs of its programs (a cluster, ``BLOCK_H`` heads each) and its launch options."""
    batch, heads, _ = q_nope.shape
    grid = (-(-heads // (BLOCK_H * ctas)), batch, splits)
    if kernel is None:
        kernel, options = mla_decode_kernel, {"STAGES": STAGES, "num_warps": 8}
    if ctas > 1:
        options["num_ctas"] = ctas
    qs, ps, os_, ls = q_nope.stride(), q_pe.stride(), o.stride(), lse.stride()
    kernel[grid](
        q_nope, q_pe, ckv_desc, kpe_desc, block_table, seq_lens, o, lse, heads,
        qs[0], qs[1], ps[0], ps[1], block_table.stride(0), os_[0], os_[1], stride_os, ls[0], ls[1], qk_scale,
        PAGE_SIZE=page_size, NUM_SPLITS=splits, **options)
