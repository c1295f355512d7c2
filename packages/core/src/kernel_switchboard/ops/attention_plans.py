"""Attention plans: validation, kernel selection and the kernel's own plan done once per step, so that ``plan.run``
does no host synchronisation and can be captured in a CUDA graph. Public from :mod:`kernel_switchboard.ops.attention`
(``ksb.attention.plan_decode`` ...).

A plan holds the runner of the kernel it selected (:mod:`.attention_runner`: the kernel's ``plan``, or its ``run``
wrapped); ``plan.run`` checks the tensors it is given against what was planned (shapes, dtypes, devices, and that a
cache holds every page the table used at plan time), with host values only, then runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..dispatch import Selection, select
from ..errors import fail
from ..paged import FP8_DTYPES, KV_DTYPES, LAYOUTS, PagedKVCache, PageTable, TokenRows
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_info, graph_features
from .attention_problems import (
    E4M3,
    INT32,
    AttnParams,
    MLADecodeProblem,
    MLAPrefillProblem,
    PODProblem,
    RaggedPrefillProblem,
    cache_dims,
    decode_problem,
    fp8_query,
    mla_prefill_problem,
    mla_problem,
    out_dtype,
    params,
    pod_problem,
    prefill_lengths,
    prefill_problem,
    ragged_problem,
)
from .attention_runner import RunOnly, lse_base
from .attention_split import two_plans_if_faster

_Tensor = torch.Tensor


def _described(t: Any) -> str:
    """Shape, dtype and device of a tensor argument (its type's name otherwise), for an error message."""
    return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_planned(name: str, t: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """``t`` a tensor of exactly this shape, dtype and device with unit stride in its last dim, as planned."""
    if not (isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype and t.device == device
            and t.stride(-1) == 1):
        raise fail(name, _described(t), f"{shape} {dtype} on {device}, unit last stride, as planned")


def _check_buffer(name: str, t: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """A buffer given to write into: None, or a tensor of this shape, dtype and device."""
    if t is not None and not (isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype
                              and t.device == device):
        raise fail(name, _described(t), f"{shape} {dtype} on {device}")


def _check_pages(name: str, num_pages: int, pages_used: int | None) -> None:
    """A cache (or page tensor) holding every page the planned table uses."""
    if pages_used is not None and num_pages < pages_used:
        raise fail(name, f"{num_pages} pages", f"at least {pages_used} pages: the planned table uses page index "
                                               f"{pages_used - 1}")


def _with_lse_base2(p: AttnParams, lse_base2: Any) -> AttnParams:
    """``p`` with ``lse_base2`` (checked: a bool, and only with ``return_lse``)."""
    if lse_base2 is False:
        return p
    if lse_base2 is not True:
        raise fail("lse_base2", lse_base2, "True or False")
    if not p.return_lse:
        raise fail("lse_base2", lse_base2, "False unless return_lse=True (it sets the base of the returned LSE)")
    return dataclasses.replace(p, lse_base2=True)


class AttentionPlan:
    """Host work done once (validation, selection, kernel plan); :meth:`run` is capturable.

    ``table``'s tensors are read on the device at every run, so they may be updated in place
    between runs as long as no sequence exceeds ``params.max_kv_len`` and every page index stays below the cache's
    page count (which :meth:`run` checks against the pages the table used at plan time); ``qo_indptr`` (prefill)
    is fixed at plan time.
    """

    __slots__ = ("_expect", "_out_shape", "_pages_used", "_runner", "params", "problem", "selection", "table")

    def __init__(self, problem: Any, params: AttnParams, selection: Selection, table: PageTable, runner: Any,
                 q_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        self.problem, self.params, self.selection, self.table = problem, params, selection, table
        self._runner, self._out_shape = runner, out_shape
        self._pages_used = table.pages_used(problem.page_size)
        self._expect = (q_shape, problem.dtype, table.block_table.device,
                        (problem.kv_dtype, problem.head_dim, problem.head_dim_v, problem.page_size, problem.layout,
                         problem.num_kv_heads), "kv_scale_tensor" in problem.features, out_dtype(problem.dtype))

    @property
    def kernel(self) -> Any:
        return self.selection.kernel

    def run(self, q: _Tensor, cache: PagedKVCache, *, out: _Tensor | None = None,
            lse: _Tensor | None = None) -> _Tensor | tuple[_Tensor, _Tensor]:
        """out (shape of the plan) in q's dtype [, lse float32]; ``out``/``lse`` may be given to write into."""
        q_shape, dtype, device, dims, scale_tensors, out_type = self._expect
        _check_planned("q", q, q_shape, dtype, device)
        if not isinstance(cache, PagedKVCache) or cache_dims(cache) != dims:
            raise fail("cache", cache, f"(dtype, head_dim, head_dim_v, page_size, layout, kv_heads) = {dims} as planned")
        if cache.k_pages.device != device:
            raise fail("cache.device", cache.k_pages.device, f"{device} as planned")
        _check_scales(cache, scale_tensors)
        _check_pages("cache.num_pages", cache.num_pages, self._pages_used)
        _check_buffer("out", out, self._out_shape, out_type, device)
        if not self.params.return_lse:
            return self._runner.run(q, cache, out, None)[0]  # type: ignore[no-any-return]
        _check_buffer("lse", lse, self._out_shape[:2], torch.float32, device)
        return self._runner.run(q, cache, out, lse)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel={self.kernel.id}, problem={self.problem})"


class DecodePlan(AttentionPlan):
    """A planned :func:`decode`; ``run(q, cache)`` with q (B, Hq, D)."""


class PrefillPlan(AttentionPlan):
    """A planned :func:`prefill`; ``run(q, cache)`` with q (Tq, Hq, D) packed by the planned qo_indptr."""


def _check_heads(num_q_heads: int, num_kv_heads: int, head_dim: int, head_dim_v: int | None, dtype: Any,
                 fp8_q: bool = False) -> int:
    """Validate a plan's head counts, head dims and query dtype (``fp8_q``: float8_e4m3fn allowed too); returns
    head_dim_v (None = head_dim)."""
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not (isinstance(value, int) and value >= 1):
            raise fail(name, value, "a positive int")
    if num_q_heads % num_kv_heads:
        raise fail("num_q_heads", num_q_heads, f"a multiple of num_kv_heads ({num_kv_heads})")
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    if not (isinstance(head_dim_v, int) and head_dim_v >= 1):
        raise fail("head_dim_v", head_dim_v, "a positive int or None (= head_dim)")
    if dtype not in FLOAT_DTYPES and not (fp8_q and dtype == E4M3):
        raise fail("dtype", dtype, "torch.float16, torch.bfloat16 or torch.float32"
                   + (" (or torch.float8_e4m3fn with q_scale)" if fp8_q else ""))
    return head_dim_v


def _check_plan_args(table: Any, num_q_heads: int, num_kv_heads: int, head_dim: int, head_dim_v: int | None,
                     dtype: Any, kv_dtype: Any, layout: str, page_size: int, max_kv_len: int | None,
                     fp8_q: bool = False) -> tuple[tuple[Any, ...], int]:
    """Validate plan arguments; returns (cache dims (kv_dtype, head_dim, head_dim_v, page_size, layout, kv_heads),
    max_kv_len)."""
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    if not (isinstance(page_size, int) and page_size >= 1):
        raise fail("page_size", page_size, "a positive int")
    head_dim_v = _check_heads(num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype, fp8_q)
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if kv_dtype not in KV_DTYPES or (kv_dtype != dtype and kv_dtype not in FP8_DTYPES):
        raise fail("kv_dtype", kv_dtype, f"dtype ({dtype}), an fp8 dtype, or None")
    if layout not in LAYOUTS:
        raise fail("layout", layout, f"one of {LAYOUTS}")
    max_kv = _planned_max_kv(table, page_size, max_kv_len)
    return (kv_dtype, head_dim, head_dim_v, page_size, layout, num_kv_heads), max_kv


def _planned_max_kv(table: PageTable, page_size: int, max_kv_len: int | None) -> int:
    """Check the table's lengths against its pages; the longest KV length a plan must serve (default: the table's
    now), at most the table's capacity."""
    table.check_against(page_size, 2**31 - 1)
    capacity = table.max_pages * page_size
    if max_kv_len is None:
        return table.max_seq_len if table.max_seq_len is not None else capacity
    if not (isinstance(max_kv_len, int) and 0 <= max_kv_len <= capacity):
        raise fail("max_kv_len", max_kv_len, f"an int in [0, max_pages * page_size = {capacity}] or None")
    return max_kv_len


def _context(device: torch.device, capturable: bool, kv_scale_tensor: bool = False
             ) -> tuple[str, Any, frozenset[str]]:
    """(device type, compute capability, context features) of a plan on ``device``: ``cuda_graph`` for a
    capturable plan on a GPU, ``kv_scale_tensor`` for a cache whose scales are tensors."""
    dev, cc = device_info(device)
    extra = graph_features(dev)
    if capturable and dev == "cuda":
        extra = extra | {"cuda_graph"}
    if kv_scale_tensor:
        extra = extra | {"kv_scale_tensor"}
    return dev, cc, extra


def _check_scales(cache: PagedKVCache, planned: bool) -> None:
    """A cache whose scales are tensors exactly when the plan was made for such a cache."""
    if cache.scale_tensors != planned:
        raise fail("cache.k_scale/v_scale", "tensors" if cache.scale_tensors else "floats",
                   f"{'tensors' if planned else 'floats'}, as planned (kv_scale_tensor={planned})")


def plan_decode(table: PageTable, *, num_q_heads: int, num_kv_heads: int, head_dim: int, head_dim_v: int | None = None,
                dtype: torch.dtype, kv_dtype: torch.dtype | None = None, layout: str = "NHD", page_size: int,
                sm_scale: float | None = None, logits_soft_cap: float | None = None, window_left: int | None = None,
                return_lse: bool = False, max_kv_len: int | None = None, capturable: bool = True,
                variant: Any = None, variant_args: Any = None, kv_scale_tensor: bool = False,
                lse_base2: bool = False, backend: BackendArg = None) -> DecodePlan:
    """Plan :func:`decode` for this table: validation, kernel selection and the kernel's own plan,
    once. ``plan.run(q, cache)`` then does no host synchronisation (CUDA-graph capturable; on a
    GPU the selection requires the ``cuda_graph`` feature unless ``capturable=False``).

    ``max_kv_len`` bounds the sequence lengths the plan will see (default: the table's now).
    ``variant`` / ``variant_args`` as in :func:`decode`; tensors in ``variant_args`` are read at every
    run, so they may be updated in place between runs. ``kv_scale_tensor``: the caches will carry their fp8 scales
    as tensors (read at every run, so a calibration may update them in place). ``lse_base2`` (with ``return_lse``):
    the LSE in base 2, ``log2(sum(2 ** (score * log2(e))))`` = the natural LSE x log2(e), as FlashInfer returns it
    (kernels that write it so save the conversion launch).
    """
    dims, max_kv = _check_plan_args(table, num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype, kv_dtype, layout,
                                    page_size, max_kv_len)
    device = table.block_table.device
    p = _with_lse_base2(params(head_dim, sm_scale, logits_soft_cap, window_left, True, bool(return_lse), 1, max_kv,
                               variant, variant_args, device), lse_base2)
    dev, cc, extra = _context(device, capturable, kv_scale_tensor)
    kv_dtype_, _, head_dim_v_, _, _, _ = dims
    b = table.batch_size
    problem = decode_problem(dev, cc, dtype, kv_dtype_, head_dim, head_dim_v_, page_size, layout, num_q_heads,
                             num_kv_heads, b, p, extra)
    selection = select("attention.decode", problem, backend)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, table, p)
    else:
        runner = RunOnly(lambda q, cache: kernel.run(q, cache, table, p))
    return DecodePlan(problem, p, selection, table, lse_base(runner, kernel, p), (b, num_q_heads, head_dim),
                      (b, num_q_heads, head_dim_v_))


def plan_prefill(table: PageTable, qo_indptr: _Tensor, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 head_dim_v: int | None = None, dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
                 layout: str = "NHD", page_size: int, causal: bool = True, sm_scale: float | None = None,
                 logits_soft_cap: float | None = None, window_left: int | None = None, return_lse: bool = False,
                 max_kv_len: int | None = None, capturable: bool = True, variant: Any = None, variant_args: Any = None,
                 kv_scale_tensor: bool = False, q_scale: float | None = None, lse_base2: bool = False,
                 backend: BackendArg = None) -> PrefillPlan:
    """Plan :func:`prefill` for this table and ``qo_indptr`` (B+1,) int32 (read back once, here).
    ``plan.run(q, cache)`` with q (qo_indptr[-1], Hq, D) does no host synchronisation. ``kv_scale_tensor`` as in
    :func:`plan_decode`; ``dtype=torch.float8_e4m3fn`` with ``q_scale``: fp8 queries (out in bfloat16), as in
    :func:`prefill`. ``lse_base2`` as in :func:`plan_decode`."""
    dims, max_kv = _check_plan_args(table, num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype, kv_dtype, layout,
                                    page_size, max_kv_len, fp8_q=True)
    scale_q = fp8_query(dtype, dims[0], q_scale, variant)
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=INT32)
    if qo_indptr.shape[0] != table.batch_size + 1:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), f"({table.batch_size + 1},) = batch + 1")
    check_same_device("qo_indptr", qo_indptr, "table.block_table", table.block_table)
    if not qo_indptr.is_contiguous():
        raise fail("qo_indptr", "non-contiguous", "a contiguous tensor")
    b = table.batch_size
    values = torch.cat((qo_indptr, table.seq_lens)).tolist()  # the one host read of the plan
    total = values[b]
    max_q, _, mixed = prefill_lengths(values, total, bool(causal), False, 0)
    device = table.block_table.device
    p = _with_lse_base2(params(head_dim, sm_scale, logits_soft_cap, window_left, bool(causal), bool(return_lse),
                               max_q, max_kv, variant, variant_args, device), lse_base2)
    if scale_q is not None:
        p = dataclasses.replace(p, q_scale=scale_q)
    dev, cc, extra = _context(device, capturable, kv_scale_tensor)
    kv_dtype_, _, head_dim_v_, _, _, _ = dims
    problem = prefill_problem(dev, cc, dtype, kv_dtype_, head_dim, head_dim_v_, page_size, layout, num_q_heads,
                              num_kv_heads, b, p, mixed, extra)
    selection = select("attention.prefill", problem, backend)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, table, p, qo_indptr=qo_indptr, host_qo_indptr=values[:b + 1])
    else:
        runner = RunOnly(lambda q, cache: kernel.run(q, qo_indptr, cache, table, p))
    return PrefillPlan(problem, p, selection, table, lse_base(runner, kernel, p), (total, num_q_heads, head_dim),
                       (total, num_q_heads, head_dim_v_))


class RaggedPrefillPlan:
    """A planned :func:`prefill_ragged`: ``run(q, k, v)`` with q (Tq, Hq, D), k (Tk, Hkv, D) and
    v (Tk, Hkv, Dv) packed by the planned indptrs; no host synchronisation (capturable)."""

    __slots__ = ("_expect", "_runner", "indptrs", "params", "problem", "selection")

    def __init__(self, problem: RaggedPrefillProblem, params: AttnParams, selection: Selection,
                 indptrs: tuple[_Tensor, _Tensor], expect: tuple[Any, ...], runner: Any) -> None:
        self.problem, self.params, self.selection, self.indptrs, self._expect = problem, params, selection, indptrs, expect
        self._runner = runner

    @property
    def kernel(self) -> Any:
        return self.selection.kernel

    def run(self, q: _Tensor, k: _Tensor, v: _Tensor, *, out: _Tensor | None = None,
            lse: _Tensor | None = None) -> _Tensor | tuple[_Tensor, _Tensor]:
        """out (Tq, Hq, Dv) in q's dtype [, lse (Tq, Hq) float32]; ``out``/``lse`` may be given to write into."""
        q_shape, k_shape, v_shape, device = self._expect
        dtype = self.problem.dtype
        for name, t, shape in (("q", q, q_shape), ("k", k, k_shape), ("v", v, v_shape)):
            _check_planned(name, t, shape, dtype, device)
        out_shape = (q_shape[0], q_shape[1], v_shape[2])
        _check_buffer("out", out, out_shape, dtype, device)
        if not self.params.return_lse:
            return self._runner.run(q, k, v, out, None)[0]  # type: ignore[no-any-return]
        _check_buffer("lse", lse, out_shape[:2], torch.float32, device)
        return self._runner.run(q, k, v, out, lse)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RaggedPrefillPlan(kernel={self.kernel.id}, problem={self.problem})"


def plan_prefill_ragged(qo_indptr: _Tensor, kv_indptr: _Tensor, *, num_q_heads: int, num_kv_heads: int,
                        head_dim: int, head_dim_v: int | None = None, dtype: torch.dtype, causal: bool = True,
                        sm_scale: float | None = None, logits_soft_cap: float | None = None,
                        window_left: int | None = None, return_lse: bool = False, capturable: bool = True,
                        variant: Any = None, variant_args: Any = None, lse_base2: bool = False,
                        backend: BackendArg = None) -> RaggedPrefillPlan:
    """Plan :func:`prefill_ragged` for these (B+1,) int32 indptrs (read back once, here): validation,
    selection and the lengths the kernels need are settled once per step, so ``plan.run(q, k, v)``
    (shared by every layer) does no host synchronisation and can be captured in a CUDA graph. ``lse_base2`` as in
    :func:`plan_decode`."""
    head_dim_v = _check_heads(num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype)
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=INT32)
    batch = qo_indptr.shape[0] - 1
    if batch < 0:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), "(batch + 1,) with batch >= 0")
    check_tensor(kv_indptr, "kv_indptr", dims=1, dtypes=INT32)
    if kv_indptr.shape != qo_indptr.shape:
        raise fail("kv_indptr.shape", tuple(kv_indptr.shape), f"{tuple(qo_indptr.shape)} as qo_indptr")
    check_same_device("kv_indptr", kv_indptr, "qo_indptr", qo_indptr)
    for name, ind in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        if not ind.is_contiguous():
            raise fail(name, "non-contiguous", "a contiguous tensor")
    values = torch.cat((qo_indptr, kv_indptr)).tolist()  # the one host read of the plan
    total_q, total_kv = values[batch], values[-1]
    max_q, max_kv, mixed = prefill_lengths(values, total_q, bool(causal), True, total_kv)
    device = qo_indptr.device
    p = _with_lse_base2(params(head_dim, sm_scale, logits_soft_cap, window_left, bool(causal), bool(return_lse),
                               max_q, max_kv or 0, variant, variant_args, device), lse_base2)
    dev, cc, extra = _context(device, capturable)
    problem = ragged_problem(dev, cc, dtype, head_dim, head_dim_v, num_q_heads, num_kv_heads, batch, p, mixed, extra)
    selection = select("attention.prefill_ragged", problem, backend)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, None, p, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                             host_indptrs=(values[:batch + 1], values[batch + 1:]))
    else:
        runner = RunOnly(lambda q, k, v: kernel.run(q, k, v, qo_indptr, kv_indptr, p))
    expect = ((total_q, num_q_heads, head_dim), (total_kv, num_kv_heads, head_dim),
              (total_kv, num_kv_heads, head_dim_v), device)
    return RaggedPrefillPlan(problem, p, selection, (qo_indptr, kv_indptr), expect, lse_base(runner, kernel, p))


class MLADecodePlan:
    """A planned :func:`mla_decode`: ``run(q_nope, q_pe, ckv_pages, kpe_pages)`` with q_nope (B, H, Dc), q_pe
    (B, H, Dr) — (B, T, H, Dc) and (B, T, H, Dr) when planned with ``q_len=T`` new tokens per request —,
    ckv_pages (P, S, Dc), kpe_pages (P, S, Dr); one plan per step serves every layer's pages. No host
    synchronisation (CUDA-graph capturable); ``table``'s tensors are read on the device at every run, so they may
    be updated in place while no sequence exceeds ``params.max_kv_len`` and every page index is below P (which
    :meth:`run` checks against the pages the table used at plan time)."""

    __slots__ = ("_expect", "_pages_used", "_rows", "_runner", "params", "problem", "selection", "table")

    def __init__(self, problem: MLADecodeProblem, params: AttnParams, selection: Selection, table: PageTable,
                 runner: Any, rows: TokenRows | None) -> None:
        self.problem, self.params, self.selection, self.table, self._runner = problem, params, selection, table, runner
        self._rows = rows
        self._pages_used = table.pages_used(problem.page_size)
        lead = (table.batch_size,) if rows is None else (table.batch_size, rows.tokens)
        self._expect = _latent_expect(table, lead, problem)

    @property
    def kernel(self) -> Any:
        return self.selection.kernel

    def run(self, q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, *,
            out: _Tensor | None = None, lse: _Tensor | None = None) -> _Tensor | tuple[_Tensor, _Tensor]:
        """out (B, H, Dc) in q's dtype [, lse (B, H) float32] — (B, T, H, Dc) [, (B, T, H)] with ``q_len=T`` —;
        ``out``/``lse`` of those shapes may be given to write into."""
        qn_shape, _, dtype, device, _, _ = self._expect
        _check_latent_planned(q_nope, q_pe, ckv_pages, kpe_pages, self._expect, self._pages_used)
        _check_buffer("out", out, qn_shape, dtype, device)
        want_lse = self.params.return_lse
        if want_lse:
            _check_buffer("lse", lse, qn_shape[:-1], torch.float32, device)
        else:
            lse = None
        if self._rows is None:
            res = self._runner.run(q_nope, q_pe, ckv_pages, kpe_pages, out, lse)
        else:  # T new tokens per request: B * T decode rows over the rows' table, rewritten from ``table`` here
            self._rows.refresh()
            rows = qn_shape[0] * qn_shape[1]
            res = self._runner.run(_rows_view(q_nope, "q_nope", rows), _rows_view(q_pe, "q_pe", rows), ckv_pages,
                                   kpe_pages, None if out is None else _rows_view(out, "out", rows),
                                   None if lse is None else _rows_view(lse, "lse", rows))
            res = (res[0].view(qn_shape) if out is None else out,
                   lse if lse is not None or res[1] is None else res[1].view(qn_shape[:-1]))
        return res if want_lse else res[0]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"MLADecodePlan(kernel={self.kernel.id}, problem={self.problem})"


def _latent_expect(table: PageTable, q_lead: tuple[int, ...], problem: Any) -> tuple[Any, ...]:
    """What an MLA plan's run checks: (q_nope shape, q_pe shape, dtype, device, ckv page dims, kpe page dims)."""
    h, dc, dr = problem.num_q_heads, problem.head_dim, problem.head_dim_pe
    return ((*q_lead, h, dc), (*q_lead, h, dr), problem.dtype, table.block_table.device, (problem.page_size, dc),
            (problem.page_size, dr))


def _check_latent_planned(q_nope: Any, q_pe: Any, ckv_pages: Any, kpe_pages: Any, expect: tuple[Any, ...],
                          pages_used: int | None) -> None:
    """An MLA plan's inputs against :func:`_latent_expect`, and pages holding every page the planned table uses."""
    qn_shape, qp_shape, dtype, device, ckv_dims, kpe_dims = expect
    _check_planned("q_nope", q_nope, qn_shape, dtype, device)
    _check_planned("q_pe", q_pe, qp_shape, dtype, device)
    for name, t, dims in (("ckv_pages", ckv_pages, ckv_dims), ("kpe_pages", kpe_pages, kpe_dims)):
        if not (isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[1:] == dims and t.dtype == dtype
                and t.device == device and t.stride(-1) == 1 and t.shape[0] == ckv_pages.shape[0]):
            raise fail(name, _described(t), f"(P, {dims[0]}, {dims[1]}) {dtype} on {device}, unit last stride, "
                                            f"P as in ckv_pages, as planned")
    _check_pages("ckv_pages.shape[0]", ckv_pages.shape[0], pages_used)


def _rows_view(t: _Tensor, name: str, rows: int) -> _Tensor:
    """``t`` (B, T, ...) viewed as (B * T, ...) decode rows, without a copy."""
    try:
        return t.view(rows, *t.shape[2:])
    except RuntimeError:
        raise fail(name, f"strides {t.stride()}", "(B, T, ...) whose B and T dims merge without a copy") from None


def plan_mla_decode(table: PageTable, *, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, dtype: torch.dtype,
                    page_size: int, sm_scale: float | None = None, return_lse: bool = False, q_len: int = 1,
                    max_kv_len: int | None = None, capturable: bool = True,
                    backend: BackendArg = None) -> MLADecodePlan:
    """Plan :func:`mla_decode` for this table: validation, kernel selection and the kernel's own plan (its split
    schedule and workspace), once per step; every layer then calls ``plan.run`` with its own pages. ``q_len``: new
    tokens per request (multi-token prediction, speculative verification; queries (B, q_len, H, D) as in
    :func:`mla_decode`). ``max_kv_len`` bounds the sequence lengths the plan will see (default: the table's now);
    on a GPU the selection requires the ``cuda_graph`` feature unless ``capturable=False``."""
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    for name, value in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv), ("head_dim_kpe", head_dim_kpe),
                        ("page_size", page_size), ("q_len", q_len)):
        if not (isinstance(value, int) and value >= 1):
            raise fail(name, value, "a positive int")
    if dtype not in FLOAT_DTYPES:
        raise fail("dtype", dtype, "torch.float16, torch.bfloat16 or torch.float32")
    max_kv_len = _planned_max_kv(table, page_size, max_kv_len)
    p = params(head_dim_ckv + head_dim_kpe, sm_scale, None, None, True, bool(return_lse), 1, max_kv_len)
    dev, cc, extra = _context(table.block_table.device, capturable)
    rows = TokenRows(table, q_len, max_kv_len) if q_len > 1 else None
    kernel_table = table if rows is None else rows.table
    problem = mla_problem(dev, cc, dtype, head_dim_ckv, head_dim_kpe, page_size, num_heads, kernel_table.batch_size, p,
                          extra)
    selection = select("attention.mla_decode", problem, backend)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, kernel_table, p)
    else:
        runner = RunOnly(lambda qn, qp, ckv, kpe: kernel.run(qn, qp, ckv, kpe, kernel_table, p))
    return MLADecodePlan(problem, p, selection, table, runner, rows)


class MLAPrefillPlan:
    """A planned :func:`mla_prefill`: ``run(q_nope, q_pe, ckv_pages, kpe_pages)`` with q_nope (Tq, H, Dc) and q_pe
    (Tq, H, Dr) packed by the planned qo_indptr, ckv_pages (P, S, Dc), kpe_pages (P, S, Dr); one plan per step serves
    every layer's pages. No host synchronisation (CUDA-graph capturable); ``table``'s tensors are read on the device
    at every run, so they may be updated in place while no sequence exceeds ``params.max_kv_len`` and every page
    index is below P (which :meth:`run` checks against the pages the table used at plan time); ``qo_indptr`` is
    fixed at plan time."""

    __slots__ = ("_expect", "_pages_used", "_runner", "params", "problem", "qo_indptr", "selection", "table")

    def __init__(self, problem: MLAPrefillProblem, params: AttnParams, selection: Selection, table: PageTable,
                 qo_indptr: _Tensor, total_q: int, runner: Any) -> None:
        self.problem, self.params, self.selection, self.table, self._runner = problem, params, selection, table, runner
        self.qo_indptr = qo_indptr
        self._pages_used = table.pages_used(problem.page_size)
        self._expect = _latent_expect(table, (total_q,), problem)

    @property
    def kernel(self) -> Any:
        return self.selection.kernel

    def run(self, q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, *,
            out: _Tensor | None = None, lse: _Tensor | None = None) -> _Tensor | tuple[_Tensor, _Tensor]:
        """out (Tq, H, Dc) in q's dtype [, lse (Tq, H) float32]; ``out``/``lse`` may be given to write into."""
        qn_shape, _, dtype, device, _, _ = self._expect
        _check_latent_planned(q_nope, q_pe, ckv_pages, kpe_pages, self._expect, self._pages_used)
        _check_buffer("out", out, qn_shape, dtype, device)
        if not self.params.return_lse:
            return self._runner.run(q_nope, q_pe, ckv_pages, kpe_pages, out, None)[0]  # type: ignore[no-any-return]
        _check_buffer("lse", lse, qn_shape[:2], torch.float32, device)
        return self._runner.run(q_nope, q_pe, ckv_pages, kpe_pages, out, lse)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"MLAPrefillPlan(kernel={self.kernel.id}, problem={self.problem})"


def plan_mla_prefill(table: PageTable, qo_indptr: _Tensor, *, num_heads: int, head_dim_ckv: int, head_dim_kpe: int,
                     dtype: torch.dtype, page_size: int, causal: bool = True, sm_scale: float | None = None,
                     return_lse: bool = False, max_kv_len: int | None = None, capturable: bool = True,
                     backend: BackendArg = None) -> MLAPrefillPlan:
    """Plan :func:`mla_prefill` for this table and ``qo_indptr`` (B+1,) int32 (read back once, here): validation,
    kernel selection and the kernel's own plan, once per step; every layer then calls ``plan.run`` with its own
    pages. ``max_kv_len`` bounds the sequence lengths the plan will see (default: the table's now); on a GPU the
    selection requires the ``cuda_graph`` feature unless ``capturable=False``."""
    if not isinstance(table, PageTable):
        raise fail("table", type(table).__name__, "a PageTable")
    for name, value in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv), ("head_dim_kpe", head_dim_kpe),
                        ("page_size", page_size)):
        if not (isinstance(value, int) and value >= 1):
            raise fail(name, value, "a positive int")
    if dtype not in FLOAT_DTYPES:
        raise fail("dtype", dtype, "torch.float16, torch.bfloat16 or torch.float32")
    b = table.batch_size
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=INT32)
    if qo_indptr.shape[0] != b + 1:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), f"({b + 1},) = batch + 1")
    check_same_device("qo_indptr", qo_indptr, "table.block_table", table.block_table)
    if not qo_indptr.is_contiguous():
        raise fail("qo_indptr", "non-contiguous", "a contiguous tensor")
    max_kv = _planned_max_kv(table, page_size, max_kv_len)
    values = torch.cat((qo_indptr, table.seq_lens)).tolist()  # the one host read of the plan
    total = values[b]
    max_q, _, mixed = prefill_lengths(values, total, bool(causal), False, 0)
    p = params(head_dim_ckv + head_dim_kpe, sm_scale, None, None, bool(causal), bool(return_lse), max_q, max_kv)
    dev, cc, extra = _context(table.block_table.device, capturable)
    problem = mla_prefill_problem(dev, cc, dtype, head_dim_ckv, head_dim_kpe, page_size, num_heads, b, p, mixed, extra)
    selection = select("attention.mla_prefill", problem, backend)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, table, p, qo_indptr=qo_indptr, host_qo_indptr=values[:b + 1])
    else:
        runner = RunOnly(lambda qn, qp, ckv, kpe: kernel.run(qn, qp, qo_indptr, ckv, kpe, table, p))
    return MLAPrefillPlan(problem, p, selection, table, qo_indptr, total, runner)


class PODPlan:
    """A planned :func:`pod`: ``run(q_prefill, q_decode, cache)`` with q_prefill (Tq, Hq, D) packed by the planned
    qo_indptr and q_decode (Bd, Hq, D); returns (out_prefill, out_decode) [, lse_prefill, lse_decode]. No host
    synchronisation (CUDA-graph capturable); both tables' tensors are read on the device at every run (in-place
    updates are seen while no sequence exceeds ``params.max_kv_len`` and every page index stays below the cache's page
    count, which :meth:`run` checks against the pages the tables used at plan time); ``qo_indptr`` is fixed."""

    __slots__ = ("_expect", "_pages_used", "_runner", "decode_table", "params", "prefill_table", "problem", "qo_indptr",
                 "selection")

    def __init__(self, problem: PODProblem, params: AttnParams, selection: Selection, prefill_table: PageTable,
                 decode_table: PageTable, qo_indptr: _Tensor, total_q: int, runner: Any) -> None:
        self.problem, self.params, self.selection, self._runner = problem, params, selection, runner
        self.prefill_table, self.decode_table, self.qo_indptr = prefill_table, decode_table, qo_indptr
        used = [t.pages_used(problem.page_size) for t in (prefill_table, decode_table)]
        self._pages_used = None if None in used else max(u for u in used if u is not None)
        h, d = problem.num_q_heads, problem.head_dim
        self._expect = ((total_q, h, d), (decode_table.batch_size, h, d), problem.dtype, prefill_table.block_table.device,
                        (problem.kv_dtype, d, problem.head_dim_v, problem.page_size, problem.layout,
                         problem.num_kv_heads))

    @property
    def kernel(self) -> Any:
        return self.selection.kernel

    def run(self, q_prefill: _Tensor, q_decode: _Tensor, cache: PagedKVCache, *, out_prefill: _Tensor | None = None,
            out_decode: _Tensor | None = None, lse_prefill: _Tensor | None = None,
            lse_decode: _Tensor | None = None) -> tuple[_Tensor, ...]:
        """(out_prefill, out_decode) in q's dtype [, lse_prefill, lse_decode float32]; the buffers may be given to
        write into."""
        qp_shape, qd_shape, dtype, device, dims = self._expect
        _check_planned("q_prefill", q_prefill, qp_shape, dtype, device)
        _check_planned("q_decode", q_decode, qd_shape, dtype, device)
        if not isinstance(cache, PagedKVCache) or cache_dims(cache) != dims:
            raise fail("cache", cache, f"(dtype, head_dim, head_dim_v, page_size, layout, kv_heads) = {dims} as planned")
        if cache.k_pages.device != device:
            raise fail("cache.device", cache.k_pages.device, f"{device} as planned")
        _check_scales(cache, "kv_scale_tensor" in self.problem.features)
        _check_pages("cache.num_pages", cache.num_pages, self._pages_used)
        dv = dims[2]
        _check_buffer("out_prefill", out_prefill, (*qp_shape[:2], dv), dtype, device)
        _check_buffer("out_decode", out_decode, (*qd_shape[:2], dv), dtype, device)
        if not self.params.return_lse:
            out_p, out_d, _, _ = self._runner.run(q_prefill, q_decode, cache, out_prefill, out_decode, None, None)
            return out_p, out_d
        _check_buffer("lse_prefill", lse_prefill, qp_shape[:2], torch.float32, device)
        _check_buffer("lse_decode", lse_decode, qd_shape[:2], torch.float32, device)
        return tuple(self._runner.run(q_prefill, q_decode, cache, out_prefill, out_decode, lse_prefill, lse_decode))

    def __repr__(self) -> str:
        return f"PODPlan(kernel={self.kernel.id}, problem={self.problem})"


def plan_pod(prefill_table: PageTable, qo_indptr: _Tensor, decode_table: PageTable, *, num_q_heads: int,
             num_kv_heads: int, head_dim: int, head_dim_v: int | None = None, dtype: torch.dtype,
             kv_dtype: torch.dtype | None = None, layout: str = "NHD", page_size: int, causal: bool = True,
             sm_scale: float | None = None, logits_soft_cap: float | None = None, window_left: int | None = None,
             return_lse: bool = False, max_kv_len: int | None = None, capturable: bool = True,
             kv_scale_tensor: bool = False, backend: BackendArg = None) -> PODPlan:
    """Plan :func:`pod` (prefill requests of ``prefill_table`` packed by ``qo_indptr`` (Bp+1,) int32, read back once
    here, and the one-token decode requests of ``decode_table``): validation, kernel selection and the kernel's own
    plan (its work split), once per step; ``plan.run(q_prefill, q_decode, cache)`` per layer does no host
    synchronisation. ``max_kv_len`` bounds both parts' sequence lengths (default: the tables' now); on a GPU the
    selection requires the ``cuda_graph`` feature unless ``capturable=False``; ``kv_scale_tensor`` as in
    :func:`plan_decode`. Unless ``backend`` names one, the plan runs as a :func:`plan_prefill` and a
    :func:`plan_decode` where their cost estimates add up to less than the POD kernel's
    (:mod:`~kernel_switchboard.ops.attention_split`); ``plan.selection`` says which, with both estimates."""
    dims, max_kv = _check_plan_args(prefill_table, num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype, kv_dtype,
                                    layout, page_size, max_kv_len)
    if not isinstance(decode_table, PageTable):
        raise fail("decode_table", type(decode_table).__name__, "a PageTable")
    check_same_device("decode_table.block_table", decode_table.block_table, "prefill_table.block_table",
                      prefill_table.block_table)
    max_kv = max(max_kv, _planned_max_kv(decode_table, page_size, max_kv_len))
    check_tensor(qo_indptr, "qo_indptr", dims=1, dtypes=INT32)
    b = prefill_table.batch_size
    if qo_indptr.shape[0] != b + 1:
        raise fail("qo_indptr.shape", tuple(qo_indptr.shape), f"({b + 1},) = prefill batch + 1")
    check_same_device("qo_indptr", qo_indptr, "prefill_table.block_table", prefill_table.block_table)
    if not qo_indptr.is_contiguous():
        raise fail("qo_indptr", "non-contiguous", "a contiguous tensor")
    values = torch.cat((qo_indptr, prefill_table.seq_lens)).tolist()  # the one host read of the plan
    total = values[b]
    max_q, _, _ = prefill_lengths(values, total, bool(causal), False, 0)
    device = prefill_table.block_table.device
    p = params(head_dim, sm_scale, logits_soft_cap, window_left, bool(causal), bool(return_lse), max_q, max_kv)
    dev, cc, extra = _context(device, capturable, kv_scale_tensor)
    kv_dtype_, _, head_dim_v_, _, _, _ = dims
    problem = pod_problem(dev, cc, dtype, kv_dtype_, head_dim, head_dim_v_, page_size, layout, num_q_heads,
                          num_kv_heads, b, decode_table.batch_size, p, extra)
    selection = select("attention.pod", problem, backend)
    if backend is None:
        common: dict[str, Any] = dict(
            num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype,
            kv_dtype=kv_dtype, layout=layout, page_size=page_size, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
            window_left=window_left, return_lse=return_lse, max_kv_len=max_kv_len, capturable=capturable,
            kv_scale_tensor=kv_scale_tensor)
        split = two_plans_if_faster(selection, lambda: plan_prefill(prefill_table, qo_indptr, causal=causal, **common),
                                    lambda: plan_decode(decode_table, **common))
        if split is not None:
            selection, runner = split
            return PODPlan(problem, p, selection, prefill_table, decode_table, qo_indptr, total, runner)
    kernel = selection.kernel
    if kernel.plan is not None:
        runner = kernel.plan(problem, prefill_table, p, qo_indptr=qo_indptr, host_qo_indptr=values[:b + 1],
                             decode_table=decode_table)
    else:
        runner = RunOnly(lambda qp, qd, cache: kernel.run(qp, qo_indptr, qd, cache, prefill_table, decode_table, p),
                         buffers=4)
    return PODPlan(problem, p, selection, prefill_table, decode_table, qo_indptr, total, runner)
