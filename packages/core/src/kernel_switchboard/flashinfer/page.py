"""``flashinfer.page`` over the switchboard: :func:`append_paged_kv_cache` (``kv_cache.append_csr``),
:func:`append_paged_mla_kv_cache` (the same, on the latent pages), :func:`get_batch_indices_positions` and
:func:`get_seq_lens` (index arithmetic in torch, on the device, exactly as FlashInfer defines it)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import fail
from ..ops import kv_cache
from ..paged import PagedKVCache
from ._common import check_layout
from ._kv import KVForms


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Tokens per request of FlashInfer's CSR pages: ``max(pages - 1, 0) * page_size + last_page_len``."""
    return torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size + kv_last_page_len


def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int,
                                batch_indices: torch.Tensor | None = None, positions: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch_indices, positions) (nnz,) int32 of packed new tokens: token i of request b (``append_indptr`` packs
    qo_len_b of them) sits at ``seq_lens[b] - qo_len_b + i``. Entries past ``append_indptr[-1]`` get batch index -1
    and position 0. ``batch_indices`` / ``positions``, when given, are written and returned."""
    if not (isinstance(append_indptr, torch.Tensor) and append_indptr.dim() == 1 and append_indptr.numel() >= 1):
        raise fail("append_indptr", type(append_indptr).__name__, "a 1-d (batch + 1,) tensor")
    device = append_indptr.device
    for name, t in (("batch_indices", batch_indices), ("positions", positions)):
        if t is not None and not (isinstance(t, torch.Tensor) and t.shape == (nnz,) and t.dtype == torch.int32
                                  and t.device == device):
            raise fail(name, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__,
                       f"({nnz},) int32 on {device}")
    ind = append_indptr.long()
    batch = ind.numel() - 1
    t = torch.arange(nnz, dtype=torch.int64, device=device)
    rows = torch.searchsorted(ind[1:], t, right=True)
    valid = (rows < batch) & (t >= ind[0])
    row = rows.clamp(max=max(batch - 1, 0))
    if batch:
        pos = seq_lens.to(device).long()[row] - (ind[row + 1] - ind[row]) + (t - ind[row])
    else:
        pos = torch.zeros_like(t)
    b_out = torch.where(valid, rows, -1).to(torch.int32)
    p_out = torch.where(valid, pos, 0).to(torch.int32)
    if batch_indices is not None:
        b_out = batch_indices.copy_(b_out)
    if positions is not None:
        p_out = positions.copy_(p_out)
    return b_out, p_out


#: the pages' caches by layout, remembered per (k, v) pair or combined tensor (checked once, as the wrappers' are):
#: engines append once per layer and step, and a cache built and checked at each call cost more host time than the
#: append's launch
_FORMS = {"NHD": KVForms("NHD"), "HND": KVForms("HND")}


def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                          positions: torch.Tensor, paged_kv_cache: Any, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, kv_layout: str = "NHD") -> None:
    """Write new K/V tokens (nnz, Hkv, D) into the pages, in place: token t goes to request ``batch_indices[t]`` at
    ``positions[t]``. The pages (``kv_indices`` / ``kv_indptr`` / ``kv_last_page_len``) already count the new
    tokens; fp8 pages store the values cast to fp8.

    Runs ``kv_cache.append_csr``: one launch that reads each token's page from the CSR arrays, with no table built
    and no read back to the host (engines call this once per layer; FlashInfer checks nothing either). A token
    whose request, position or page lies outside (a padding entry of ``get_batch_indices_positions``: batch index
    -1) writes nothing."""
    check_layout(kv_layout)
    _append_csr(append_key, append_value, _FORMS[kv_layout].cache(paged_kv_cache), batch_indices, positions,
                kv_indices, kv_indptr, kv_last_page_len)


def append_paged_mla_kv_cache(append_ckv: torch.Tensor, append_kpe: torch.Tensor, batch_indices: torch.Tensor,
                              positions: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
                              kv_indices: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> None:
    """Write new MLA latent tokens, ckv (nnz, Dc) and kpe (nnz, Dr), into ckv_cache (P, S, Dc) and kpe_cache
    (P, S, Dr), in place, as :func:`append_paged_kv_cache` places tokens.

    Runs ``kv_cache.append_csr`` on the pages seen as a one-head cache (ckv as K, kpe as V): one launch, no table
    built, no read back, and a token whose target lies outside writes nothing, as :func:`append_paged_kv_cache`."""
    for name, t in (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache), ("append_ckv", append_ckv),
                    ("append_kpe", append_kpe)):
        dims = 2 if name.startswith("append") else 3
        if not (isinstance(t, torch.Tensor) and t.dim() == dims):
            raise fail(name, type(t).__name__ if not isinstance(t, torch.Tensor) else tuple(t.shape),
                       "a (nnz, dim) tensor" if dims == 2 else "a (pages, page_size, dim) tensor")
    if kpe_cache.dtype != ckv_cache.dtype or kpe_cache.shape[:2] != ckv_cache.shape[:2]:
        raise fail("kpe_cache", f"{tuple(kpe_cache.shape)} {kpe_cache.dtype}",
                   f"the pages and page size of ckv_cache {tuple(ckv_cache.shape[:2])}, in its dtype {ckv_cache.dtype}")
    cache = PagedKVCache(ckv_cache.unsqueeze(2), kpe_cache.unsqueeze(2), "NHD")
    _append_csr(append_ckv.unsqueeze(1), append_kpe.unsqueeze(1), cache, batch_indices, positions, kv_indices,
                kv_indptr, kv_last_page_len)


def _append_csr(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, batch_indices: Any, positions: Any,
                kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any) -> None:
    """``kv_cache.append_csr`` with FlashInfer's arguments (int64 index tensors taken as int32; ``kv_last_page_len``
    checked for its shape only, as the pages already count the new tokens), unchecked targets: no read back."""
    indptr = _int32(kv_indptr, "kv_indptr")
    if not (isinstance(kv_last_page_len, torch.Tensor) and kv_last_page_len.shape == (indptr.numel() - 1,)):
        raise fail("kv_last_page_len", tuple(kv_last_page_len.shape) if isinstance(kv_last_page_len, torch.Tensor)
                   else type(kv_last_page_len).__name__, f"a ({indptr.numel() - 1},) tensor: one per request")
    kv_cache.append_csr(k, v, cache, indptr, _int32(kv_indices, "kv_indices"), _int32(positions, "positions"),
                        _int32(batch_indices, "batch_indices"), check_indices=False)


def _int32(t: Any, name: str) -> torch.Tensor:
    if not (isinstance(t, torch.Tensor) and t.dtype in (torch.int32, torch.int64)):
        raise fail(name, type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype, "an int32 tensor")
    return t if t.dtype == torch.int32 else t.to(torch.int32)
