"""The canonical paged KV-cache description, with converters to FlashInfer's CSR form and
vLLM's block-table form.

- :class:`PagedKVCache`: K and V page tensors. Layout ``"NHD"``: ``(num_pages, page_size,
  kv_heads, head_dim)``; ``"HND"``: ``(num_pages, kv_heads, page_size, head_dim)``. V may have a
  different head dim (``head_dim_v``). fp8 (e4m3/e5m2) pages carry ``k_scale`` / ``v_scale``
  (dequantised value = stored value × scale): a float, or a float32 tensor of shape () or (kv_heads,) on the pages'
  device (a scale per KV head, updated in place by a calibration without a host read; problems then carry the
  feature ``kv_scale_tensor``).
- :class:`PageTable`: ``block_table`` ``(batch, max_pages)`` int32 (vLLM's form: row ``b`` lists the
  pages of request ``b`` in order; entries past the request's last page are ignored) and
  ``seq_lens`` ``(batch,)`` int32 (tokens in the cache for each request).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import torch

from .device import is_capturing
from .errors import check, fail

LAYOUTS = ("NHD", "HND")
FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
KV_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32}) | FP8_DTYPES
INDEX_DTYPES = frozenset({torch.int32, torch.int64})
#: page ids, lengths and page sizes are int32 in every kernel: values must stay below this
INT32_LIMIT = 2**31


class PagedKVCache:
    """K/V page tensors of one attention layer. See the module docstring for shapes."""

    __slots__ = ("_dims", "k_pages", "k_scale", "layout", "scale_tensors", "v_pages", "v_scale")

    def __init__(
        self,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        layout: str = "NHD",
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> None:
        # each message is built only on failure: engines and the FlashInfer-compatible layer make a cache per call
        if layout not in LAYOUTS:
            raise fail("layout", layout, f"one of {LAYOUTS}")
        for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
            if not (isinstance(t, torch.Tensor) and t.dim() == 4):
                raise fail(name, _shape(t), f"a 4-d tensor in {layout} layout")
            if t.dtype not in KV_DTYPES:
                raise fail(f"{name}.dtype", t.dtype, f"one of {sorted(map(str, KV_DTYPES))}")
            if not (t.stride(-1) == 1 or t.is_contiguous()):
                raise fail(f"{name}.stride", t.stride(), "unit stride in head_dim")
        if v_pages.dtype != k_pages.dtype:
            raise fail("v_pages.dtype", v_pages.dtype, f"the same as k_pages ({k_pages.dtype})")
        if v_pages.device != k_pages.device:
            raise fail("v_pages.device", v_pages.device, f"k_pages.device ({k_pages.device})")
        if k_pages.shape[:3] != v_pages.shape[:3]:
            raise fail("v_pages.shape", tuple(v_pages.shape),
                       f"the same first three dims as k_pages {tuple(k_pages.shape)}")
        fp8 = k_pages.dtype in FP8_DTYPES
        if not fp8 and not (k_scale is None and v_scale is None):
            raise fail("k_scale/v_scale", (k_scale, v_scale), "None unless pages are fp8")
        if layout == "NHD":
            num_pages, page_size, kv_heads, head_dim = k_pages.shape
        else:
            num_pages, kv_heads, page_size, head_dim = k_pages.shape
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if isinstance(s, torch.Tensor):
                _check_scale_tensor(name, s, kv_heads, k_pages.device)
            elif not (s is None or _positive_finite(s)):
                raise fail(name, s, f"a finite float > 0, a float32 tensor of shape () or ({kv_heads},), or None")
        self.k_pages, self.v_pages, self.layout = k_pages, v_pages, layout
        self.k_scale: float | torch.Tensor | None = _scale(k_scale, fp8)
        self.v_scale: float | torch.Tensor | None = _scale(v_scale, fp8)
        #: True when a scale is a tensor (problems then carry the feature ``kv_scale_tensor``)
        self.scale_tensors = isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor)
        self._dims = (num_pages, page_size, kv_heads, head_dim, v_pages.shape[-1])

    num_pages = property(lambda self: self._dims[0])
    page_size = property(lambda self: self._dims[1])
    num_kv_heads = property(lambda self: self._dims[2])
    head_dim = property(lambda self: self._dims[3])
    head_dim_v = property(lambda self: self._dims[4])
    dtype = property(lambda self: self.k_pages.dtype)
    device = property(lambda self: self.k_pages.device)

    @property
    def is_fp8(self) -> bool:
        return self.k_pages.dtype in FP8_DTYPES

    def to_layout(self, layout: str) -> PagedKVCache:
        """The same cache in another layout (a copy unless it already is in that layout)."""
        check(layout in LAYOUTS, "layout", layout, f"one of {LAYOUTS}")
        if layout == self.layout:
            return self
        k = self.k_pages.transpose(1, 2).contiguous()
        v = self.v_pages.transpose(1, 2).contiguous()
        return PagedKVCache(k, v, layout, self.k_scale if self.is_fp8 else None, self.v_scale if self.is_fp8 else None)

    def nhd(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V pages viewed as NHD ``(num_pages, page_size, kv_heads, dim)`` (a view, no copy)."""
        if self.layout == "NHD":
            return self.k_pages, self.v_pages
        return self.k_pages.transpose(1, 2), self.v_pages.transpose(1, 2)

    def __repr__(self) -> str:
        return (f"PagedKVCache(layout={self.layout}, num_pages={self.num_pages}, page_size={self.page_size}, "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, head_dim_v={self.head_dim_v}, "
                f"dtype={self.dtype}, device={self.device})")


class PageTable:
    """Which pages hold each request's tokens: ``block_table`` (batch, max_pages) int32 and
    ``seq_lens`` (batch,) int32 on the cache's device.

    Construction reads the largest sequence length back to the host once (a device sync on a
    GPU) unless ``max_seq_len`` is given or a CUDA graph is being captured; plans do this once.
    Tensors written in place after construction are noticed (their version counters) and read
    again at the next eager call; a ``max_seq_len`` given by the caller is trusted as an upper bound.
    """

    __slots__ = ("_checked", "_given", "_max_seq_len", "_top_page", "_versions", "block_table", "seq_lens")

    def __init__(self, block_table: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int | None = None) -> None:
        check(isinstance(block_table, torch.Tensor) and block_table.dim() == 2, "block_table",
              _shape(block_table), "a 2-d (batch, max_pages) tensor")
        check(block_table.dtype == torch.int32, "block_table.dtype", block_table.dtype, "torch.int32")
        check(isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1, "seq_lens", _shape(seq_lens),
              "a 1-d (batch,) tensor")
        check(seq_lens.dtype == torch.int32, "seq_lens.dtype", seq_lens.dtype, "torch.int32")
        check(seq_lens.shape[0] == block_table.shape[0], "seq_lens.shape", tuple(seq_lens.shape),
              f"({block_table.shape[0]},) to match block_table's batch")
        check(seq_lens.device == block_table.device, "seq_lens.device", seq_lens.device,
              f"block_table.device ({block_table.device})")
        check(block_table.stride(-1) == 1, "block_table.stride", block_table.stride(), "unit stride in the last dim")
        check(seq_lens.is_contiguous(), "seq_lens", "non-contiguous", "a contiguous tensor")
        check(max_seq_len is None or isinstance(max_seq_len, torch.SymInt)
              or (_is_int(max_seq_len) and 0 <= max_seq_len < INT32_LIMIT), "max_seq_len", max_seq_len,
              "None or an int in [0, 2**31)")
        self.block_table, self.seq_lens = block_table, seq_lens
        self._given = max_seq_len is not None
        self._max_seq_len = max_seq_len
        self._versions = (_version(block_table), _version(seq_lens))
        self._checked: set[tuple[int, int]] = set()
        self._top_page: dict[int, int] = {}
        if max_seq_len is None and not is_capturing():
            self._measure()

    def _measure(self) -> None:
        seq_lens = self.seq_lens
        self._max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
        check(seq_lens.numel() == 0 or int(seq_lens.min()) >= 0, "seq_lens", "negative entries", "lengths >= 0")

    @property
    def max_seq_len(self) -> int | None:
        """Host bound on the sequence lengths. When the table's tensors were written in place since it
        was last read (and the bound was not given by the caller), it is read again (one sync)."""
        if torch.compiler.is_compiling():  # traced code passes the bound to the custom op as it is
            return self._max_seq_len
        versions = (_version(self.block_table), _version(self.seq_lens))
        if versions != self._versions and not is_capturing():
            self._versions = versions
            self._checked.clear()
            self._top_page.clear()
            if not self._given:
                self._measure()
        return self._max_seq_len

    @property
    def batch_size(self) -> int:
        return self.block_table.shape[0]

    @property
    def max_pages(self) -> int:
        return self.block_table.shape[1]

    def check_against(self, page_size: int, num_pages: int) -> None:
        """Raise unless every request fits its pages and every used page index is in range.

        Reads values back from the device once per (page_size, num_pages); skipped in capture.
        """
        max_seq_len = self.max_seq_len  # re-reads the lengths if they were written in place
        key = (page_size, num_pages)
        if key in self._checked or is_capturing():
            return
        if max_seq_len is not None and max_seq_len > self.max_pages * page_size:
            raise fail("seq_lens", f"max {max_seq_len}",
                       f"at most max_pages * page_size = {self.max_pages} * {page_size} = {self.max_pages * page_size}")
        hi = -1
        if self.batch_size and self.max_pages:
            used = torch.arange(self.max_pages, device=self.block_table.device)[None, :] * page_size < self.seq_lens[:, None]
            if bool(used.any()):
                ids = self.block_table[used]
                lo, hi = int(ids.min()), int(ids.max())
                if lo < 0 or hi >= num_pages:
                    raise fail("block_table", f"page index {hi if hi >= num_pages else lo}",
                               f"page indices in [0, {num_pages}) for the pages a request uses")
        self._top_page[page_size] = hi
        self._checked.add(key)

    def pages_used(self, page_size: int) -> int | None:
        """One more than the largest page index a request uses, as the last check at ``page_size`` found it
        (:meth:`check_against`; 0 when no request uses a page), or None before any such check: what a cache must
        hold at least. A plan checks its cache against it at every run without reading the device."""
        top = self._top_page.get(page_size)
        return None if top is None else top + 1

    def checked_max_seq_len(self, page_size: int, num_pages: int) -> int:
        """:meth:`check_against` then the host bound on sequence length (``max_pages * page_size`` where none is
        known): the attention ops' one call per table; once checked, a version compare and a set lookup."""
        try:
            versions = (self.block_table._version, self.seq_lens._version)
        except RuntimeError:  # an inference tensor has no version counter
            versions = (_version(self.block_table), _version(self.seq_lens))
        if versions != self._versions or (page_size, num_pages) not in self._checked:
            self.check_against(page_size, num_pages)
        bound = self._max_seq_len
        return bound if bound is not None else self.block_table.shape[1] * page_size

    def pages_per_request(self, page_size: int) -> torch.Tensor:
        """(batch,) int32: how many pages each request uses."""
        return ((self.seq_lens + page_size - 1) // page_size).to(torch.int32)

    # -- converters ------------------------------------------------------------------------------
    @classmethod
    def from_csr(cls, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                 page_size: int) -> PageTable:
        """From FlashInfer's form: ``indptr`` (batch+1,), ``indices`` (nnz,), ``last_page_len`` (batch,), int32 or
        int64 on one device; request ``b`` holds pages ``indices[indptr[b]:indptr[b+1]]``, the last of them filled
        to ``last_page_len[b]`` slots (1..page_size; ignored for a request without pages).

        Every value is checked (non-decreasing ``indptr`` within ``indices``, page ids and lengths in int32 range,
        ``last_page_len`` within the page) with one read back to the host, which also sizes the table.
        """
        _check_index_tensor(indptr, "indptr")
        check(indptr.numel() >= 1, "indptr.shape", tuple(indptr.shape), "(batch+1,) with at least one entry")
        batch = indptr.numel() - 1
        _check_index_tensor(indices, "indices", indptr)
        _check_index_tensor(last_page_len, "last_page_len", indptr)
        check(last_page_len.shape == (batch,), "last_page_len.shape", tuple(last_page_len.shape),
              f"({batch},): one entry per request (indptr has {batch + 1})")
        check(_is_int(page_size) and 1 <= page_size < INT32_LIMIT, "page_size", page_size, "an int in [1, 2**31)")
        device, nnz = indptr.device, indices.numel()
        ptr = indptr.to(torch.int64)
        counts = ptr[1:] - ptr[:-1]
        ids = indices.to(torch.int64)
        used = torch.arange(nnz, device=device)
        used = (used >= ptr[0]) & (used < ptr[-1])
        has_pages = counts > 0
        last = last_page_len.to(torch.int64)
        lens = torch.where(has_pages, (counts - 1) * page_size + last, 0)
        zero = ptr.new_zeros(())
        big = torch.iinfo(torch.int64).max
        stats = torch.stack([  # one host read for every check and the table's size
            ptr[0], ptr[-1], counts.min() if batch else zero, counts.max() if batch else zero,
            torch.where(used, ids, big).amin() if nnz else zero, torch.where(used, ids, -1).amax() if nnz else zero,
            torch.where(has_pages, last, page_size).amin() if batch else zero + 1,
            last.amin() if batch else zero, last.amax() if batch else zero, lens.amax() if batch else zero,
        ]).tolist()
        first, end, min_count, max_pages, lo_id, hi_id, min_last_used, min_last, max_last, max_len = stats
        check(first >= 0, "indptr", f"indptr[0] = {first}", "indptr[0] >= 0")
        check(min_count >= 0, "indptr", "decreasing entries", "non-decreasing offsets (pages per request >= 0)")
        check(end <= nnz, "indptr", f"indptr[-1] = {end}", f"at most indices.numel() = {nnz}")
        check(lo_id >= 0 and hi_id < INT32_LIMIT, "indices", f"page id {lo_id if lo_id < 0 else hi_id}",
              "page ids in [0, 2**31)")
        check(min_last >= 0 and max_last <= page_size and min_last_used >= 1, "last_page_len",
              f"entries in [{min_last}, {max_last}]" + ("" if min_last_used >= 1 else " (0 for a request with pages)"),
              f"1..page_size={page_size} slots for a request with pages (0..{page_size} for one without)")
        check(max_len < INT32_LIMIT, "page_size", page_size,
              f"a size that keeps sequence lengths below 2**31 (the longest would be {max_len})")
        col = torch.arange(max_pages, device=device)[None, :]
        table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
        table[col < counts[:, None]] = ids[first:end].to(torch.int32)
        out = cls(table, lens.to(torch.int32), max_seq_len=max_len)
        out._given = False  # measured here, not a caller's bound: in-place writes are noticed as usual
        return out

    def to_csr(self, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """To FlashInfer's form: (indptr (batch+1,), indices (nnz,), last_page_len (batch,)), int32."""
        counts = self.pages_per_request(page_size).to(torch.int64)
        indptr = torch.zeros(self.batch_size + 1, dtype=torch.int32, device=self.block_table.device)
        indptr[1:] = torch.cumsum(counts, 0).to(torch.int32)
        mask = torch.arange(self.max_pages, device=self.block_table.device)[None, :] < counts[:, None]
        indices = self.block_table[mask].to(torch.int32)
        last = torch.where(counts > 0, self.seq_lens - (counts.to(torch.int32) - 1) * page_size, 0).to(torch.int32)
        return indptr, indices, last

    def __repr__(self) -> str:
        return f"PageTable(batch={self.batch_size}, max_pages={self.max_pages}, max_seq_len={self.max_seq_len})"


class TokenRows:
    """The page table of ``tokens`` query rows per request of ``source``: attention of each request's ``tokens``
    newest tokens (multi-token prediction, speculative verification) run as single-token decode rows. Row
    ``b * tokens + i`` is request ``b`` up to its token ``seq_len - tokens + i``, so each new token sees the ones
    before it; a row before the request's first token is empty (length 0). ``table`` is the result
    (batch * tokens rows, ``max_seq_len`` as given); ``refresh()`` rewrites it from the source table in place, with
    no allocation and no host synchronisation (CUDA-graph capturable)."""

    __slots__ = ("_back", "source", "table", "tokens")

    def __init__(self, source: PageTable, tokens: int, max_seq_len: int | None) -> None:
        batch, pages = source.block_table.shape
        device = source.block_table.device
        self.source, self.tokens = source, tokens
        # how far each row's last token sits behind the request's newest
        self._back = torch.arange(tokens - 1, -1, -1, dtype=torch.int32, device=device)
        self.table = PageTable(torch.empty(batch * tokens, pages, dtype=torch.int32, device=device),
                               torch.empty(batch * tokens, dtype=torch.int32, device=device), max_seq_len=max_seq_len)
        self.refresh()

    def refresh(self) -> PageTable:
        batch, pages = self.source.block_table.shape
        self.table.block_table.view(batch, self.tokens, pages).copy_(
            self.source.block_table[:, None, :].expand(batch, self.tokens, pages))
        lens = self.table.seq_lens.view(batch, self.tokens)
        torch.sub(self.source.seq_lens[:, None], self._back, out=lens)
        lens.clamp_(min=0)
        return self.table


class CsrTargets(NamedTuple):
    """Where FlashInfer's CSR page table puts each new token, (T,) int64 each, from clamped reads (so every token
    has values, in range or not): its request ``batch`` and ``position`` as given; the request's page range
    ``[start, end)`` in ``indices``; the entry ``item = start + position // page_size`` and the page there."""

    batch: torch.Tensor
    position: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    item: torch.Tensor
    page: torch.Tensor


def csr_targets(indptr: torch.Tensor, indices: torch.Tensor, batch_indices: torch.Tensor, positions: torch.Tensor,
                page_size: int) -> CsrTargets:
    """The :class:`CsrTargets` of new tokens (``kv_cache.append_csr``'s addressing, which its check and its reference
    kernel share)."""
    batch, nnz = indptr.shape[0] - 1, indices.shape[0]
    b, pos = batch_indices.long(), positions.long()
    row = b.clamp(0, max(batch - 1, 0))
    ptr = indptr.long()
    start, end = ptr[row], ptr[(row + 1).clamp(max=batch)]
    item = start + pos.clamp(min=0) // page_size
    page = indices.long()[item.clamp(0, max(nnz - 1, 0))] if nnz else torch.full_like(b, -1)
    return CsrTargets(b, pos, start, end, item, page)


def _check_scale_tensor(name: str, s: torch.Tensor, kv_heads: int, device: torch.device) -> None:
    """A scale tensor: float32, shape () or (kv_heads,), contiguous, on the pages' device."""
    check(s.dtype == torch.float32, f"{name}.dtype", s.dtype, "torch.float32")
    check(s.dim() == 0 or tuple(s.shape) == (kv_heads,), f"{name}.shape", tuple(s.shape),
          f"() or ({kv_heads},) = (num_kv_heads,)")
    check(s.device == device, f"{name}.device", s.device, f"the pages' device ({device})")
    check(s.is_contiguous(), name, "non-contiguous", "a contiguous tensor")


def _scale(s: float | torch.Tensor | None, fp8: bool) -> float | torch.Tensor | None:
    """A cache's scale: the tensor as given, a float, 1.0 for fp8 pages without one, None otherwise."""
    if isinstance(s, torch.Tensor):
        return s
    return float(s) if s is not None else (1.0 if fp8 else None)


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place write counter (inference tensors have none: 0)."""
    try:
        return t._version
    except RuntimeError:
        return 0


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _positive_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _check_index_tensor(t: Any, name: str, like: torch.Tensor | None = None) -> None:
    check(isinstance(t, torch.Tensor) and t.dim() == 1, name, _shape(t), "a 1-d tensor")
    check(t.dtype in INDEX_DTYPES, f"{name}.dtype", t.dtype, "torch.int32 or torch.int64")
    if like is not None:
        check(t.device == like.device, f"{name}.device", t.device, f"indptr.device ({like.device})")


def _shape(t: Any) -> Any:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
