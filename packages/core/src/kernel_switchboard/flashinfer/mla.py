"""``flashinfer.mla`` over the switchboard: :class:`BatchMLAPagedAttentionWrapper` (absorbed multi-head latent
attention, one latent KV head).

The step's query counts (``qo_indptr``) pick the switchboard plan: one new token per request runs
``attention.plan_mla_decode``; the same T > 1 new tokens per request with ``causal`` (multi-token prediction,
speculative verification) run as its B * T decode rows; any other layout (uneven counts, requests without new tokens,
non-causal attention of several tokens) runs ``attention.plan_mla_prefill``. Causal as FlashInfer defines it: query i
of a request with qo_len new tokens and kv_len cached ones (the new included) sits at position kv_len - qo_len + i.
The latent cache is in q's dtype (fp8 latent caches are refused).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..errors import fail
from ..ops import attention
from ._common import (
    LOG2E_TENSOR,
    GraphTable,
    check_backend,
    check_graph_buffers,
    check_page_size,
    check_unserved,
    check_workspace,
    copy_into,
    csr_table,
    page_counts,
    to_dtype,
)

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


class BatchMLAPagedAttentionWrapper:
    """FlashInfer's MLA wrapper: ``plan`` once per step, ``run`` per layer with that layer's latent pages.
    ``backend`` is accepted and does not change the result (except ``"cutlass"``'s own run arguments, refused)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr: torch.Tensor | None = None, kv_indptr: torch.Tensor | None = None,
                 kv_indices: torch.Tensor | None = None, kv_len_arr: torch.Tensor | None = None,
                 backend: str = "auto") -> None:
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)
        check_backend(backend)
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        if use_cuda_graph:
            check_graph_buffers("the caller's fixed buffers", {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr,
                                                               "kv_indices": kv_indices, "kv_len_arr": kv_len_arr})
            assert qo_indptr is not None and kv_indptr is not None and kv_len_arr is not None
            if kv_indptr.numel() != qo_indptr.numel() or kv_len_arr.numel() != qo_indptr.numel() - 1:
                raise fail("kv_indptr/kv_len_arr", f"{kv_indptr.numel()}/{kv_len_arr.numel()} entries",
                           f"batch + 1 / batch with batch = {qo_indptr.numel() - 1} (from qo_indptr)")
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._backend = backend
        self._graph_tables: dict[int, GraphTable] = {}
        self._graph: GraphTable | None = None
        self._table: Any = None
        self._plans: dict[tuple[Any, ...], Any] = {}
        self._key: tuple[Any, ...] | None = None
        self._qo: torch.Tensor | None = None
        self._q_len = 1
        self._causal = False
        self._sm_scale: float | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             kv_len_arr: torch.Tensor, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, page_size: int,
             causal: bool, sm_scale: float, q_data_type: torch.dtype, kv_data_type: torch.dtype,
             use_profiler: bool = False) -> None:
        """Plan one step: ``qo_indptr`` (B+1,) the new query tokens of each request, ``kv_indptr`` / ``kv_indices``
        its pages and ``kv_len_arr`` (B,) its KV length (the new tokens included)."""
        if use_profiler:
            raise fail("use_profiler", use_profiler, "False: FlashInfer's intra-kernel profiler is not served")
        q_dtype, kv_dtype = to_dtype(q_data_type, "q_data_type"), to_dtype(kv_data_type, "kv_data_type")
        if q_dtype not in _FLOATS:
            raise fail("q_data_type", q_dtype, "torch.float16, torch.bfloat16 or torch.float32")
        if kv_dtype != q_dtype:
            raise fail("kv_data_type", kv_dtype, f"q_data_type ({q_dtype}): fp8 latent caches are not served")
        for name, value in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv), ("head_dim_kpe", head_dim_kpe)):
            if not (isinstance(value, int) and value >= 1):
                raise fail(name, value, "a positive int (NoPE MLA, head_dim_kpe=0, is not served)")
        page_size = check_page_size(page_size)
        if not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1:
            raise fail("qo_indptr", type(qo_indptr).__name__, "a 1-d int32 tensor")
        lens = page_counts(qo_indptr)
        q_len = lens[0] if lens else 1
        rows = q_len >= 1 and all(n == q_len for n in lens) and (q_len == 1 or causal)  # decode rows serve it
        batch = len(lens)
        if self._use_cuda_graph:
            if not rows:
                raise fail("qo_indptr", f"query counts {sorted(set(lens))} (causal={causal})",
                           "the same number (>= 1) of new tokens for every request, causal when several, with "
                           "use_cuda_graph=True (other layouts are served without CUDA graphs)")
            table, max_kv = self._graph_step(qo_indptr, kv_indptr, kv_indices, kv_len_arr, batch, page_size, q_len)
            qo = None
        else:
            table = csr_table(kv_indptr, kv_indices, page_size, self.device, seq_lens=kv_len_arr,
                              names=("kv_indptr", "kv_indices", "kv_len_arr"))
            max_kv = None
            qo = None if rows else qo_indptr.to(self.device, torch.int32, non_blocking=True).contiguous()
            self._plans.clear()
        self._table, self._qo, self._causal, self._sm_scale = table, qo, bool(causal), sm_scale
        self._q_len = q_len if rows else 0  # 0: packed rows of the mla_prefill plan
        self._page_size, self._head_dim_ckv = page_size, head_dim_ckv
        self._q_data_type, self._kv_data_type = q_dtype, kv_dtype
        self._key = (batch, num_heads, head_dim_ckv, head_dim_kpe, page_size, q_dtype, self._q_len, sm_scale)
        self._dims = (num_heads, head_dim_ckv, head_dim_kpe, max_kv)
        self._plan_for(False)

    def _graph_step(self, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, batch: int,
                    page_size: int, q_len: int) -> tuple[Any, int]:
        assert self._qo_indptr_buf is not None and self._kv_indptr_buf is not None
        assert self._kv_indices_buf is not None and self._kv_len_arr_buf is not None
        if batch != self._qo_indptr_buf.numel() - 1:
            raise fail("qo_indptr", f"{batch} requests",
                       f"the batch size fixed at construction ({self._qo_indptr_buf.numel() - 1})")
        copy_into(self._qo_indptr_buf, qo_indptr, "qo_indptr")
        copy_into(self._kv_indptr_buf, kv_indptr, "kv_indptr")
        copy_into(self._kv_len_arr_buf, kv_len_arr, "kv_len_arr")
        copy_into(self._kv_indices_buf, kv_indices, "kv_indices")
        graph = self._graph_tables.get(page_size)
        if graph is None:
            graph = self._graph_tables[page_size] = GraphTable(
                self._kv_indptr_buf, self._kv_indices_buf, page_size, seq_lens_buf=self._kv_len_arr_buf,
                workspace=self._float_workspace_buffer)
        graph.check(page_counts(kv_indptr), "kv_indices")
        graph.refresh()
        self._graph = graph
        return graph.table, graph.max_kv_len

    def _plan_for(self, return_lse: bool) -> Any:
        key = (self._key, return_lse)
        plan = self._plans.get(key)
        if plan is None:
            num_heads, ckv, kpe, max_kv = self._dims
            common: dict[str, Any] = {"num_heads": num_heads, "head_dim_ckv": ckv, "head_dim_kpe": kpe,
                                      "dtype": self._q_data_type, "page_size": self._page_size,
                                      "sm_scale": self._sm_scale, "return_lse": return_lse, "max_kv_len": max_kv,
                                      "capturable": self._use_cuda_graph}
            if self._qo is None:
                plan = attention.plan_mla_decode(self._table, q_len=self._q_len, **common)
            else:
                plan = attention.plan_mla_prefill(self._table, self._qo, causal=self._causal, **common)
            self._plans[key] = plan
        return plan

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            profiler_buffer: torch.Tensor | None = None, kv_len: torch.Tensor | None = None,
            page_table: torch.Tensor | None = None, return_lse_base_on_e: bool = False, o_scale: float | None = None,
            *, ckv_scale: float | None = None, ckv_scale_arr: torch.Tensor | None = None,
            kpe_scale: float | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """MLA attention of q_nope (Tq, H, Dc), q_pe (Tq, H, Dr) packed by the planned ``qo_indptr`` over ckv_cache
        (P, S, Dc), kpe_cache (P, S, Dr): out (Tq, H, Dc) in q's dtype [, lse (Tq, H) float32, base 2 unless
        ``return_lse_base_on_e``]."""
        if (profiler_buffer is not None or kv_len is not None or page_table is not None or o_scale is not None
                or ckv_scale is not None or ckv_scale_arr is not None or kpe_scale is not None):
            check_unserved(profiler_buffer=profiler_buffer, kv_len=kv_len, page_table=page_table, o_scale=o_scale,
                           ckv_scale=ckv_scale, ckv_scale_arr=ckv_scale_arr, kpe_scale=kpe_scale)
        if self._key is None:
            raise fail("plan", "not called", "plan() before run()")
        plan = self._plans.get((self._key, bool(return_lse)))
        if plan is None:
            plan = self._plan_for(bool(return_lse))
        if self._graph is not None:
            self._graph.refresh()
        t = self._q_len
        if t > 1:  # (B*T, H, D) rows as (B, T, H, D): each request's new tokens
            q_nope, q_pe = _tokens(q_nope, "q_nope", t), _tokens(q_pe, "q_pe", t)
            out = None if out is None else _tokens(out, "out", t)
            lse = None if lse is None else _tokens(lse, "lse", t)
        res = plan.run(q_nope, q_pe, ckv_cache, kpe_cache, out=out, lse=lse)
        if not return_lse:
            return res if t <= 1 else res.flatten(0, 1)  # type: ignore[no-any-return]
        o, s = res
        if not return_lse_base_on_e:
            s.mul_(LOG2E_TENSOR)
        return (o, s) if t <= 1 else (o.flatten(0, 1), s.flatten(0, 1))

    run_return_lse = functools.partialmethod(run, return_lse=True)


def _tokens(t: Any, name: str, q_len: int) -> torch.Tensor:
    if not (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] % q_len == 0):
        raise fail(name, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__,
                   f"(batch * {q_len}, ...): {q_len} new tokens per request as planned")
    return t.view(t.shape[0] // q_len, q_len, *t.shape[1:])
