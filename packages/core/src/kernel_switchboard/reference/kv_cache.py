"""Reference kv_cache kernels (see :mod:`kernel_switchboard.ops.kv_cache` for signatures).

Batched index writes with no host synchronisation (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from ..paged import PagedKVCache, PageTable, csr_targets
from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY


def _targets(table: PageTable, batch_indices: torch.Tensor, positions: torch.Tensor, page_size: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(page id, slot) int64 of each token."""
    pos = positions.long()
    pages = table.block_table[batch_indices.long(), pos // page_size].long()
    return pages, pos % page_size


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None) -> torch.Tensor:
    """``x`` (T, H, D) as stored in pages of ``dtype``: fp8 stores x * (1 / scale) saturated to the fp8 range; a
    scale tensor of shape () or (H,) scales each head by its own.

    The reciprocal is taken once in float32, as CUDA's division by a scalar does, so that CPU and GPU
    store the same bytes."""
    if scale is None:
        return x.to(dtype)
    limit = torch.finfo(dtype).max
    if isinstance(scale, torch.Tensor):
        inv: float | torch.Tensor = (1.0 / scale.float()).reshape(-1, 1)
    else:
        inv = torch.tensor(1.0 / scale, dtype=torch.float32).item()
    return (x.float() * inv).clamp(-limit, limit).to(dtype)


def append(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, table: PageTable, batch_indices: torch.Tensor,
           positions: torch.Tensor) -> None:
    """Write k (T, Hkv, D), v (T, Hkv, Dv) at (batch_indices[t], positions[t]) of the paged cache."""
    pages, slots = _targets(table, batch_indices, positions, cache.page_size)
    k_nhd, v_nhd = cache.nhd()  # views: writes land in the cache's own layout
    k_nhd[pages, slots] = quantize(k, cache.dtype, cache.k_scale)  # (T, Hkv, D): a per-head scale broadcasts
    v_nhd[pages, slots] = quantize(v, cache.dtype, cache.v_scale)


def append_slots(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, slot_mapping: torch.Tensor) -> None:
    """Write k (T, Hkv, D), v (T, Hkv, Dv) at slots ``slot_mapping`` (T,) of the paged cache; a negative slot
    writes nothing.

    Without a host read (capturable): each padding token repeats the write of a real token next to it (the
    same slot, the same value), so no index is written with two different values; when no token is real,
    every write puts back what slot 0 of page 0 holds."""
    tokens = k.shape[0]
    if tokens == 0:
        return
    slots = slot_mapping.long()
    t = torch.arange(tokens, device=slots.device)
    real = slots >= 0
    before = torch.cummax(torch.where(real, t, -1), 0).values  # last real token at or before t, else -1
    after = torch.where(real, t, tokens).flip(0).cummin(0).values.flip(0)  # first at or after t, else T
    src = torch.where(before >= 0, before, after)
    any_real = src < tokens
    src = src.clamp(max=tokens - 1)
    target = torch.where(any_real, slots[src], 0)
    pages, offsets = target // cache.page_size, target % cache.page_size
    keep = any_real[:, None, None]
    k_nhd, v_nhd = cache.nhd()  # views: writes land in the cache's own layout
    for x, pages_nhd, scale in ((k, k_nhd, cache.k_scale), (v, v_nhd, cache.v_scale)):
        new = quantize(x, cache.dtype, scale)[src]
        old = pages_nhd[pages, offsets]
        if cache.is_fp8:  # torch.where has no fp8 kernels: select the bytes
            chosen = torch.where(keep, new.view(torch.uint8), old.view(torch.uint8)).view(cache.dtype)
        else:
            chosen = torch.where(keep, new, old)
        pages_nhd[pages, offsets] = chosen


def append_csr(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, indptr: torch.Tensor, indices: torch.Tensor,
               batch_indices: torch.Tensor, positions: torch.Tensor) -> None:
    """Write k (T, Hkv, D), v (T, Hkv, Dv) at page ``indices[indptr[b] + pos // S]``, slot ``pos % S`` of the paged
    cache; a token whose request, position or page lies outside writes nothing (its slot is -1: the slots are
    computed with clamped reads, then written as :func:`append_slots` writes them)."""
    size = cache.page_size
    b, pos, start, end, it, page = csr_targets(indptr, indices, batch_indices, positions, size)
    ok = (b >= 0) & (b < indptr.shape[0] - 1) & (pos >= 0) & (start >= 0) & (it < end) & (it < indices.shape[0])
    ok &= (page >= 0) & (page < cache.num_pages)
    append_slots(k, v, cache, torch.where(ok, page * size + pos % size, -1))


def append_mla(ckv: torch.Tensor, kpe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
               table: PageTable, batch_indices: torch.Tensor, positions: torch.Tensor) -> None:
    """Write ckv (T, Dc), kpe (T, Dr) at (batch_indices[t], positions[t]) of the MLA pages (P, S, D)."""
    pages, slots = _targets(table, batch_indices, positions, ckv_pages.shape[1])
    ckv_pages[pages, slots] = ckv.to(ckv_pages.dtype)
    kpe_pages[pages, slots] = kpe.to(kpe_pages.dtype)


KERNELS = [
    # a token's stored values depend on that token alone (copies, or an exact divide and round for fp8): batch invariant
    Kernel("kv_cache.append", "append", "reference", INVARIANT_CAPTURABLE, append, priority=PRIORITY),
    Kernel("kv_cache.append_slots", "append_slots", "reference", INVARIANT_CAPTURABLE, append_slots,
           priority=PRIORITY),
    Kernel("kv_cache.append_csr", "append_csr", "reference", INVARIANT_CAPTURABLE, append_csr, priority=PRIORITY),
    Kernel("kv_cache.append_mla", "append_mla", "reference", INVARIANT_CAPTURABLE, append_mla, priority=PRIORITY),
]
