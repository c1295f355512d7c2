"""Absorbed MLA decode in Gluon with warp-specialised partitions (FlashMLA's "seesaw"), Hopper, 64 heads per CTA.

Why a third kernel: in ``_mla_gluon`` both warpgroups compute half of every score tile (m64n32 wgmma, which reads
three bytes of shared memory per 32 MACs and runs at about two-thirds of the tensor-core rate on Hopper) and meet at
two CTA barriers per tile. Here the two consumer warpgroups take the score tiles in turn: warpgroup ``t % 2``
computes tile ``t``'s whole 64 x 64 scores (m64n64), its online softmax, and publishes P and the row statistics
through shared memory; both then multiply P by their half of the 512 latent columns (the owner with P in registers).
While one runs its softmax the other's MMAs run. A one-warp loader partition fills a two-slot TMA ring (and zeroes
the rows of a partial last tile past the request's end, which may hold NaN), so no CTA barrier is left in the loop.

The schedule is set by the ring: with the queries, two 72 KB tiles fill shared memory, so tile t + 2 can load only
once both warpgroups are done with tile t. Each warpgroup therefore multiplies the other's tile t - 1 first (its
PV MMA is issued before this tile's scores, and its half of that tile is released when it is done, before this
tile's softmax). Each part of a slot is released on its own (k_pe once the owner's scores are done, each latent
half once its warpgroup's PV is), and the loader refills each part as soon as it is free. A tile arrives in five
pieces (k_pe, then four 128-column latent pieces of two 64-column TMA boxes), each on its own barrier, and the
score MMAs take them in that order as they land (FlashMLA's fine-grained pipelining). Each piece's barrier pair is
its own allocation (the compiler syncs the warpgroup's warps between waits on one allocation), and one loop body
serves every tile: warpgroup 0's first tile folds in a stand-in for "the other's tile -1", and the loop runs one
step further when the split's last tile is the other's (a copy of the body less to compile).

The default MLA decode on Hopper where TMA can load the pages (``_mla.mla_config`` sets ``MLAConfig.gluon_ws``).
On the H200 (B=128 L=8192 H=128 page 64) it runs within a few percent of FlashInfer's MLA decode, eager and in CUDA
graphs; the per-piece barriers and the single loop body made it faster than one barrier allocation and one release
per slot with separate first and last tiles. Host ptxas sm_90 (Triton 3.6): 168 registers at launch, 232 per
consumer warpgroup, no spills, no injected wgmma wait, 225 KB of shared memory.

What bounds it: not DRAM (it is as fast with the tiles L2-resident); the two head-block programs of a request each
read every tile from L2 (twice the KV bytes in L2 reads), and the loop still waits about a fifth of its time for
tile pieces. Issuing each warpgroup's scores before the other's P (so a softmax never idles the tensor cores) is
faster only when loads are short: on a two-slot ring it delays the next tile's loads.

``CTAS=2`` (``MLAConfig.cluster``, Triton >= 3.9) is meant to halve those L2 reads: a 2-CTA cluster takes 128
heads, 64 per CTA (each CTA runs the code above on its rows: the layouts split the heads with CGA bases), and every
latent box is loaded once into both CTAs by a TMA multicast that CTA 0 issues. The ring's "free" barriers live in
CTA 0, where both CTAs' consumers arrive; each CTA's loader posts the bytes of its own ready barriers, the other
CTA's after its consumers have seen the slot's previous tile (the bytes may land first: the phase stays open until
then). Host ptxas sm_90 (Triton 3.9): 168 registers, 225 KB of shared memory per CTA, as with one CTA, and 184
bytes of spills (148 for one CTA: Triton 3.9 runs ptxas with ``--regAllocOptLevel=2``; 3.6 and 3.7 spill nothing).
On the H200 (Triton 3.9) it is correct but slightly slower than the one-CTA kernel at B=128 L=8192 H=128, and its
first call compiles for about twice as long: the one-CTA kernel is not waiting on L2. Off by default; kept for
experiments (``MLAConfig(cluster=True)``).
"""

from __future__ import annotations

from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from . import _mla_gluon
from ._mla_gluon import _split_tiles, _tile_row, _tma_load

#: Triton 3.6 (the H200 image) names a shared-memory view's retyping ``_reinterpret``, 3.7+ ``reinterpret``
_REINTERPRET_IS_PRIVATE = gl.constexpr(not hasattr(gl.shared_memory_descriptor, "reinterpret"))
#: latent columns per TMA box (the 128-byte swizzle's width in bf16)
BOX_COLS = 64
#: latent columns per ready barrier: the score MMAs start as each such piece lands (two 64-column TMA boxes)
PIECE_COLS = 128


@gluon.constexpr_function
def _cga(ctas: int, split_dim: int | None, rank: int) -> list[list[int]]:
    """CGA bases of a rank-``rank`` tensor in a program of ``ctas`` CTAs (1 or 2): halved along ``split_dim``
    between the two, or whole in each when ``split_dim`` is None; none for one CTA."""
    return [[int(d == split_dim) for d in range(rank)]] if ctas > 1 else []


@gluon.constexpr_function
def _on_ctas(layout: Any, bases: list[list[int]]) -> Any:
    """``layout`` shared by a cluster's CTAs as ``bases`` say; ``layout`` itself without bases (one CTA: Triton
    3.6's layouts have no ``cga_layout``). (Rebuilt from its fields: Triton's jit rejects ``dataclasses.replace``
    in a constexpr function.)"""
    return layout.__class__(**{**layout.__dict__, "cga_layout": bases}) if bases else layout


@gluon.constexpr_function
def _barrier_layout(ctas: int, shared: bool = False) -> Any:
    """One mbarrier per CTA, or with ``shared`` one for the cluster in CTA 0 (every CTA's arrivals go there and
    only CTA 0 waits; its count is multiplied by the CTAs)."""
    if ctas == 1:
        return mbarrier.MBarrierLayout()
    return mbarrier.MBarrierLayout([[0]] if shared else [[1]])


@gluon.jit
def _loader(p, CTAS: gl.constexpr):
    """Worker (1 warp): TMA loads of the split's KV tiles into the ring, each part of a slot (k_pe, latent half 0, half
    1) as soon as tile t - 2 is done with it, in pieces with a barrier each. A partial last tile waits for the whole
    slot and lands on a private barrier first; its rows past the end are zeroed before all of its pieces are
    published.
    In a 2-CTA cluster CTA 0 issues each load once for both CTAs (TMA multicast) once both CTAs' consumers freed
    the part, and each CTA's loader posts the bytes its own ready barriers expect.
    (Every partition takes the kernel's argument tuple ``p`` and unpacks all of it.)"""
    io, sizes, smem, bars, PAGE_SIZE, NUM_SPLITS = p  # noqa: RUF059
    ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, stride_bt, o, lse, qk_scale = io  # noqa: RUF059
    q_smem, qp_smem, ckv_smem, kpe_smem, p_smem, stats = smem  # noqa: RUF059
    ready, empty, p_ready, tail = bars  # noqa: RUF059
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    BOX: gl.constexpr = ckv_desc.block_type.shape[1]
    PIECES: gl.constexpr = len(ready) - 1
    PIECE: gl.constexpr = ckv_smem.shape[2] // PIECES
    DC: gl.constexpr = ckv_smem.shape[2]
    b = gl.program_id(1)
    start, end, tiles = _split_tiles(seq_lens_ptr, b, gl.program_id(2), NUM_SPLITS, BLOCK_N)
    bt_row = block_table_ptr + b.to(gl.int64) * stride_bt
    for t in range(tiles):
        slot = t % 2
        freed = ((t // 2) & 1) ^ 1  # the phase that frees tile t - 2's parts (a fresh barrier passes phase 1)
        token = start + t * BLOCK_N
        row = _tile_row(bt_row, token, PAGE_SIZE)
        valid = end - token
        if valid >= BLOCK_N:  # each part as soon as tile t - 2 is done with it, each piece on its own barrier
            mbarrier.wait(empty[2].index(slot), freed)
            bar = ready[PIECES].index(slot)
            _after_phase(bar, freed, CTAS)
            mbarrier.expect(bar, kpe_desc.block_type.nbytes)
            _load(kpe_desc, row, 0, bar, kpe_smem.index(slot), CTAS)
            for h in gl.static_range(2):
                mbarrier.wait(empty[h].index(slot), freed)
                for c in gl.static_range(h * PIECES // 2, (h + 1) * PIECES // 2):
                    bar = ready[c].index(slot)
                    _after_phase(bar, freed, CTAS)
                    mbarrier.expect(bar, (PIECE // BOX) * ckv_desc.block_type.nbytes)
                    for x in gl.static_range(c * PIECE, (c + 1) * PIECE, BOX):
                        _load(ckv_desc, row, x, bar, ckv_smem.index(slot).slice(x, BOX, dim=1), CTAS)
        else:  # the last tile, partial: at most one per split, so the private barrier's phase is 0
            for part in gl.static_range(3):
                mbarrier.wait(empty[part].index(slot), freed)
            mbarrier.expect(tail, (DC // BOX) * ckv_desc.block_type.nbytes + kpe_desc.block_type.nbytes)
            for x in gl.static_range(0, DC, BOX):
                _load(ckv_desc, row, x, tail, ckv_smem.index(slot).slice(x, BOX, dim=1), CTAS)
            _load(kpe_desc, row, 0, tail, kpe_smem.index(slot), CTAS)
            mbarrier.wait(tail, 0)
            boxes = _as_boxes(ckv_smem.index(slot), BOX)
            for c in range(DC // BOX):  # a loop, not unrolled: this runs once per split, and unrolled it was a
                _zero_rows_from(boxes.index(c), valid, CTAS)  # quarter of the kernel's compile time
            _zero_rows_from(kpe_smem.index(slot), valid, CTAS)
            fence_async_shared()
            for c in gl.static_range(PIECES + 1):
                _after_phase(ready[c].index(slot), freed, CTAS)
                mbarrier.arrive(ready[c].index(slot), count=1)


@gluon.jit
def _load(desc, row, col, bar, smem, CTAS: gl.constexpr):
    """TMA load of ``desc``'s box at (row, col) into ``smem``, signalling ``bar``; in a 2-CTA cluster CTA 0 loads it
    into both CTAs' ``smem`` at once (multicast), each CTA's ``bar`` counting the bytes it receives."""
    if CTAS > 1:
        _tma_load(desc, [row, col], bar, smem, multicast=True)
    else:
        _tma_load(desc, [row, col], bar, smem)


@gluon.jit
def _after_phase(bar, phase, CTAS: gl.constexpr):
    """In a cluster, wait until ``bar`` (this CTA's) completed ``phase``, the one before the phase about to be
    posted: only CTA 0 waits on the ring's free barriers (they are its own), so the other CTA's loader checks here
    that its consumers have seen the slot's previous tile before it expects or publishes the next one."""
    if CTAS > 1:
        mbarrier.wait(bar, phase)


@gluon.jit
def _as_boxes(tile, BOX: gl.constexpr):
    """A (BLOCK_N, D) tile in shared memory as its BOX-column TMA boxes, (D / BOX, BLOCK_N, BOX): with a 128-byte
    swizzle each 64-column box is stored whole, one after another."""
    shape: gl.constexpr = [tile.shape[1] // BOX, tile.shape[0], BOX]
    if _REINTERPRET_IS_PRIVATE:
        return tile._reinterpret(tile.dtype, shape, tile.layout)
    else:
        return tile.reinterpret(tile.dtype, shape, tile.layout)


@gluon.jit
def _zero_rows_from(smem, valid, CTAS: gl.constexpr):
    """Zero the rows >= ``valid`` of a (BLOCK_N, 64) box in shared memory, 8 rows at a time (one warp, few
    registers); in a cluster each CTA its own copy."""
    layout: gl.constexpr = _on_ctas(gl.BlockedLayout([1, 2], [2, 16], [1, 1], [1, 0]), _cga(CTAS, None, 2))
    ROWS: gl.constexpr = 8
    for r in gl.static_range(smem.shape[0] // ROWS):
        keep = r * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)) < valid
        part = smem.slice(r * ROWS, ROWS, dim=0)
        t = part.load(layout)
        part.store(gl.where(keep[:, None], t, gl.zeros_like(t)))


@gluon.jit
def _own_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, t, s_layout: gl.constexpr):
    """Start the (64, BLOCK_N) score MMAs of tile ``t``: k_pe, then each latent piece, each once it has landed (one
    wgmma group per piece in flight)."""
    slot = t % 2
    phase = (t // 2) & 1
    BLOCK_H: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ckv_smem.shape[1]
    PIECES: gl.constexpr = len(ready) - 1  # latent pieces per tile (the last barrier pair: k_pe)
    PIECE: gl.constexpr = ckv_smem.shape[2] // PIECES
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)  # not read: use_acc=False
    # the queries' descriptors computed here, not hoisted out of the loop: index t >> 30 (always 0) is not a
    # constant, so the 36 MMAs' 64-bit operand descriptors do not stay live across the loop (ptxas spilled them)
    qn = q_smem.index(t >> 30)
    mbarrier.wait(ready[PIECES].index(slot), phase)  # k_pe first: its part of the slot is freed first
    s = warpgroup_mma(qp_smem.index(t >> 30), kpe_smem.index(slot).permute((1, 0)), s, use_acc=False, is_async=True)
    for c in gl.static_range(PIECES):
        mbarrier.wait(ready[c].index(slot), phase)
        k = ckv_smem.index(slot).slice(c * PIECE, PIECE, dim=1)
        s = warpgroup_mma(qn.slice(c * PIECE, PIECE, dim=1), k.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _other_pv(p_smem, stats, ckv_smem, ready, p_ready, acc, l_i, t, WG: gl.constexpr, row_o: gl.constexpr):
    """Start the PV MMA of the other warpgroup's tile ``t`` (P and its statistics from shared memory): returns
    (the MMA in flight, l, m after tile t). Warpgroup 0's first tile has a stand-in for ``t = -1``: the kernel's
    initial P (zeros) and statistics (m = -inf, alpha = 1, sums 0), with V from this warpgroup's half of tile 0 once
    it has landed (finite: a partial tile's rows past the end are zeroed before they are published)."""
    HALF: gl.constexpr = acc.shape[1]
    # no wait on the tile's pieces: the owner waited on them before publishing P, and p_ready orders this after that
    mbarrier.wait(p_ready, t & 1)  # t = -1: a fresh barrier passes phase 1
    slot = t % 2
    if WG == 0:
        if t < 0:  # in a branch: the compiler syncs the warpgroup's warps between waits on one barrier allocation
            PIECE: gl.constexpr = ckv_smem.shape[2] // (len(ready) - 1)
            for c in gl.static_range(HALF // PIECE):
                mbarrier.wait(ready[c].index(0), 0)
        slot = gl.where(t < 0, 0, slot)
    m_t = stats[0].load(row_o)
    alpha = stats[1].load(row_o)
    l_i = l_i * alpha + stats[2].load(row_o)
    acc = acc * alpha[:, None]
    v = ckv_smem.index(slot).slice(WG * HALF, HALF, dim=1)
    return warpgroup_mma(p_smem.index(t >> 30), v, acc, is_async=True), l_i, m_t


@gluon.jit
def _publish_and_own_pv(p_smem, stats, ckv_smem, empty, p_ready, pr, m_new, alpha, psum, acc, l_i, t,
                        WG: gl.constexpr, p_layout: gl.constexpr):
    """Publish P(t) and its statistics to the other warpgroup (which consumed P(t - 1) before it published
    anything newer), then fold tile t into this warpgroup's output columns with P from registers; frees this
    warpgroup's latent half of the slot. Returns (acc, l, m)."""
    HALF: gl.constexpr = acc.shape[1]
    p_smem.index(0).store(pr)
    stats[0].store(m_new)
    stats[1].store(alpha)
    stats[2].store(psum)
    fence_async_shared()
    mbarrier.arrive(p_ready, count=1)
    acc = acc * alpha[:, None]
    v = ckv_smem.index(t % 2).slice(WG * HALF, HALF, dim=1)
    acc = warpgroup_mma(gl.convert_layout(pr, p_layout), v, acc)
    mbarrier.arrive(empty[WG].index(t % 2), count=1)  # this warpgroup's latent half of tile t
    return acc, l_i * alpha + psum, m_new


@gluon.jit
def _softmax(s, m_i, valid, qk_scale, dtype: gl.constexpr, row_o: gl.constexpr):
    """Online-softmax step of a (64, BLOCK_N) score tile whose first ``valid`` keys count: (P in ``dtype``, m,
    alpha, row sums of P), the statistics in ``row_o``."""
    row_s: gl.constexpr = gl.SliceLayout(1, s.type.layout)
    keys = gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
    s = gl.where((keys < valid)[None, :], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.convert_layout(gl.max(s, 1), row_o))
    pr = gl.exp2(s - gl.convert_layout(m_new, row_s)[:, None])
    return pr.to(dtype), m_new, gl.exp2(m_i - m_new), gl.convert_layout(gl.sum(pr, 1), row_o)


@gluon.jit
def _store_output(acc, l_i, m_i, o, lse, heads, b, split, WG: gl.constexpr):
    """A consumer warpgroup's epilogue: its (64, 256) output columns of request ``b``'s split divided by the row sums
    ``l_i`` (zeros for an empty split), and from warpgroup 0 the natural-log LSE (-inf where empty)."""
    o_ptr, stride_ob, stride_oh, stride_os = o
    lse_ptr, stride_lb, stride_lh = lse
    BLOCK_H: gl.constexpr = acc.shape[0]
    HALF: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    empty_row = l_i == 0.0
    safe = gl.where(empty_row, 1.0, l_i)
    out = acc * (1.0 / safe)[:, None]
    oh = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    oc = WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
    o_rows = o_ptr + b.to(gl.int64) * stride_ob + oh[:, None] * stride_oh + split * stride_os
    gl.store(o_rows + oc[None, :], out.to(o_ptr.dtype.element_ty), mask=(oh < heads)[:, None])
    if WG == 0:
        lse_v = gl.where(empty_row, float("-inf"), (m_i + gl.log2(safe)) * 0.6931471805599453)
        gl.store(lse_ptr + b.to(gl.int64) * stride_lb + oh * stride_lh + split, lse_v, mask=oh < heads)


@gluon.jit
def _consume(p, CTAS: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup ``WG`` (4 warps): output columns [WG * 256, WG * 256 + 256) of every tile, the scores
    and softmax of tiles t with t % 2 == WG. Each of its score tiles starts by folding in the other warpgroup's
    previous tile, so the other's P is consumed before its own is published over it and this warpgroup's half of
    that tile is released early. In a 2-CTA cluster each CTA's warpgroup ``WG`` takes its CTA's half of the
    heads."""
    io, sizes, smem, bars, PAGE_SIZE, NUM_SPLITS = p  # noqa: RUF059
    ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, stride_bt, o, lse, qk_scale = io  # noqa: RUF059
    q_smem, qp_smem, ckv_smem, kpe_smem, p_smem, stats = smem  # noqa: RUF059
    ready, empty, p_ready, tail = bars  # noqa: RUF059
    heads = sizes
    BLOCK_H: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    DC: gl.constexpr = ckv_smem.shape[2]
    HALF: gl.constexpr = DC // 2
    PIECES: gl.constexpr = len(ready) - 1
    dtype: gl.constexpr = ckv_desc.dtype
    rows: gl.constexpr = _cga(CTAS, 0, 2)  # the heads split between a cluster's CTAs
    s_layout: gl.constexpr = _on_ctas(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                instr_shape=[16, BLOCK_N, 16]), rows)
    o_layout: gl.constexpr = _on_ctas(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                instr_shape=[16, HALF, 16]), rows)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    b = gl.program_id(1)
    split = gl.program_id(2)
    start, end, tiles = _split_tiles(seq_lens_ptr, b, split, NUM_SPLITS, BLOCK_N)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_o)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=row_o)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    # j runs one step past this warpgroup's last tile when the split's last tile is the other's, to fold that in
    for j in range(WG, tiles + (tiles > 0), 2):
        # the other warpgroup's tile j - 1 first, so this warpgroup's half of it is released as soon as that PV MMA is
        # done (the next tile's loads start before this tile's softmax); then this tile's scores, piece by piece
        pv, l_i, m_i = _other_pv(p_smem, stats, ckv_smem, ready, p_ready, acc, l_i, j - 1, WG, row_o)
        if j < tiles:
            s_mma = _own_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, j, s_layout)
            acc = warpgroup_mma_wait(num_outstanding=PIECES + 1, deps=(pv,))  # the score groups may still run
            mbarrier.arrive(empty[WG].index((j + 1) % 2), count=1, pred=j > 0)  # its half of tile j - 1 (if any)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_mma,))
            mbarrier.arrive(empty[2].index(j % 2), count=1)  # tile j's k_pe: only its scores read it
            pr, m_new, alpha, psum = _softmax(s, m_i, end - (start + j * BLOCK_N), qk_scale, dtype, row_o)
            acc, l_i, m_i = _publish_and_own_pv(p_smem, stats, ckv_smem, empty, p_ready, pr, m_new, alpha, psum, acc,
                                                l_i, j, WG, p_layout)
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
            mbarrier.arrive(empty[WG].index((j + 1) % 2), count=1)

    _store_output(acc, l_i, m_i, o, lse, heads, b, split, WG)


@gluon.jit
def _stage_queries(qn_ptr, qp_ptr, q_smem, qp_smem, heads, stride_qnb, stride_qnh, stride_qpb, stride_qph,
                   ld_layout: gl.constexpr):
    """The program's q_nope (BLOCK_H, DC) and q_pe (BLOCK_H, DR) rows into shared memory (rows past ``heads``
    zero), 64 columns at a time, by the default partition's warps before the partitions fork."""
    BLOCK_H: gl.constexpr = q_smem.shape[1]
    DC: gl.constexpr = q_smem.shape[2]
    b = gl.program_id(1)
    offs_h = gl.program_id(0) * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout))
    qn_rows = qn_ptr + b.to(gl.int64) * stride_qnb + offs_h[:, None] * stride_qnh
    for c in gl.static_range(DC // 64):
        q_smem.index(0).slice(c * 64, 64, dim=1).store(gl.load(qn_rows + c * 64 + cols[None, :],
                                                               mask=(offs_h < heads)[:, None], other=0.0))
    qp_rows = qp_ptr + b.to(gl.int64) * stride_qpb + offs_h[:, None] * stride_qph
    qp_smem.index(0).store(gl.load(qp_rows + cols[None, :], mask=(offs_h < heads)[:, None], other=0.0))


@gluon.jit
def mla_decode_ws_kernel(
    qn_ptr, qp_ptr, ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, o_ptr, lse_ptr, heads,
    stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_bt, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    qk_scale,
    PAGE_SIZE: gl.constexpr,  # tokens per page, a multiple of BLOCK_N
    NUM_SPLITS: gl.constexpr,  # KV splits per request (grid dim 2)
    DC: gl.constexpr,  # latent columns
    PIECE: gl.constexpr,  # latent columns per ready barrier (whole 64-column TMA boxes, the 128-byte swizzle's width)
    CTAS: gl.constexpr,  # 1, or 2: a cluster whose CTAs take 64 heads each and share every tile (TMA multicast)
    num_warps: gl.constexpr,  # 4: the default partition is consumer warpgroup 0
):
    """Arguments as ``_mla_gluon.mla_decode_kernel``'s (``ckv_desc``'s blocks: 64-column TMA boxes, whole in each
    CTA of a cluster); grid (head blocks, batch, splits), 64 * CTAS heads per program."""
    BLOCK_H: gl.constexpr = 64 * CTAS
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    PIECES: gl.constexpr = DC // PIECE
    DR: gl.constexpr = kpe_desc.block_type.shape[1]
    dtype: gl.constexpr = ckv_desc.dtype
    rows: gl.constexpr = _cga(CTAS, 0, 2)  # the heads split between a cluster's CTAs
    # the queries, staged by the default partition's 4 warps before the partitions fork, 64 columns at a time
    q_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_H, DC],
                                       _on_ctas(gl.NVMMASharedLayout.get_default_for([64, DC], dtype), rows))
    qp_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_H, DR],
                                        _on_ctas(gl.NVMMASharedLayout.get_default_for([64, DR], dtype), rows))
    ld_layout: gl.constexpr = _on_ctas(gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0]), rows)
    _stage_queries(qn_ptr, qp_ptr, q_smem, qp_smem, heads, stride_qnb, stride_qnh, stride_qpb, stride_qph, ld_layout)
    ckv_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DC], ckv_desc.layout)
    kpe_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DR], kpe_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_H, BLOCK_N],
                                       _on_ctas(gl.NVMMASharedLayout.get_default_for([64, BLOCK_N], dtype), rows))
    # the row statistics of a published P (m, alpha, row sums), three buffers: stores to one buffer would be
    # separated by CTA barriers (Gluon cannot tell its rows apart)
    row_layout: gl.constexpr = _on_ctas(gl.SwizzledSharedLayout(1, 1, 1, [0]), _cga(CTAS, 0, 1))
    stats = (gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout),
             gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout),
             gl.allocate_shared_memory(gl.float32, [BLOCK_H], row_layout))
    # the stand-in for "the other warpgroup's tile -1" that warpgroup 0 folds in first (``_other_pv``): P = 0,
    # m = -inf, alpha = 1, row sums 0, so warpgroup 0's first tile runs the loop's code (no separate copy to compile)
    p_smem.index(0).store(gl.zeros([BLOCK_H, BLOCK_N], dtype, ld_layout))
    row_ld: gl.constexpr = gl.SliceLayout(1, ld_layout)
    stats[0].store(gl.full([BLOCK_H], float("-inf"), gl.float32, row_ld))
    stats[1].store(gl.full([BLOCK_H], 1.0, gl.float32, row_ld))
    stats[2].store(gl.zeros([BLOCK_H], gl.float32, row_ld))
    # a barrier pair (one per ring slot) for each latent piece and for k_pe, each its own allocation: the compiler
    # syncs a partition's warps between two waits on one allocation (it cannot tell which barrier an index names);
    # in a cluster, a pair in each CTA
    own: gl.constexpr = _barrier_layout(CTAS)
    ready = ()
    for _ in gl.static_range(PIECES + 1):  # (the Gluon frontend concatenates tuples; it does not unpack them)
        pair = gl.allocate_shared_memory(gl.int64, [2, CTAS], own)
        ready = ready + (pair,)  # type: ignore[assignment]  # noqa: RUF005
    # per ring slot, the parts of a tile each freed on its own: latent half 0 (by warpgroup 0's PV), half 1 (by
    # warpgroup 1's), k_pe (by the owner's scores); in a cluster one barrier in CTA 0 that every CTA's consumers free
    # (CTA 0 loads each part into both)
    free: gl.constexpr = _barrier_layout(CTAS, shared=True)
    empty = (gl.allocate_shared_memory(gl.int64, [2, 1], free),
             gl.allocate_shared_memory(gl.int64, [2, 1], free),
             gl.allocate_shared_memory(gl.int64, [2, 1], free))
    p_ready = gl.allocate_shared_memory(gl.int64, [CTAS], own)
    tail = gl.allocate_shared_memory(gl.int64, [CTAS], own)
    for c in gl.static_range(PIECES + 1):
        for i in gl.static_range(2):
            mbarrier.init(ready[c].index(i), count=1)  # the loader's expect + the TMA bytes, or its arrive (partial tile)
    for i in gl.static_range(2):
        for part in gl.static_range(3):
            mbarrier.init(empty[part].index(i), count=1)  # one consumer (in a cluster, one in each CTA)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(tail, count=1)
    fence_async_shared()
    io = (ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, stride_bt, (o_ptr, stride_ob, stride_oh, stride_os),
          (lse_ptr, stride_lb, stride_lh), qk_scale)
    p = (io, heads, (q_smem, qp_smem, ckv_smem, kpe_smem, p_smem, stats), (ready, empty, p_ready, tail), PAGE_SIZE,
         NUM_SPLITS)
    # (CTAS passed on its own: a constant inside the tuple ``p`` reaches the partitions as a tensor)
    gl.warp_specialize([(_consume, (p, CTAS, 0)), (_consume, (p, CTAS, 1)), (_loader, (p, CTAS))], [4, 1], [232, 40])


def descriptors(ckv_rows: Any, kpe_rows: Any, ctas: int = 1) -> tuple[Any, Any]:
    """``_mla_gluon.descriptors`` for this kernel: latent blocks of ``BOX_COLS``-column TMA boxes."""
    return _mla_gluon.descriptors(ckv_rows, kpe_rows, BOX_COLS, ctas)


def launch(*args: Any, ctas: int = 1) -> None:
    """As ``_mla_gluon.launch`` (the pages through :func:`descriptors`), with this kernel (``PIECE_COLS`` columns per
    barrier; 4 warps per partition, 168 registers a thread at launch); ``ctas=2``: 2-CTA clusters of 128 heads sharing
    each tile."""
    _mla_gluon.launch(*args, kernel=mla_decode_ws_kernel, ctas=ctas, DC=args[2].shape[1], PIECE=PIECE_COLS, CTAS=ctas,
                      num_warps=4, maxnreg=168)
