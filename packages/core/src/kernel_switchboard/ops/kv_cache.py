"""KV-cache ops: ``kv_cache.append`` (paged K/V), ``kv_cache.append_slots`` (paged K/V by slot mapping),
``kv_cache.append_csr`` (paged K/V through FlashInfer's CSR page table) and ``kv_cache.append_mla`` (MLA latent
pages).

Kernel ``run`` signatures (canonical, validated arguments), writing the pages in place:

- ``kv_cache.append``: ``run(k, v, cache, table, batch_indices, positions) -> None``; k (T, Hkv, D),
  v (T, Hkv, Dv); batch_indices, positions (T,) int32: token t goes to request
  ``batch_indices[t]`` at position ``positions[t]``, i.e. page ``table.block_table[b, pos // S]``,
  slot ``pos % S``. fp8 caches store ``value / scale`` (saturated to the fp8 range).
- ``kv_cache.append_slots``: ``run(k, v, cache, slot_mapping) -> None``; k (T, Hkv, D), v (T, Hkv, Dv);
  slot_mapping (T,) int32 or int64 in the form vLLM and SGLang use: token t goes to page
  ``slot // S``, slot ``slot % S``; a negative slot marks a padding token, which writes nothing.
  fp8 caches as in ``append``.
- ``kv_cache.append_csr``: ``run(k, v, cache, indptr, indices, batch_indices, positions) -> None``; indptr (B+1,)
  and indices (nnz,) int32, FlashInfer's form: request b holds pages ``indices[indptr[b]:indptr[b+1]]``; token t
  goes to page ``indices[indptr[b] + pos // S]``, slot ``pos % S``. A token whose request, position or page lies
  outside writes nothing (and nothing outside the tensors is read).
- ``kv_cache.append_mla``: ``run(ckv, kpe, ckv_pages, kpe_pages, table, batch_indices, positions) -> None``;
  ckv (T, Dc), kpe (T, Dr); ckv_pages (P, S, Dc), kpe_pages (P, S, Dr).

Every position (every slot) must lie inside its request's pages (the cache); the public functions check
that with one read back from the device (skipped during CUDA-graph capture, or with ``check_indices=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..device import is_capturing
from ..dispatch import select
from ..errors import fail
from ..paged import PagedKVCache, PageTable, csr_targets
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

_INT32 = frozenset({torch.int32})
_Tensor = torch.Tensor
_IN_PLACE = frozenset({"paged", "in_place"})


class AppendProblem(NamedTuple):
    """Signature of a paged K/V append, by positions (``kv_cache.append``) or by slot mapping
    (``kv_cache.append_slots``): the two ops rank kernels on the same fields."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype  # k / v dtype
    kv_dtype: torch.dtype  # page dtype
    head_dim: int
    head_dim_v: int
    page_size: int
    layout: str
    num_kv_heads: int
    tokens: int  # bucketed
    features: frozenset[str]


class MLAAppendProblem(NamedTuple):
    """Signature of an MLA latent-cache append."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim: int  # latent (ckv) dim
    head_dim_pe: int  # rope dim
    page_size: int
    layout: None
    tokens: int  # bucketed
    features: frozenset[str]


def batch_indices_positions(qo_indptr: _Tensor, seq_lens: _Tensor, total: int) -> tuple[_Tensor, _Tensor]:
    """(batch_indices, positions) (total,) int32 of packed new tokens, on the device, no host sync.

    qo_indptr (B+1,) int32 packs ``total`` new tokens per request; seq_lens (B,) int32 are the
    lengths *after* the append, so token i of request b goes to ``seq_len_b - qo_len_b + i``.
    """
    t = torch.arange(total, device=qo_indptr.device, dtype=torch.int64)
    ind = qo_indptr.long()
    rows = torch.searchsorted(ind[1:], t, right=True)
    qo_len = ind[1:] - ind[:-1]
    positions = seq_lens.long()[rows] - qo_len[rows] + (t - ind[rows])
    return rows.to(torch.int32), positions.to(torch.int32)


# -- validation ---------------------------------------------------------------------------------------
def _check_index_tensors(positions: Any, batch_indices: Any, tokens: int, table: PageTable, like: _Tensor
                         ) -> _Tensor:
    """Check positions / batch_indices; returns batch_indices (arange(B) when None and T == B)."""
    _check_per_token(positions, "positions", _INT32, tokens, like)
    if batch_indices is None:
        if tokens != table.batch_size:
            raise fail("batch_indices", None, f"a (T,) int32 tensor: T = {tokens} tokens != batch {table.batch_size}, "
                                              "so which request each token belongs to must be given")
        return torch.arange(tokens, dtype=torch.int32, device=positions.device)
    _check_per_token(batch_indices, "batch_indices", _INT32, tokens, like)
    return batch_indices


def _check_per_token(t: Any, name: str, dtypes: Any, tokens: int, like: _Tensor,
                     count: str = "the number of tokens") -> None:
    """``t``: a contiguous (tokens,) tensor of ``dtypes`` on the pages' device."""
    check_tensor(t, name, dims=1, dtypes=dtypes)
    if t.shape[0] != tokens:
        raise fail(f"{name}.shape", tuple(t.shape), f"({tokens},) = {count}")
    check_same_device(name, t, "the pages", like)
    if not t.is_contiguous():
        raise fail(name, "non-contiguous", "a contiguous tensor")


def _check_table(table: Any, like: _Tensor) -> None:
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    if table.block_table.device != like.device:
        raise fail("table.device", table.block_table.device, f"the device of the pages ({like.device})")


def _check_targets(table: PageTable, batch_indices: _Tensor, positions: _Tensor, page_size: int, num_pages: int) -> None:
    """One device read: every token's request, position and page must be in range."""
    if positions.numel() == 0 or is_capturing():
        return
    b, max_pages = table.batch_size, table.max_pages
    bi, pos = batch_indices.long(), positions.long()
    bad_b = (bi < 0) | (bi >= b)
    bad_pos = (pos < 0) | (pos >= max_pages * page_size)
    if b and max_pages:
        pages = table.block_table[bi.clamp(0, b - 1), (pos // page_size).clamp(0, max_pages - 1)]
        bad_page = (pages < 0) | (pages >= num_pages)
    else:
        bad_page = torch.ones_like(bad_b)
    bad_page = bad_page & ~bad_b & ~bad_pos
    _raise_first_bad([
        (bad_b, "batch_indices", lambda t: f"{int(bi[t])} at token {t}", lambda t: f"request indices in [0, {b})"),
        (bad_pos, "positions", lambda t: f"{int(pos[t])} at token {t}",
         lambda t: f"positions in [0, max_pages * page_size = {max_pages} * {page_size})"),
        (bad_page, "table.block_table", lambda t: f"page index {int(pages[t])} for token {t}",
         lambda t: f"page indices in [0, {num_pages}) for the pages written"),
    ])


def _raise_first_bad(checks: list[tuple[_Tensor, str, Callable[[int], str], Callable[[int], str]]]) -> None:
    """With one read back for every check: raise for the first check (argument name, value and what is allowed,
    told by its first bad token) whose (T,) mask flags a token."""
    flags = torch.stack([mask.any() for mask, *_ in checks]).tolist()
    for flag, (mask, name, value, allowed) in zip(flags, checks, strict=True):
        if flag:
            t = int(mask.nonzero()[0, 0])
            raise fail(name, value(t), allowed(t))


def _check_kv(k: Any, v: Any, cache: Any) -> _Tensor:
    """Check new K/V rows against the cache they go to; returns its K pages."""
    if not isinstance(cache, PagedKVCache):
        raise fail("cache", type(cache).__name__, "a PagedKVCache")
    pages = cache.k_pages
    for name, t, dim in (("k", k, cache.head_dim), ("v", v, cache.head_dim_v)):
        check_tensor(t, name, dims=3, dtypes=FLOAT_DTYPES)
        if t.shape[1] != cache.num_kv_heads or t.shape[2] != dim:
            raise fail(f"{name}.shape", tuple(t.shape), f"(T, {cache.num_kv_heads}, {dim}) to match the cache")
        if t.stride(-1) != 1:
            raise fail(f"{name}.stride", t.stride(), "unit stride in the last (head_dim) dim")
        check_same_device(name, t, "cache", pages)
    if v.shape[0] != k.shape[0] or v.dtype != k.dtype:
        raise fail("v", f"{tuple(v.shape)} {v.dtype}", f"k's token count and dtype ({k.shape[0]}, {k.dtype})")
    if k.dtype != cache.dtype and not cache.is_fp8:
        raise fail("k.dtype", k.dtype, f"the cache's dtype ({cache.dtype})")
    return pages


def _kv_features(cache: PagedKVCache, dev: str) -> frozenset[str]:
    """The features a K/V append into ``cache`` uses."""
    feats = _IN_PLACE | graph_features(dev)
    if cache.is_fp8:
        feats = feats | {"fp8_kv"}
    if cache.head_dim != cache.head_dim_v:
        feats = feats | {"qk_v_dims_differ"}
    return feats


# -- append -------------------------------------------------------------------------------------------
def append(k: _Tensor, v: _Tensor, cache: PagedKVCache, table: PageTable, positions: _Tensor,
           batch_indices: _Tensor | None = None, *, check_indices: bool = True, backend: BackendArg = None) -> None:
    """Write new K/V tokens into the paged cache, in place.

    k (T, Hkv, D), v (T, Hkv, Dv) in the cache's dtype (any float dtype for an fp8 cache, which
    stores value / scale); positions (T,) int32; batch_indices (T,) int32, or None when each
    request gets exactly one token (T == batch, token t -> request t). See
    :func:`batch_indices_positions` for packed prefill tokens.
    """
    if torch.compiler.is_compiling():
        APPEND.compiled(k, v, cache, table, positions, batch_indices, check_indices, backend)
        return
    _append_eager(k, v, cache, table, positions, batch_indices, check_indices, backend)


def append_call(k: _Tensor, v: _Tensor, cache: PagedKVCache, table: PageTable, positions: _Tensor,
                batch_indices: _Tensor | None = None, check_indices: bool = True) -> tuple[AppendProblem, _Tensor]:
    """Validate an :func:`append` call (``check_indices``: the targets, one host read): its problem and the batch
    indices (made for one token per request)."""
    pages = _check_kv(k, v, cache)
    _check_table(table, pages)
    batch_indices = _check_index_tensors(positions, batch_indices, k.shape[0], table, pages)
    if check_indices:
        _check_targets(table, batch_indices, positions, cache.page_size, cache.num_pages)
    dev, cc = device_key(pages)
    feats = _kv_features(cache, dev)
    problem = AppendProblem(dev, cc, k.dtype, cache.dtype, cache.head_dim, cache.head_dim_v, cache.page_size,
                            cache.layout, cache.num_kv_heads, bucket(k.shape[0]), feats)
    return problem, batch_indices


def _append_eager(k: _Tensor, v: _Tensor, cache: PagedKVCache, table: PageTable, positions: _Tensor,
                  batch_indices: _Tensor | None, check_indices: bool, backend: BackendArg) -> None:
    problem, batch_indices = append_call(k, v, cache, table, positions, batch_indices, check_indices)
    select("kv_cache.append", problem, backend).kernel.run(k, v, cache, table, batch_indices, positions)


# -- append_slots -------------------------------------------------------------------------------------
_SLOT_DTYPES = frozenset({torch.int32, torch.int64})


def append_slots(k: _Tensor, v: _Tensor, cache: PagedKVCache, slot_mapping: _Tensor, *, check_indices: bool = True,
                 backend: BackendArg = None) -> None:
    """Write new K/V tokens into the paged cache by slot mapping, in place (the form vLLM and SGLang use).

    k (T, Hkv, D), v (T, Hkv, Dv) in the cache's dtype (any float dtype for an fp8 cache, which
    stores value / scale); slot_mapping (T,) int32 or int64: token t goes to page ``slot // page_size``,
    offset ``slot % page_size``; a negative slot marks a padding token and writes nothing. Two tokens
    for one slot are undefined. No host synchronisation beyond the one range check of
    ``check_indices`` (skipped during CUDA-graph capture), so a captured step can replay it.
    """
    if torch.compiler.is_compiling():
        APPEND_SLOTS.compiled(k, v, cache, slot_mapping, check_indices, backend)
        return
    problem = append_slots_call(k, v, cache, slot_mapping, check_indices)[0]
    select("kv_cache.append_slots", problem, backend).kernel.run(k, v, cache, slot_mapping)


def _check_slots(slot_mapping: _Tensor, num_slots: int) -> None:
    """One device read: every slot must be a padding mark (< 0) or lie in [0, num_pages * page_size)."""
    if slot_mapping.numel() == 0 or is_capturing():
        return
    if int(slot_mapping.max()) >= num_slots:
        t = int((slot_mapping >= num_slots).nonzero()[0, 0])
        raise fail("slot_mapping", f"{int(slot_mapping[t])} at token {t}",
                   f"slots in [0, num_pages * page_size = {num_slots}), or negative for a padding token")


def append_slots_call(k: _Tensor, v: _Tensor, cache: PagedKVCache, slot_mapping: _Tensor,
                      check_indices: bool = True) -> tuple[AppendProblem]:
    """Validate an :func:`append_slots` call (``check_indices``: the slots, one host read): its problem."""
    pages = _check_kv(k, v, cache)
    _check_per_token(slot_mapping, "slot_mapping", _SLOT_DTYPES, k.shape[0], pages, "the number of tokens in k and v")
    if check_indices:
        _check_slots(slot_mapping, cache.num_pages * cache.page_size)
    dev, cc = device_key(pages)
    feats = _kv_features(cache, dev)
    return AppendProblem(dev, cc, k.dtype, cache.dtype, cache.head_dim, cache.head_dim_v, cache.page_size,
                              cache.layout, cache.num_kv_heads, bucket(k.shape[0]), feats),


# -- append_csr -----------------------------------------------------------------------------------------
def append_csr(k: _Tensor, v: _Tensor, cache: PagedKVCache, indptr: _Tensor, indices: _Tensor, positions: _Tensor,
               batch_indices: _Tensor, *, check_indices: bool = True, backend: BackendArg = None) -> None:
    """Write new K/V tokens into the paged cache through FlashInfer's CSR page table, in place (the form of
    ``flashinfer.append_paged_kv_cache``, which engines call once per layer with one table per step).

    k (T, Hkv, D), v (T, Hkv, Dv) as in :func:`append`; indptr (B+1,), indices (nnz,) int32: request b holds pages
    ``indices[indptr[b]:indptr[b+1]]``, in order; positions, batch_indices (T,) int32: token t goes to request
    ``batch_indices[t]`` at position ``positions[t]``. No table is built: the kernel reads the page of each token
    from the CSR arrays (one launch). ``check_indices`` checks every target with one read back from the device
    (skipped during CUDA-graph capture); without it a token whose target lies outside writes nothing.
    """
    if torch.compiler.is_compiling():
        APPEND_CSR.compiled(k, v, cache, indptr, indices, positions, batch_indices, check_indices, backend)
        return
    problem = append_csr_call(k, v, cache, indptr, indices, positions, batch_indices, check_indices)[0]
    select("kv_cache.append_csr", problem, backend).kernel.run(k, v, cache, indptr, indices, batch_indices, positions)


def _check_csr(indptr: Any, indices: Any, like: _Tensor) -> None:
    """indptr (B+1,) and indices (nnz,): contiguous int32 tensors on the pages' device."""
    for name, t in (("indptr", indptr), ("indices", indices)):
        check_tensor(t, name, dims=1, dtypes=_INT32)
        check_same_device(name, t, "the pages", like)
        if not t.is_contiguous():
            raise fail(name, "non-contiguous", "a contiguous tensor")
    if indptr.shape[0] < 1:
        raise fail("indptr.shape", tuple(indptr.shape), "(batch + 1,) with at least one entry")


def _check_csr_targets(indptr: _Tensor, indices: _Tensor, batch_indices: _Tensor, positions: _Tensor,
                       page_size: int, num_pages: int) -> None:
    """One device read: every token's request, its page range in ``indices``, its position and its page must be in
    range."""
    if positions.numel() == 0 or is_capturing():
        return
    batch, nnz = indptr.shape[0] - 1, indices.shape[0]
    bi, pos, start, end, it, page = csr_targets(indptr, indices, batch_indices, positions, page_size)
    bad_b = (bi < 0) | (bi >= batch)
    bad_range = ~bad_b & ((start < 0) | (end < start) | (end > nnz))
    bad_pos = ~bad_b & ~bad_range & ((pos < 0) | (it >= end))
    bad_page = ~bad_b & ~bad_range & ~bad_pos & ((page < 0) | (page >= num_pages))
    _raise_first_bad([
        (bad_b, "batch_indices", lambda t: f"{int(bi[t])} at token {t}", lambda t: f"request indices in [0, {batch})"),
        (bad_range, "indptr", lambda t: f"[{int(start[t])}, {int(end[t])}) for request {int(bi[t])} (token {t})",
         lambda t: f"non-decreasing offsets within indices ([0, {nnz}])"),
        (bad_pos, "positions", lambda t: f"{int(pos[t])} at token {t}",
         lambda t: f"positions in [0, {int(end[t] - start[t])} pages * page_size {page_size}) of request "
                   f"{int(bi[t])}"),
        (bad_page, "indices", lambda t: f"page index {int(page[t])} for token {t}",
         lambda t: f"page indices in [0, {num_pages})"),
    ])


def append_csr_call(k: _Tensor, v: _Tensor, cache: PagedKVCache, indptr: _Tensor, indices: _Tensor,
                    positions: _Tensor, batch_indices: _Tensor, check_indices: bool = True) -> tuple[AppendProblem]:
    """Validate an :func:`append_csr` call (``check_indices``: the targets, one host read): its problem."""
    pages = _check_kv(k, v, cache)
    _check_csr(indptr, indices, pages)
    _check_per_token(positions, "positions", _INT32, k.shape[0], pages)
    _check_per_token(batch_indices, "batch_indices", _INT32, k.shape[0], pages)
    if check_indices:
        _check_csr_targets(indptr, indices, batch_indices, positions, cache.page_size, cache.num_pages)
    dev, cc = device_key(pages)
    return AppendProblem(dev, cc, k.dtype, cache.dtype, cache.head_dim, cache.head_dim_v, cache.page_size,
                         cache.layout, cache.num_kv_heads, bucket(k.shape[0]), _kv_features(cache, dev)),


# -- append_mla ----------------------------------------------------------------------------------------
def append_mla(ckv: _Tensor, kpe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable,
               positions: _Tensor, batch_indices: _Tensor | None = None, *, check_indices: bool = True,
               backend: BackendArg = None) -> None:
    """Write new MLA latent tokens into the pages, in place.

    ckv (T, Dc), kpe (T, Dr) in the pages' dtype; ckv_pages (P, S, Dc), kpe_pages (P, S, Dr);
    positions / batch_indices as in :func:`append`.
    """
    if torch.compiler.is_compiling():
        APPEND_MLA.compiled(ckv, kpe, ckv_pages, kpe_pages, table, positions, batch_indices, check_indices, backend)
        return
    _append_mla_eager(ckv, kpe, ckv_pages, kpe_pages, table, positions, batch_indices, check_indices, backend)


def append_mla_call(ckv: _Tensor, kpe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable,
                    positions: _Tensor, batch_indices: _Tensor | None = None,
                    check_indices: bool = True) -> tuple[MLAAppendProblem, _Tensor]:
    """Validate an :func:`append_mla` call (``check_indices``: the targets, one host read): its problem and the
    batch indices (made for one token per request)."""
    check_tensor(ckv_pages, "ckv_pages", dims=3, dtypes=FLOAT_DTYPES)
    check_tensor(kpe_pages, "kpe_pages", dims=3, dtypes=FLOAT_DTYPES)
    if kpe_pages.shape[:2] != ckv_pages.shape[:2] or kpe_pages.dtype != ckv_pages.dtype:
        raise fail("kpe_pages", f"{tuple(kpe_pages.shape)} {kpe_pages.dtype}",
                   f"(P, S, Dr) with (P, S) = {tuple(ckv_pages.shape[:2])} and dtype {ckv_pages.dtype} as ckv_pages")
    check_same_device("kpe_pages", kpe_pages, "ckv_pages", ckv_pages)
    for name, t, pages in (("ckv", ckv, ckv_pages), ("kpe", kpe, kpe_pages)):
        check_tensor(t, name, dims=2)
        if t.dtype != pages.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"the dtype of {name}_pages ({pages.dtype})")
        if t.shape[1] != pages.shape[2]:
            raise fail(f"{name}.shape", tuple(t.shape), f"(T, {pages.shape[2]}) to match {name}_pages (P, S, D)")
        if t.stride(-1) != 1:
            raise fail(f"{name}.stride", t.stride(), "unit stride in the last dim")
        check_same_device(name, t, "ckv_pages", ckv_pages)
        if pages.stride(-1) != 1:
            raise fail(f"{name}_pages.stride", pages.stride(), "unit stride in the last dim")
    if kpe.shape[0] != ckv.shape[0]:
        raise fail("kpe.shape", tuple(kpe.shape), f"({ckv.shape[0]}, Dr): as many tokens as ckv")
    _check_table(table, ckv_pages)
    batch_indices = _check_index_tensors(positions, batch_indices, ckv.shape[0], table, ckv_pages)
    page_size = ckv_pages.shape[1]
    if check_indices:
        _check_targets(table, batch_indices, positions, page_size, ckv_pages.shape[0])
    dev, cc = device_key(ckv_pages)
    problem = MLAAppendProblem(dev, cc, ckv.dtype, ckv_pages.dtype, ckv.shape[1], kpe.shape[1], page_size, None,
                               bucket(ckv.shape[0]), _IN_PLACE | graph_features(dev))
    return problem, batch_indices


def _append_mla_eager(ckv: _Tensor, kpe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable,
                      positions: _Tensor, batch_indices: _Tensor | None, check_indices: bool,
                      backend: BackendArg) -> None:
    problem, batch_indices = append_mla_call(ckv, kpe, ckv_pages, kpe_pages, table, positions, batch_indices,
                                             check_indices)
    select("kv_cache.append_mla", problem, backend).kernel.run(ckv, kpe, ckv_pages, kpe_pages, table, batch_indices,
                                                               positions)


# -- specs ---------------------------------------------------------------------------------------------
_TARGETS = (Arg("positions"), Arg("batch_indices", "Tensor?"), Arg("check_indices", "bool"), Arg("backend", "backend"))
APPEND = define(OpSpec(
    "kv_cache.append", append, AppendProblem, append_call, reference="append", cases="kv_cache", op="kv_cache_append",
    args=(Arg("k"), Arg("v"), Arg("cache", "cache", mutated=True), Arg("table", "table"), *_TARGETS),
    returns="()", fake=lambda *_: None,
))
APPEND_SLOTS = define(OpSpec(
    "kv_cache.append_slots", append_slots, AppendProblem, append_slots_call, reference="append_slots",
    cases="kv_cache", op="kv_cache_append_slots",
    args=(Arg("k"), Arg("v"), Arg("cache", "cache", mutated=True), Arg("slot_mapping"), Arg("check_indices", "bool"),
          Arg("backend", "backend")),
    returns="()", fake=lambda *_: None,
))
APPEND_CSR = define(OpSpec(
    "kv_cache.append_csr", append_csr, AppendProblem, append_csr_call, reference="append_csr", cases="kv_cache",
    op="kv_cache_append_csr",
    args=(Arg("k"), Arg("v"), Arg("cache", "cache", mutated=True), Arg("indptr"), Arg("indices"), Arg("positions"),
          Arg("batch_indices"), Arg("check_indices", "bool"), Arg("backend", "backend")),
    returns="()", fake=lambda *_: None,
))
APPEND_MLA = define(OpSpec(
    "kv_cache.append_mla", append_mla, MLAAppendProblem, append_mla_call, reference="append_mla", cases="kv_cache",
    op="kv_cache_append_mla",
    args=(Arg("ckv"), Arg("kpe"), Arg("ckv_pages", mutated=True), Arg("kpe_pages", mutated=True),
          Arg("table", "table"), *_TARGETS),
    returns="()", fake=lambda *_: None,
))
