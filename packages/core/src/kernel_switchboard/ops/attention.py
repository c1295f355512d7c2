"""Attention ops: ``attention.decode``, ``attention.prefill``, ``attention.prefill_ragged``,
``attention.mla_decode``, ``attention.merge_states``, ``attention.dense`` (dense tensors with a bias or
mask, :mod:`.attention_dense`); the :func:`cascade` helper; and plans
(:func:`plan_decode`, :func:`plan_prefill`, :func:`plan_prefill_ragged`, :func:`plan_mla_decode`, defined in
:mod:`.attention_plans`) for repeated steps and CUDA graphs.

Kernel ``run`` signatures (canonical, validated arguments; see docs/ops.md), each returning
``(out, lse_or_None)``:

- ``attention.decode``: ``run(q, cache, table, p)``; q (B, Hq, D) -> out (B, Hq, Dv), lse (B, Hq).
- ``attention.prefill``: ``run(q, qo_indptr, cache, table, p)``; q (Tq, Hq, D), qo_indptr (B+1,) int32.
- ``attention.prefill_ragged``: ``run(q, k, v, qo_indptr, kv_indptr, p)``; k (Tk, Hkv, D), v (Tk, Hkv, Dv).
- ``attention.mla_decode``: ``run(q_nope, q_pe, ckv_pages, kpe_pages, table, p)``.
- ``attention.merge_states``: ``run(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

A kernel may also offer ``plan(problem, table, p)`` (decode) / ``plan(problem, table, p,
qo_indptr=...)`` (prefill) returning an object whose ``run(q, cache, out, lse)`` writes ``out``
(and ``lse`` unless it is None) with no host synchronisation; an MLA decode kernel's plan object has
``run(q_nope, q_pe, ckv_pages, kpe_pages, out, lse)``.

Conventions: ``p`` is an :class:`AttnParams`. Query token i of request b (qo_len_b tokens) sits
at KV position ``seq_len_b - qo_len_b + i``; causal masks later positions; ``window_left = w >= 0``
masks positions before ``position - w``. GQA: q head h reads kv head ``h // (Hq // Hkv)``. LSE
is float32, natural log, of the scaled (and soft-capped) logits; a query with nothing to attend
gets out 0 and lse -inf. Tensors have unit stride in their last dim; outputs have q's dtype.
fp8 caches are dequantised as ``stored * scale``.

Eager calls validate on the host. ``decode`` reads nothing back from the device once a
:class:`PageTable` has been checked; ``prefill`` and ``prefill_ragged`` read the indptrs (and
seq_lens) back once per call (use :func:`plan_prefill` / :func:`plan_prefill_ragged` to pay that once per step).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..device import is_capturing
from ..dispatch import select_kernel
from ..errors import fail
from ..paged import FP8_DTYPES, PagedKVCache, PageTable, TokenRows
from ..variants import BoundVariant, bind
from ._common import (
    FLOAT_DTYPES,
    BackendArg,
    backend_from_str,
    backend_to_str,
    check_same_device,
    check_tensor,
    compiling,
    custom_op,
    device_key,
    graph_features,
)

_INT32 = frozenset({torch.int32})
_Tensor = torch.Tensor


@dataclass(frozen=True, slots=True)
class AttnParams:
    """Scalar parameters of one attention call, host values only."""

    sm_scale: float
    logits_soft_cap: float | None
    window_left: int  # -1 = no window
    causal: bool
    return_lse: bool
    max_q_len: int  # upper bound on any request's query count
    max_kv_len: int  # upper bound on any request's KV length
    variant: BoundVariant | None = None  # custom attention variant and its call-time args (variants.py)


class DecodeProblem(NamedTuple):
    """Signature of a paged decode call (one query token per request)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    page_size: int
    layout: str
    num_q_heads: int
    num_kv_heads: int
    group_size: int
    batch: int  # bucketed
    max_kv_len: int  # bucketed
    features: frozenset[str]
    variant: str | None = None  # Variant.key of a custom attention variant


class PrefillProblem(NamedTuple):
    """Signature of a paged prefill / append / mixed-batch call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    page_size: int
    layout: str
    num_q_heads: int
    num_kv_heads: int
    group_size: int
    batch: int  # bucketed
    max_q_len: int  # bucketed
    max_kv_len: int  # bucketed
    features: frozenset[str]
    variant: str | None = None  # Variant.key of a custom attention variant


class RaggedPrefillProblem(NamedTuple):
    """Signature of a prefill over contiguous variable-length K/V (no pages: page_size/layout None)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    page_size: None
    layout: None
    num_q_heads: int
    num_kv_heads: int
    group_size: int
    batch: int  # bucketed
    max_q_len: int  # bucketed
    max_kv_len: int  # bucketed
    features: frozenset[str]
    variant: str | None = None  # Variant.key of a custom attention variant


class MLADecodeProblem(NamedTuple):
    """Signature of an absorbed multi-head latent attention decode (one latent KV head)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim: int  # latent (ckv) dim, 512 for DeepSeek
    head_dim_v: int  # = head_dim
    head_dim_pe: int  # rope dim, 64 for DeepSeek
    page_size: int
    layout: None
    num_q_heads: int
    num_kv_heads: int  # 1
    group_size: int  # = num_q_heads
    batch: int  # bucketed
    max_kv_len: int  # bucketed
    features: frozenset[str]


class MergeProblem(NamedTuple):
    """Signature of a merge of two partial attention states."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    head_dim: int
    num_heads: int
    tokens: int  # bucketed
    features: frozenset[str]


# -- scalar parameters ------------------------------------------------------------------------------
def _params(head_dim: int, sm_scale: Any, cap: Any, window: Any, causal: bool, return_lse: bool, max_q: int,
            max_kv: int) -> AttnParams:
    """Validated :class:`AttnParams`."""
    try:
        return _params_cached(head_dim, sm_scale, cap, window, causal, return_lse, max_q, max_kv)
    except TypeError:  # an unhashable scalar argument
        for name, value in (("sm_scale", sm_scale), ("logits_soft_cap", cap), ("window_left", window)):
            if not (value is None or isinstance(value, (int, float))):
                raise fail(name, value, "a number or None") from None
        raise


@functools.lru_cache(maxsize=1024)
def _params_cached(head_dim: int, sm_scale: Any, cap: Any, window: Any, causal: bool, return_lse: bool, max_q: int,
            max_kv: int) -> AttnParams:
    """Validated :class:`AttnParams` (cached: warm calls skip the checks)."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    elif not (isinstance(sm_scale, (int, float)) and 0 < sm_scale < math.inf):
        raise fail("sm_scale", sm_scale, "a positive finite float or None (1/sqrt(head_dim))")
    if cap is not None and not (isinstance(cap, (int, float)) and 0 < cap < math.inf):
        raise fail("logits_soft_cap", cap, "a positive finite float or None (no cap)")
    if window is None:
        window = -1
    elif not (isinstance(window, int) and window >= -1):
        raise fail("window_left", window, "an int >= -1 (-1 = no window) or None")
    return AttnParams(float(sm_scale), None if cap is None else float(cap), int(window), bool(causal),
                      bool(return_lse), max_q, max_kv)


def _with_variant(p: AttnParams, bound: BoundVariant | None) -> AttnParams:
    return p if bound is None else dataclasses.replace(p, variant=bound)


def _variant_key(p: AttnParams) -> str | None:
    return None if p.variant is None else p.variant.variant.key


def _eager_only(fn: Any) -> Any:
    """``fn`` run outside torch.compile tracing (variant calls are not custom ops: a graph break)."""
    return torch.compiler.disable(fn)


def _features(base: tuple[str, ...], p: AttnParams, fp8: bool, dims_differ: bool, device: str,
              mixed: bool = False) -> frozenset[str]:
    return _feature_set(base, p.window_left >= 0, p.logits_soft_cap is not None, p.return_lse, fp8, dims_differ, mixed,
                        p.variant is not None, graph_features(device))


@functools.lru_cache(maxsize=1024)
def _feature_set(base: tuple[str, ...], window: bool, cap: bool, lse: bool, fp8: bool, dims_differ: bool, mixed: bool,
                 variant: bool, graph: frozenset[str]) -> frozenset[str]:
    flags = (("sliding_window", window), ("soft_cap", cap), ("return_lse", lse), ("fp8_kv", fp8),
             ("qk_v_dims_differ", dims_differ), ("mixed_batch", mixed), ("custom_variant", variant))
    return frozenset(base).union((name for name, on in flags if on), graph)


# -- validation helpers -------------------------------------------------------------------------------
def _check_q(q: Any, name: str, dims: int) -> None:
    """A float tensor of ``dims`` dims with unit stride in the last dim (one test on the hot path)."""
    if not (isinstance(q, torch.Tensor) and q.dim() == dims and q.dtype in FLOAT_DTYPES and q.stride(-1) == 1):
        check_tensor(q, name, dims=dims, dtypes=FLOAT_DTYPES)
        raise fail(f"{name}.stride", q.stride(), "unit stride in the last (head_dim) dim")


def _check_cache(cache: Any, q: _Tensor) -> tuple[Any, ...]:
    """Check the cache against q; returns its dims (kv_dtype, head_dim, head_dim_v, page_size, layout, kv_heads)."""
    if not isinstance(cache, PagedKVCache):
        raise fail("cache", type(cache).__name__, "a PagedKVCache")
    dims = _cache_dims(cache)
    kv_dtype, head_dim, _, _, _, kv_heads = dims
    shape = q.shape
    if head_dim != shape[-1] or shape[-2] % kv_heads or (kv_dtype != q.dtype and kv_dtype not in FP8_DTYPES) or \
            cache.k_pages.device != q.device:
        _raise_cache(cache, q)
    return dims


def _raise_cache(cache: PagedKVCache, q: _Tensor) -> None:
    if cache.device != q.device:
        raise fail("cache.device", cache.device, f"the device of q ({q.device})")
    if cache.head_dim != q.shape[-1]:
        raise fail("q.shape", tuple(q.shape), f"head_dim (last dim) equal to cache.head_dim ({cache.head_dim})")
    if q.shape[-2] % cache.num_kv_heads:
        raise fail("q.shape", tuple(q.shape),
                   f"num_q_heads (dim -2) a multiple of cache.num_kv_heads ({cache.num_kv_heads})")
    raise fail("cache.dtype", cache.dtype, f"q.dtype ({q.dtype}) or an fp8 dtype (float8_e4m3fn, float8_e5m2)")


def _check_table(table: Any, page_size: int, num_pages: int, batch: int, q: _Tensor) -> int:
    """Check the table against the cache; returns the host bound on sequence length."""
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    block_table = table.block_table
    if block_table.shape[0] != batch:
        raise fail("table.batch_size", table.batch_size, f"{batch} = the batch of q")
    if block_table.device != q.device:
        raise fail("table.device", block_table.device, f"the device of q ({q.device})")
    table.check_against(page_size, num_pages)
    max_seq_len = table.max_seq_len
    return max_seq_len if max_seq_len is not None else block_table.shape[1] * page_size


def _check_indptr(ind: Any, name: str, batch: int, q: _Tensor) -> None:
    check_tensor(ind, name, dims=1, dtypes=_INT32)
    if ind.shape[0] != batch + 1:
        raise fail(f"{name}.shape", tuple(ind.shape), f"({batch + 1},) = batch + 1")
    check_same_device(name, ind, "q", q)
    if not ind.is_contiguous():
        raise fail(name, "non-contiguous", "a contiguous tensor")


def _lengths(values: list[int], name: str, total: int, total_name: str) -> list[int]:
    """Per-request lengths of host indptr ``values``; raises unless it runs 0..total, non-decreasing."""
    if values[0] != 0 or values[-1] != total:
        raise fail(name, f"[{values[0]}, ..., {values[-1]}]", f"starting at 0 and ending at {total_name} = {total}")
    lens = [b - a for a, b in itertools.pairwise(values)]
    if lens and min(lens) < 0:
        raise fail(name, values, "non-decreasing offsets")
    return lens


def _check_fits(qo_lens: list[int], kv_lens: list[int]) -> None:
    for b, (nq, nk) in enumerate(zip(qo_lens, kv_lens)):
        if nq > nk:
            raise fail("qo_indptr", f"qo_len {nq} of request {b}",
                       f"at most that request's kv length {nk} (causal queries are the last tokens of the sequence)")


def _prefill_host(qo_indptr: _Tensor, kv_lens_src: _Tensor, total_q: int, causal: bool, ragged: bool,
                  total_kv: int) -> tuple[int, int | None, bool]:
    """One host read of qo_indptr and seq_lens (paged) or kv_indptr (ragged): validates them and
    returns (max_q_len, max_kv_len or None, mixed prefill/decode batch)."""
    return _prefill_lengths(torch.cat((qo_indptr, kv_lens_src)).tolist(), total_q, causal, ragged, total_kv)


def _prefill_lengths(values: list[int], total_q: int, causal: bool, ragged: bool,
                     total_kv: int) -> tuple[int, int | None, bool]:
    """:func:`_prefill_host` on the values already read: qo_indptr (B+1) then seq_lens (B) or kv_indptr (B+1)."""
    b = (len(values) - 1) // 2 if ragged else len(values) // 2
    qo_lens = _lengths(values[: b + 1], "qo_indptr", total_q, "q.shape[0]")
    if ragged:
        kv_lens = _lengths(values[b + 1:], "kv_indptr", total_kv, "k.shape[0]")
    else:
        kv_lens = values[b + 1:]
    if causal:
        _check_fits(qo_lens, kv_lens)
    max_q = max(qo_lens, default=0)
    mixed = max_q > 1 and 1 in qo_lens
    return max_q, (max(kv_lens, default=0) if ragged else None), mixed


def _result(out: _Tensor, lse: _Tensor | None, return_lse: bool) -> _Tensor | tuple[_Tensor, _Tensor]:
    """``out``, or ``(out, lse)`` when the caller asked for the LSE."""
    if not return_lse:
        return out
    if lse is None:
        raise RuntimeError("the selected attention kernel returned no lse although return_lse=True was requested")
    return out, lse


_TABLES: dict[tuple[int, int, int | None], tuple[Any, Any, tuple[int, int], PageTable]] = {}


def table_of(block_table: _Tensor, seq_lens: _Tensor, max_seq_len: int | None) -> PageTable:
    """The :class:`PageTable` of these tensors inside a custom op (torch.compile path), reused while
    the same tensors are unchanged (same version counters), so its one-time device checks are not
    repeated at every compiled call."""
    try:
        versions = (block_table._version, seq_lens._version)
    except RuntimeError:  # inference-mode tensors carry no version counter
        return PageTable(block_table, seq_lens, max_seq_len)
    key = (id(block_table), id(seq_lens), max_seq_len)
    hit = _TABLES.get(key)
    if hit is not None and hit[0]() is block_table and hit[1]() is seq_lens and hit[2] == versions:
        return hit[3]
    table = PageTable(block_table, seq_lens, max_seq_len)
    if len(_TABLES) >= 8:
        _TABLES.clear()
    _TABLES[key] = (weakref.ref(block_table), weakref.ref(seq_lens), versions, table)
    return table


def _empty_lse() -> _Tensor:
    return torch.empty(0, dtype=torch.float32)


# -- decode ----------------------------------------------------------------------------------------
def decode(q: _Tensor, cache: PagedKVCache, table: PageTable, *, sm_scale: float | None = None,
           logits_soft_cap: float | None = None, window_left: int | None = None, return_lse: bool = False,
           variant: Any = None, variant_args: Any = None,
           backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Paged decode: one query token per request against its cached K/V.

    q (B, Hq, D) fp16/bf16/fp32; cache :class:`PagedKVCache` (same dtype as q, or fp8 with scales);
    table :class:`PageTable` of B requests. Returns out (B, Hq, Dv) in q's dtype, and lse (B, Hq)
    float32 when ``return_lse``. ``variant``: a :class:`~kernel_switchboard.variants.Variant`, with
    its parameters in ``variant_args``.
    """
    if variant is not None or variant_args is not None:
        run = _eager_only(_decode_eager) if compiling() else _decode_eager
        out, lse = run(q, cache, table, sm_scale, logits_soft_cap, window_left, return_lse, backend, variant,
                       variant_args)
        return _result(out, lse, return_lse)
    if compiling():
        out, lse = _decode_op(q, cache.k_pages, cache.v_pages, cache.layout, cache.k_scale, cache.v_scale,
                              table.block_table, table.seq_lens, table.max_seq_len, sm_scale, logits_soft_cap,
                              window_left, return_lse, backend_to_str(backend))
        return _result(out, lse, return_lse)
    out, lse = _decode_eager(q, cache, table, sm_scale, logits_soft_cap, window_left, return_lse, backend)
    return _result(out, lse, return_lse)


def _decode_problem(dev: str, cc: Any, dtype: torch.dtype, cache_dims: tuple[Any, ...], num_q_heads: int, batch: int,
                    p: AttnParams, extra: frozenset[str] = frozenset()) -> DecodeProblem:
    kv_dtype, head_dim, head_dim_v, page_size, layout, num_kv_heads = cache_dims
    feats = _features(("paged",), p, kv_dtype in FP8_DTYPES, head_dim != head_dim_v, dev) | extra
    return DecodeProblem(dev, cc, dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, num_q_heads, num_kv_heads,
                         num_q_heads // num_kv_heads, bucket(batch), bucket(p.max_kv_len), feats, _variant_key(p))


def _cache_dims(cache: PagedKVCache) -> tuple[Any, ...]:
    return cache.dtype, cache.head_dim, cache.head_dim_v, cache.page_size, cache.layout, cache.num_kv_heads


def _decode_eager(q: _Tensor, cache: PagedKVCache, table: PageTable, sm_scale: Any, cap: Any, window: Any,
                  return_lse: bool, backend: BackendArg, variant: Any = None, variant_args: Any = None
                  ) -> tuple[_Tensor, _Tensor | None]:
    _check_q(q, "q", 3)
    dims = _check_cache(cache, q)
    b, hq, d = q.shape
    max_kv = _check_table(table, dims[3], cache.num_pages, b, q)
    p = _with_variant(_params(d, sm_scale, cap, window, True, return_lse, 1, max_kv),
                      bind(variant, variant_args, q.device))
    dev, cc = device_key(q)
    problem = _decode_problem(dev, cc, q.dtype, dims, hq, b, p)
    return select_kernel("attention.decode", problem, backend).run(q, cache, table, p)  # type: ignore[no-any-return]


def _decode_impl(q: _Tensor, k_pages: _Tensor, v_pages: _Tensor, layout: str, k_scale: float | None,
                 v_scale: float | None, block_table: _Tensor, seq_lens: _Tensor, max_seq_len: int | None,
                 sm_scale: float | None, logits_soft_cap: float | None, window_left: int | None, return_lse: bool,
                 backend: str | None) -> tuple[_Tensor, _Tensor]:
    cache = PagedKVCache(k_pages, v_pages, layout, *_scales(k_pages, k_scale, v_scale))
    table = table_of(block_table, seq_lens, max_seq_len)
    out, lse = _decode_eager(q, cache, table, sm_scale, logits_soft_cap, window_left, return_lse,
                             backend_from_str(backend))
    return out, (lse if lse is not None else _empty_lse().to(q.device))


def _decode_fake(q: _Tensor, k_pages: _Tensor, v_pages: _Tensor, layout: str, k_scale: float | None,
                 v_scale: float | None, block_table: _Tensor, seq_lens: _Tensor, max_seq_len: int | None,
                 sm_scale: float | None, logits_soft_cap: float | None, window_left: int | None, return_lse: bool,
                 backend: str | None) -> tuple[_Tensor, _Tensor]:
    out = q.new_empty((q.shape[0], q.shape[1], v_pages.shape[-1]))
    return out, q.new_empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)


def _scales(k_pages: _Tensor, k_scale: float | None, v_scale: float | None) -> tuple[float | None, float | None]:
    return (k_scale, v_scale) if k_pages.dtype in FP8_DTYPES else (None, None)


_decode_op = custom_op("attention_decode", _decode_impl, _decode_fake)


# -- prefill (paged) ---------------------------------------------------------------------------------
def prefill(q: _Tensor, qo_indptr: _Tensor, cache: PagedKVCache, table: PageTable, *, causal: bool = True,
            sm_scale: float | None = None, logits_soft_cap: float | None = None, window_left: int | None = None,
            return_lse: bool = False, variant: Any = None, variant_args: Any = None,
            backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Paged prefill, append (qo_len < kv_len) and mixed prefill/decode batches.

    q (Tq, Hq, D) packed: request b owns rows ``qo_indptr[b]:qo_indptr[b+1]``; qo_indptr (B+1,)
    int32; the cache already holds every request's new tokens (``table.seq_lens`` counts them).
    Returns out (Tq, Hq, Dv) in q's dtype, and lse (Tq, Hq) float32 when ``return_lse``.
    ``variant`` / ``variant_args``: a custom attention variant, as in :func:`decode`.
    """
    if variant is not None or variant_args is not None:
        run = _eager_only(_prefill_eager) if compiling() else _prefill_eager
        out, lse = run(q, qo_indptr, cache, table, causal, sm_scale, logits_soft_cap, window_left, return_lse, backend,
                       variant, variant_args)
        return _result(out, lse, return_lse)
    if compiling():
        out, lse = _prefill_op(q, qo_indptr, cache.k_pages, cache.v_pages, cache.layout, cache.k_scale, cache.v_scale,
                               table.block_table, table.seq_lens, table.max_seq_len, causal, sm_scale,
                               logits_soft_cap, window_left, return_lse, backend_to_str(backend))
        return _result(out, lse, return_lse)
    out, lse = _prefill_eager(q, qo_indptr, cache, table, causal, sm_scale, logits_soft_cap, window_left, return_lse,
                              backend)
    return _result(out, lse, return_lse)


def _prefill_problem(dev: str, cc: Any, dtype: torch.dtype, cache_dims: tuple[Any, ...], num_q_heads: int,
                     batch: int, p: AttnParams, mixed: bool, extra: frozenset[str] = frozenset()) -> PrefillProblem:
    kv_dtype, head_dim, head_dim_v, page_size, layout, num_kv_heads = cache_dims
    base = ("paged", "causal") if p.causal else ("paged",)
    feats = _features(base, p, kv_dtype in FP8_DTYPES, head_dim != head_dim_v, dev, mixed) | extra
    return PrefillProblem(dev, cc, dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, num_q_heads, num_kv_heads,
                          num_q_heads // num_kv_heads, bucket(batch), bucket(p.max_q_len), bucket(p.max_kv_len), feats,
                          _variant_key(p))


def _check_prefill(q: _Tensor, qo_indptr: _Tensor, cache: PagedKVCache, table: PageTable, causal: bool
                   ) -> tuple[int, int, bool]:
    """Validate a paged prefill; returns (max_q_len, max_kv_len, mixed)."""
    _check_q(q, "q", 3)
    dims = _check_cache(cache, q)
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    _check_indptr(qo_indptr, "qo_indptr", table.batch_size, q)
    max_kv = _check_table(table, dims[3], cache.num_pages, table.batch_size, q)
    if is_capturing():
        return q.shape[0], max_kv, False
    max_q, _, mixed = _prefill_host(qo_indptr, table.seq_lens, q.shape[0], causal, False, 0)
    return max_q, max_kv, mixed


def _prefill_eager(q: _Tensor, qo_indptr: _Tensor, cache: PagedKVCache, table: PageTable, causal: bool, sm_scale: Any,
                   cap: Any, window: Any, return_lse: bool, backend: BackendArg, variant: Any = None,
                   variant_args: Any = None) -> tuple[_Tensor, _Tensor | None]:
    max_q, max_kv, mixed = _check_prefill(q, qo_indptr, cache, table, bool(causal))
    p = _with_variant(_params(q.shape[2], sm_scale, cap, window, bool(causal), bool(return_lse), max_q, max_kv),
                      bind(variant, variant_args, q.device))
    dev, cc = device_key(q)
    problem = _prefill_problem(dev, cc, q.dtype, _cache_dims(cache), q.shape[1], table.batch_size, p, mixed)
    kernel = select_kernel("attention.prefill", problem, backend)
    return kernel.run(q, qo_indptr, cache, table, p)  # type: ignore[no-any-return]


def _prefill_impl(q: _Tensor, qo_indptr: _Tensor, k_pages: _Tensor, v_pages: _Tensor, layout: str,
                  k_scale: float | None, v_scale: float | None, block_table: _Tensor, seq_lens: _Tensor,
                  max_seq_len: int | None, causal: bool, sm_scale: float | None, logits_soft_cap: float | None,
                  window_left: int | None, return_lse: bool, backend: str | None) -> tuple[_Tensor, _Tensor]:
    cache = PagedKVCache(k_pages, v_pages, layout, *_scales(k_pages, k_scale, v_scale))
    table = table_of(block_table, seq_lens, max_seq_len)
    out, lse = _prefill_eager(q, qo_indptr, cache, table, causal, sm_scale, logits_soft_cap, window_left, return_lse,
                              backend_from_str(backend))
    return out, (lse if lse is not None else _empty_lse().to(q.device))


def _prefill_fake(q: _Tensor, qo_indptr: _Tensor, k_pages: _Tensor, v_pages: _Tensor, layout: str,
                  k_scale: float | None, v_scale: float | None, block_table: _Tensor, seq_lens: _Tensor,
                  max_seq_len: int | None, causal: bool, sm_scale: float | None, logits_soft_cap: float | None,
                  window_left: int | None, return_lse: bool, backend: str | None) -> tuple[_Tensor, _Tensor]:
    out = q.new_empty((q.shape[0], q.shape[1], v_pages.shape[-1]))
    return out, q.new_empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)


_prefill_op = custom_op("attention_prefill", _prefill_impl, _prefill_fake)


# -- prefill (ragged K/V) ------------------------------------------------------------------------------
def prefill_ragged(q: _Tensor, k: _Tensor, v: _Tensor, qo_indptr: _Tensor, kv_indptr: _Tensor, *, causal: bool = True,
                   sm_scale: float | None = None, logits_soft_cap: float | None = None, window_left: int | None = None,
                   return_lse: bool = False, variant: Any = None, variant_args: Any = None,
                   backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Prefill over contiguous variable-length K/V (no cache).

    q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), same dtype; request b owns q rows
    ``qo_indptr[b]:qo_indptr[b+1]`` and K/V rows ``kv_indptr[b]:kv_indptr[b+1]`` (both (B+1,) int32).
    Returns out (Tq, Hq, Dv) in q's dtype, and lse (Tq, Hq) float32 when ``return_lse``.
    ``variant`` / ``variant_args``: a custom attention variant, as in :func:`decode`.
    """
    if variant is not None or variant_args is not None:
        run = _eager_only(_ragged_eager) if compiling() else _ragged_eager
        out, lse = run(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left, return_lse,
                       backend, variant, variant_args)
        return _result(out, lse, return_lse)
    if compiling():
        out, lse = _ragged_op(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left,
                              return_lse, backend_to_str(backend))
        return _result(out, lse, return_lse)
    out, lse = _ragged_eager(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left,
                             return_lse, backend)
    return _result(out, lse, return_lse)


def _ragged_eager(q: _Tensor, k: _Tensor, v: _Tensor, qo_indptr: _Tensor, kv_indptr: _Tensor, causal: bool,
                  sm_scale: Any, cap: Any, window: Any, return_lse: bool, backend: BackendArg, variant: Any = None,
                  variant_args: Any = None) -> tuple[_Tensor, _Tensor | None]:
    _check_q(q, "q", 3)
    for name, t in (("k", k), ("v", v)):
        _check_q(t, name, 3)
        if t.dtype != q.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"q.dtype ({q.dtype})")
        check_same_device(name, t, "q", q)
    if k.shape[-1] != q.shape[-1]:
        raise fail("k.shape", tuple(k.shape), f"head_dim (last dim) equal to q's ({q.shape[-1]})")
    if v.shape[:2] != k.shape[:2]:
        raise fail("v.shape", tuple(v.shape), f"(Tk, Hkv, Dv) with (Tk, Hkv) = {tuple(k.shape[:2])} as in k")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise fail("q.shape", tuple(q.shape), f"num_q_heads (dim 1) a multiple of k's num_kv_heads ({k.shape[1]})")
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=_INT32)
    batch = qo_indptr.shape[0] - 1
    if batch < 0:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), "(batch + 1,) with batch >= 0")
    _check_indptr(qo_indptr, "qo_indptr", batch, q)
    _check_indptr(kv_indptr, "kv_indptr", batch, q)
    causal = bool(causal)
    if is_capturing():
        max_q, max_kv, mixed = q.shape[0], k.shape[0], False
    else:
        max_q, max_kv_host, mixed = _prefill_host(qo_indptr, kv_indptr, q.shape[0], causal, True, k.shape[0])
        max_kv = max_kv_host or 0
    p = _with_variant(_params(q.shape[2], sm_scale, cap, window, causal, bool(return_lse), max_q, max_kv),
                      bind(variant, variant_args, q.device))
    dev, cc = device_key(q)
    base = ("ragged", "causal") if causal else ("ragged",)
    feats = _features(base, p, False, k.shape[-1] != v.shape[-1], dev, mixed)
    problem = RaggedPrefillProblem(dev, cc, q.dtype, k.dtype, k.shape[-1], v.shape[-1], None, None, q.shape[1],
                                   k.shape[1], q.shape[1] // k.shape[1], bucket(batch), bucket(max_q), bucket(max_kv),
                                   feats, _variant_key(p))
    kernel = select_kernel("attention.prefill_ragged", problem, backend)
    return kernel.run(q, k, v, qo_indptr, kv_indptr, p)  # type: ignore[no-any-return]


def _ragged_impl(q: _Tensor, k: _Tensor, v: _Tensor, qo_indptr: _Tensor, kv_indptr: _Tensor, causal: bool,
                 sm_scale: float | None, logits_soft_cap: float | None, window_left: int | None, return_lse: bool,
                 backend: str | None) -> tuple[_Tensor, _Tensor]:
    out, lse = _ragged_eager(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left, return_lse,
                             backend_from_str(backend))
    return out, (lse if lse is not None else _empty_lse().to(q.device))


def _ragged_fake(q: _Tensor, k: _Tensor, v: _Tensor, qo_indptr: _Tensor, kv_indptr: _Tensor, causal: bool,
                 sm_scale: float | None, logits_soft_cap: float | None, window_left: int | None, return_lse: bool,
                 backend: str | None) -> tuple[_Tensor, _Tensor]:
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
    return out, q.new_empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)


_ragged_op = custom_op("attention_prefill_ragged", _ragged_impl, _ragged_fake)


# -- MLA decode ------------------------------------------------------------------------------------------
def mla_decode(q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable, *,
               sm_scale: float | None = None, return_lse: bool = False,
               backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Absorbed multi-head latent attention decode (DeepSeek-V2/V3), one latent KV head.

    q_nope (B, H, Dc), q_pe (B, H, Dr); ckv_pages (P, S, Dc), kpe_pages (P, S, Dr), q's dtype;
    table of B requests over pages of size S. logits = (q_nope·ckv + q_pe·kpe) * sm_scale; out =
    softmax · ckv, (B, H, Dc) in q's dtype; lse (B, H) float32 when ``return_lse``. ``sm_scale``
    defaults to 1/sqrt(Dc + Dr); DeepSeek models pass their own (1/sqrt(192) times the YaRN mscale²).

    Several new tokens per request (multi-token prediction, speculative verification): q_nope
    (B, T, H, Dc) and q_pe (B, T, H, Dr) are the queries of each request's T newest tokens, already
    in the cache at positions seq_len - T ... seq_len - 1, each attending causally; out (B, T, H, Dc),
    lse (B, T, H). They run as B * T decode rows that share their request's pages
    (:class:`~kernel_switchboard.paged.TokenRows`); a position below 0 gives an empty row (out 0, lse -inf).
    """
    if isinstance(q_nope, torch.Tensor) and q_nope.dim() == 4:
        return _mla_decode_tokens(q_nope, q_pe, ckv_pages, kpe_pages, table, sm_scale, return_lse, backend)
    if compiling():
        out, lse = _mla_op(q_nope, q_pe, ckv_pages, kpe_pages, table.block_table, table.seq_lens, table.max_seq_len,
                           sm_scale, return_lse, backend_to_str(backend))
        return _result(out, lse, return_lse)
    out, lse = _mla_eager(q_nope, q_pe, ckv_pages, kpe_pages, table, sm_scale, return_lse, backend)
    return _result(out, lse, return_lse)


def _mla_decode_tokens(q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable,
                       sm_scale: float | None, return_lse: bool, backend: BackendArg) -> _Tensor | tuple[_Tensor, _Tensor]:
    """:func:`mla_decode` of T new tokens per request: q_nope (B, T, H, Dc), q_pe (B, T, H, Dr) as B * T rows."""
    if not (isinstance(q_pe, torch.Tensor) and q_pe.dim() == 4 and q_pe.shape[:3] == q_nope.shape[:3]):
        got = tuple(q_pe.shape) if isinstance(q_pe, torch.Tensor) else type(q_pe).__name__
        raise fail("q_pe.shape", got, f"(B, T, H, Dr) with (B, T, H) = {tuple(q_nope.shape[:3])} as in q_nope")
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    b, t, h = q_nope.shape[:3]
    if table.batch_size != b:
        raise fail("table.batch_size", table.batch_size, f"{b} = the batch of q_nope (B, T, H, Dc)")
    if t < 1:
        raise fail("q_nope.shape", tuple(q_nope.shape), "(B, T, H, Dc) with T >= 1 new tokens per request")
    rows = TokenRows(table, t, table.max_seq_len).table
    res = mla_decode(q_nope.reshape(b * t, h, -1), q_pe.reshape(b * t, h, -1), ckv_pages, kpe_pages, rows,
                     sm_scale=sm_scale, return_lse=return_lse, backend=backend)
    if return_lse:
        return res[0].view(b, t, h, -1), res[1].view(b, t, h)
    return res.view(b, t, h, -1)  # type: ignore[union-attr]


def _mla_eager(q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, table: PageTable,
               sm_scale: Any, return_lse: bool, backend: BackendArg) -> tuple[_Tensor, _Tensor | None]:
    _check_q(q_nope, "q_nope", 3)
    _check_q(q_pe, "q_pe", 3)
    if q_pe.dtype != q_nope.dtype:
        raise fail("q_pe.dtype", q_pe.dtype, f"q_nope.dtype ({q_nope.dtype})")
    if q_pe.shape[:2] != q_nope.shape[:2]:
        raise fail("q_pe.shape", tuple(q_pe.shape), f"(B, H, Dr) with (B, H) = {tuple(q_nope.shape[:2])} as in q_nope")
    check_same_device("q_pe", q_pe, "q_nope", q_nope)
    for name, t, q in (("ckv_pages", ckv_pages, q_nope), ("kpe_pages", kpe_pages, q_pe)):
        _check_q(t, name, 3)
        if t.dtype != q_nope.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"q_nope.dtype ({q_nope.dtype})")
        if t.shape[-1] != q.shape[-1]:
            raise fail(f"{name}.shape", tuple(t.shape), f"last dim equal to {'q_nope' if q is q_nope else 'q_pe'}'s "
                                                        f"({q.shape[-1]})")
        check_same_device(name, t, "q_nope", q_nope)
    if kpe_pages.shape[:2] != ckv_pages.shape[:2]:
        raise fail("kpe_pages.shape", tuple(kpe_pages.shape), f"(P, S, Dr) with (P, S) = {tuple(ckv_pages.shape[:2])}")
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    if table.batch_size != q_nope.shape[0]:
        raise fail("table.batch_size", table.batch_size, f"{q_nope.shape[0]} = the batch of q_nope")
    if table.block_table.device != q_nope.device:
        raise fail("table.device", table.block_table.device, f"the device of q_nope ({q_nope.device})")
    page_size = ckv_pages.shape[1]
    table.check_against(page_size, ckv_pages.shape[0])
    max_kv = table.max_seq_len if table.max_seq_len is not None else table.max_pages * page_size
    dc, dr = q_nope.shape[-1], q_pe.shape[-1]
    p = _params(dc + dr, sm_scale, None, None, True, bool(return_lse), 1, max_kv)
    dev, cc = device_key(q_nope)
    b, h = q_nope.shape[:2]
    feats = _features(("paged",), p, False, False, dev)
    problem = MLADecodeProblem(dev, cc, q_nope.dtype, ckv_pages.dtype, dc, dc, dr, page_size, None, h, 1, h,
                               bucket(b), bucket(max_kv), feats)
    kernel = select_kernel("attention.mla_decode", problem, backend)
    return kernel.run(q_nope, q_pe, ckv_pages, kpe_pages, table, p)  # type: ignore[no-any-return]


def _mla_impl(q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, block_table: _Tensor,
              seq_lens: _Tensor, max_seq_len: int | None, sm_scale: float | None, return_lse: bool,
              backend: str | None) -> tuple[_Tensor, _Tensor]:
    table = table_of(block_table, seq_lens, max_seq_len)
    out, lse = _mla_eager(q_nope, q_pe, ckv_pages, kpe_pages, table, sm_scale, return_lse, backend_from_str(backend))
    return out, (lse if lse is not None else _empty_lse().to(q_nope.device))


def _mla_fake(q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, block_table: _Tensor,
              seq_lens: _Tensor, max_seq_len: int | None, sm_scale: float | None, return_lse: bool,
              backend: str | None) -> tuple[_Tensor, _Tensor]:
    return torch.empty_like(q_nope), q_nope.new_empty(q_nope.shape[:2] if return_lse else (0,), dtype=torch.float32)


_mla_op = custom_op("attention_mla_decode", _mla_impl, _mla_fake)


# -- merge_states ----------------------------------------------------------------------------------------
def merge_states(out_a: _Tensor, lse_a: _Tensor, out_b: _Tensor, lse_b: _Tensor, *,
                 backend: BackendArg = None) -> tuple[_Tensor, _Tensor]:
    """Merge two attention results over disjoint KV sets into the result over their union.

    out_a, out_b (T, H, D) same float dtype; lse_a, lse_b (T, H) float32, natural log (-inf = empty).
    Returns (out (T, H, D) in out_a's dtype, lse (T, H) float32).
    """
    if compiling():
        return _merge_op(out_a, lse_a, out_b, lse_b, backend_to_str(backend))  # type: ignore[no-any-return]
    return _merge_eager(out_a, lse_a, out_b, lse_b, backend)


def _merge_eager(out_a: _Tensor, lse_a: _Tensor, out_b: _Tensor, lse_b: _Tensor, backend: BackendArg
                 ) -> tuple[_Tensor, _Tensor]:
    _check_q(out_a, "out_a", 3)
    _check_q(out_b, "out_b", 3)
    if out_b.shape != out_a.shape or out_b.dtype != out_a.dtype:
        raise fail("out_b", f"{tuple(out_b.shape)} {out_b.dtype}", f"out_a's shape and dtype ({tuple(out_a.shape)} "
                                                                   f"{out_a.dtype})")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        check_tensor(t, name, dims=2, dtypes=frozenset({torch.float32}))
        if t.shape != out_a.shape[:2]:
            raise fail(f"{name}.shape", tuple(t.shape), f"(T, H) = {tuple(out_a.shape[:2])} as in out_a")
        if t.stride(-1) != 1:
            raise fail(f"{name}.stride", t.stride(), "unit stride in the last dim")
        check_same_device(name, t, "out_a", out_a)
    check_same_device("out_b", out_b, "out_a", out_a)
    dev, cc = device_key(out_a)
    problem = MergeProblem(dev, cc, out_a.dtype, out_a.shape[2], out_a.shape[1], bucket(out_a.shape[0]),
                           graph_features(dev))
    return select_kernel("attention.merge_states", problem, backend).run(out_a, lse_a, out_b, lse_b)  # type: ignore[no-any-return]


def _merge_impl(out_a: _Tensor, lse_a: _Tensor, out_b: _Tensor, lse_b: _Tensor,
                backend: str | None) -> tuple[_Tensor, _Tensor]:
    return _merge_eager(out_a, lse_a, out_b, lse_b, backend_from_str(backend))


def _merge_fake(out_a: _Tensor, lse_a: _Tensor, out_b: _Tensor, lse_b: _Tensor,
                backend: str | None) -> tuple[_Tensor, _Tensor]:
    return torch.empty_like(out_a), torch.empty_like(lse_a)


_merge_op = custom_op("attention_merge_states", _merge_impl, _merge_fake)


# -- cascade (shared prefix) -------------------------------------------------------------------------------
_SINGLE: dict[tuple[int, torch.device], _Tensor] = {}


def cascade(q: _Tensor, qo_indptr: _Tensor, cache: PagedKVCache, prefix_table: PageTable, suffix_table: PageTable, *,
            causal: bool = True, sm_scale: float | None = None, logits_soft_cap: float | None = None,
            return_lse: bool = False, backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Attention of B requests that share one prefix: equal to :func:`prefill` over prefix + suffix.

    ``prefix_table`` (batch 1) lists the shared prefix pages, read once for every query
    (non-causal: every query follows the whole prefix); ``suffix_table`` (batch B) lists each
    request's own pages, whose tokens include its queries (causal within the suffix). The two
    partial results are combined with :func:`merge_states`. q (Tq, Hq, D) packed by qo_indptr
    (B+1,) int32 (decode: qo_indptr = arange(B+1)). Returns out (Tq, Hq, Dv) [, lse (Tq, Hq)].
    """
    if not isinstance(prefix_table, PageTable) or prefix_table.batch_size != 1:
        raise fail("prefix_table", prefix_table, "a PageTable of batch 1 (the shared prefix)")
    check_tensor(q, "q", dims=3)
    key = (q.shape[0], q.device)
    whole = _SINGLE.get(key)
    if whole is None:
        if len(_SINGLE) > 64:
            _SINGLE.clear()
        whole = _SINGLE[key] = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    out_p, lse_p = prefill(q, whole, cache, prefix_table, causal=False, sm_scale=sm_scale,
                           logits_soft_cap=logits_soft_cap, return_lse=True, backend=backend)
    out_s, lse_s = prefill(q, qo_indptr, cache, suffix_table, causal=causal, sm_scale=sm_scale,
                           logits_soft_cap=logits_soft_cap, return_lse=True, backend=backend)
    out, lse = merge_states(out_p, lse_p, out_s, lse_s, backend=backend)
    return _result(out, lse, return_lse)


# -- dense attention with a bias or mask: its own module, used from this namespace ----------------------
from .attention_dense import DenseParams, DenseProblem, dense  # noqa: E402, F401

# -- plans ---------------------------------------------------------------------------------------------
# Plans live in attention_plans.py (they build on the helpers above) and are used from this namespace.
from .attention_plans import (  # noqa: E402, F401
    AttentionPlan,
    DecodePlan,
    MLADecodePlan,
    PrefillPlan,
    RaggedPrefillPlan,
    plan_decode,
    plan_mla_decode,
    plan_prefill,
    plan_prefill_ragged,
)

