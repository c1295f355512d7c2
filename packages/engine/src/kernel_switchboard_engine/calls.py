"""Every switchboard op the engine calls, in one place, with an optional tracer.

The model code calls the functions below instead of ``ksb.<family>.<op>`` directly, so that
``switchboard demo`` can record, per op, which kernel served it and why (the dispatch
:class:`~kernel_switchboard.dispatch.Selection`), how often it ran and how long it took.
Without an active tracer each wrapper is one global read plus the op call, and it traces
cleanly under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

import kernel_switchboard as ksb
from kernel_switchboard.dispatch import Selection


@dataclass
class OpRecord:
    """What the tracer saw of one op: calls, host seconds, and the selections made (by kernel id)."""

    op: str
    calls: int = 0
    seconds: float = 0.0
    selections: dict[str, Selection] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class OpTracer:
    """Records every op call made while it is active (``with tracer.active(): ...``)."""

    def __init__(self, sync: bool = False) -> None:
        #: synchronise the GPU around each call so the seconds are device time (slower)
        self.sync = sync
        self.records: dict[str, OpRecord] = {}

    @contextmanager
    def active(self) -> Iterator[OpTracer]:
        global _tracer
        previous, _tracer = _tracer, self
        try:
            yield self
        finally:
            _tracer = previous

    def call(self, op: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rec = self.records.setdefault(op, OpRecord(op))
        try:
            sel = ksb.explain(op, *args, **kwargs)
            rec.selections.setdefault(sel.kernel.id, sel)
        except Exception as exc:  # explain failing must never stop the engine; the call itself will raise
            rec.errors.append(f"{type(exc).__name__}: {exc}")
        return self._timed(rec, fn, args, kwargs)

    def run_plan(self, plan: Any, args: tuple[Any, ...]) -> Any:
        """``plan.run(*args)``, recorded under the plan's op with the selection it made at plan time."""
        rec = self.records.setdefault(plan.selection.op, OpRecord(plan.selection.op))
        rec.selections.setdefault(plan.selection.kernel.id, plan.selection)
        return self._timed(rec, plan.run, args, {})

    def _timed(self, rec: OpRecord, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``fn`` and add one call and its seconds to ``rec`` (device time when ``sync``)."""
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        rec.calls += 1
        rec.seconds += time.perf_counter() - start
        return out


_tracer: OpTracer | None = None


@contextmanager
def untraced() -> Iterator[None]:
    """No tracing inside (CUDA-graph capture: ``explain`` validates on the host, which capture forbids)."""
    global _tracer
    previous, _tracer = _tracer, None
    try:
        yield
    finally:
        _tracer = previous


def _call(op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    tracer = _tracer
    if tracer is None or torch.compiler.is_compiling():
        return fn(*args, **kwargs)
    return tracer.call(op, fn, args, kwargs)


# -- the ops -------------------------------------------------------------------------------------------
def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a (M, K) @ b (K, N) (+ bias (N,)) -> (M, N)."""
    if bias is None:
        return _call("gemm.mm", ksb.gemm.mm, a, b)
    return _call("gemm.mm", ksb.gemm.mm, a, b, bias=bias)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-group matmul a (G, M, K) @ b (G, K, N) -> (G, M, N) through ``gemm.grouped_mm``."""
    g, m, k = a.shape
    offsets = torch.arange(0, (g + 1) * m, m, dtype=torch.int32, device=a.device)
    c = _call("gemm.grouped_mm", ksb.gemm.grouped_mm, a.reshape(g * m, k), b, offsets)
    return c.view(g, m, b.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    """``gemma``: the weight applies as (1 + w)."""
    return _call("norm.rms_norm", ksb.norm.rms_norm, x, weight, eps, gemma=gemma)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       gemma: bool = False) -> None:
    """In place: residual <- x + residual; x <- rms_norm(residual)."""
    _call("norm.fused_add_rms_norm", ksb.norm.fused_add_rms_norm, x, residual, weight, eps, gemma=gemma)


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, scaling: Any,
         interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _call("rope.apply", ksb.rope.apply, q, k, positions, theta=theta, scaling=scaling, interleaved=interleaved)


def rope_table(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
               interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope from a cos/sin table (scalings ``rope.apply`` does not take: linear, YaRN)."""
    return _call("rope.apply_cos_sin_cache", ksb.rope.apply_cos_sin_cache, q, k, positions, cos_sin,
                 interleaved=interleaved)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _call("activation.silu_and_mul", ksb.activation.silu_and_mul, x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _call("activation.gelu_tanh_and_mul", ksb.activation.gelu_tanh_and_mul, x)


def append_kv(k: torch.Tensor, v: torch.Tensor, cache: ksb.PagedKVCache, table: ksb.PageTable,
              positions: torch.Tensor, batch_indices: torch.Tensor | None, check: bool) -> None:
    _call("kv_cache.append", ksb.kv_cache.append, k, v, cache, table, positions, batch_indices, check_indices=check)


def append_mla(ckv: torch.Tensor, kpe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
               table: ksb.PageTable, positions: torch.Tensor, batch_indices: torch.Tensor | None, check: bool) -> None:
    _call("kv_cache.append_mla", ksb.kv_cache.append_mla, ckv, kpe, ckv_pages, kpe_pages, table, positions,
          batch_indices, check_indices=check)


def plan_decode(cache: ksb.PagedKVCache, table: ksb.PageTable, num_q_heads: int, dtype: torch.dtype,
                sm_scale: float, soft_cap: float | None = None, window_left: int = -1, max_kv_len: int | None = None,
                capturable: bool = False) -> Any:
    """One ``attention.plan_decode`` per decode step and window, run by every layer of that window with its cache."""
    return ksb.attention.plan_decode(table, num_q_heads=num_q_heads, num_kv_heads=cache.num_kv_heads,
                                     head_dim=cache.head_dim, head_dim_v=cache.head_dim_v, dtype=dtype,
                                     kv_dtype=cache.dtype, layout=cache.layout, page_size=cache.page_size,
                                     sm_scale=sm_scale, logits_soft_cap=soft_cap, window_left=window_left,
                                     max_kv_len=max_kv_len, capturable=capturable)


def plan_prefill(qo_indptr: torch.Tensor, cache: ksb.PagedKVCache, table: ksb.PageTable, num_q_heads: int,
                 dtype: torch.dtype, sm_scale: float, soft_cap: float | None = None, window_left: int = -1) -> Any:
    """One causal ``attention.plan_prefill`` per step and window, run by every layer of that window (the indptrs
    are read once per plan)."""
    return ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=num_q_heads, num_kv_heads=cache.num_kv_heads,
                                      head_dim=cache.head_dim, head_dim_v=cache.head_dim_v, dtype=dtype,
                                      kv_dtype=cache.dtype, layout=cache.layout, page_size=cache.page_size,
                                      causal=True, sm_scale=sm_scale, logits_soft_cap=soft_cap,
                                      window_left=window_left, capturable=False)


def plan_mla_decode(table: ksb.PageTable, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, dtype: torch.dtype,
                    page_size: int, sm_scale: float, max_kv_len: int | None = None, capturable: bool = False,
                    q_len: int = 1) -> Any:
    """One ``attention.plan_mla_decode`` per step, run by every layer with its own latent pages."""
    return ksb.attention.plan_mla_decode(table, num_heads=num_heads, head_dim_ckv=head_dim_ckv,
                                         head_dim_kpe=head_dim_kpe, dtype=dtype, page_size=page_size,
                                         sm_scale=sm_scale, max_kv_len=max_kv_len, capturable=capturable, q_len=q_len)


def plan_prefill_ragged(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_heads: int, head_dim: int,
                        head_dim_v: int, dtype: torch.dtype, sm_scale: float) -> Any:
    """One causal ``attention.plan_prefill_ragged`` per step (MHA: as many KV heads as query heads)."""
    return ksb.attention.plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=num_heads, num_kv_heads=num_heads,
                                             head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype, causal=True,
                                             sm_scale=sm_scale, capturable=False)


def run_plan(plan: Any, *args: Any) -> Any:
    """``plan.run(*args)`` for an attention plan, recorded by an active tracer."""
    tracer = _tracer
    if tracer is None or torch.compiler.is_compiling():
        return plan.run(*args)
    return tracer.run_plan(plan, args)


def decode(q: torch.Tensor, cache: ksb.PagedKVCache, table: ksb.PageTable, sm_scale: float,
           soft_cap: float | None = None, window_left: int = -1) -> torch.Tensor:
    return _call("attention.decode", ksb.attention.decode, q, cache, table, sm_scale=sm_scale, logits_soft_cap=soft_cap,
                 window_left=window_left)


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
               table: ksb.PageTable, sm_scale: float) -> torch.Tensor:
    return _call("attention.mla_decode", ksb.attention.mla_decode, q_nope, q_pe, ckv_pages, kpe_pages, table,
                 sm_scale=sm_scale)


def route(logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool, num_expert_group: int | None,
          topk_group: int | None, correction_bias: torch.Tensor | None,
          routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _call("moe.route", ksb.moe.route, logits, top_k, scoring=scoring, renormalize=renormalize,
                 num_expert_group=num_expert_group, topk_group=topk_group, correction_bias=correction_bias,
                 routed_scaling_factor=routed_scaling_factor)


def experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
            w2: torch.Tensor) -> torch.Tensor:
    return _call("moe.experts", ksb.moe.experts, x, topk_weights, topk_ids, w13, w2)


class InvalidLogitsError(RuntimeError):
    """A model step produced logits the sampler cannot draw from (NaN, +inf, or no finite entry): the sampling
    ops mark such a row instead of synchronising to check it, and the engine raises here on the host copy it reads
    anyway."""


def check_sampled(tokens: list[int], what: str) -> list[int]:
    """``tokens`` (the host copy of a sampling op's output) unless a row came back marked invalid."""
    if ksb.sampling.INVALID in tokens:
        rows = [i for i, t in enumerate(tokens) if t == ksb.sampling.INVALID]
        raise InvalidLogitsError(f"{what}: rows {rows} of {len(tokens)} had logits with NaN or +inf or no finite "
                                 "entry; the model's output is not finite")
    return tokens


def top_k_top_p(logits: torch.Tensor, top_k: Any, top_p: Any, temperature: Any,
                generator: torch.Generator | None) -> torch.Tensor:
    return _call("sampling.top_k_top_p", ksb.sampling.top_k_top_p, logits, top_k, top_p, is_logits=True,
                 temperature=temperature, generator=generator)


def chain_speculative(draft_probs: torch.Tensor, draft_ids: torch.Tensor, target_probs: torch.Tensor,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _call("sampling.chain_speculative", ksb.sampling.chain_speculative, draft_probs, draft_ids, target_probs,
                 generator=generator)
