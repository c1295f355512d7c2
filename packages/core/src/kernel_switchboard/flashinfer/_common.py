"""Pieces every module of :mod:`kernel_switchboard.flashinfer` shares: refusals, dtype names, FlashInfer's paged-KV
forms, base-2 log-sum-exp, and page tables built from FlashInfer's CSR description (once per plan, or rewritten in
place at every run for CUDA graphs)."""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError, fail
from ..paged import FP8_DTYPES, PagedKVCache, PageTable

#: FlashInfer's log-sum-exp is base 2 (``log2(sum(exp2(...)))``), the switchboard's natural: ``lse2 = lse * LOG2E``
LOG2E = 1.0 / math.log(2.0)
#: and back: ``lse = lse2 * LN2``
LN2 = math.log(2.0)

#: implementation backends FlashInfer's wrappers accept; whichever is named, the switchboard ranks its own kernels
BACKENDS = ("auto", "fa2", "fa3", "cudnn", "cutlass", "trtllm-gen", "cute-dsl")
LAYOUTS = ("NHD", "HND")
_INT_DTYPES = (torch.int32, torch.int64)


def check_backend(backend: Any) -> None:
    if backend not in BACKENDS:
        raise fail("backend", backend, f"one of {BACKENDS} (the switchboard picks its own kernel whichever is named)")


def check_layout(kv_layout: Any) -> None:
    if kv_layout not in LAYOUTS:
        raise fail("kv_layout", kv_layout, f"one of {LAYOUTS}")


def check_pos_encoding(pos_encoding_mode: Any) -> None:
    """RoPE or ALiBi fused into attention is not served: rotate q and k with :mod:`kernel_switchboard.flashinfer.rope`
    before attention instead."""
    if pos_encoding_mode != "NONE":
        raise fail("pos_encoding_mode", pos_encoding_mode,
                   "'NONE' (apply RoPE with kernel_switchboard.flashinfer.rope before attention; ALiBi is not served)")


def check_unserved(**values: Any) -> None:
    """Raise naming the first argument given a value: each is a FlashInfer feature this layer does not serve."""
    for name, value in values.items():
        if value is not None:
            raise fail(name, _shown(value), "None: not served by kernel_switchboard.flashinfer")


def check_jit_args(jit_args: Any) -> None:
    if jit_args is not None:
        raise fail("jit_args", _shown(jit_args), "None: FlashInfer JIT variants are not served "
                                                 "(use kernel_switchboard.Variant with kernel_switchboard.attention)")


def check_workspace(buffer: Any) -> torch.Tensor:
    if not isinstance(buffer, torch.Tensor):
        raise fail("float_workspace_buffer", type(buffer).__name__, "a torch.Tensor (its device is the wrappers' device)")
    return buffer


def to_dtype(value: Any, name: str) -> torch.dtype:
    """A torch dtype from a dtype or its name (``"float16"``), as FlashInfer's arguments take them."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)  # type: ignore[no-any-return]
    raise fail(name, value, "a torch.dtype or its name, e.g. 'bfloat16'")


def scale_value(value: Any, name: str) -> float:
    """A calibration scale as a host float (1.0 for None); a tensor scale would need a device read per call."""
    if value is None:
        return 1.0
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    raise fail(name, _shown(value), "a positive Python float or None (tensor scales are not served)")


def window_of(window_left: Any) -> int | None:
    """FlashInfer's ``window_left`` (-1 = no window) as the switchboard's (None = no window)."""
    if not (isinstance(window_left, int) and window_left >= -1):
        raise fail("window_left", window_left, "an int >= -1 (-1 = no window)")
    return None if window_left < 0 else window_left


def soft_cap_of(logits_soft_cap: Any) -> float | None:
    """FlashInfer's ``logits_soft_cap`` (None or 0 = off) as the switchboard's (None = off)."""
    if logits_soft_cap is None or logits_soft_cap == 0:
        return None
    return float(logits_soft_cap)


def merge_legacy_args(api: str, names: Sequence[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Optional plan arguments given positionally (deprecated by FlashInfer, still accepted) merged into ``kwargs``."""
    if len(args) > len(names):
        raise TypeError(f"{api}.plan() takes at most {len(names)} optional positional arguments, got {len(args)}")
    merged = dict(kwargs)
    for name, value in zip(names, args):
        if name in merged:
            raise TypeError(f"{api}.plan() got multiple values for argument {name!r}")
        merged[name] = value
    return merged


def _shown(value: Any) -> Any:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else value


# -- paged KV forms ---------------------------------------------------------------------------------------------
class KVForms:
    """:class:`PagedKVCache` objects for FlashInfer's paged KV forms: a ``(k, v)`` pair of 4-d tensors, or one 5-d
    tensor holding K at ``[:, 0]`` and V at ``[:, 1]``, in ``layout``.

    The full validation runs once per tensor geometry (shapes, strides, dtypes, devices, scales); later calls only
    rebind the tensors. A one-tensor cache is recognised by its own geometry (an engine passes a fresh view of it at
    every call); a (k, v) pair by the identity of its tensors, through weak references (an engine passes the same
    per-layer tensors at every step). Nothing keeps the caller's tensors alive. A pair tensor whose shape or strides
    are changed in place (``resize_``, ``set_``) must be passed as a new object.
    """

    __slots__ = ("__weakref__", "_known", "_page_dim", "_seen", "layout")

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self._page_dim = -3 if layout == "NHD" else -2
        self._seen: dict[tuple[Any, ...], tuple[int, ...]] = {}
        #: id of a pair's K seen before -> (weak ref to it, weak ref to its V, scales, dims, fp8)
        self._known: dict[int, tuple[Any, Any, tuple[float, float], tuple[int, ...], bool]] = {}

    def cache(self, paged_kv_cache: Any, k_scale: float = 1.0, v_scale: float = 1.0) -> PagedKVCache:
        """The cache of these pages; fp8 pages dequantise as ``stored * scale`` (scales are ignored otherwise).
        As in FlashInfer, pages without their page dim (a 3-d pair, a 4-d combined tensor) have page size 1."""
        if type(paged_kv_cache) is tuple or type(paged_kv_cache) is list:
            if len(paged_kv_cache) == 2:
                k = paged_kv_cache[0]
                entry = self._known.get(id(k))
                if entry is not None and entry[0]() is k and entry[1]() is paged_kv_cache[1] \
                        and entry[2] == (k_scale, v_scale):
                    k, v = self._split(paged_kv_cache, True)
                    return _rebound(k, v, self.layout, entry[2] if entry[4] else (None, None), entry[3])
            return self._validated(paged_kv_cache, True, k_scale, v_scale)
        if isinstance(paged_kv_cache, torch.Tensor):  # one tensor: its own geometry fixes K's and V's
            key = (paged_kv_cache.shape, paged_kv_cache.stride(), paged_kv_cache.dtype, paged_kv_cache.get_device(),
                   k_scale, v_scale)
            dims = self._seen.get(key)
            if dims is not None:
                k, v = self._split(paged_kv_cache, False)
                fp8 = paged_kv_cache.dtype in FP8_DTYPES
                return _rebound(k, v, self.layout, (k_scale, v_scale) if fp8 else (None, None), dims)
            cache = self._validated(paged_kv_cache, False, k_scale, v_scale)
            self._seen[key] = cache._dims
            return cache
        return self._validated(paged_kv_cache, False, k_scale, v_scale)

    def _split(self, paged_kv_cache: Any, pair: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if pair:
            k, v = paged_kv_cache
            if k.dim() == 3:
                return k.unsqueeze(self._page_dim), v.unsqueeze(self._page_dim)
            return k, v
        kv = paged_kv_cache if paged_kv_cache.dim() != 4 else paged_kv_cache.unsqueeze(self._page_dim)
        return kv.unbind(1)  # type: ignore[no-any-return]

    def _validated(self, paged_kv_cache: Any, pair: bool, k_scale: float, v_scale: float) -> PagedKVCache:
        """The full checks (once per geometry); a (k, v) pair is then remembered by identity."""
        if isinstance(paged_kv_cache, torch.Tensor):
            kv = paged_kv_cache if paged_kv_cache.dim() != 4 else paged_kv_cache.unsqueeze(self._page_dim)
            if kv.dim() != 5 or kv.shape[1] != 2:
                raise fail("paged_kv_cache", _shown(paged_kv_cache),
                           f"a (k, v) pair of 4-d tensors or one 5-d tensor (pages, 2, ...) in {self.layout} layout")
        elif not (pair and len(paged_kv_cache) == 2):
            raise fail("paged_kv_cache", type(paged_kv_cache).__name__,
                       "a (k, v) pair of 4-d tensors or one 5-d tensor (pages, 2, ...)")
        elif not all(isinstance(t, torch.Tensor) for t in paged_kv_cache):
            raise fail("paged_kv_cache", tuple(type(t).__name__ for t in paged_kv_cache), "a (k, v) pair of tensors")
        k, v = self._split(paged_kv_cache, pair)
        key = (k.shape, v.shape, k.stride(), v.stride(), k.dtype, v.dtype, k.get_device(), v.get_device(),
               k_scale, v_scale)
        dims: tuple[int, ...] | None = self._seen.get(key)
        fp8 = k.dtype in FP8_DTYPES
        scales = (k_scale, v_scale) if fp8 else (None, None)
        if dims is None:
            dims = PagedKVCache(k, v, self.layout, *scales)._dims
            if len(self._seen) >= 1024:
                self._seen.clear()
            self._seen[key] = dims
        if pair:
            if len(self._known) >= 4096:
                self._known.clear()
            first = paged_kv_cache[0]
            known, ident = self._known, id(first)
            forget = lambda _: known.pop(ident, None)  # the tensor is gone: so is its entry
            known[ident] = (weakref.ref(first, forget), weakref.ref(paged_kv_cache[1]), (k_scale, v_scale), dims, fp8)
        return _rebound(k, v, self.layout, scales, dims)


def _rebound(k: torch.Tensor, v: torch.Tensor, layout: str, scales: tuple[float | None, float | None],
             dims: tuple[int, ...]) -> PagedKVCache:
    """A :class:`PagedKVCache` of pages whose geometry a full construction has already validated (same shapes,
    strides, dtypes, devices and scales): the same fields without repeating the checks."""
    cache = object.__new__(PagedKVCache)
    cache.k_pages, cache.v_pages, cache.layout = k, v, layout
    cache.k_scale, cache.v_scale = scales
    cache.scale_tensors = False  # FlashInfer's scales are floats
    cache._dims = dims  # type: ignore[assignment]
    return cache


# -- page tables from FlashInfer's CSR form ------------------------------------------------------------------------
def _index_tensor(t: Any, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INT_DTYPES:
        raise fail(name, _shown(t) if isinstance(t, torch.Tensor) else type(t).__name__, "a 1-d int32 tensor")
    return t.to(device, non_blocking=True)


def check_page_size(page_size: Any) -> int:
    if not (isinstance(page_size, int) and not isinstance(page_size, bool) and page_size >= 1):
        raise fail("page_size", page_size, "a positive int")
    return page_size


def csr_table(indptr: Any, indices: Any, page_size: int, device: torch.device, *, last_page_len: Any = None,
              seq_lens: Any = None, names: tuple[str, str, str] = ("indptr", "indices", "last_page_len")) -> PageTable:
    """The :class:`PageTable` of FlashInfer's CSR pages (``indptr`` (B+1,), ``indices``), the lengths from
    ``last_page_len`` (B,) or given as ``seq_lens`` (B,), on ``device``. Host work: the page counts are read once."""
    indptr = _index_tensor(indptr, names[0], device)
    indices = _index_tensor(indices, names[1], device)
    batch = indptr.numel() - 1
    if batch < 0:
        raise fail(names[0], "an empty tensor", "a (batch + 1,) tensor")
    if seq_lens is not None:
        lens = _index_tensor(seq_lens, names[2], device)
        if lens.numel() != batch:
            raise fail(names[2], _shown(lens), f"({batch},): one length per request")
        # the last page's fill follows from each length and page count; from_csr checks that they agree
        counts = (indptr[1:] - indptr[:-1]).to(lens.dtype)
        last = torch.where(counts > 0, lens - (counts - 1).clamp(min=0) * page_size, torch.zeros_like(lens))
        try:
            pages = PageTable.from_csr(indptr, indices, last, page_size).block_table
        except InvalidArgumentError as exc:
            if not str(exc).startswith("last_page_len"):
                raise
            raise fail(names[2], _shown(lens), "lengths that fill each request's pages: "
                       "(pages - 1) * page_size < length <= pages * page_size (0 without pages)") from None
        return PageTable(pages, lens.to(torch.int32).contiguous())
    last = _index_tensor(last_page_len, names[2], device)
    return PageTable.from_csr(indptr, indices, last, page_size)


def page_counts(indptr: torch.Tensor) -> list[int]:
    """Pages per request of a CSR ``indptr`` (one host read)."""
    values = indptr.tolist()
    return [b - a for a, b in itertools.pairwise(values)]


class GraphTable:
    """The page table of a CUDA-graph wrapper: a fixed ``(batch, width)`` block table and ``(batch,)`` lengths that
    :meth:`refresh` rebuilds from the caller's CSR buffers with fixed shapes, no allocation and no host read, so the
    caller may rewrite its buffers in place between graph replays.

    ``width`` (the most pages one request may use) follows the engines' sizing: the indices buffer holds ``width``
    pages for each of the requests the indptr buffer's storage has rows for. :meth:`check` refuses a step whose
    requests need more.
    """

    def __init__(self, indptr_buf: torch.Tensor, indices_buf: torch.Tensor, page_size: int, *,
                 last_page_len_buf: torch.Tensor | None = None, seq_lens_buf: torch.Tensor | None = None,
                 workspace: torch.Tensor | None = None) -> None:
        device = indices_buf.device
        batch = indptr_buf.numel() - 1
        rows = max(batch, indptr_buf.untyped_storage().nbytes() // indptr_buf.element_size()
                   - indptr_buf.storage_offset() - 1, 1)
        width = max(indices_buf.numel() // rows, 1)
        self.batch, self.width, self.page_size = batch, width, page_size
        self.indptr, self.indices, self.last_page_len = indptr_buf, indices_buf, last_page_len_buf
        self._gather, block_table = _scratch(workspace, batch, width, device)
        self._cols = torch.arange(width, dtype=torch.int32, device=device)
        self._last_index = max(indices_buf.numel() - 1, 0)
        self._counts = torch.empty(batch, dtype=torch.int32, device=device)
        self._nonempty = torch.empty(batch, dtype=torch.int32, device=device)
        given = seq_lens_buf is not None and seq_lens_buf.dtype == torch.int32 and seq_lens_buf.is_contiguous()
        self._seq_lens_src = None if given else seq_lens_buf
        seq_lens = seq_lens_buf if given else torch.zeros(batch, dtype=torch.int32, device=device)
        assert seq_lens is not None
        self.table = PageTable(block_table, seq_lens, max_seq_len=width * page_size)
        self.refresh()

    @property
    def max_kv_len(self) -> int:
        return self.width * self.page_size

    def check(self, counts: list[int], name: str = "paged_kv_indices_buffer") -> None:
        """Refuse a step whose page counts this table cannot hold."""
        most = max(counts, default=0)
        if most > self.width:
            raise fail(name, f"{self.indices.numel()} entries for a request of {most} pages",
                       f"room for every request's pages: this CUDA-graph wrapper serves at most {self.width} pages "
                       f"per request (the indices buffer split over the requests its indptr buffer's storage holds)")

    def refresh(self) -> PageTable:
        """Rewrite the block table and lengths from the caller's buffers (fixed shapes: capturable)."""
        table = self.table
        starts, ends = self.indptr[:-1], self.indptr[1:]
        torch.add(starts.unsqueeze(1), self._cols, out=self._gather)
        self._gather.clamp_(max=self._last_index)
        torch.index_select(self.indices, 0, self._gather.view(-1), out=table.block_table.view(-1))
        if self.last_page_len is not None:  # lengths from the pages: (pages - 1) * page_size + last, 0 when no pages
            torch.sub(ends, starts, out=self._counts)
            torch.clamp(self._counts, max=1, out=self._nonempty)
            lens = table.seq_lens
            torch.sub(self._counts, 1, out=lens)
            lens.mul_(self.page_size).add_(self.last_page_len).mul_(self._nonempty)
        elif self._seq_lens_src is not None:
            table.seq_lens.copy_(self._seq_lens_src)
        return table


def _scratch(workspace: torch.Tensor | None, batch: int, width: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(gather index, block table), both (batch, width) int32: carved from the caller's float workspace when it has
    room (they are rewritten at every run, so wrappers sharing a workspace may share them), else allocated."""
    count = batch * width
    nbytes = 8 * count
    if (workspace is not None and workspace.device == device and workspace.is_contiguous()
            and workspace.numel() * workspace.element_size() >= nbytes and workspace.data_ptr() % 4 == 0):
        words = workspace.view(-1).view(torch.uint8)[:nbytes].view(torch.int32)
        return words[:count].view(batch, width), words[count:].view(batch, width)
    return (torch.empty(batch, width, dtype=torch.int32, device=device),
            torch.zeros(batch, width, dtype=torch.int32, device=device))


def copy_into(buffer: torch.Tensor, values: Any, name: str) -> None:
    """FlashInfer's CUDA-graph ``plan``: the step's values go into the caller's fixed buffer (nothing when they are
    that buffer already)."""
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise fail(name, _shown(values) if isinstance(values, torch.Tensor) else type(values).__name__,
                   "a 1-d int32 tensor")
    if values.numel() > buffer.numel():
        raise fail(name, f"{values.numel()} entries", f"at most the {buffer.numel()} of the buffer given at construction")
    target = buffer[: values.numel()]
    if values.device == target.device and values.data_ptr() == target.data_ptr():
        return
    target.copy_(values, non_blocking=True)


def check_graph_buffers(batch_name: str, buffers: dict[str, Any]) -> None:
    for name, buf in buffers.items():
        if not isinstance(buf, torch.Tensor) or buf.dim() != 1 or buf.dtype != torch.int32 or not buf.is_contiguous():
            raise fail(name, _shown(buf) if isinstance(buf, torch.Tensor) else type(buf).__name__,
                       f"a contiguous 1-d int32 tensor when use_cuda_graph=True ({batch_name})")
