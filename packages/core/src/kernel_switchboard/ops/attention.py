"""Attention ops: ``attention.decode``, ``attention.prefill``, ``attention.prefill_ragged``,
``attention.mla_decode``, ``attention.mla_prefill``, ``attention.pod`` (prefill and decode requests in one launch),
``attention.merge_states``, ``attention.dense`` (dense tensors with a bias or mask, :mod:`.attention_dense`); the
:func:`cascade` helper; and plans (:func:`plan_decode`, :func:`plan_prefill`, :func:`plan_prefill_ragged`,
:func:`plan_mla_decode`, :func:`plan_mla_prefill`, :func:`plan_pod`, defined in :mod:`.attention_plans`) for repeated
steps and CUDA graphs.

Kernel ``run`` signatures (canonical, validated arguments; see docs/ops.md), each returning
``(out, lse_or_None)``:

- ``attention.decode``: ``run(q, cache, table, p)``; q (B, Hq, D) -> out (B, Hq, Dv), lse (B, Hq).
- ``attention.prefill``: ``run(q, qo_indptr, cache, table, p)``; q (Tq, Hq, D), qo_indptr (B+1,) int32.
- ``attention.prefill_ragged``: ``run(q, k, v, qo_indptr, kv_indptr, p)``; k (Tk, Hkv, D), v (Tk, Hkv, Dv).
- ``attention.mla_decode``: ``run(q_nope, q_pe, ckv_pages, kpe_pages, table, p)``.
- ``attention.mla_prefill``: ``run(q_nope, q_pe, qo_indptr, ckv_pages, kpe_pages, table, p)``; q_nope (Tq, H, Dc).
- ``attention.pod``: ``run(q_prefill, qo_indptr, q_decode, cache, prefill_table, decode_table, p)`` ->
  ``(out_prefill, out_decode, lse_prefill, lse_decode)``.
- ``attention.merge_states``: ``run(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

The paged, ragged and MLA ops also take a kernel's ``plan`` (the backend contract, :mod:`.attention_runner`):
``plan(problem, table, p, **static)`` returns a runner whose ``run(..., out, lse)`` writes into the buffers it is
given (or returns new tensors for None) with no host synchronisation. A kernel needs one of the two: the core wraps a
run-only kernel. An eager call is the kernel's plan and run (a run-only kernel's run); a planned call keeps the runner.

One validation: every call is prepared by :mod:`.attention_problems` (``decode_call`` ...), eagerly, inside its
custom op under torch.compile (the same public function runs there), and for ``ksb.explain`` (the op's spec).

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

from typing import Any

import torch

from ..dispatch import select
from ..errors import fail
from ..paged import PagedKVCache, PageTable
from ..spec import Arg, OpSpec, define, table_of
from ._common import BackendArg, check_tensor
from .attention_problems import (
    AttnParams,
    DecodeProblem,
    MergeProblem,
    MLADecodeProblem,
    MLAPrefillProblem,
    PODProblem,
    PrefillProblem,
    RaggedPrefillProblem,
    decode_call,
    merge_call,
    mla_call,
    mla_prefill_call,
    out_dtype,
    pod_call,
    prefill_call,
    ragged_call,
    token_rows_table,
)
from .attention_split import two_plans_if_faster

_Tensor = torch.Tensor


def _result(out: _Tensor, lse: _Tensor | None, return_lse: bool) -> _Tensor | tuple[_Tensor, _Tensor]:
    """``out``, or ``(out, lse)`` when the caller asked for the LSE."""
    if not return_lse:
        return out
    if lse is None:
        raise RuntimeError("the selected attention kernel returned no lse although return_lse=True was requested")
    return out, lse


def _eager_only(fn: Any) -> Any:
    """``fn`` run outside torch.compile tracing (variant calls are not custom ops: a graph break)."""
    return torch.compiler.disable(fn)


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
    if torch.compiler.is_compiling():
        if variant is None and variant_args is None:
            out, lse = DECODE.compiled(q, cache, table, sm_scale, logits_soft_cap, window_left, return_lse, backend)
            return (out, lse) if return_lse else out
        return _eager_only(decode)(q, cache, table, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,  # type: ignore[no-any-return]
                                   window_left=window_left, return_lse=return_lse, variant=variant,
                                   variant_args=variant_args, backend=backend)
    problem, p = decode_call(q, cache, table, sm_scale, logits_soft_cap, window_left, return_lse, variant, variant_args)
    kernel = select("attention.decode", problem, backend).kernel
    if kernel.plan is None:
        out, lse = kernel.run(q, cache, table, p)
    else:
        out, lse = kernel.plan(problem, table, p).run(q, cache, None, None)
    if not return_lse:
        return out  # type: ignore[no-any-return]
    return _result(out, lse, True)


# -- prefill (paged) ---------------------------------------------------------------------------------
def prefill(q: _Tensor, qo_indptr: _Tensor, cache: PagedKVCache, table: PageTable, *, causal: bool = True,
            sm_scale: float | None = None, logits_soft_cap: float | None = None, window_left: int | None = None,
            return_lse: bool = False, variant: Any = None, variant_args: Any = None, q_scale: float | None = None,
            backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Paged prefill, append (qo_len < kv_len) and mixed prefill/decode batches.

    q (Tq, Hq, D) packed: request b owns rows ``qo_indptr[b]:qo_indptr[b+1]``; qo_indptr (B+1,)
    int32; the cache already holds every request's new tokens (``table.seq_lens`` counts them).
    Returns out (Tq, Hq, Dv) in q's dtype, and lse (Tq, Hq) float32 when ``return_lse``.
    ``variant`` / ``variant_args``: a custom attention variant, as in :func:`decode`.

    fp8 attention (FlashAttention-3's): q in float8_e4m3fn with ``q_scale`` (q = stored * q_scale) over a
    float8_e4m3fn cache; q·k then runs on fp8 tensor cores (feature ``fp8_q``) and out is bfloat16.
    """
    if torch.compiler.is_compiling():
        if variant is None and variant_args is None:
            out, lse = PREFILL.compiled(q, qo_indptr, cache, table, causal, q_scale, sm_scale, logits_soft_cap,
                                        window_left, return_lse, backend)
            return (out, lse) if return_lse else out
        return _eager_only(prefill)(q, qo_indptr, cache, table, causal=causal, sm_scale=sm_scale,  # type: ignore[no-any-return]
                                    logits_soft_cap=logits_soft_cap, window_left=window_left, return_lse=return_lse,
                                    variant=variant, variant_args=variant_args, q_scale=q_scale, backend=backend)
    problem, p, host = prefill_call(q, qo_indptr, cache, table, causal, sm_scale, logits_soft_cap, window_left,
                                    return_lse, variant, variant_args, q_scale)
    kernel = select("attention.prefill", problem, backend).kernel
    if kernel.plan is None:
        out, lse = kernel.run(q, qo_indptr, cache, table, p)
    else:
        runner = kernel.plan(problem, table, p, qo_indptr=qo_indptr, host_qo_indptr=host)
        out, lse = runner.run(q, cache, None, None)
    return _result(out, lse, return_lse)


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
    if torch.compiler.is_compiling():
        if variant is None and variant_args is None:
            out, lse = RAGGED.compiled(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left,
                                       return_lse, backend)
            return (out, lse) if return_lse else out
        return _eager_only(prefill_ragged)(q, k, v, qo_indptr, kv_indptr, causal=causal, sm_scale=sm_scale,  # type: ignore[no-any-return]
                                           logits_soft_cap=logits_soft_cap, window_left=window_left,
                                           return_lse=return_lse, variant=variant, variant_args=variant_args,
                                           backend=backend)
    problem, p, host = ragged_call(q, k, v, qo_indptr, kv_indptr, causal, sm_scale, logits_soft_cap, window_left,
                                   return_lse, variant, variant_args)
    kernel = select("attention.prefill_ragged", problem, backend).kernel
    if kernel.plan is None:
        out, lse = kernel.run(q, k, v, qo_indptr, kv_indptr, p)
    else:
        runner = kernel.plan(problem, None, p, qo_indptr=qo_indptr, kv_indptr=kv_indptr, host_indptrs=host)
        out, lse = runner.run(q, k, v, None, None)
    return _result(out, lse, return_lse)


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
    lead = q_nope.shape[:2] if isinstance(q_nope, torch.Tensor) and q_nope.dim() == 4 else None
    if torch.compiler.is_compiling():
        if lead is not None:  # the B * T decode rows' table, then their queries as (B * T, H, D)
            table = token_rows_table(q_nope, q_pe, table)
            q_nope, q_pe = q_nope.flatten(0, 1), q_pe.flatten(0, 1)
        out, lse = MLA.compiled(q_nope, q_pe, ckv_pages, kpe_pages, table, sm_scale, return_lse, backend)
    else:
        problem, p, rows_table, q_nope, q_pe = mla_call(q_nope, q_pe, ckv_pages, kpe_pages, table, sm_scale, return_lse)
        kernel = select("attention.mla_decode", problem, backend).kernel
        if kernel.plan is None:
            out, lse = kernel.run(q_nope, q_pe, ckv_pages, kpe_pages, rows_table, p)
        else:
            out, lse = kernel.plan(problem, rows_table, p).run(q_nope, q_pe, ckv_pages, kpe_pages, None, None)
    if lead is not None:
        out = out.view(*lead, *out.shape[1:])
        lse = lse.view(*lead, *lse.shape[1:]) if return_lse and lse is not None else lse
    return _result(out, lse, return_lse)


# -- MLA prefill ------------------------------------------------------------------------------------------
def mla_prefill(q_nope: _Tensor, q_pe: _Tensor, qo_indptr: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor,
                table: PageTable, *, causal: bool = True, sm_scale: float | None = None, return_lse: bool = False,
                backend: BackendArg = None) -> _Tensor | tuple[_Tensor, _Tensor]:
    """Absorbed multi-head latent attention over paged latent KV for several new tokens per request: chunked
    prefill, append and mixed prefill/decode batches of DeepSeek-style models (one latent KV head).

    q_nope (Tq, H, Dc) and q_pe (Tq, H, Dr) packed: request b owns rows ``qo_indptr[b]:qo_indptr[b+1]``; qo_indptr
    (B+1,) int32; ckv_pages (P, S, Dc), kpe_pages (P, S, Dr) in q's dtype, already holding every request's new
    tokens (``table.seq_lens`` counts them). Query i of request b sits at KV position ``seq_len_b - qo_len_b + i``;
    causal masks later positions. logits = (q_nope·ckv + q_pe·kpe) * sm_scale (default 1/sqrt(Dc + Dr)); out =
    softmax · ckv, (Tq, H, Dc) in q's dtype; lse (Tq, H) float32 when ``return_lse``. The kernels read the latent
    pages through the table: no gathering by hand. FlashInfer's ``BatchMLAPagedAttentionWrapper`` with several
    query tokens per request computes the same.
    """
    if torch.compiler.is_compiling():
        out, lse = MLA_PREFILL.compiled(q_nope, q_pe, qo_indptr, ckv_pages, kpe_pages, table, causal, sm_scale,
                                        return_lse, backend)
        return (out, lse) if return_lse else out
    problem, p, host = mla_prefill_call(q_nope, q_pe, qo_indptr, ckv_pages, kpe_pages, table, causal, sm_scale,
                                        return_lse)
    kernel = select("attention.mla_prefill", problem, backend).kernel
    if kernel.plan is None:
        out, lse = kernel.run(q_nope, q_pe, qo_indptr, ckv_pages, kpe_pages, table, p)
    else:
        runner = kernel.plan(problem, table, p, qo_indptr=qo_indptr, host_qo_indptr=host)
        out, lse = runner.run(q_nope, q_pe, ckv_pages, kpe_pages, None, None)
    return _result(out, lse, return_lse)


# -- POD: prefill and decode requests in one launch ------------------------------------------------------------
def pod(q_prefill: _Tensor, qo_indptr: _Tensor, q_decode: _Tensor, cache: PagedKVCache, prefill_table: PageTable,
        decode_table: PageTable, *, causal: bool = True, sm_scale: float | None = None,
        logits_soft_cap: float | None = None, window_left: int | None = None, return_lse: bool = False,
        backend: BackendArg = None) -> tuple[_Tensor, ...]:
    """Prefill-on-decode (POD): a batch's prefill requests and decode requests attended together, one kernel launch
    where the kernel allows, over one paged cache.

    The prefill part is :func:`prefill` of q_prefill (Tq, Hq, D) packed by qo_indptr (Bp+1,) int32 over
    ``prefill_table`` (Bp requests; ``causal`` applies to it); the decode part is :func:`decode` of q_decode
    (Bd, Hq, D) over ``decode_table`` (Bd requests); both read ``cache``, which already holds every request's new
    tokens. Returns (out_prefill (Tq, Hq, Dv), out_decode (Bd, Hq, Dv)), and with ``return_lse`` also
    (lse_prefill (Tq, Hq), lse_decode (Bd, Hq)) float32 after them. FlashInfer's ``BatchPODWithPagedKVCacheWrapper``
    computes the same; :func:`plan_pod` plans it once per step. Eager = the kernel's plan and run, or, as in
    :func:`plan_pod`, a prefill plan and a decode plan where their estimates add up to less; under torch.compile,
    one custom op (``torch.ops.ksb.attention_pod``) that takes that same path.
    """
    if torch.compiler.is_compiling():
        out_p, out_d, lse_p, lse_d = POD.compiled(q_prefill, qo_indptr, q_decode, cache, prefill_table, decode_table,
                                                  causal, sm_scale, logits_soft_cap, window_left, return_lse, backend)
        return (out_p, out_d, lse_p, lse_d) if return_lse else (out_p, out_d)
    problem, p, host = pod_call(q_prefill, qo_indptr, q_decode, cache, prefill_table, decode_table, causal, sm_scale,
                                logits_soft_cap, window_left, return_lse)
    selection = select("attention.pod", problem, backend)
    if backend is None and host is not None:  # as plan_pod decides (no plan is made while a graph is captured)
        common: dict[str, Any] = dict(
            num_q_heads=problem.num_q_heads, num_kv_heads=problem.num_kv_heads, head_dim=problem.head_dim,
            head_dim_v=problem.head_dim_v, dtype=problem.dtype, kv_dtype=problem.kv_dtype, layout=problem.layout,
            page_size=problem.page_size, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
            return_lse=bool(return_lse), capturable=False, kv_scale_tensor="kv_scale_tensor" in problem.features)
        split = two_plans_if_faster(selection, lambda: plan_prefill(prefill_table, qo_indptr, causal=causal, **common),
                                    lambda: plan_decode(decode_table, **common))
        if split is not None:
            out_p, out_d, lse_p, lse_d = split[1].run(q_prefill, q_decode, cache, None, None, None, None)
            return (out_p, out_d, lse_p, lse_d) if return_lse else (out_p, out_d)
    kernel = selection.kernel
    if kernel.plan is None:
        out_p, out_d, lse_p, lse_d = kernel.run(q_prefill, qo_indptr, q_decode, cache, prefill_table, decode_table, p)
    else:
        runner = kernel.plan(problem, prefill_table, p, qo_indptr=qo_indptr, host_qo_indptr=host,
                             decode_table=decode_table)
        out_p, out_d, lse_p, lse_d = runner.run(q_prefill, q_decode, cache, None, None, None, None)
    if not return_lse:
        return out_p, out_d
    if lse_p is None or lse_d is None:
        raise RuntimeError("the selected POD kernel returned no lse although return_lse=True was requested")
    return out_p, out_d, lse_p, lse_d


# -- merge_states ----------------------------------------------------------------------------------------
def merge_states(out_a: _Tensor, lse_a: _Tensor, out_b: _Tensor, lse_b: _Tensor, *,
                 backend: BackendArg = None) -> tuple[_Tensor, _Tensor]:
    """Merge two attention results over disjoint KV sets into the result over their union.

    out_a, out_b (T, H, D) same float dtype; lse_a, lse_b (T, H) float32, natural log (-inf = empty).
    Returns (out (T, H, D) in out_a's dtype, lse (T, H) float32).
    """
    if torch.compiler.is_compiling():
        return MERGE.compiled(out_a, lse_a, out_b, lse_b, backend)  # type: ignore[no-any-return]
    problem, = merge_call(out_a, lse_a, out_b, lse_b)
    return select("attention.merge_states", problem, backend).kernel.run(out_a, lse_a, out_b, lse_b)  # type: ignore[no-any-return]


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


# -- specs ----------------------------------------------------------------------------------------------
def _out_lse(result: Any) -> tuple[_Tensor, _Tensor]:
    """A public attention result as its custom op returns it: (out, lse), lse empty where none was asked for."""
    if isinstance(result, tuple):
        return result  # type: ignore[return-value]
    return result, result.new_empty((0,), dtype=torch.float32)


def _fake_out_lse(q: _Tensor, rows: tuple[int, ...], dv: int, return_lse: bool) -> tuple[_Tensor, _Tensor]:
    """Fake outputs of an attention op: out (*rows, dv) in q's dtype, lse (*rows) float32 (or empty)."""
    return q.new_empty((*rows, dv)), q.new_empty(rows if return_lse else (0,), dtype=torch.float32)


_SCALARS = (Arg("sm_scale", "float?"), Arg("logits_soft_cap", "float?"), Arg("window_left", "int?"),
            Arg("return_lse", "bool"), Arg("backend", "backend"))

DECODE = define(OpSpec(
    "attention.decode", decode, DecodeProblem, decode_call, reference="decode", cases="attention",
    op="attention_decode", args=(Arg("q"), Arg("cache", "cache"), Arg("table", "table"), *_SCALARS),
    returns="(Tensor, Tensor)", outputs=_out_lse,
    fake=lambda q, k_pages, v_pages, *rest: _fake_out_lse(q, q.shape[:2], v_pages.shape[-1], rest[-2]),
))
def _fake_prefill(q: _Tensor, qo_indptr: _Tensor, k_pages: _Tensor, v_pages: _Tensor, *rest: Any
                  ) -> tuple[_Tensor, _Tensor]:
    out, lse = _fake_out_lse(q, q.shape[:2], v_pages.shape[-1], rest[-2])
    return out.to(out_dtype(q.dtype)), lse


PREFILL = define(OpSpec(
    "attention.prefill", prefill, PrefillProblem, prefill_call, reference="prefill", cases="attention",
    op="attention_prefill",
    args=(Arg("q"), Arg("qo_indptr"), Arg("cache", "cache"), Arg("table", "table"), Arg("causal", "bool"),
          Arg("q_scale", "float?"), *_SCALARS),
    returns="(Tensor, Tensor)", outputs=_out_lse, fake=_fake_prefill,
))
RAGGED = define(OpSpec(
    "attention.prefill_ragged", prefill_ragged, RaggedPrefillProblem, ragged_call, reference="prefill_ragged",
    cases="attention", op="attention_prefill_ragged",
    args=(Arg("q"), Arg("k"), Arg("v"), Arg("qo_indptr"), Arg("kv_indptr"), Arg("causal", "bool"), *_SCALARS),
    returns="(Tensor, Tensor)", outputs=_out_lse,
    fake=lambda q, k, v, *rest: _fake_out_lse(q, q.shape[:2], v.shape[-1], rest[-2]),
))
MLA = define(OpSpec(
    "attention.mla_decode", mla_decode, MLADecodeProblem, mla_call, reference="mla_decode", cases="attention",
    op="attention_mla_decode",
    args=(Arg("q_nope"), Arg("q_pe"), Arg("ckv_pages"), Arg("kpe_pages"), Arg("table", "table"),
          Arg("sm_scale", "float?"), Arg("return_lse", "bool"), Arg("backend", "backend")),
    returns="(Tensor, Tensor)", outputs=_out_lse,
    fake=lambda q_nope, *rest: _fake_out_lse(q_nope, q_nope.shape[:2], q_nope.shape[-1], rest[-2]),
))
MLA_PREFILL = define(OpSpec(
    "attention.mla_prefill", mla_prefill, MLAPrefillProblem, mla_prefill_call, reference="mla_prefill",
    cases="attention", op="attention_mla_prefill",
    args=(Arg("q_nope"), Arg("q_pe"), Arg("qo_indptr"), Arg("ckv_pages"), Arg("kpe_pages"), Arg("table", "table"),
          Arg("causal", "bool"), Arg("sm_scale", "float?"), Arg("return_lse", "bool"), Arg("backend", "backend")),
    returns="(Tensor, Tensor)", outputs=_out_lse,
    fake=lambda q_nope, *rest: _fake_out_lse(q_nope, q_nope.shape[:2], q_nope.shape[-1], rest[-2]),
))
def _pod_outputs(result: tuple[_Tensor, ...]) -> tuple[_Tensor, ...]:
    """A public POD result as its custom op returns it: both outs, then both lses (empty where none was asked for)."""
    if len(result) == 4:
        return result
    out_p, out_d = result
    return out_p, out_d, out_p.new_empty((0,), dtype=torch.float32), out_d.new_empty((0,), dtype=torch.float32)


def _fake_pod(q_prefill: _Tensor, qo_indptr: _Tensor, q_decode: _Tensor, k_pages: _Tensor, v_pages: _Tensor,
              *rest: Any) -> tuple[_Tensor, ...]:
    dv, return_lse = v_pages.shape[-1], rest[-2]
    out_p, lse_p = _fake_out_lse(q_prefill, q_prefill.shape[:2], dv, return_lse)
    out_d, lse_d = _fake_out_lse(q_decode, q_decode.shape[:2], dv, return_lse)
    return out_p.to(out_dtype(q_prefill.dtype)), out_d.to(out_dtype(q_decode.dtype)), lse_p, lse_d


POD = define(OpSpec(
    "attention.pod", pod, PODProblem, pod_call, reference="pod", cases="attention", op="attention_pod",
    args=(Arg("q_prefill"), Arg("qo_indptr"), Arg("q_decode"), Arg("cache", "cache"), Arg("prefill_table", "table"),
          Arg("decode_table", "table"), Arg("causal", "bool"), *_SCALARS),
    returns="(Tensor, Tensor, Tensor, Tensor)", outputs=_pod_outputs, fake=_fake_pod,
))
MERGE = define(OpSpec(
    "attention.merge_states", merge_states, MergeProblem, merge_call, reference="merge_states", cases="attention",
    op="attention_merge_states",
    args=(Arg("out_a"), Arg("lse_a"), Arg("out_b"), Arg("lse_b"), Arg("backend", "backend")),
    returns="(Tensor, Tensor)",
    fake=lambda out_a, lse_a, *rest: (torch.empty_like(out_a), torch.empty_like(lse_a)),
))

# -- dense attention with a bias or mask, and the plans: their own modules, used from this namespace -------------
from .attention_dense import DenseParams, DenseProblem, dense  # noqa: E402
from .attention_plans import (  # noqa: E402
    AttentionPlan,
    DecodePlan,
    MLADecodePlan,
    MLAPrefillPlan,
    PODPlan,
    PrefillPlan,
    RaggedPrefillPlan,
    plan_decode,
    plan_mla_decode,
    plan_mla_prefill,
    plan_pod,
    plan_prefill,
    plan_prefill_ragged,
)

__all__ = [
    "AttentionPlan", "AttnParams", "DecodePlan", "DecodeProblem", "DenseParams", "DenseProblem", "MLADecodePlan",
    "MLADecodeProblem", "MLAPrefillPlan", "MLAPrefillProblem", "MergeProblem", "PODPlan", "PODProblem", "PrefillPlan",
    "PrefillProblem", "RaggedPrefillPlan", "RaggedPrefillProblem", "cascade", "decode", "dense", "merge_states",
    "mla_decode", "mla_prefill", "plan_decode", "plan_mla_decode", "plan_mla_prefill", "plan_pod", "plan_prefill",
    "plan_prefill_ragged", "pod", "prefill", "prefill_ragged", "table_of",
]
