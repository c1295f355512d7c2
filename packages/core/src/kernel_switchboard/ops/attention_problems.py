"""Problems of the attention ops: their scalar parameters, their problem types, and the one validation of a call
that builds them.

The public functions (:mod:`.attention`) prepare every call here, eagerly and inside their custom ops under
torch.compile (the same functions), and ``ksb.explain`` asks the same functions for the problem. The plans
(:mod:`.attention_plans`) validate their descriptive arguments themselves and build their problems with the same
builders (``decode_problem`` ...), so a problem type is constructed in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..device import is_capturing
from ..errors import fail
from ..invariance import FEATURE as INVARIANT
from ..invariance import SCOPE as INVARIANT_SCOPE
from ..paged import FP8_DTYPES, PagedKVCache, PageTable, TokenRows
from ..variants import BoundVariant, bind
from ._common import FLOAT_DTYPES, check_same_device, check_tensor, device_info, device_key, graph_features

INT32 = frozenset({torch.int32})
_Tensor = torch.Tensor
_NO_FEATURES: frozenset[str] = frozenset()
_CAPTURE = frozenset({"cuda_graph"})
_SCALE_TENSORS = frozenset({"kv_scale_tensor"})


def cache_features(cache: PagedKVCache, extra: frozenset[str]) -> frozenset[str]:
    """``extra`` and the cache's own context features (``kv_scale_tensor`` for scales given as tensors)."""
    return extra | _SCALE_TENSORS if cache.scale_tensors else extra


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
    #: made inside ``ksb.batch_invariant()``: kernels fix their split and tile choices (see invariance.py)
    batch_invariant: bool = False
    #: queries in float8_e4m3fn: their scale (q = stored * q_scale); None for float queries
    q_scale: float | None = None
    #: the log-sum-exp wanted in base 2 (``log2(sum(2 ** (score * log2(e))))`` = natural LSE x log2(e)), as
    #: FlashInfer returns it; kernels with ``writes_lse_base2`` write it so, others are converted by the plan
    lse_base2: bool = False


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


class MLAPrefillProblem(NamedTuple):
    """Signature of an absorbed multi-head latent attention prefill / append / mixed batch over paged latent KV (one
    latent KV head shared by every query head)."""

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
    max_q_len: int  # bucketed
    max_kv_len: int  # bucketed
    features: frozenset[str]


class PODProblem(NamedTuple):
    """Signature of a POD call: a prefill part (paged, several query tokens per request) and a decode part (paged, one
    token per request) attended together over one cache."""

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
    batch: int  # prefill requests, bucketed
    decode_batch: int  # decode requests, bucketed
    max_q_len: int  # the prefill part's longest query, bucketed
    max_kv_len: int  # the longest KV of either part, bucketed
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


# -- scalar parameters --------------------------------------------------------------------------------------
def params(head_dim: int, sm_scale: Any, cap: Any, window: Any, causal: bool, return_lse: bool, max_q: int,
           max_kv: int, variant: Any = None, variant_args: Any = None, device: Any = None) -> AttnParams:
    """Validated :class:`AttnParams`; ``variant`` / ``variant_args`` bound (and checked) on ``device``;
    ``batch_invariant`` inside a ``ksb.batch_invariant()`` scope."""
    try:
        p = _params(head_dim, sm_scale, cap, window, causal, return_lse, max_q, max_kv, INVARIANT_SCOPE.get())
    except TypeError:  # an unhashable scalar argument
        for name, value in (("sm_scale", sm_scale), ("logits_soft_cap", cap), ("window_left", window)):
            if not (value is None or isinstance(value, (int, float))):
                raise fail(name, value, "a number or None") from None
        raise
    if variant is None and variant_args in (None, ()):
        return p
    return dataclasses.replace(p, variant=bind(variant, variant_args, device))


@functools.lru_cache(maxsize=1024)
def _params(head_dim: int, sm_scale: Any, cap: Any, window: Any, causal: bool, return_lse: bool, max_q: int,
            max_kv: int, invariant: bool = False) -> AttnParams:
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
                      bool(return_lse), max_q, max_kv, batch_invariant=invariant)


# -- problem builders (the one construction of each problem type) ----------------------------------------
def _features(base: tuple[str, ...], p: AttnParams, fp8: bool, dims_differ: bool, mixed: bool,
              extra: frozenset[str]) -> frozenset[str]:
    flags = (("sliding_window", p.window_left >= 0), ("soft_cap", p.logits_soft_cap is not None),
             ("return_lse", p.return_lse), ("fp8_kv", fp8), ("qk_v_dims_differ", dims_differ),
             ("mixed_batch", mixed), ("custom_variant", p.variant is not None), (INVARIANT, p.batch_invariant),
             ("fp8_q", p.q_scale is not None))
    return frozenset(base).union((name for name, on in flags if on), extra)


def _variant_key(p: AttnParams) -> str | None:
    return None if p.variant is None else p.variant.variant.key


@functools.lru_cache(maxsize=1024)
def decode_problem(dev: str, cc: Any, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, head_dim_v: int,
                   page_size: int, layout: str, num_q_heads: int, num_kv_heads: int, batch: int, p: AttnParams,
                   extra: frozenset[str]) -> DecodeProblem:
    """The :class:`DecodeProblem` of these (validated) values; ``extra``: features of the call's context
    (``cuda_graph`` while captured or for a capturable plan)."""
    feats = _features(("paged",), p, kv_dtype in FP8_DTYPES, head_dim != head_dim_v, False, extra)
    return DecodeProblem(dev, cc, dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, num_q_heads, num_kv_heads,
                         num_q_heads // num_kv_heads, bucket(batch), bucket(p.max_kv_len), feats, _variant_key(p))


@functools.lru_cache(maxsize=1024)
def prefill_problem(dev: str, cc: Any, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, head_dim_v: int,
                    page_size: int, layout: str, num_q_heads: int, num_kv_heads: int, batch: int, p: AttnParams,
                    mixed: bool, extra: frozenset[str]) -> PrefillProblem:
    """The :class:`PrefillProblem` of these (validated) values (``mixed``: prefill and decode requests)."""
    base = ("paged", "causal") if p.causal else ("paged",)
    feats = _features(base, p, kv_dtype in FP8_DTYPES, head_dim != head_dim_v, mixed, extra)
    return PrefillProblem(dev, cc, dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, num_q_heads, num_kv_heads,
                          num_q_heads // num_kv_heads, bucket(batch), bucket(p.max_q_len), bucket(p.max_kv_len), feats,
                          _variant_key(p))


@functools.lru_cache(maxsize=1024)
def ragged_problem(dev: str, cc: Any, dtype: torch.dtype, head_dim: int, head_dim_v: int, num_q_heads: int,
                   num_kv_heads: int, batch: int, p: AttnParams, mixed: bool,
                   extra: frozenset[str]) -> RaggedPrefillProblem:
    """The :class:`RaggedPrefillProblem` of these (validated) values; K/V have q's dtype."""
    base = ("ragged", "causal") if p.causal else ("ragged",)
    feats = _features(base, p, False, head_dim != head_dim_v, mixed, extra)
    return RaggedPrefillProblem(dev, cc, dtype, dtype, head_dim, head_dim_v, None, None, num_q_heads, num_kv_heads,
                                num_q_heads // num_kv_heads, bucket(batch), bucket(p.max_q_len), bucket(p.max_kv_len),
                                feats, _variant_key(p))


@functools.lru_cache(maxsize=1024)
def mla_problem(dev: str, cc: Any, dtype: torch.dtype, head_dim_ckv: int, head_dim_kpe: int, page_size: int,
                num_heads: int, batch: int, p: AttnParams, extra: frozenset[str]) -> MLADecodeProblem:
    """The :class:`MLADecodeProblem` of these (validated) values; the pages have q's dtype."""
    feats = _features(("paged",), p, False, False, False, extra)
    return MLADecodeProblem(dev, cc, dtype, dtype, head_dim_ckv, head_dim_ckv, head_dim_kpe, page_size, None,
                            num_heads, 1, num_heads, bucket(batch), bucket(p.max_kv_len), feats)


@functools.lru_cache(maxsize=1024)
def mla_prefill_problem(dev: str, cc: Any, dtype: torch.dtype, head_dim_ckv: int, head_dim_kpe: int, page_size: int,
                        num_heads: int, batch: int, p: AttnParams, mixed: bool,
                        extra: frozenset[str]) -> MLAPrefillProblem:
    """The :class:`MLAPrefillProblem` of these (validated) values; the pages have q's dtype."""
    base = ("paged", "causal") if p.causal else ("paged",)
    feats = _features(base, p, False, False, mixed, extra)
    return MLAPrefillProblem(dev, cc, dtype, dtype, head_dim_ckv, head_dim_ckv, head_dim_kpe, page_size, None,
                             num_heads, 1, num_heads, bucket(batch), bucket(p.max_q_len), bucket(p.max_kv_len), feats)


@functools.lru_cache(maxsize=1024)
def pod_problem(dev: str, cc: Any, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, head_dim_v: int,
                page_size: int, layout: str, num_q_heads: int, num_kv_heads: int, prefill_batch: int, decode_batch: int,
                p: AttnParams, extra: frozenset[str]) -> PODProblem:
    """The :class:`PODProblem` of these (validated) values (``p.causal``: the prefill part's mask)."""
    base = ("paged", "causal") if p.causal else ("paged",)
    feats = _features(base, p, kv_dtype in FP8_DTYPES, head_dim != head_dim_v, False, extra)
    return PODProblem(dev, cc, dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, num_q_heads, num_kv_heads,
                      num_q_heads // num_kv_heads, bucket(prefill_batch), bucket(decode_batch), bucket(p.max_q_len),
                      bucket(p.max_kv_len), feats)


# -- checks ----------------------------------------------------------------------------------------------
def check_q(q: Any, name: str, dims: int, dtypes: frozenset[torch.dtype] = FLOAT_DTYPES) -> None:
    """A float tensor of ``dims`` dims with unit stride in the last dim (one test on the hot path)."""
    if not (isinstance(q, torch.Tensor) and q.dim() == dims and q.dtype in dtypes and q.stride(-1) == 1):
        check_tensor(q, name, dims=dims, dtypes=dtypes)
        raise fail(f"{name}.stride", q.stride(), "unit stride in the last (head_dim) dim")


E4M3 = torch.float8_e4m3fn
#: queries of attention.prefill: a float dtype, or float8_e4m3fn with a q_scale over an e4m3 cache
PREFILL_Q_DTYPES = FLOAT_DTYPES | {E4M3}


def out_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The dtype of attention outputs for queries of ``q_dtype``: q's, bfloat16 for float8_e4m3fn queries."""
    return torch.bfloat16 if q_dtype == E4M3 else q_dtype


def fp8_query(q_dtype: torch.dtype, kv_dtype: torch.dtype, q_scale: Any, variant: Any) -> float | None:
    """The validated ``q_scale`` of a prefill whose queries are float8_e4m3fn (QK on fp8 tensor cores, as
    FlashAttention-3 runs it); None for float queries, which take none."""
    if q_dtype != E4M3:
        if q_scale is not None:
            raise fail("q_scale", q_scale, f"None: q is {q_dtype}, not float8_e4m3fn")
        return None
    if isinstance(q_scale, bool) or not (isinstance(q_scale, (int, float)) and 0 < q_scale < math.inf):
        raise fail("q_scale", q_scale, "a positive finite float, the scale of q's float8_e4m3fn values "
                                       "(q = stored * q_scale)")
    if kv_dtype != E4M3:
        raise fail("cache.dtype", kv_dtype, "float8_e4m3fn: queries in float8_e4m3fn attend an e4m3 cache")
    if variant is not None:
        raise fail("variant", variant, "None: queries in float8_e4m3fn take no custom variant")
    return float(q_scale)


def cache_dims(cache: PagedKVCache) -> tuple[Any, ...]:
    """(kv_dtype, head_dim, head_dim_v, page_size, layout, num_kv_heads) of a cache: what a plan fixes."""
    return cache.dtype, cache.head_dim, cache.head_dim_v, cache.page_size, cache.layout, cache.num_kv_heads


def check_cache(cache: Any, q: _Tensor) -> tuple[Any, ...]:
    """Check the cache against q; returns :func:`cache_dims`."""
    if not isinstance(cache, PagedKVCache):
        raise fail("cache", type(cache).__name__, "a PagedKVCache")
    dims = cache_dims(cache)
    kv_dtype, head_dim, _, _, _, kv_heads = dims
    if head_dim != q.shape[-1] or q.shape[-2] % kv_heads or (kv_dtype != q.dtype and kv_dtype not in FP8_DTYPES) \
            or cache.k_pages.device != q.device:
        raise_cache(cache, q)
    return dims


def raise_cache(cache: PagedKVCache, q: _Tensor) -> None:
    """The error for a cache that does not fit q (its device, head dim, heads or dtype)."""
    if cache.device != q.device:
        raise fail("cache.device", cache.device, f"the device of q ({q.device})")
    if cache.head_dim != q.shape[-1]:
        raise fail("q.shape", tuple(q.shape), f"head_dim (last dim) equal to cache.head_dim ({cache.head_dim})")
    if q.shape[-2] % cache.num_kv_heads:
        raise fail("q.shape", tuple(q.shape),
                   f"num_q_heads (dim -2) a multiple of cache.num_kv_heads ({cache.num_kv_heads})")
    raise fail("cache.dtype", cache.dtype, f"q.dtype ({q.dtype}) or an fp8 dtype (float8_e4m3fn, float8_e5m2)")


def check_table(table: Any, batch: int, device: torch.device, q_name: str = "q") -> None:
    """A :class:`PageTable` of ``batch`` requests on ``device`` (q's)."""
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    if table.block_table.shape[0] != batch:
        raise fail("table.batch_size", table.batch_size, f"{batch} = the batch of {q_name}")
    if table.block_table.device != device:
        raise fail("table.device", table.block_table.device, f"the device of {q_name} ({device})")


def check_indptr(ind: Any, name: str, batch: int, q: _Tensor, q_name: str = "q") -> None:
    """A contiguous (batch + 1,) int32 tensor on q's device."""
    check_tensor(ind, name, dims=1, dtypes=INT32)
    if ind.shape[0] != batch + 1:
        raise fail(f"{name}.shape", tuple(ind.shape), f"({batch + 1},) = batch + 1")
    check_same_device(name, ind, q_name, q)
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


def prefill_lengths(values: list[int], total_q: int, causal: bool, ragged: bool,
                    total_kv: int) -> tuple[int, int | None, bool]:
    """Validate host values of qo_indptr (B+1) then seq_lens (B, paged) or kv_indptr (B+1, ragged); returns
    (max_q_len, max_kv_len (ragged) or None, mixed prefill/decode batch)."""
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


# -- calls: validation of a public call and its problem ----------------------------------------------------
def decode_call(q: Any, cache: Any, table: Any, sm_scale: Any = None, logits_soft_cap: Any = None,
                window_left: Any = None, return_lse: bool = False, variant: Any = None,
                variant_args: Any = None) -> tuple[DecodeProblem, AttnParams]:
    """Validate a :func:`~.attention.decode` call; its problem and parameters.

    The eager hot path: one function with the checks inline and the cached builders (a warm call enters no other
    Python function but the table's check)."""
    if not (isinstance(q, torch.Tensor) and q.dim() == 3 and q.dtype in FLOAT_DTYPES and q.stride(-1) == 1):
        check_q(q, "q", 3)
    if not isinstance(cache, PagedKVCache):
        raise fail("cache", type(cache).__name__, "a PagedKVCache")
    k_pages = cache.k_pages
    if cache.layout == "NHD":
        num_pages, page_size, kv_heads, head_dim = k_pages.shape
    else:
        num_pages, kv_heads, page_size, head_dim = k_pages.shape
    batch, num_q_heads, d = q.shape
    kv_dtype = k_pages.dtype
    if head_dim != d or num_q_heads % kv_heads or (kv_dtype != q.dtype and kv_dtype not in FP8_DTYPES) \
            or k_pages.device != q.device:
        raise_cache(cache, q)
    if not (isinstance(table, PageTable) and table.block_table.shape[0] == batch
            and table.block_table.device == q.device):
        check_table(table, batch, q.device)
    max_kv = table.checked_max_seq_len(page_size, num_pages)
    device = q.device
    dev, cc = device_info(device)
    graph = _CAPTURE if dev == "cuda" and torch.cuda.is_current_stream_capturing() else _NO_FEATURES
    if cache.scale_tensors:
        graph = graph | _SCALE_TENSORS
    try:
        p = _params(d, sm_scale, logits_soft_cap, window_left, True, return_lse, 1, max_kv, INVARIANT_SCOPE.get())
    except TypeError:
        p = params(d, sm_scale, logits_soft_cap, window_left, True, return_lse, 1, max_kv)
    if variant is not None or variant_args is not None:
        p = dataclasses.replace(p, variant=bind(variant, variant_args, device))
    return decode_problem(dev, cc, q.dtype, kv_dtype, head_dim, cache.v_pages.shape[-1], page_size, cache.layout,
                          num_q_heads, kv_heads, batch, p, graph), p


def prefill_call(q: Any, qo_indptr: Any, cache: Any, table: Any, causal: bool = True, sm_scale: Any = None,
                 logits_soft_cap: Any = None, window_left: Any = None, return_lse: bool = False, variant: Any = None,
                 variant_args: Any = None, q_scale: Any = None) -> tuple[PrefillProblem, AttnParams, list[int] | None]:
    """Validate a :func:`~.attention.prefill` call: its problem, parameters and the host values of qo_indptr (one
    read of qo_indptr and seq_lens; None while a CUDA graph is captured, which allows none)."""
    check_q(q, "q", 3, PREFILL_Q_DTYPES)
    dims = check_cache(cache, q)
    scale_q = fp8_query(q.dtype, dims[0], q_scale, variant)
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    batch = table.batch_size
    check_indptr(qo_indptr, "qo_indptr", batch, q)
    check_table(table, batch, q.device)
    kv_dtype, head_dim, head_dim_v, page_size, layout, kv_heads = dims
    max_kv = table.checked_max_seq_len(page_size, cache.num_pages)
    causal = bool(causal)
    host: list[int] | None = None
    if is_capturing():
        max_q, mixed = q.shape[0], False
    else:
        values = torch.cat((qo_indptr, table.seq_lens)).tolist()
        max_q, _, mixed = prefill_lengths(values, q.shape[0], causal, False, 0)
        host = values[:batch + 1]
    p = params(head_dim, sm_scale, logits_soft_cap, window_left, causal, bool(return_lse), max_q, max_kv, variant,
               variant_args, q.device)
    if scale_q is not None:
        p = dataclasses.replace(p, q_scale=scale_q)
    dev, cc = device_key(q)
    problem = prefill_problem(dev, cc, q.dtype, kv_dtype, head_dim, head_dim_v, page_size, layout, q.shape[1],
                              kv_heads, batch, p, mixed, cache_features(cache, graph_features(dev)))
    return problem, p, host


def ragged_call(q: Any, k: Any, v: Any, qo_indptr: Any, kv_indptr: Any, causal: bool = True, sm_scale: Any = None,
                logits_soft_cap: Any = None, window_left: Any = None, return_lse: bool = False, variant: Any = None,
                variant_args: Any = None
                ) -> tuple[RaggedPrefillProblem, AttnParams, tuple[list[int], list[int]] | None]:
    """Validate a :func:`~.attention.prefill_ragged` call: its problem, parameters and the host values of both
    indptrs (one read; None while a CUDA graph is captured)."""
    check_q(q, "q", 3)
    for name, t in (("k", k), ("v", v)):
        check_q(t, name, 3)
        if t.dtype != q.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"q.dtype ({q.dtype})")
        check_same_device(name, t, "q", q)
    if k.shape[-1] != q.shape[-1]:
        raise fail("k.shape", tuple(k.shape), f"head_dim (last dim) equal to q's ({q.shape[-1]})")
    if v.shape[:2] != k.shape[:2]:
        raise fail("v.shape", tuple(v.shape), f"(Tk, Hkv, Dv) with (Tk, Hkv) = {tuple(k.shape[:2])} as in k")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise fail("q.shape", tuple(q.shape), f"num_q_heads (dim 1) a multiple of k's num_kv_heads ({k.shape[1]})")
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=INT32)
    batch = qo_indptr.shape[0] - 1
    if batch < 0:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), "(batch + 1,) with batch >= 0")
    check_indptr(qo_indptr, "qo_indptr", batch, q)
    check_indptr(kv_indptr, "kv_indptr", batch, q)
    causal = bool(causal)
    host: tuple[list[int], list[int]] | None = None
    if is_capturing():
        max_q, max_kv, mixed = q.shape[0], k.shape[0], False
    else:
        values = torch.cat((qo_indptr, kv_indptr)).tolist()
        max_q, max_kv_host, mixed = prefill_lengths(values, q.shape[0], causal, True, k.shape[0])
        max_kv = max_kv_host or 0
        host = values[:batch + 1], values[batch + 1:]
    p = params(q.shape[2], sm_scale, logits_soft_cap, window_left, causal, bool(return_lse), max_q, max_kv, variant,
               variant_args, q.device)
    dev, cc = device_key(q)
    problem = ragged_problem(dev, cc, q.dtype, k.shape[-1], v.shape[-1], q.shape[1], k.shape[1], batch, p, mixed,
                             graph_features(dev))
    return problem, p, host


def check_latent(q_nope: Any, q_pe: Any, ckv_pages: Any, kpe_pages: Any) -> None:
    """Queries q_nope (rows, H, Dc) and q_pe (rows, H, Dr) and latent pages ckv (P, S, Dc) and kpe (P, S, Dr), all of
    one float dtype on one device with unit stride in the last dim (the MLA ops' common check)."""
    check_q(q_nope, "q_nope", 3)
    check_q(q_pe, "q_pe", 3)
    if q_pe.dtype != q_nope.dtype:
        raise fail("q_pe.dtype", q_pe.dtype, f"q_nope.dtype ({q_nope.dtype})")
    if q_pe.shape[:2] != q_nope.shape[:2]:
        raise fail("q_pe.shape", tuple(q_pe.shape), f"(rows, H, Dr) with (rows, H) = {tuple(q_nope.shape[:2])} as in "
                                                    f"q_nope")
    check_same_device("q_pe", q_pe, "q_nope", q_nope)
    for name, t, q in (("ckv_pages", ckv_pages, q_nope), ("kpe_pages", kpe_pages, q_pe)):
        check_q(t, name, 3)
        if t.dtype != q_nope.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"q_nope.dtype ({q_nope.dtype})")
        if t.shape[-1] != q.shape[-1]:
            raise fail(f"{name}.shape", tuple(t.shape), f"last dim equal to {'q_nope' if q is q_nope else 'q_pe'}'s "
                                                        f"({q.shape[-1]})")
        check_same_device(name, t, "q_nope", q_nope)
    if kpe_pages.shape[:2] != ckv_pages.shape[:2]:
        raise fail("kpe_pages.shape", tuple(kpe_pages.shape),
                   f"(P, S, Dr) with the pages and page size (P, S) of ckv_pages.shape {tuple(ckv_pages.shape)}")


def pod_call(q_prefill: Any, qo_indptr: Any, q_decode: Any, cache: Any, prefill_table: Any, decode_table: Any,
             causal: bool = True, sm_scale: Any = None, logits_soft_cap: Any = None, window_left: Any = None,
             return_lse: bool = False) -> tuple[PODProblem, AttnParams, list[int] | None]:
    """Validate a :func:`~.attention.pod` call: its problem, parameters and the host values of the prefill part's
    qo_indptr (one read of it and both tables' lengths; None while a CUDA graph is captured)."""
    check_q(q_prefill, "q_prefill", 3)
    check_q(q_decode, "q_decode", 3)
    if q_decode.dtype != q_prefill.dtype or q_decode.shape[1:] != q_prefill.shape[1:]:
        raise fail("q_decode", f"{tuple(q_decode.shape)} {q_decode.dtype}",
                   f"(B_decode, {q_prefill.shape[1]}, {q_prefill.shape[2]}) {q_prefill.dtype} as q_prefill's heads")
    check_same_device("q_decode", q_decode, "q_prefill", q_prefill)
    dims = check_cache(cache, q_prefill)
    for name, table in (("prefill_table", prefill_table), ("decode_table", decode_table)):
        if not isinstance(table, PageTable):
            raise fail(name, type(table).__name__, "a PageTable")
    batch = prefill_table.batch_size
    check_indptr(qo_indptr, "qo_indptr", batch, q_prefill, "q_prefill")
    for name, table, q in (("prefill_table", prefill_table, q_prefill), ("decode_table", decode_table, q_decode)):
        if table.block_table.device != q.device:
            raise fail(f"{name}.device", table.block_table.device, f"the device of q ({q.device})")
    if decode_table.batch_size != q_decode.shape[0]:
        raise fail("decode_table.batch_size", decode_table.batch_size, f"{q_decode.shape[0]} = the batch of q_decode")
    kv_dtype, head_dim, head_dim_v, page_size, layout, kv_heads = dims
    max_kv = max(prefill_table.checked_max_seq_len(page_size, cache.num_pages),
                 decode_table.checked_max_seq_len(page_size, cache.num_pages))
    causal = bool(causal)
    host: list[int] | None = None
    if is_capturing():
        max_q = q_prefill.shape[0]
    else:
        values = torch.cat((qo_indptr, prefill_table.seq_lens)).tolist()
        max_q, _, _ = prefill_lengths(values, q_prefill.shape[0], causal, False, 0)
        host = values[:batch + 1]
    p = params(head_dim, sm_scale, logits_soft_cap, window_left, causal, bool(return_lse), max_q, max_kv)
    dev, cc = device_key(q_prefill)
    problem = pod_problem(dev, cc, q_prefill.dtype, kv_dtype, head_dim, head_dim_v, page_size, layout,
                          q_prefill.shape[1], kv_heads, batch, q_decode.shape[0], p,
                          cache_features(cache, graph_features(dev)))
    return problem, p, host


def mla_call(q_nope: Any, q_pe: Any, ckv_pages: Any, kpe_pages: Any, table: Any, sm_scale: Any = None,
             return_lse: bool = False) -> tuple[MLADecodeProblem, AttnParams, PageTable, _Tensor, _Tensor]:
    """Validate a :func:`~.attention.mla_decode` call: its problem, parameters, and the page table and queries the
    kernel reads (for queries (B, T, H, D) of T new tokens per request: the B * T decode rows, :class:`TokenRows`)."""
    if isinstance(q_nope, torch.Tensor) and q_nope.dim() == 4:
        table = token_rows_table(q_nope, q_pe, table)
        q_nope, q_pe = q_nope.flatten(0, 1), q_pe.flatten(0, 1)
    check_latent(q_nope, q_pe, ckv_pages, kpe_pages)
    check_table(table, q_nope.shape[0], q_nope.device, "q_nope")
    page_size = ckv_pages.shape[1]
    max_kv = table.checked_max_seq_len(page_size, ckv_pages.shape[0])
    dc, dr = q_nope.shape[-1], q_pe.shape[-1]
    p = params(dc + dr, sm_scale, None, None, True, bool(return_lse), 1, max_kv)
    dev, cc = device_key(q_nope)
    problem = mla_problem(dev, cc, q_nope.dtype, dc, dr, page_size, q_nope.shape[1], q_nope.shape[0], p,
                          graph_features(dev))
    return problem, p, table, q_nope, q_pe


def mla_prefill_call(q_nope: Any, q_pe: Any, qo_indptr: Any, ckv_pages: Any, kpe_pages: Any, table: Any,
                     causal: bool = True, sm_scale: Any = None, return_lse: bool = False
                     ) -> tuple[MLAPrefillProblem, AttnParams, list[int] | None]:
    """Validate a :func:`~.attention.mla_prefill` call: its problem, parameters and the host values of qo_indptr (one
    read of qo_indptr and seq_lens; None while a CUDA graph is captured, which allows none)."""
    check_latent(q_nope, q_pe, ckv_pages, kpe_pages)
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    batch = table.batch_size
    check_indptr(qo_indptr, "qo_indptr", batch, q_nope, "q_nope")
    check_table(table, batch, q_nope.device, "q_nope")
    page_size = ckv_pages.shape[1]
    max_kv = table.checked_max_seq_len(page_size, ckv_pages.shape[0])
    causal = bool(causal)
    host: list[int] | None = None
    if is_capturing():
        max_q, mixed = q_nope.shape[0], False
    else:
        values = torch.cat((qo_indptr, table.seq_lens)).tolist()
        max_q, _, mixed = prefill_lengths(values, q_nope.shape[0], causal, False, 0)
        host = values[:batch + 1]
    dc, dr = q_nope.shape[-1], q_pe.shape[-1]
    p = params(dc + dr, sm_scale, None, None, causal, bool(return_lse), max_q, max_kv)
    dev, cc = device_key(q_nope)
    problem = mla_prefill_problem(dev, cc, q_nope.dtype, dc, dr, page_size, q_nope.shape[1], batch, p, mixed,
                                  graph_features(dev))
    return problem, p, host


def token_rows_table(q_nope: _Tensor, q_pe: Any, table: Any) -> PageTable:
    """The table of the B * T decode rows of queries (B, T, H, D): T new tokens per request."""
    if not (isinstance(q_pe, torch.Tensor) and q_pe.dim() == 4 and q_pe.shape[:3] == q_nope.shape[:3]):
        got = tuple(q_pe.shape) if isinstance(q_pe, torch.Tensor) else type(q_pe).__name__
        raise fail("q_pe.shape", got, f"(B, T, H, Dr) with (B, T, H) = {tuple(q_nope.shape[:3])} as in q_nope")
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    b, t = q_nope.shape[:2]
    if table.batch_size != b:
        raise fail("table.batch_size", table.batch_size, f"{b} = the batch of q_nope (B, T, H, Dc)")
    if t < 1:
        raise fail("q_nope.shape", tuple(q_nope.shape), "(B, T, H, Dc) with T >= 1 new tokens per request")
    return TokenRows(table, t, table.max_seq_len).table


def merge_call(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[MergeProblem]:
    """Validate a :func:`~.attention.merge_states` call; its problem."""
    check_q(out_a, "out_a", 3)
    check_q(out_b, "out_b", 3)
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
    return MergeProblem(dev, cc, out_a.dtype, out_a.shape[2], out_a.shape[1], bucket(out_a.shape[0]),
                        graph_features(dev)),
