"""Paged KV-cache writes: ``kv_cache.append`` (K/V pages, NHD or HND, fp8 with scales), ``kv_cache.append_slots``
(the same addressed by slot mapping; negative slots skipped), ``kv_cache.append_csr`` (the same addressed through
FlashInfer's CSR page table) and ``kv_cache.append_mla`` (latent + rope pages).
One program per (token, block of heads)."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ._attn_common import interpreting
from ._launch import Relaunch

#: fp8 page dtypes the append kernel writes: (finite range, smallest normal exponent, mantissa bits)
FP8 = {torch.float8_e4m3fn: (448.0, -6, 3), torch.float8_e5m2: (57344.0, -14, 2)}


@triton.jit
def _store_rows(
    src_ptr,  # this token's source rows, (heads, dim) with head stride stride_sh
    dst_ptr,  # destination base at (page, slot)
    offs_h,  # (BLOCK_HK,) head indices
    mask_h,  # (BLOCK_HK,) valid heads
    stride_sh,  # source stride over heads
    stride_dh,  # destination stride over heads
    inv_scale,  # 1 / scale (fp8 pages), else 1.0; with INV_STRIDE >= 0 a pointer to the reciprocals
    DIM: tl.constexpr,  # head dim
    BLOCK_D: tl.constexpr,  # next power of two of DIM
    FP8_LIMIT: tl.constexpr,  # saturation bound (fp8 pages), 0.0 = plain cast
    FP8_MIN_EXP: tl.constexpr,  # smallest normal exponent of the fp8 format
    FP8_MANT: tl.constexpr,  # mantissa bits of the fp8 format
    ROUND_FIRST: tl.constexpr,  # round to the fp8 grid before the cast (the interpreter's cast drops carries)
    INV_STRIDE: tl.constexpr,  # per-head reciprocal scales' stride over heads (0: one), -1: inv_scale is the float
):
    offs_d = tl.arange(0, BLOCK_D)
    mask = mask_h[:, None] & (offs_d < DIM)[None, :]
    x = tl.load(src_ptr + offs_h[:, None] * stride_sh + offs_d[None, :], mask=mask, other=0.0)
    if FP8_LIMIT > 0.0:
        if INV_STRIDE >= 0:
            inv = tl.load(inv_scale + offs_h * INV_STRIDE, mask=mask_h, other=1.0)[:, None]
        else:
            inv = inv_scale
        y = tl.clamp(x.to(tl.float32) * inv, -FP8_LIMIT, FP8_LIMIT)
        if ROUND_FIRST:
            a = tl.maximum(tl.abs(y), tl.exp2(FP8_MIN_EXP * 1.0))
            e = tl.floor(tl.log2(a))
            e = tl.where(tl.exp2(e) > a, e - 1.0, e)
            quantum = tl.exp2(e - FP8_MANT)
            r = tl.abs(((y / quantum + 12582912.0) - 12582912.0) * quantum)  # round half to even on the grid
            y = tl.where(y < 0, -r, r)  # keep the sign of values that round to zero (-0.0, as the cast gives)
        x = y.to(dst_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    else:
        x = x.to(dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + offs_h[:, None] * stride_dh + offs_d[None, :], x, mask=mask)


@triton.jit
def _append_kernel(
    k_ptr,  # (T, Hkv, D) new keys
    v_ptr,  # (T, Hkv, Dv) new values
    kp_ptr,  # K pages (any layout through strides)
    vp_ptr,  # V pages
    block_table_ptr,  # (B, max_pages) int32
    batch_idx_ptr,  # (T,) int32 request of each token
    pos_ptr,  # (T,) int32 position of each token
    kv_heads,  # Hkv
    stride_kt,  # k stride over tokens
    stride_kh,  # k stride over heads
    stride_vt,  # v stride over tokens
    stride_vh,  # v stride over heads
    stride_kpp,  # K pages stride over pages
    stride_kps,  # K pages stride over slots
    stride_kph,  # K pages stride over heads
    stride_vpp,  # V pages stride over pages
    stride_vps,  # V pages stride over slots
    stride_vph,  # V pages stride over heads
    stride_bt,  # block_table row stride
    inv_k_scale,  # 1 / k_scale (fp8), else 1.0
    inv_v_scale,  # 1 / v_scale (fp8), else 1.0
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_V: tl.constexpr,  # Dv
    BLOCK_D: tl.constexpr,  # next power of two of D
    BLOCK_DV: tl.constexpr,  # next power of two of Dv
    BLOCK_HK: tl.constexpr,  # heads per program
    PAGE_SIZE: tl.constexpr,  # tokens per page
    FP8_LIMIT: tl.constexpr,  # saturation bound of fp8 pages, 0.0 otherwise
    FP8_MIN_EXP: tl.constexpr,  # smallest normal exponent of the fp8 format
    FP8_MANT: tl.constexpr,  # mantissa bits of the fp8 format
    ROUND_FIRST: tl.constexpr,  # round to the fp8 grid before the cast (interpreter)
    K_INV_STRIDE: tl.constexpr,  # inv_k_scale: per-head reciprocals' stride (0: one), -1: a float
    V_INV_STRIDE: tl.constexpr,  # inv_v_scale: likewise
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_HK + tl.arange(0, BLOCK_HK)
    mask_h = offs_h < kv_heads
    b = tl.load(batch_idx_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    page = tl.load(block_table_ptr + b * stride_bt + pos // PAGE_SIZE).to(tl.int64)
    slot = pos % PAGE_SIZE
    _store_rows(k_ptr + t * stride_kt, kp_ptr + page * stride_kpp + slot * stride_kps, offs_h, mask_h, stride_kh,
                stride_kph, inv_k_scale, HEAD_DIM, BLOCK_D, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT, ROUND_FIRST, K_INV_STRIDE)
    _store_rows(v_ptr + t * stride_vt, vp_ptr + page * stride_vpp + slot * stride_vps, offs_h, mask_h, stride_vh,
                stride_vph, inv_v_scale, HEAD_DIM_V, BLOCK_DV, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT, ROUND_FIRST, V_INV_STRIDE)


def _page_strides(cache: Any) -> tuple[int, int, int, int, int, int]:
    """(page, slot, head) strides of the K pages, then of the V pages, whatever the layout."""
    kp, vp = cache.k_pages, cache.v_pages
    nhd = cache.layout == "NHD"
    kps, kph = (kp.stride(1), kp.stride(2)) if nhd else (kp.stride(2), kp.stride(1))
    vps, vph = (vp.stride(1), vp.stride(2)) if nhd else (vp.stride(2), vp.stride(1))
    return kp.stride(0), kps, kph, vp.stride(0), vps, vph


#: store launches kept by the geometry that fixes all their arguments but the tensors (:func:`_store`), at most
#: :data:`MAX_KEPT` of them
_KEPT: dict[tuple[Any, ...], Relaunch] = {}
MAX_KEPT = 64


def _store(kernel: Any, k: torch.Tensor, v: torch.Tensor, cache: Any, indexes: tuple[torch.Tensor, ...],
           counts: tuple[int, ...] = (), index_strides: tuple[int, ...] = ()) -> None:
    """Launch a store kernel with (k, v, the K and V pages, ``indexes``, ``counts``, the head count, the strides of
    k, v and the pages, ``index_strides``, the reciprocal scales) and its block sizes.

    An engine appends at every layer of a step with the same geometry, each layer's own pages: with float scales (or
    none) the launch is kept by that geometry (device, shapes, layout, scales) and later calls put their tensors in
    place (:class:`~._launch.Relaunch`: same dtypes, strides and alignment), which skips Triton's per-call work.
    Tensor scales take their reciprocals on the device at every call, so those launches are not kept."""
    tensors = (k, v, cache.k_pages, cache.v_pages, *indexes)
    key = None
    if not cache.scale_tensors:
        key = (id(kernel), k.device, k.shape, v.shape, cache.k_pages.shape, cache.v_pages.shape, cache.layout,
               cache.k_scale, cache.v_scale, *(t.shape for t in indexes))
        kept = _KEPT.get(key)
        bound = None if kept is None else kept.bind(*tensors)
        if kept is not None and bound is not None:
            kept.launch(bound)
            return
    grid, inverses, meta = _store_launch(k, v, cache)
    args = (*tensors, *counts, k.shape[1], k.stride(0), k.stride(1), v.stride(0), v.stride(1), *_page_strides(cache),
            *index_strides, *inverses)
    if key is None:
        kernel[grid](*args, **meta)
        return
    if len(_KEPT) >= MAX_KEPT:
        _KEPT.clear()
    _KEPT[key] = Relaunch(kernel, grid, args, meta, range(len(tensors)))


def append(k: torch.Tensor, v: torch.Tensor, cache: Any, table: Any, batch_indices: torch.Tensor,
           positions: torch.Tensor) -> None:
    """The ``kv_cache.append`` kernel: write k (T, Hkv, D), v (T, Hkv, Dv) into the pages, in place."""
    if k.shape[0] == 0:
        return
    bt = table.block_table
    _store(_append_kernel, k, v, cache, (bt, batch_indices, positions), (), (bt.stride(0),))


def _store_launch(k: torch.Tensor, v: torch.Tensor, cache: Any) -> tuple[tuple[int, int], tuple[Any, Any],
                                                                           dict[str, Any]]:
    """What both append kernels launch with: the grid (tokens, head blocks), the reciprocal K and V scales, and the
    compile-time arguments (block sizes, the fp8 format of the pages, the scales' strides)."""
    tokens, kv_heads, d = k.shape
    dv = v.shape[2]
    block_d, block_dv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    block_hk = max(1, min(triton.next_power_of_2(kv_heads), 4096 // max(block_d, block_dv)))
    limit, min_exp, mant = FP8.get(cache.k_pages.dtype, (0.0, 0, 0))
    (inv_k, k_stride), (inv_v, v_stride) = (_inverse(cache.k_scale, limit), _inverse(cache.v_scale, limit))
    meta = dict(HEAD_DIM=d, HEAD_DIM_V=dv, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_HK=block_hk,
                PAGE_SIZE=cache.page_size, FP8_LIMIT=limit, FP8_MIN_EXP=min_exp, FP8_MANT=mant,
                ROUND_FIRST=bool(limit) and interpreting(), K_INV_STRIDE=k_stride, V_INV_STRIDE=v_stride, num_warps=4)
    return (tokens, triton.cdiv(kv_heads, block_hk)), (inv_k, inv_v), meta


@triton.jit
def _append_slots_kernel(
    k_ptr,  # (T, Hkv, D) new keys
    v_ptr,  # (T, Hkv, Dv) new values
    kp_ptr,  # K pages (any layout through strides)
    vp_ptr,  # V pages
    slot_ptr,  # (T,) int32 or int64 slot of each token: page * PAGE_SIZE + offset; negative = padding
    kv_heads,  # Hkv
    stride_kt,  # k stride over tokens
    stride_kh,  # k stride over heads
    stride_vt,  # v stride over tokens
    stride_vh,  # v stride over heads
    stride_kpp,  # K pages stride over pages
    stride_kps,  # K pages stride over slots
    stride_kph,  # K pages stride over heads
    stride_vpp,  # V pages stride over pages
    stride_vps,  # V pages stride over slots
    stride_vph,  # V pages stride over heads
    inv_k_scale,  # 1 / k_scale (fp8), else 1.0; with K_INV_STRIDE >= 0 a pointer to the per-head reciprocals
    inv_v_scale,  # 1 / v_scale (fp8), else 1.0; likewise
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_V: tl.constexpr,  # Dv
    BLOCK_D: tl.constexpr,  # next power of two of D
    BLOCK_DV: tl.constexpr,  # next power of two of Dv
    BLOCK_HK: tl.constexpr,  # heads per program
    PAGE_SIZE: tl.constexpr,  # tokens per page
    FP8_LIMIT: tl.constexpr,  # saturation bound of fp8 pages, 0.0 otherwise
    FP8_MIN_EXP: tl.constexpr,  # smallest normal exponent of the fp8 format
    FP8_MANT: tl.constexpr,  # mantissa bits of the fp8 format
    ROUND_FIRST: tl.constexpr,  # round to the fp8 grid before the cast (interpreter)
    K_INV_STRIDE: tl.constexpr,  # inv_k_scale: per-head reciprocals' stride (0: one), -1: a float
    V_INV_STRIDE: tl.constexpr,  # inv_v_scale: likewise
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    _store_at_slot(k_ptr, v_ptr, kp_ptr, vp_ptr, t, slot, kv_heads, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps, stride_vph, inv_k_scale, inv_v_scale,
                   HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_HK, PAGE_SIZE, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT,
                   ROUND_FIRST, K_INV_STRIDE, V_INV_STRIDE)


@triton.jit
def _store_at_slot(k_ptr, v_ptr, kp_ptr, vp_ptr, t, slot, kv_heads, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps, stride_vph, inv_k_scale, inv_v_scale,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_HK: tl.constexpr, PAGE_SIZE: tl.constexpr, FP8_LIMIT: tl.constexpr,
                   FP8_MIN_EXP: tl.constexpr, FP8_MANT: tl.constexpr, ROUND_FIRST: tl.constexpr,
                   K_INV_STRIDE: tl.constexpr, V_INV_STRIDE: tl.constexpr):
    """Token ``t``'s K and V rows (this program's block of heads) to ``slot`` (page * PAGE_SIZE + offset, int64);
    a negative slot stores nothing (arguments as the slot kernels')."""
    offs_h = tl.program_id(1) * BLOCK_HK + tl.arange(0, BLOCK_HK)
    mask_h = offs_h < tl.where(slot >= 0, kv_heads, 0)
    slot = tl.maximum(slot, 0)
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    _store_rows(k_ptr + t * stride_kt, kp_ptr + page * stride_kpp + offset * stride_kps, offs_h, mask_h, stride_kh,
                stride_kph, inv_k_scale, HEAD_DIM, BLOCK_D, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT, ROUND_FIRST, K_INV_STRIDE)
    _store_rows(v_ptr + t * stride_vt, vp_ptr + page * stride_vpp + offset * stride_vps, offs_h, mask_h, stride_vh,
                stride_vph, inv_v_scale, HEAD_DIM_V, BLOCK_DV, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT, ROUND_FIRST, V_INV_STRIDE)


@triton.jit
def _append_csr_kernel(
    k_ptr, v_ptr, kp_ptr, vp_ptr,  # as ``_append_slots_kernel``'s
    indptr_ptr,  # (B + 1,) int32: request b holds pages indices[indptr[b]:indptr[b + 1]]
    indices_ptr,  # (nnz,) int32 page ids
    batch_idx_ptr,  # (T,) int32 request of each token
    pos_ptr,  # (T,) int32 position of each token
    batch,  # B
    nnz,  # entries of indices
    num_pages,  # pages in the cache
    kv_heads, stride_kt, stride_kh, stride_vt, stride_vh, stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps,
    stride_vph, inv_k_scale, inv_v_scale,  # as ``_append_slots_kernel``'s
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_HK: tl.constexpr, PAGE_SIZE: tl.constexpr, FP8_LIMIT: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
    FP8_MANT: tl.constexpr, ROUND_FIRST: tl.constexpr, K_INV_STRIDE: tl.constexpr, V_INV_STRIDE: tl.constexpr,
):
    """Token t to page ``indices[indptr[b] + pos // PAGE_SIZE]``, slot ``pos % PAGE_SIZE``; a token whose request,
    position or page lies outside (the op's ``check_indices`` refuses them) stores nothing and reads nothing
    outside the tensors."""
    t = tl.program_id(0).to(tl.int64)
    b = tl.load(batch_idx_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    ok = (b >= 0) & (b < batch) & (pos >= 0)
    b = tl.where(ok, b, 0)
    start = tl.load(indptr_ptr + b, mask=ok, other=0).to(tl.int64)
    end = tl.load(indptr_ptr + b + 1, mask=ok, other=0).to(tl.int64)
    it = start + pos // PAGE_SIZE
    ok = ok & (start >= 0) & (it < end) & (it < nnz)
    page = tl.load(indices_ptr + tl.where(ok, it, 0), mask=ok, other=-1).to(tl.int64)
    ok = ok & (page >= 0) & (page < num_pages)
    slot = tl.where(ok, page * PAGE_SIZE + pos % PAGE_SIZE, -1)
    _store_at_slot(k_ptr, v_ptr, kp_ptr, vp_ptr, t, slot, kv_heads, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_kpp, stride_kps, stride_kph, stride_vpp, stride_vps, stride_vph, inv_k_scale, inv_v_scale,
                   HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_HK, PAGE_SIZE, FP8_LIMIT, FP8_MIN_EXP, FP8_MANT,
                   ROUND_FIRST, K_INV_STRIDE, V_INV_STRIDE)


def append_slots(k: torch.Tensor, v: torch.Tensor, cache: Any, slot_mapping: torch.Tensor) -> None:
    """The ``kv_cache.append_slots`` kernel: write k (T, Hkv, D), v (T, Hkv, Dv) at their slots, in place."""
    if k.shape[0] == 0:
        return
    _store(_append_slots_kernel, k, v, cache, (slot_mapping,))


def append_csr(k: torch.Tensor, v: torch.Tensor, cache: Any, indptr: torch.Tensor, indices: torch.Tensor,
               batch_indices: torch.Tensor, positions: torch.Tensor) -> None:
    """The ``kv_cache.append_csr`` kernel: write k (T, Hkv, D), v (T, Hkv, Dv) through the CSR page table, in
    place, in one launch."""
    if k.shape[0] == 0:
        return
    _store(_append_csr_kernel, k, v, cache, (indptr, indices, batch_indices, positions),
           (indptr.shape[0] - 1, indices.shape[0], cache.num_pages))


def _inverse(scale: Any, limit: float) -> tuple[Any, int]:
    """(1 / scale, the reciprocals' stride over heads or -1 for a float) of an fp8 cache's scale: a float, or a tensor
    () / (Hkv,) of per-head scales (its reciprocals in float32, computed on the device); (1.0, -1) without fp8."""
    if not limit:
        return 1.0, -1
    if isinstance(scale, torch.Tensor):
        return 1.0 / scale, 1 if scale.dim() else 0
    return 1.0 / scale, -1


@triton.jit
def _append_mla_kernel(
    ckv_ptr,  # (T, Dc) new latents
    kpe_ptr,  # (T, Dr) new rope keys
    cp_ptr,  # (P, S, Dc) latent pages
    pp_ptr,  # (P, S, Dr) rope-key pages
    block_table_ptr,  # (B, max_pages) int32
    batch_idx_ptr,  # (T,) int32 request of each token
    pos_ptr,  # (T,) int32 position of each token
    stride_ct,  # ckv stride over tokens
    stride_pt,  # kpe stride over tokens
    stride_cpp,  # latent pages stride over pages
    stride_cps,  # latent pages stride over slots
    stride_ppp,  # rope pages stride over pages
    stride_pps,  # rope pages stride over slots
    stride_bt,  # block_table row stride
    DIM_C: tl.constexpr,  # Dc
    DIM_R: tl.constexpr,  # Dr
    BLOCK_C: tl.constexpr,  # next power of two of Dc
    BLOCK_R: tl.constexpr,  # next power of two of Dr
    PAGE_SIZE: tl.constexpr,  # tokens per page
):
    t = tl.program_id(0).to(tl.int64)
    b = tl.load(batch_idx_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    page = tl.load(block_table_ptr + b * stride_bt + pos // PAGE_SIZE).to(tl.int64)
    slot = pos % PAGE_SIZE
    one = tl.arange(0, 1)
    _store_rows(ckv_ptr + t * stride_ct, cp_ptr + page * stride_cpp + slot * stride_cps, one, one < 1, 0, 0, 1.0,
                DIM_C, BLOCK_C, 0.0, 0, 0, False, -1)
    _store_rows(kpe_ptr + t * stride_pt, pp_ptr + page * stride_ppp + slot * stride_pps, one, one < 1, 0, 0, 1.0,
                DIM_R, BLOCK_R, 0.0, 0, 0, False, -1)


def append_mla(ckv: torch.Tensor, kpe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor, table: Any,
               batch_indices: torch.Tensor, positions: torch.Tensor) -> None:
    """The ``kv_cache.append_mla`` kernel: write ckv (T, Dc), kpe (T, Dr) into (P, S, Dc), (P, S, Dr) pages."""
    tokens = ckv.shape[0]
    if tokens == 0:
        return
    bt = table.block_table
    _append_mla_kernel[(tokens,)](
        ckv, kpe, ckv_pages, kpe_pages, bt, batch_indices, positions,
        ckv.stride(0), kpe.stride(0), ckv_pages.stride(0), ckv_pages.stride(1), kpe_pages.stride(0),
        kpe_pages.stride(1), bt.stride(0),
        DIM_C=ckv.shape[1], DIM_R=kpe.shape[1], BLOCK_C=triton.next_power_of_2(ckv.shape[1]),
        BLOCK_R=triton.next_power_of_2(kpe.shape[1]), PAGE_SIZE=ckv_pages.shape[1], num_warps=4,
    )
