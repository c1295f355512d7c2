"""FlashInfer's paged KV forms as :class:`PagedKVCache` objects, with the host work of a ``run`` kept small.

A ``(k, v)`` pair of 4-d tensors, or one 5-d tensor holding K at ``[:, 0]`` and V at ``[:, 1]``, in the wrapper's
layout (3-d pairs and 4-d combined tensors, without their page dim, have page size 1, as in FlashInfer). The full
validation runs once per tensor geometry (shapes, strides, dtypes, devices, scales); later calls take one of two
remembered paths, neither of which keeps the caller's tensors alive:

- a pair, by the identity of its tensors (an engine passes the same per-layer tensors at every step), through weak
  references: the cache is rebound to the tensors given. A pair tensor whose shape or strides are changed in place
  (``resize_``, ``set_``) must be passed as a new object.
- a combined tensor, by its address, shape, strides, dtype and device, which also serves an engine that passes a
  fresh view of the same memory at every call. Splitting it into K and V costs more than the rest of a ``run``, so
  the split is kept from the second call on: K and V views made over the tensor's storage without referencing the
  tensor (a view made by indexing would keep its base, the caller's tensor, alive). They are remembered for as long
  as the tensor that owns the memory (its ``_base``, or itself) lives, through a weak reference to it; a tensor
  reshaped in place no longer matches what was remembered and is validated again, and memory it gave up in place is
  released then.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..errors import fail
from ..paged import FP8_DTYPES, PagedKVCache

#: remembered combined tensors: at most this many owners, and this many page tensors per owner
_MAX_OWNERS = 256
_MAX_PER_OWNER = 1024


class _Split:
    """One combined tensor's split, remembered by address: its geometry, and the cache over K/V views that share its
    storage (never the tensor itself)."""

    __slots__ = ("cache", "dtype", "scales", "shape", "storage", "stride")

    def __init__(self, kv: torch.Tensor, cache: PagedKVCache, scales: tuple[float, float]) -> None:
        self.shape, self.stride, self.dtype = kv.shape, kv.stride(), kv.dtype
        self.storage = kv.untyped_storage()
        self.cache, self.scales = cache, scales


class _Owner:
    """The remembered splits of the tensors whose memory one tensor owns, dropped when it goes (weak reference); and
    the addresses seen once (a split is made at the second sight: memory passed once is not worth its views)."""

    __slots__ = ("device", "ref", "seen", "splits")

    def __init__(self, ref: weakref.ref[torch.Tensor], device: int) -> None:
        self.ref, self.device = ref, device
        self.splits: dict[int, _Split] = {}
        self.seen: set[int] = set()


class KVForms:
    """:class:`PagedKVCache` objects for FlashInfer's paged KV forms in ``layout`` (see the module docstring).
    ``remember=False``: every call validates (for one-off calls that would not repeat)."""

    __slots__ = ("__weakref__", "_known", "_owners", "_page_dim", "_remember", "_seen", "layout")

    def __init__(self, layout: str, remember: bool = True) -> None:
        self.layout = layout
        self._page_dim = -3 if layout == "NHD" else -2
        self._remember = remember
        self._seen: dict[tuple[Any, ...], tuple[int, ...]] = {}
        #: id of a pair's K seen before -> (weak ref to it, weak ref to its V, k_scale, v_scale asked, dims, the
        #: cache's scales, whether the pair lacks its page dim)
        self._known: dict[int, tuple[Any, ...]] = {}
        #: id of the tensor owning a combined tensor's memory -> its remembered splits, by address
        self._owners: dict[int, _Owner] = {}

    def cache(self, paged_kv_cache: Any, k_scale: float = 1.0, v_scale: float = 1.0) -> PagedKVCache:
        """The cache of these pages; fp8 pages dequantise as ``stored * scale`` (scales are ignored otherwise)."""
        if (type(paged_kv_cache) is tuple or type(paged_kv_cache) is list) and len(paged_kv_cache) == 2:
            k, v = paged_kv_cache
            pair = self._known.get(id(k))
            if pair is not None and pair[0]() is k and pair[1]() is v and pair[2] == k_scale and pair[3] == v_scale:
                if pair[6]:  # a 3-d pair: page size 1
                    k, v = k.unsqueeze(self._page_dim), v.unsqueeze(self._page_dim)
                cache = _new_cache(PagedKVCache)
                cache.k_pages, cache.v_pages, cache.layout, cache.scale_tensors = k, v, self.layout, False
                cache.k_scale, cache.v_scale = pair[5]
                cache._dims = pair[4]
                return cache
            return self._validated(paged_kv_cache, True, k_scale, v_scale)
        if isinstance(paged_kv_cache, torch.Tensor):
            kv = paged_kv_cache
            base = kv._base
            owner = self._owners.get(id(kv if base is None else base))
            if owner is not None:
                split = owner.splits.get(kv.data_ptr())
                if split is not None and kv.shape == split.shape and kv.stride() == split.stride \
                        and kv.dtype == split.dtype and kv.get_device() == owner.device \
                        and split.scales == (k_scale, v_scale) and owner.ref() is (kv if base is None else base):
                    return split.cache
            return self._combined(kv, k_scale, v_scale)
        return self._validated(paged_kv_cache, type(paged_kv_cache) in (tuple, list), k_scale, v_scale)

    def with_scale_tensors(self, cache: PagedKVCache, k_scale: Any, v_scale: Any) -> PagedKVCache:
        """``cache`` (fp8 pages) dequantised by scales of which at least one is a tensor: float32 of shape (),
        (1,) or (kv_heads,) on the pages' device, read on the device at every run (the others: floats, or None)."""
        if not cache.is_fp8:
            name = "k_scale" if isinstance(k_scale, torch.Tensor) else "v_scale"
            raise fail(name, "a tensor", "a float: tensor scales are served for fp8 pages (the cache then carries "
                                         "them); FlashInfer folds a 16-bit cache's scales on the host")
        ks, vs = (_scale_tensor(s, name, cache) if isinstance(s, torch.Tensor) else (1.0 if s is None else s)
                  for s, name in ((k_scale, "k_scale"), (v_scale, "v_scale")))
        return rebound(cache.k_pages, cache.v_pages, self.layout, (ks, vs), cache._dims, scale_tensors=True)

    # -- paths ---------------------------------------------------------------------------------------------------
    def _combined(self, kv: torch.Tensor, k_scale: float, v_scale: float) -> PagedKVCache:
        """A combined tensor not remembered yet (or reshaped in place): validated, then remembered by address."""
        key = (kv.shape, kv.stride(), kv.dtype, kv.get_device(), k_scale, v_scale)
        dims = self._seen.get(key)
        if dims is None:
            cache = self._validated(kv, False, k_scale, v_scale)
            self._seen[key] = dims = cache._dims
        else:
            k, v = self._split(kv, False)
            cache = rebound(k, v, self.layout, (k_scale, v_scale) if kv.dtype in FP8_DTYPES else (None, None), dims)
        if self._remember:
            self._remember_split(kv, cache, (k_scale, v_scale))
        return cache

    def _remember_split(self, kv: torch.Tensor, cache: PagedKVCache, scales: tuple[float, float]) -> None:
        base = kv._base
        owner_tensor = kv if base is None else base
        owner = self._owners.get(id(owner_tensor))
        if owner is None or owner.ref() is not owner_tensor:
            if len(self._owners) >= _MAX_OWNERS:
                self._owners.clear()
            forms, ident = weakref.ref(self), id(owner_tensor)

            def forget(ref: weakref.ref[torch.Tensor]) -> None:  # the owner is gone: so are its splits
                live = forms()
                if live is not None and (gone := live._owners.get(ident)) is not None and gone.ref is ref:
                    del live._owners[ident]

            owner = self._owners[ident] = _Owner(weakref.ref(owner_tensor, forget), kv.get_device())
        storage = kv.untyped_storage()
        stale = [ptr for ptr, split in owner.splits.items() if split.storage is not storage]
        for ptr in stale:  # memory the owner gave up in place (resize_, set_): released now
            del owner.splits[ptr]
        address = kv.data_ptr()
        if address not in owner.seen:
            if len(owner.seen) >= _MAX_PER_OWNER:
                owner.seen.clear()
            owner.seen.add(address)
            return
        if len(owner.splits) >= _MAX_PER_OWNER:
            owner.splits.clear()
        k, v = (_storage_view(t) for t in (cache.k_pages, cache.v_pages))
        kept = rebound(k, v, self.layout, (cache.k_scale, cache.v_scale), cache._dims)  # type: ignore[arg-type]
        owner.splits[address] = _Split(kv, kept, scales)

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
        if pair and self._remember:
            if len(self._known) >= 4096:
                self._known.clear()
            first = paged_kv_cache[0]
            known, ident = self._known, id(first)
            forget = lambda _: known.pop(ident, None)  # the tensor is gone: so is its entry
            known[ident] = (weakref.ref(first, forget), weakref.ref(paged_kv_cache[1]), k_scale, v_scale, dims, scales,
                            first.dim() == 3)
        return rebound(k, v, self.layout, scales, dims)


_new_cache = object.__new__


def rebound(k: torch.Tensor, v: torch.Tensor, layout: str, scales: tuple[Any, Any], dims: tuple[int, ...],
            scale_tensors: bool = False) -> PagedKVCache:
    """A :class:`PagedKVCache` of pages whose geometry a full construction has already validated (same shapes,
    strides, dtypes, devices; float scales, or scale tensors checked by :func:`_scale_tensor`): the same fields
    without repeating the checks."""
    cache = _new_cache(PagedKVCache)
    cache.k_pages, cache.v_pages, cache.layout = k, v, layout
    cache.k_scale, cache.v_scale = scales
    cache.scale_tensors = scale_tensors
    cache._dims = dims  # type: ignore[assignment]
    return cache


def _storage_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a new tensor over the same storage that does not reference ``t`` (an indexing view would
    keep its base alive)."""
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                                   t.stride())


def _scale_tensor(s: torch.Tensor, name: str, cache: PagedKVCache) -> torch.Tensor:
    """A FlashInfer scale tensor as the cache carries it (per tensor or per KV head; (1,) is read as ())."""
    heads = cache.num_kv_heads
    if s.dim() == 1 and s.shape[0] == 1 and heads != 1:
        s = s.view(())
    if not (s.dtype == torch.float32 and (s.dim() == 0 or tuple(s.shape) == (heads,)) and s.device == cache.device
            and s.is_contiguous()):
        raise fail(name, f"a tensor {tuple(s.shape)} {s.dtype} on {s.device}",
                   f"a float, or a contiguous float32 tensor of shape (), (1,) or ({heads},) = (num_kv_heads,) on "
                   f"the pages' device ({cache.device})")
    return s


def _shown(value: Any) -> Any:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else value
