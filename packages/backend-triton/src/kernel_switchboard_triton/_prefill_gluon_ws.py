"""Soft-capped prefill in Gluon with warp-specialised partitions (FlashAttention-3's schedule), Hopper.

Why a second prefill kernel: with a soft cap every score costs the SFU a tanh and an exponential, two of its 16 a
clock per SM against 512 of the tensor cores' 4096 bf16 flops a clock, so the softmax keeps the SFU as busy as the
MMAs keep the tensor cores. The Triton kernel (``_prefill``, FlashAttention-2's order) runs them one after the
other; here they overlap:

- A one-warp loader partition fills a ring of ``STAGES`` K and V slots by TMA, each tile's K and V on barriers of
  their own, so the scores of a tile start once its K has landed.
- Two consumer warpgroups take 64 of the program's 128 packed query rows each (both read every K/V tile, which is
  loaded once). Each issues the scores of tile j + 1 and the PV MMA of tile j back to back and computes tile
  j + 1's weights while that PV MMA runs; the two warpgroups' softmaxes and MMAs interleave on the SM as the warp
  scheduler finds them ready.
- The softmax subtracts the cap instead of a running row maximum (``_attn_common.fixed_max``): the accumulator
  is never rescaled, so the weights of the next tile do not wait for the PV MMA in flight.

What it serves: bfloat16 queries and K/V, head dim 128 (qk and v), a soft cap up to ``FIXED_MAX_CAP``, causal or
not, no window, no custom variant, ragged K/V or pages that hold whole 128-key tiles (TMA), on sm_90. The slots
(request, 128-row tile, KV head) and their heavy-first order are the Triton kernel's (``_prefill`` module docstring),
so each row's result depends on its request alone, as there. Rows of a partial last tile past the request's keys
may hold anything (the next request's rows, a page's unwritten slots): the loader zeroes V's and the consumers mask
the scores there.

Persistent programs, one per SM (FlashAttention-3's form): each takes its first item from its program id, then
claims the next from a counter (items in their heavy-first order, so a program that drew light items takes more).
The loader hands each item to the consumers one item ahead through two 8-word slots per program in global memory
(read from shared memory, the item's fields lengthened the consumers' tile loop by about 12% on ptxas), and the consumers
copy the next item's queries by cp.async into their second query buffer while this item's first scores run, so the
next item's first loads and queries overlap this item's last tiles and output.

Measured on an H100 (cap 30, 32/8 heads, ragged causal, FlashInfer 0.6.18 in the same process,
docs/benchmarks.md): 8x2048 417-426 TFLOP/s against 391-397 for one program per item and 438 for FlashInfer;
1x8192 532-538 against 527-530 and 498. Two ring slots were as fast as three. Below 256 requests each item finds
its request by one vector load per index array instead of a binary search of dependent loads (``_request``).
Host ptxas sm_90 (Triton 3.6): 168 registers at launch, 232 per consumer warpgroup, 192 KB of shared memory.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._attn_common import sm_count
from ._mla_gluon import _tma_load
from ._mla_gluon_ws import BOX_COLS, _as_boxes, _zero_rows_from

#: cp.async from global to shared memory: Triton 3.6 names it async_copy_global_to_shared; 3.7+ async_load
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
BLOCK_M = gl.constexpr(128)  # packed query rows per program: 64 per consumer warpgroup (one m64 wgmma tile)
BLOCK_N = gl.constexpr(128)  # keys per tile
STAGES = gl.constexpr(2)  # ring slots of K and of V (192 KB of shared memory with two query buffers per consumer warpgroup)
INFO = gl.constexpr(8)  # int32 fields of an item handed from the loader to the consumers (``_publish``)
MAX_VEC_B = 256  # batches below it find their requests by vector loads (``_request``), larger ones by search
BOX = gl.constexpr(BOX_COLS)  # V columns per TMA box (the 128-byte swizzle's width), zeroed box by box


@gluon.jit
def _request(slot_id, work, GROUP: gl.constexpr, PAGED: gl.constexpr, VEC_B: gl.constexpr, LOG_B: gl.constexpr):
    """The request b of slot ``slot_id`` (the last b with ``qo_indptr[b] * GROUP // BLOCK_M + b <= slot_id``), its
    query tokens [q_start, q_end) and its KV start (ragged) and length. ``VEC_B`` > 0 (a power of two above the
    batch, 32 or more): every request's bounds in one vector load per array and reductions over them, so the item's
    first K/V load waits for one memory round trip, not one per step of a binary search; 0: the binary search
    (``LOG_B`` steps, large batches), the search ``_mla_prefill``'s Triton kernel also runs (a Gluon kernel cannot
    call a Triton jit helper). Run by the loader warp."""
    qo_indptr_ptr, kv_indptr_ptr, seq_lens_ptr, block_table_ptr, stride_bt, batch, n_items = work  # noqa: RUF059
    if VEC_B > 0:
        layout: gl.constexpr = gl.BlockedLayout([VEC_B // 32], [32], [1], [0])
        idx = gl.arange(0, VEC_B, layout=layout)
        qo = gl.load(qo_indptr_ptr + idx, mask=idx <= batch, other=0)
        if PAGED:
            kv = gl.load(seq_lens_ptr + idx, mask=idx < batch, other=0)
        else:
            kv = gl.load(kv_indptr_ptr + idx, mask=idx <= batch, other=0)
        seen = (idx < batch) & (qo * GROUP // BLOCK_M + idx <= slot_id)
        b = gl.maximum(gl.sum(seen.to(gl.int32), 0) - 1, 0)
        q_start = gl.sum(gl.where(idx == b, qo, 0), 0)
        q_end = gl.sum(gl.where(idx == b + 1, qo, 0), 0)
        kv_at_b = gl.sum(gl.where(idx == b, kv, 0), 0)
        if PAGED:
            kv_start = kv_at_b * 0
            kv_len = kv_at_b
        else:
            kv_start = kv_at_b
            kv_len = gl.sum(gl.where(idx == b + 1, kv, 0), 0) - kv_at_b
    else:
        lo = 0
        hi = batch
        for _ in gl.static_range(LOG_B):
            mid = (lo + hi) // 2
            go = gl.load(qo_indptr_ptr + mid) * GROUP // BLOCK_M + mid <= slot_id
            lo = gl.where(go, mid, lo)
            hi = gl.where(go, hi, mid)
        b = lo
        q_start = gl.load(qo_indptr_ptr + b)
        q_end = gl.load(qo_indptr_ptr + b + 1)
        if PAGED:
            kv_len = gl.load(seq_lens_ptr + b)
            kv_start = kv_len * 0
        else:
            kv_start = gl.load(kv_indptr_ptr + b)
            kv_len = gl.load(kv_indptr_ptr + b + 1) - kv_start
    return b, q_start, q_end, kv_start, kv_len


@gluon.jit
def _slot(item, work, GROUP: gl.constexpr, NUM_KV_HEADS: gl.constexpr, PAGED: gl.constexpr, CAUSAL: gl.constexpr,
          VEC_B: gl.constexpr, LOG_B: gl.constexpr):
    """Work item ``item``: (request b, KV head, first packed row, packed rows of the request, first query token,
    KV length, KV start (ragged), KV tiles to read, first tile that needs a mask). A slot past its request's rows
    reads no tile. Slots as in ``_prefill``: request b owns ``[qo_indptr[b] * GROUP // BLOCK_M + b, ...)``, its
    heavy (late causal) tiles first; item = slot x KV heads + KV head. ``VEC_B``, ``LOG_B``: as :func:`_request`'s."""
    slot_id = item // NUM_KV_HEADS
    kvh = item % NUM_KV_HEADS
    b, q_start, q_end, kv_start, kv_len = _request(slot_id, work, GROUP, PAGED, VEC_B, LOG_B)
    first_slot = q_start * GROUP // BLOCK_M + b
    n_slots = q_end * GROUP // BLOCK_M + b + 1 - first_slot
    row0 = (n_slots - 1 - (slot_id - first_slot)) * BLOCK_M
    rows = (q_end - q_start) * GROUP
    end = kv_len
    full = kv_len // BLOCK_N  # tiles wholly inside the request's keys
    if CAUSAL:
        past = kv_len - (q_end - q_start)  # the query token t sees keys [0, past + t]
        end = gl.minimum(kv_len, past + (gl.minimum(row0 + BLOCK_M, rows) - 1) // GROUP + 1)
        full = gl.minimum(full, (past + row0 // GROUP + 1) // BLOCK_N)
    tiles = gl.where(row0 < rows, gl.cdiv(gl.maximum(end, 0), BLOCK_N), 0)
    return b, kvh, row0, rows, q_start, kv_len, kv_start, tiles, full


@gluon.jit
def _kv_row(bt_row, kv_start, kvh, token, PAGED: gl.constexpr, HND: gl.constexpr, NUM_KV_HEADS: gl.constexpr,
            PAGE_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr):
    """(row, column) of the tile of keys starting at ``token`` in the K/V rows the descriptors address
    (``_prefill._token_rows``)."""
    if PAGED:
        page = gl.load(bt_row + token // PAGE_SIZE)
        if HND:
            return (page * NUM_KV_HEADS + kvh) * PAGE_SIZE + token % PAGE_SIZE, 0
        else:
            return page * PAGE_SIZE + token % PAGE_SIZE, kvh * HEAD_DIM
    else:
        return kv_start + token, kvh * HEAD_DIM


@gluon.jit
def _publish(handoff, r, item, kvh, row0, rows, q_start, kv_len, tiles, full):
    """The loader's ``r``-th item for the consumers (``item`` >= n_items: none, they stop): its fields into slot
    r % 2 of this program's handoff words in global memory once both consumers released the item published two
    before. Global, not shared, memory: values the consumers load from shared memory lengthen their tile loop by
    about 12% on ptxas (spills, addresses in vector registers), values loaded from global memory do not."""
    words, info_ready, info_empty = handoff
    s = r % 2
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    k = gl.arange(0, INFO, layout=layout)
    fields = gl.where(k == 0, item, gl.where(k == 1, kvh, gl.where(k == 2, row0, gl.where(k == 3, rows, gl.where(
        k == 4, q_start, gl.where(k == 5, kv_len, gl.where(k == 6, tiles, full))))))).to(gl.int32)
    mbarrier.wait(info_empty.index(s), ((r // 2) & 1) ^ 1)  # a fresh barrier passes phase 1
    gl.store(words + (gl.program_id(0) * 2 + s) * INFO + k, fields)
    mbarrier.arrive(info_ready.index(s), count=1)  # release: the stores are seen after the consumers' wait


@gluon.jit
def _peek(handoff, r):
    """The consumers' side of :func:`_publish`: (item, KV head, first packed row, packed rows, first query token,
    KV length, KV tiles, first tile that needs a mask) of the ``r``-th item, read again as often as needed until
    :func:`_release` (the loader writes the slot again only after both consumers released it)."""
    words, info_ready, info_empty = handoff  # noqa: RUF059
    mbarrier.wait(info_ready.index(r % 2), (r // 2) & 1)
    at = words + (gl.program_id(0) * 2 + r % 2) * INFO
    return (gl.load(at), gl.load(at + 1), gl.load(at + 2), gl.load(at + 3), gl.load(at + 4), gl.load(at + 5),
            gl.load(at + 6), gl.load(at + 7))


@gluon.jit
def _release(handoff, r):
    """This consumer warpgroup is done reading the ``r``-th item's fields."""
    mbarrier.arrive(handoff[2].index(r % 2), count=1)


@gluon.jit
def _loader(p, GROUP: gl.constexpr, NUM_KV_HEADS: gl.constexpr, PAGED: gl.constexpr, HND: gl.constexpr,
            CAUSAL: gl.constexpr, VEC_B: gl.constexpr, LOG_B: gl.constexpr, PAGE_SIZE: gl.constexpr,
            DYNAMIC: gl.constexpr):
    """Worker (1 warp): the program's items, each handed to the consumers (:func:`_publish`) one item ahead, and K
    and V of their tiles into the ring, each tile once both consumers freed the slot's previous one (the next item's
    first tiles load while the consumers finish this one). ``DYNAMIC``: after its first item (its program id) the
    program claims the next from ``counter`` (items in their heavy-first order, so a program that drew light items
    takes more), else it has one item. A partial last tile's V lands on a private barrier first; its rows past the
    keys are zeroed before it is published (a weight of 0 times a NaN there would be NaN)."""
    work, descs, smem, bars, q_ptrs, o_ptrs, scales, handoff, counter = p  # noqa: RUF059
    block_table_ptr, stride_bt, n_items = work[3], work[4], work[6]
    k_desc, v_desc = descs
    q_smem, k_smem, v_smem = smem  # noqa: RUF059
    k_ready, v_ready, k_empty, v_empty, tail = bars
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    item = gl.program_id(0)  # the grid has at most n_items programs
    b, kvh, row0, rows, q_start, kv_len, kv_start, tiles, full = _slot(item, work, GROUP, NUM_KV_HEADS, PAGED, CAUSAL,
                                                                      VEC_B, LOG_B)
    _publish(handoff, 0, item, kvh, row0, rows, q_start, kv_len, tiles, full)
    done = 0  # tiles loaded by this program: the ring's position
    tails = 0  # partial tiles loaded: the private barrier's phase
    r = 0
    while item < n_items:
        if DYNAMIC:
            nxt = gl.num_programs(0) + gl.atomic_add(counter, 1, sem="relaxed")
        else:
            nxt = n_items
        nb, nkvh, nrow0, nrows, nq_start, nkv_len, nkv_start, ntiles, nfull = _slot(
            gl.minimum(nxt, n_items - 1), work, GROUP, NUM_KV_HEADS, PAGED, CAUSAL, VEC_B, LOG_B)
        ntiles = gl.where(nxt < n_items, ntiles, 0)
        _publish(handoff, r + 1, nxt, nkvh, nrow0, nrows, nq_start, nkv_len, ntiles, nfull)
        bt_row = block_table_ptr + b.to(gl.int64) * stride_bt
        for j in range(tiles):
            n = done + j
            slot = n % STAGES
            freed = ((n // STAGES) & 1) ^ 1  # the phase that frees tile n - STAGES (a fresh barrier passes 1)
            row, col = _kv_row(bt_row, kv_start, kvh, j * BLOCK_N, PAGED, HND, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM)
            mbarrier.wait(k_empty.index(slot), freed)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [row, col], k_ready.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), freed)
            valid = kv_len - j * BLOCK_N
            if valid >= BLOCK_N:
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                _tma_load(v_desc, [row, col], v_ready.index(slot), v_smem.index(slot))
            else:  # the item's last tile, partial
                mbarrier.expect(tail, v_desc.block_type.nbytes)
                _tma_load(v_desc, [row, col], tail, v_smem.index(slot))
                mbarrier.wait(tail, tails & 1)
                tails += 1
                boxes = _as_boxes(v_smem.index(slot), BOX)
                for c in range(HEAD_DIM // BOX):
                    _zero_rows_from(boxes.index(c), valid, 1)
                fence_async_shared()
                mbarrier.arrive(v_ready.index(slot), count=1)
        done += tiles
        item = nxt
        b = nb
        kvh = nkvh
        kv_len = nkv_len
        kv_start = nkv_start
        tiles = ntiles
        r += 1


@gluon.jit
def _tanh(x):
    """tanh on the SFU (``tanh.approx.f32``: relative error <= 2^-10.7, fine for bfloat16 scores)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _weights(s, j, row_pos, kv_len, full, qk_scale, cap_log2, CAUSAL: gl.constexpr, p_layout: gl.constexpr):
    """Softmax weights of score tile ``j`` against the cap (``cap * tanh(s * qk_scale)`` in log2 units minus the
    cap, in [-2 cap log2 e, 0]), 0 for masked keys (past the request, or past the row's position when causal), in
    bfloat16 as the PV MMA's register operand; and their row sums."""
    e = cap_log2 * _tanh(s * qk_scale) - cap_log2
    if j >= full:  # a tile at the causal diagonal or the end of the keys
        keys = j * BLOCK_N + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        keep = (keys < kv_len)[None, :]
        if CAUSAL:
            keep = keep & (keys[None, :] <= row_pos[:, None])
        pr = gl.where(keep, gl.exp2(e), 0.0)
    else:
        pr = gl.exp2(e)
    return gl.convert_layout(pr.to(gl.bfloat16), p_layout), gl.sum(pr, 1)


@gluon.jit
def _consume(p, WG: gl.constexpr, GROUP: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
             LSE_BASE2: gl.constexpr):
    """Consumer warpgroup ``WG`` (4 warps): packed rows [WG * 64, WG * 64 + 64) of each item the loader hands over,
    until it hands over none. Each item's rows were copied into one of the warpgroup's two query buffers while the
    previous item ran (:func:`_attend`)."""
    work, descs, smem, bars, q_ptrs, o_ptrs, scales, handoff, counter = p  # noqa: RUF059
    n_items = work[6]
    q_smem = smem[0]
    item, kvh, row0, rows, q_start, kv_len, tiles, full = _peek(handoff, 0)
    _release(handoff, 0)
    _stage_rows(q_ptrs, q_smem.index(WG * 2), q_start, row0 + WG * 64, rows, kvh, GROUP)
    done = 0  # tiles consumed by this program: the ring's position
    r = 0
    while item < n_items:
        _attend(p, kvh, row0, rows, q_start, kv_len, tiles, full, done, r, WG, GROUP, CAUSAL, RETURN_LSE, LSE_BASE2)
        done += tiles
        r += 1
        # the next item's fields again (read before, for its rows' copy; not kept through this item's tiles)
        item, kvh, row0, rows, q_start, kv_len, tiles, full = _peek(handoff, r)
        _release(handoff, r)


@gluon.jit
def _attend(p, kvh, row0, rows, q_start, kv_len, tiles, full, done, r, WG: gl.constexpr, GROUP: gl.constexpr,
            CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, LSE_BASE2: gl.constexpr):
    """The ``r``-th item's rows of consumer warpgroup ``WG``: its ``tiles`` tiles from ring position ``done`` on, then
    its output. Once its first scores are issued, the next item's rows start their copy into the other query buffer
    (:func:`_next_rows`). Tile j + 1's scores and tile j's PV MMA are in flight together while tile j + 1's weights
    are computed."""
    work, descs, smem, bars, q_ptrs, o_ptrs, scales, handoff, counter = p  # noqa: RUF059
    q_smem, k_smem, v_smem = smem
    k_ready, v_ready, k_empty, v_empty, tail = bars  # noqa: RUF059
    qk_scale, cap_log2 = scales
    STAGES: gl.constexpr = k_smem.shape[0]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q = q_smem.index(WG * 2 + r % 2)
    async_copy.wait_group(0)  # this item's rows
    fence_async_shared()  # the rows' copies before the score MMAs read them (the async proxy)
    offs_m = row0 + WG * 64 + gl.arange(0, 64, layout=row_s)
    row_pos = kv_len - rows // GROUP + offs_m // GROUP  # the KV position of each row's query
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=o_layout)
    l_i = gl.zeros([64], gl.float32, layout=row_s)
    first = done % STAGES
    if tiles > 0:
        mbarrier.wait(k_ready.index(first), (done // STAGES) & 1)
        s_mma = warpgroup_mma(q, k_smem.index(first).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _next_rows(p, r, WG, GROUP)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_mma,))
        mbarrier.arrive(k_empty.index(first), count=1)
        pr, psum = _weights(s, 0, row_pos, kv_len, full, qk_scale, cap_log2, CAUSAL, p_layout)
        for j in range(1, tiles):
            n = done + j
            slot = n % STAGES
            prev = (n - 1) % STAGES
            mbarrier.wait(k_ready.index(slot), (n // STAGES) & 1)
            s_mma = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((n - 1) // STAGES) & 1)
            pv = warpgroup_mma(pr, v_smem.index(prev), acc, is_async=True)
            l_i = l_i + psum
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_mma,))  # the scores (issued first) are done
            mbarrier.arrive(k_empty.index(slot), count=1)
            pr_next, psum = _weights(s, j, row_pos, kv_len, full, qk_scale, cap_log2, CAUSAL, p_layout)
            acc, pr = warpgroup_mma_wait(num_outstanding=0, deps=(pv, pr))
            mbarrier.arrive(v_empty.index(prev), count=1)
            pr = pr_next
        n = done + tiles - 1
        mbarrier.wait(v_ready.index(n % STAGES), (n // STAGES) & 1)
        acc = warpgroup_mma(pr, v_smem.index(n % STAGES), acc)
        mbarrier.arrive(v_empty.index(n % STAGES), count=1)
        l_i = l_i + psum
    else:
        _next_rows(p, r, WG, GROUP)

    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh = o_ptrs
    empty_row = l_i == 0.0
    safe = gl.where(empty_row, 1.0, l_i)
    out = acc * gl.convert_layout(1.0 / safe, row_o)[:, None]
    rows_o = row0 + WG * 64 + gl.arange(0, 64, layout=row_o)
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    tok = q_start + rows_o // GROUP
    head = kvh * GROUP + rows_o % GROUP
    o_offs = tok.to(gl.int64) * stride_ot + head * stride_oh
    gl.store(o_ptr + o_offs[:, None] + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=(rows_o < rows)[:, None])
    if RETURN_LSE:
        lse = cap_log2 + gl.log2(safe)
        if not LSE_BASE2:
            lse = lse * 0.6931471805599453
        lse = gl.where(empty_row, float("-inf"), lse)
        tok_s = q_start + offs_m // GROUP
        head_s = kvh * GROUP + offs_m % GROUP
        gl.store(lse_ptr + tok_s.to(gl.int64) * stride_lt + head_s * stride_lh, lse, mask=offs_m < rows)


@gluon.jit
def _next_rows(p, r, WG: gl.constexpr, GROUP: gl.constexpr):
    """Start the copy of the next item's rows (the ``r + 1``-th, :func:`_peek`) into the warpgroup's other query
    buffer (whose MMAs retired with the item before this one)."""
    work, descs, smem, bars, q_ptrs, o_ptrs, scales, handoff, counter = p  # noqa: RUF059
    item, kvh, row0, rows, q_start, kv_len, tiles, full = _peek(handoff, r + 1)  # noqa: RUF059
    if item < work[6]:
        _stage_rows(q_ptrs, smem[0].index(WG * 2 + (r + 1) % 2), q_start, row0 + WG * 64, rows, kvh, GROUP)


@gluon.jit
def _stage_rows(q_ptrs, q_smem, q_start, first, rows, kvh, GROUP: gl.constexpr):
    """Copy packed query rows [first, first + 64) of the request into ``q_smem`` (64, head dim), rows past the
    request zero, by one warpgroup's cp.async, as one commit group (:func:`_attend` waits for it)."""
    q_ptr, stride_qt, stride_qh = q_ptrs
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld_layout))
    r = first + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_layout))
    offs = (q_start + r // GROUP).to(gl.int64) * stride_qt + (kvh * GROUP + r % GROUP) * stride_qh
    # 16-byte pieces: the launcher routes here only queries 16-byte aligned with strides of whole 8 elements (the
    # compiler cannot see it through the partition's arguments)
    ptrs = gl.multiple_of(q_ptr + offs[:, None] + cols[None, :], [16, 16])
    _cp_async(q_smem, ptrs, mask=(r < rows)[:, None])
    async_copy.commit_group()


@gluon.jit
def prefill_ws_kernel(
    q_ptr, k_desc, v_desc, qo_indptr_ptr, kv_indptr_ptr, block_table_ptr, seq_lens_ptr, o_ptr, lse_ptr, counter, words,
    stride_qt, stride_qh, stride_bt, stride_ot, stride_oh, stride_lt, stride_lh, qk_scale, cap_log2, batch, n_items,
    GROUP: gl.constexpr,  # query heads per KV head
    NUM_KV_HEADS: gl.constexpr,  # KV heads (items: slots x KV heads, the head varying fastest)
    PAGE_SIZE: gl.constexpr,  # tokens per page (PAGED), a multiple of BLOCK_N
    PAGED: gl.constexpr,  # paged (else ragged) K/V
    HND: gl.constexpr,  # paged HND pages: TMA rows are (page, KV head, slot)
    CAUSAL: gl.constexpr,  # causal mask
    RETURN_LSE: gl.constexpr,  # write lse
    LSE_BASE2: gl.constexpr,  # lse in base 2 (else natural log)
    VEC_B: gl.constexpr,  # a power of two above the batch: requests found by one vector load (0: binary search)
    LOG_B: gl.constexpr,  # binary-search steps, >= log2(B) + 1 (VEC_B 0)
    DYNAMIC: gl.constexpr,  # persistent programs claiming items from ``counter`` (else one item per program)
    num_warps: gl.constexpr,  # 4: the default partition is consumer warpgroup 0
):
    """Arguments as ``_prefill._prefill_kernel``'s where they share a name; ``k_desc`` / ``v_desc``: TMA
    descriptors of K / V as token rows (``_prefill.tma_descriptors``), blocks (BLOCK_N, head dim); ``qk_scale`` =
    sm_scale / cap, ``cap_log2`` = cap x log2 e (``_attn_common.soft_cap_args``); ``n_items`` work items (slots x
    KV heads): program i takes item i, then (``DYNAMIC``) the items past the grid in the order it claims them from
    ``counter`` (one int32, zero at the launch); ``words``: int32 (programs, 2, INFO), the loader's items for the
    consumers (:func:`_publish`)."""
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    dtype: gl.constexpr = k_desc.dtype
    # two query buffers per consumer warpgroup (index 2 x warpgroup + item parity): the next item's rows are copied
    # while this item's MMAs read the other
    q_smem = gl.allocate_shared_memory(dtype, [4, 64, HEAD_DIM], gl.NVMMASharedLayout.get_default_for([64, HEAD_DIM],
                                                                                                      dtype))
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    # each barrier array its own allocation: the compiler syncs a partition's warps between two waits on one
    # allocation (it cannot tell which barrier an index names)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    tail = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    info_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    info_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)  # the loader's expect + the TMA bytes
        mbarrier.init(v_ready.index(i), count=1)  # (or its arrive, for a partial last tile)
        mbarrier.init(k_empty.index(i), count=2)  # both consumer warpgroups
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(tail, count=1)
    for i in gl.static_range(2):
        mbarrier.init(info_ready.index(i), count=1)  # the loader
        mbarrier.init(info_empty.index(i), count=2)  # both consumer warpgroups
    fence_async_shared()
    p = ((qo_indptr_ptr, kv_indptr_ptr, seq_lens_ptr, block_table_ptr, stride_bt, batch, n_items), (k_desc, v_desc),
         (q_smem, k_smem, v_smem), (k_ready, v_ready, k_empty, v_empty, tail), (q_ptr, stride_qt, stride_qh),
         (o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh), (qk_scale, cap_log2),
         (words, info_ready, info_empty), counter)
    # (constants passed on their own: a constant inside the tuple ``p`` reaches the partitions as a tensor)
    gl.warp_specialize([
        (_consume, (p, 0, GROUP, CAUSAL, RETURN_LSE, LSE_BASE2)),
        (_consume, (p, 1, GROUP, CAUSAL, RETURN_LSE, LSE_BASE2)),
        (_loader, (p, GROUP, NUM_KV_HEADS, PAGED, HND, CAUSAL, VEC_B, LOG_B, PAGE_SIZE, DYNAMIC)),
    ], [4, 1], [232, 40])


def descriptors(k_rows: Any, v_rows: Any, head_dim: int) -> tuple[Any, Any]:
    """Gluon TMA descriptors of K and V as token rows (``_prefill._token_rows``), blocks (BLOCK_N, head_dim)."""
    block = [BLOCK_N.value, head_dim]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return TensorDescriptor.from_tensor(k_rows, block, layout), TensorDescriptor.from_tensor(v_rows, block, layout)


def launch(q: Any, k_desc: Any, v_desc: Any, qo_indptr: Any, kv_indptr: Any, block_table: Any, seq_lens: Any,
           out: Any, lse: Any, *, kv_heads: int, page_size: int, paged: bool, hnd: bool, causal: bool,
           qk_scale: float, cap_log2: float, lse_base2: bool, programs: int | None = None) -> None:
    """One launch over the (slots x KV heads) work items, slots of ``BLOCK_M`` rows; descriptors from
    :func:`descriptors`; ``lse`` None writes none; ``programs``: that many persistent programs claim the items
    (default: one per SM; as many as items or more: one program per item)."""
    programs = programs or sm_count(q.device)
    batch = qo_indptr.shape[0] - 1
    vec_b = max(32, 1 << batch.bit_length())  # > batch: indptr[0..batch] fits; a warp's width at least
    group = q.shape[1] // kv_heads
    slots = q.shape[0] * group // BLOCK_M.value + batch
    lse_t = lse if lse is not None else out
    bt = block_table if paged else qo_indptr
    n_items = slots * kv_heads
    grid = min(programs, n_items)
    dynamic = grid < n_items
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if dynamic else qo_indptr
    words = torch.empty(grid, 2, INFO.value, dtype=torch.int32, device=q.device)
    prefill_ws_kernel[(grid,)](
        q, k_desc, v_desc, qo_indptr, kv_indptr if kv_indptr is not None else qo_indptr, bt,
        seq_lens if seq_lens is not None else qo_indptr, out, lse_t, counter, words,
        q.stride(0), q.stride(1), block_table.stride(0) if paged else 0, out.stride(0), out.stride(1),
        lse_t.stride(0), lse_t.stride(1), qk_scale, cap_log2, batch, n_items,
        GROUP=group, NUM_KV_HEADS=kv_heads, PAGE_SIZE=page_size, PAGED=paged, HND=hnd, CAUSAL=causal,
        RETURN_LSE=lse is not None, LSE_BASE2=lse_base2, VEC_B=vec_b if vec_b <= MAX_VEC_B else 0,
        LOG_B=max(1, batch.bit_length()), DYNAMIC=dynamic, num_warps=4, maxnreg=168)
