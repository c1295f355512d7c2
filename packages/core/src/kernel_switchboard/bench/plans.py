"""Plans of the attention ops that have one, for a named kernel or the automatic choice: made once, then called
the way an engine calls them (``plan.run``, on a GPU also replayed in a CUDA graph)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _decode_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_decode

    q, cache, table = args
    plan = plan_decode(table, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=cache.head_dim,
                       head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype, layout=cache.layout,
                       page_size=cache.page_size, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, cache)


def _prefill_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_prefill

    q, qo_indptr, cache, table = args
    plan = plan_prefill(table, qo_indptr, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads,
                        head_dim=cache.head_dim, head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype,
                        layout=cache.layout, page_size=cache.page_size, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, cache)


def _ragged_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_prefill_ragged

    q, k, v, qo_indptr, kv_indptr = args
    plan = plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=q.shape[1], num_kv_heads=k.shape[1],
                               head_dim=q.shape[2], head_dim_v=v.shape[2], dtype=q.dtype, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, k, v)


def _mla_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_mla_decode

    q_nope, q_pe, ckv, kpe, table = args
    plan = plan_mla_decode(table, num_heads=q_nope.shape[-2], head_dim_ckv=ckv.shape[2], head_dim_kpe=kpe.shape[2],
                           dtype=q_nope.dtype, page_size=ckv.shape[1], backend=kernel_id,
                           q_len=q_nope.shape[1] if q_nope.dim() == 4 else 1, **kwargs)
    return plan, lambda: plan.run(q_nope, q_pe, ckv, kpe)


#: op -> (kernel id or None, case args, case kwargs) -> (plan, call)
PLANNERS: dict[str, Callable[..., tuple[Any, Callable[[], Any]]]] = {
    "attention.decode": _decode_plan, "attention.prefill": _prefill_plan, "attention.prefill_ragged": _ragged_plan,
    "attention.mla_decode": _mla_plan}
