"""Absorbed MLA decode in Gluon, Hopper, 64 heads per CTA: warp-specialised, the split's tiles taken in pairs
(FlashMLA's seesaw schedule, its deep-dive of 2025-04-22). Experimental: ``MLAConfig(pairs=True)``, off by default
until it is measured on a GPU (it has compiled for sm_90 and run in the CPU Gluon emulator, not on a GPU;
notes/gpu-runs.md, "For the next GPU session").

Why a fourth kernel: in ``_mla_gluon_ws`` a warpgroup's score MMAs queue behind its PV of the other's P, so every
tile's softmax and publish run while the tensor cores wait for them. Its loop (run 23's clock profile) takes ~4,000
cycles a tile for ~2,200 cycles of MMAs: 55% tensor-core use, where FlashMLA reports 80%.

Here tiles A = 2i and B = 2i + 1 (ring slots 0 and 1) are one step, and the 512 output columns are split as before
(warpgroup 0 the left 256, warpgroup 1 the right). Both warpgroups start their tile's scores at once. Each takes
the max with the running max m of its own tile (m_A, m_B), publishes it and exponentiates against it without
waiting; once it has the other's, both use m' = max(m_A, m_B):

- warpgroup 0: O_L = O_L e^(m - m_A) + P_A V_A,L (P from registers; frees A's left half); then P_A e^(m_A - m') goes
  to A's k_pe space for warpgroup 1; O_L = O_L e^(m_A - m') + P_B' V_B,L (P_B' from B's k_pe space; frees B's left
  half and k_pe).
- warpgroup 1: P_B' = P_B e^(m_B - m') to B's k_pe space for warpgroup 0; O_R = O_R e^(m - m') + P_A' V_A,R (frees
  A's right half and k_pe) + P_B' V_B,R (P from registers; frees B's right half). With ``OWN_PV_FIRST`` the last
  two in the other order, as FlashMLA's warpgroups take their own tile's half first.

With ``EARLY_SCORES`` warpgroup 0 issues the next step's A scores behind its PV of P_B', as FlashMLA does, so the
tensor cores do not wait for warpgroup 0 between steps. Both options are off until timed on a GPU.

So one warpgroup's exponentials run under the other's MMAs, and neither waits for the other before its
exponentials (the maxima, a row vector each way, are needed only for the rescale after). P's go through the k_pe
part of their tile, which only the owner's scores read: no shared memory is added, and the kernel has 8 KB less than
``_mla_gluon_ws`` (no P buffer). The loader (``_mla_gluon_ws._loader`` with ``KPE_LAST``) loads the latent halves
first, since a tile's k_pe part is now freed last, and the scores take the pieces in that order. Both warpgroups
fold the row sums the same way, l = l e^(m - m') + sum_A e^(m_A - m') + sum_B e^(m_B - m'), so their halves of a
row are divided by the same l. A split with an odd number of tiles ends on a step without B: warpgroup 1's scores
are all -inf, so its max is m and its P zero, and it stores no P.

``tests/test_gluon_emulated.py`` runs this kernel, with each option, on the CPU against the reference (barrier
phases, late TMA loads, wgmma operands checked when retired, deadlocks).
"""

from __future__ import annotations

from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from . import _mla_gluon
from ._mla_gluon_ws import PIECE_COLS, _loader, _split_state, _stage_queries, _store_output

#: warpgroup 1 runs its own PV (P_B' from registers, over B's right half) before warpgroup 0's P_A' (over A's), as
#: FlashMLA orders both warpgroups: B's right half is freed a PV earlier, A's a PV later, and warpgroup 1 no longer
#: waits for P_A' before its first PV. Off until timed against the order below on a GPU (``tools/mla_probe.py``)
OWN_PV_FIRST = False
#: warpgroup 0 issues the next tile A's score MMAs behind its PV of P_B' (the left half's pieces at once, the rest
#: once B's left half and k_pe are freed), so the tensor cores do not wait for it between steps; FlashMLA does the
#: same. Off until timed on a GPU (``tools/mla_probe.py``)
EARLY_SCORES = False


@gluon.jit
def _tile_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, t, valid, qk_scale, s_layout: gl.constexpr):
    """The (64, BLOCK_N) scores of tile ``t`` times ``qk_scale`` (log2 domain), keys from ``valid`` on at -inf: each
    latent piece's MMAs as it lands, then k_pe's (the loader's order), waited for."""
    BLOCK_H: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ckv_smem.shape[1]
    PIECES: gl.constexpr = len(ready) - 1  # latent pieces per tile (the last barrier pair: k_pe)
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)  # not read: use_acc=False
    s = _score_pieces(q_smem, qp_smem, ckv_smem, kpe_smem, ready, t, s, 0, PIECES + 1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    return _masked(s, valid, qk_scale, s_layout)


@gluon.jit
def _score_pieces(q_smem, qp_smem, ckv_smem, kpe_smem, ready, t, s, FIRST: gl.constexpr, LAST: gl.constexpr):
    """Issue the score MMAs of tile ``t``'s pieces [FIRST, LAST) into ``s`` (64, BLOCK_N), each once it landed; piece
    PIECES is k_pe. Asynchronous, a commit group per piece, not waited for."""
    slot = t % 2
    phase = (t // 2) & 1
    PIECES: gl.constexpr = len(ready) - 1
    PIECE: gl.constexpr = ckv_smem.shape[2] // PIECES
    qn = q_smem.index(t >> 30)  # not hoisted out of the loop (``_mla_gluon_ws._own_scores`` says why)
    for c in gl.static_range(FIRST, LAST):
        mbarrier.wait(ready[c].index(slot), phase)
        if c < PIECES:
            k = ckv_smem.index(slot).slice(c * PIECE, PIECE, dim=1)
            s = warpgroup_mma(qn.slice(c * PIECE, PIECE, dim=1), k.permute((1, 0)), s, use_acc=c > 0, is_async=True)
        else:
            s = warpgroup_mma(qp_smem.index(t >> 30), kpe_smem.index(slot).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _masked(s, valid, qk_scale, s_layout: gl.constexpr):
    """Scores ``s`` (64, BLOCK_N) times ``qk_scale``, keys from ``valid`` on at -inf."""
    BLOCK_N: gl.constexpr = s.shape[1]
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.where((keys < valid)[None, :], s * qk_scale, float("-inf"))


@gluon.jit
def _exp_rows(s, m, row_o: gl.constexpr):
    """P = 2^(s - m) of a score tile and its row sums (in ``row_o``)."""
    p = gl.exp2(s - gl.convert_layout(m, gl.SliceLayout(1, s.type.layout))[:, None])
    return p, gl.convert_layout(gl.sum(p, 1), row_o)


@gluon.jit
def _free_b_left(empty):
    """Warpgroup 0 frees B's left half and its k_pe part (where P_B' was) once its PV of them is done."""
    mbarrier.arrive(empty[0].index(1), count=1)
    mbarrier.arrive(empty[2].index(1), count=1)


@gluon.jit
def _own_pv(p_b, ckv_smem, empty, acc, HALF: gl.constexpr, p_layout: gl.constexpr):
    """Warpgroup 1's PV of its own tile B (P_B' from registers) over B's right half, which it then frees."""
    acc = warpgroup_mma(gl.convert_layout(p_b, p_layout), ckv_smem.index(1).slice(HALF, HALF, dim=1), acc)
    mbarrier.arrive(empty[1].index(1), count=1)  # B's right half
    return acc


@gluon.jit
def _consume(p, WG: gl.constexpr, OWN_FIRST: gl.constexpr, EARLY: gl.constexpr):
    """Consumer warpgroup ``WG`` (4 warps): output columns [WG * 256, WG * 256 + 256), the scores of every step's
    tile A (``WG`` 0) or B (``WG`` 1); the module docstring gives the schedule."""
    io, sizes, smem, bars, PAGE_SIZE, NUM_SPLITS = p  # noqa: RUF059
    ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, stride_bt, o, lse, qk_scale = io  # noqa: RUF059
    q_smem, qp_smem, ckv_smem, kpe_smem, row_max, row_sum = smem
    ready, empty, xbars, tail = bars  # noqa: RUF059
    bar_m0, bar_m1, bar_pa, bar_pb = xbars
    heads = sizes
    BLOCK_H: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    HALF: gl.constexpr = ckv_smem.shape[2] // 2
    dtype: gl.constexpr = ckv_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    b, split, start, end, tiles, m_i, l_i, acc = _split_state(seq_lens_ptr, NUM_SPLITS, BLOCK_N, BLOCK_H, HALF, o_layout)
    s_next = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)  # EARLY: tile A's scores, from the step before
    if EARLY:
        if WG == 0:
            if tiles > 0:
                s_next = _tile_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, 0, end - start, qk_scale, s_layout)
    for i in range(0, (tiles + 1) // 2):  # step i: tile A = 2i in slot 0, B = 2i + 1 (if any) in slot 1
        ta = 2 * i
        has_b = ta + 1 < tiles
        phase = i & 1
        if WG == 0:  # tile A, output columns [0, 256)
            if EARLY:
                s = s_next
            else:
                s = _tile_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, ta, end - (start + ta * BLOCK_N),
                                 qk_scale, s_layout)
            m_own = gl.maximum(m_i, gl.convert_layout(gl.max(s, 1), row_o))
            row_max[0].store(m_own)
            mbarrier.arrive(bar_m0, count=1)
            p_own, sum_own = _exp_rows(s, m_own, row_o)
            acc = acc * gl.exp2(m_i - m_own)[:, None]
            acc = warpgroup_mma(gl.convert_layout(p_own.to(dtype), p_layout), ckv_smem.index(0).slice(0, HALF, dim=1),
                                acc)
            mbarrier.arrive(empty[0].index(0), count=1)  # A's left half
            mbarrier.wait(bar_m1, phase)
            m_new = gl.maximum(m_own, row_max[1].load(row_o))
            fix = gl.exp2(m_own - m_new)  # P_A and O_L from m_own to m_new
            kpe_smem.index(ta >> 30).store((p_own * gl.convert_layout(fix, row_s)[:, None]).to(dtype))  # for warpgroup 1
            sum_a = sum_own * fix
            row_sum[0].store(sum_a)
            fence_async_shared()
            mbarrier.arrive(bar_pa, count=1)
            acc = acc * fix[:, None]
            sum_b = gl.zeros_like(sum_a)
            if has_b:
                mbarrier.wait(bar_pb, phase)
                sum_b = row_sum[1].load(row_o)
                pv = warpgroup_mma(kpe_smem.index(1), ckv_smem.index(1).slice(0, HALF, dim=1), acc, is_async=True)
                LEFT: gl.constexpr = (len(ready) - 1) // 2  # the latent pieces of a tile's left half
                if EARLY and ta + 2 < tiles:
                    # the next A's left-half scores queued behind this PV (those pieces were loaded once A's left
                    # half was freed, mid-step), then the rest once B's parts are freed
                    s_n = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
                    s_n = _score_pieces(q_smem, qp_smem, ckv_smem, kpe_smem, ready, ta + 2, s_n, 0, LEFT)
                    acc = warpgroup_mma_wait(num_outstanding=LEFT, deps=(pv,))
                    _free_b_left(empty)
                    s_n = _score_pieces(q_smem, qp_smem, ckv_smem, kpe_smem, ready, ta + 2, s_n, LEFT, 2 * LEFT + 1)
                    s_n = warpgroup_mma_wait(num_outstanding=0, deps=(s_n,))
                    s_next = _masked(s_n, end - (start + (ta + 2) * BLOCK_N), qk_scale, s_layout)
                else:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
                    _free_b_left(empty)
                    s_next = gl.zeros_like(s_next)  # the last step: not read (a fresh value keeps none alive)
            else:
                s_next = gl.zeros_like(s_next)
        else:  # tile B, output columns [256, 512)
            s = gl.full([BLOCK_H, BLOCK_N], float("-inf"), gl.float32, layout=s_layout)
            if has_b:
                s = _tile_scores(q_smem, qp_smem, ckv_smem, kpe_smem, ready, ta + 1,
                                 end - (start + (ta + 1) * BLOCK_N), qk_scale, s_layout)
            m_own = gl.maximum(m_i, gl.convert_layout(gl.max(s, 1), row_o))
            row_max[1].store(m_own)
            mbarrier.arrive(bar_m1, count=1)
            # without B every score is -inf and m_own may be too: subtracting 0 instead gives P = 0, not NaN
            p_own, sum_own = _exp_rows(s, gl.where(m_own == float("-inf"), 0.0, m_own), row_o)
            mbarrier.wait(bar_m0, phase)
            m_new = gl.maximum(m_own, row_max[0].load(row_o))
            fix = gl.exp2(m_own - m_new)  # P_B from m_own to m_new
            p_b = (p_own * gl.convert_layout(fix, row_s)[:, None]).to(dtype)
            sum_b = sum_own * fix
            if has_b:
                kpe_smem.index(1 + (ta >> 30)).store(p_b)  # for warpgroup 0 (a runtime index: not hoisted)
                row_sum[1].store(sum_b)
                fence_async_shared()
                mbarrier.arrive(bar_pb, count=1)
            acc = acc * gl.exp2(m_i - m_new)[:, None]
            if OWN_FIRST:
                if has_b:
                    acc = _own_pv(p_b, ckv_smem, empty, acc, HALF, p_layout)
            mbarrier.wait(bar_pa, phase)
            sum_a = row_sum[0].load(row_o)
            pv = warpgroup_mma(kpe_smem.index(0), ckv_smem.index(0).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
            mbarrier.arrive(empty[1].index(0), count=1)  # A's right half
            mbarrier.arrive(empty[2].index(0), count=1)  # A's k_pe part, where P_A was
            if not OWN_FIRST:
                if has_b:
                    acc = _own_pv(p_b, ckv_smem, empty, acc, HALF, p_layout)
        l_i = l_i * gl.exp2(m_i - m_new) + sum_a + sum_b  # the same in both warpgroups
        m_i = m_new

    _store_output(acc, l_i, m_i, o, lse, heads, b, split, WG)


@gluon.jit
def mla_decode_pairs_kernel(
    qn_ptr, qp_ptr, ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, o_ptr, lse_ptr, heads,
    stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_bt, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    qk_scale,
    PAGE_SIZE: gl.constexpr,  # tokens per page, a multiple of BLOCK_N
    NUM_SPLITS: gl.constexpr,  # KV splits per request (grid dim 2)
    DC: gl.constexpr,  # latent columns
    PIECE: gl.constexpr,  # latent columns per ready barrier (whole 64-column TMA boxes)
    num_warps: gl.constexpr,  # 4: the default partition is consumer warpgroup 0
    OWN_FIRST: gl.constexpr,  # warpgroup 1's own PV (B) before warpgroup 0's P_A' (``OWN_PV_FIRST``)
    EARLY: gl.constexpr,  # warpgroup 0 issues the next A's scores behind its last PV (``EARLY_SCORES``)
):
    """Arguments as ``_mla_gluon_ws.mla_decode_ws_kernel``'s with one CTA; grid (head blocks, batch, splits), 64 heads
    per program."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[0]
    PIECES: gl.constexpr = DC // PIECE
    DR: gl.constexpr = kpe_desc.block_type.shape[1]
    dtype: gl.constexpr = ckv_desc.dtype
    # the queries, staged by the default partition's 4 warps before the partitions fork, 64 columns at a time
    q_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_H, DC], gl.NVMMASharedLayout.get_default_for([64, DC], dtype))
    qp_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_H, DR], gl.NVMMASharedLayout.get_default_for([64, DR], dtype))
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    _stage_queries(qn_ptr, qp_ptr, q_smem, qp_smem, heads, stride_qnb, stride_qnh, stride_qpb, stride_qph, ld_layout)
    ckv_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DC], ckv_desc.layout)
    kpe_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DR], kpe_desc.layout)
    # the step's row statistics: maxima (m_A by warpgroup 0, m_B by warpgroup 1) and sums (of P_A', of P_B')
    rows: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row_max = (gl.allocate_shared_memory(gl.float32, [BLOCK_H], rows), gl.allocate_shared_memory(gl.float32, [BLOCK_H], rows))
    row_sum = (gl.allocate_shared_memory(gl.float32, [BLOCK_H], rows), gl.allocate_shared_memory(gl.float32, [BLOCK_H], rows))
    # a barrier pair (one per ring slot) for each latent piece and for k_pe, each its own allocation (the compiler
    # syncs a partition's warps between two waits on one allocation); per slot the three parts each freed on their
    # own (latent half 0 by warpgroup 0, half 1 by warpgroup 1, k_pe by the reader of the P stored there); and the
    # exchanges of a step (m_A, m_B, P_A', P_B'), each completing once per step
    ready = ()
    for _ in gl.static_range(PIECES + 1):  # (the Gluon frontend concatenates tuples; it does not unpack them)
        pair = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ready = ready + (pair,)  # type: ignore[assignment]  # noqa: RUF005
    empty = (gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout()),
             gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout()),
             gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout()))
    xbars = (gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
             gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
             gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
             gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()))
    tail = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for c in gl.static_range(PIECES + 1):
        for i in gl.static_range(2):
            mbarrier.init(ready[c].index(i), count=1)  # the loader's expect + the TMA bytes, or its arrive (partial tile)
    for i in gl.static_range(2):
        for part in gl.static_range(3):
            mbarrier.init(empty[part].index(i), count=1)
    for x in gl.static_range(4):
        mbarrier.init(xbars[x], count=1)
    mbarrier.init(tail, count=1)
    fence_async_shared()
    io = (ckv_desc, kpe_desc, block_table_ptr, seq_lens_ptr, stride_bt, (o_ptr, stride_ob, stride_oh, stride_os),
          (lse_ptr, stride_lb, stride_lh), qk_scale)
    p = (io, heads, (q_smem, qp_smem, ckv_smem, kpe_smem, row_max, row_sum), (ready, empty, xbars, tail), PAGE_SIZE,
         NUM_SPLITS)
    gl.warp_specialize([(_consume, (p, 0, OWN_FIRST, EARLY)), (_consume, (p, 1, OWN_FIRST, EARLY)),
                        (_loader, (p, 1, True))], [4, 1], [232, 40])


def launch(*args: Any) -> None:
    """As ``_mla_gluon.launch``, with this kernel (64-column latent TMA boxes, ``PIECE_COLS`` columns per barrier; 4
    warps per partition, 168 registers a thread at launch)."""
    _mla_gluon.launch(*args, kernel=mla_decode_pairs_kernel, ckv_cols=64, DC=args[2].shape[1], PIECE=PIECE_COLS,
                      OWN_FIRST=OWN_PV_FIRST, EARLY=EARLY_SCORES, num_warps=4, maxnreg=168)
