"""``flashinfer.prefill`` over the switchboard: :class:`BatchPrefillWithPagedKVCacheWrapper` (``plan_prefill``),
:class:`BatchPrefillWithRaggedKVCacheWrapper` (``plan_prefill_ragged``), :func:`single_prefill_with_kv_cache`.

Queries of request b are rows ``qo_indptr[b]:qo_indptr[b+1]``; with ``causal=True`` they are the request's last
tokens (query i of a request with qo_len queries and kv_len keys sits at position kv_len - qo_len + i), so every
request needs qo_len <= kv_len. Custom masks and the multi-item-scoring arguments are refused by name, except
``custom_mask`` in :func:`single_prefill_with_kv_cache` (served by ``attention.dense``).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch

from ..errors import fail
from ..ops import attention
from ._common import (
    GraphTable,
    check_graph_buffers,
    check_layout,
    check_page_size,
    check_pos_encoding,
    check_unserved,
    copy_into,
    csr_table,
    page_counts,
    scale_value,
)
from ._paged import PagedWrapper, Step, _check_out, _factor, check_heads, check_run_extras, plan_dtypes
from .decode import single_attention


def _check_prefill_args(custom_mask: Any, packed_custom_mask: Any, prefix_len_ptr: Any, token_pos_in_items_ptr: Any,
                        token_pos_in_items_len: Any, max_item_len_ptr: Any, fixed_split_size: Any) -> None:
    check_unserved(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask, prefix_len_ptr=prefix_len_ptr,
                   token_pos_in_items_ptr=token_pos_in_items_ptr, max_item_len_ptr=max_item_len_ptr)
    if token_pos_in_items_len:
        raise fail("token_pos_in_items_len", token_pos_in_items_len, "0: multi-item scoring is not served")
    if fixed_split_size is not None and fixed_split_size > 0:
        raise fail("fixed_split_size", fixed_split_size,
                   "None or -1: fixed KV split sizes (batch-invariant reductions) are not served")


def _query_shape(values: list[int]) -> tuple[int, int, bool]:
    """(total rows, most rows of one request, whether 1-row and longer requests mix) of host ``qo_indptr`` values."""
    lens = [b - a for a, b in itertools.pairwise(values)]
    most = max(lens, default=0)
    return values[-1] if values else 0, most, most > 1 and 1 in lens


class BatchPrefillWithPagedKVCacheWrapper(PagedWrapper):
    """FlashInfer's paged prefill / append wrapper: ``plan`` once per step, ``run`` per layer. ``backend`` is accepted
    and does not change the result (the switchboard ranks its own kernels)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: torch.Tensor | None = None, paged_kv_indptr_buf: torch.Tensor | None = None,
                 paged_kv_indices_buf: torch.Tensor | None = None,
                 paged_kv_last_page_len_buf: torch.Tensor | None = None, custom_mask_buf: torch.Tensor | None = None,
                 mask_indptr_buf: torch.Tensor | None = None, backend: str = "auto", jit_args: list[Any] | None = None,
                 jit_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        check_unserved(custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf, jit_kwargs=jit_kwargs)
        if use_cuda_graph:
            check_graph_buffers("the caller's fixed buffers", {
                "qo_indptr_buf": qo_indptr_buf, "paged_kv_indptr_buf": paged_kv_indptr_buf,
                "paged_kv_indices_buf": paged_kv_indices_buf, "paged_kv_last_page_len_buf": paged_kv_last_page_len_buf})
            assert qo_indptr_buf is not None and paged_kv_indptr_buf is not None
            assert paged_kv_last_page_len_buf is not None
            self._fixed_batch_size = qo_indptr_buf.numel() - 1
            for name, buf, n in (("paged_kv_indptr_buf", paged_kv_indptr_buf, self._fixed_batch_size + 1),
                                 ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, self._fixed_batch_size)):
                if buf.numel() != n:
                    raise fail(name, f"{buf.numel()} entries", f"{n} (from qo_indptr_buf's batch size)")
        else:
            self._fixed_batch_size = 0
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._graph_tables: dict[int, GraphTable] = {}
        self._graph_queries: tuple[int, int, bool] | None = None

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo: int | None = None, custom_mask: torch.Tensor | None = None,
             packed_custom_mask: torch.Tensor | None = None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: float | None = None, window_left: int = -1,
             logits_soft_cap: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             q_data_type: Any = "float16", kv_data_type: Any = None, o_data_type: Any = None,
             non_blocking: bool = True, prefix_len_ptr: torch.Tensor | None = None,
             token_pos_in_items_ptr: torch.Tensor | None = None, token_pos_in_items_len: int = 0,
             max_item_len_ptr: torch.Tensor | None = None, seq_lens: torch.Tensor | None = None,
             seq_lens_q: torch.Tensor | None = None, block_tables: torch.Tensor | None = None,
             max_token_per_sequence: int | None = None, max_sequence_kv: int | None = None,
             fixed_split_size: int | None = None, disable_split_kv: bool = False) -> None:
        """Plan one step: ``qo_indptr`` (B+1,) packs the queries, ``paged_kv_indptr`` / ``paged_kv_indices`` /
        ``paged_kv_last_page_len`` the pages, which already hold every request's new tokens.
        ``use_fp16_qk_reduction`` is a precision shortcut the switchboard does not take (it computes in float32);
        ``seq_lens``, ``block_tables`` and the ``max_*`` hints of other FlashInfer backends are not needed."""
        _check_prefill_args(custom_mask, packed_custom_mask, prefix_len_ptr, token_pos_in_items_ptr,
                            token_pos_in_items_len, max_item_len_ptr, fixed_split_size)
        check_heads(num_qo_heads, num_kv_heads, head_dim_qk)
        page_size = check_page_size(page_size)
        head_dim_v = head_dim_qk if head_dim_vo is None else head_dim_vo
        q_dtype, kv_dtype = plan_dtypes(q_data_type, kv_data_type, o_data_type)
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        if not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1:
            raise fail("qo_indptr", type(qo_indptr).__name__, "a 1-d int32 tensor")
        queries = _query_shape(qo_indptr.tolist())
        if self._use_cuda_graph:
            table, max_kv, qo = self._graph_step(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                                 page_size, queries)
        else:
            table = csr_table(paged_kv_indptr, paged_kv_indices, page_size, self.device,
                              last_page_len=paged_kv_last_page_len,
                              names=("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"))
            max_kv, qo = None, qo_indptr.to(self.device, torch.int32, non_blocking=True).contiguous()
        if qo.numel() != table.batch_size + 1:
            raise fail("qo_indptr", f"{qo.numel()} entries", f"batch + 1 = {table.batch_size + 1} (as paged_kv_indptr)")
        self._batch_size, self._num_qo_heads, self._num_kv_heads = table.batch_size, num_qo_heads, num_kv_heads
        self._cached_q_data_type, self._cached_kv_data_type, self._cached_o_data_type = q_dtype, kv_dtype, q_dtype
        self._qo_indptr_last = queries[0]
        self._start_step(Step(table, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_v, page_size, q_dtype, kv_dtype,
                              (queries[0], num_qo_heads, head_dim_v), max_kv, qo))

    begin_forward = plan

    def _graph_step(self, qo_indptr: torch.Tensor, indptr: Any, indices: Any, last_page_len: Any, page_size: int,
                    queries: tuple[int, int, bool]) -> tuple[Any, int, torch.Tensor]:
        """CUDA-graph ``plan``: the step's values go into the caller's buffers; the query layout must stay within the
        one the switchboard plan was made for (same rows, no longer request, same mix of lengths)."""
        if qo_indptr.numel() - 1 != self._fixed_batch_size:
            raise fail("qo_indptr", f"{qo_indptr.numel() - 1} requests",
                       f"the batch size fixed at construction ({self._fixed_batch_size}) when use_cuda_graph=True")
        first = self._graph_queries
        if first is not None and (queries[0] != first[0] or queries[1] > first[1] or queries[2] != first[2]):
            raise fail("qo_indptr", f"(rows, longest, mixed) = {queries}",
                       f"the first CUDA-graph plan's layout {first}: same rows, no longer request, same mix")
        assert self._qo_indptr_buf is not None and self._paged_kv_indptr_buf is not None
        assert self._paged_kv_indices_buf is not None and self._paged_kv_last_page_len_buf is not None
        copy_into(self._qo_indptr_buf, qo_indptr, "qo_indptr")
        copy_into(self._paged_kv_indptr_buf, indptr, "paged_kv_indptr")
        copy_into(self._paged_kv_last_page_len_buf, last_page_len, "paged_kv_last_page_len")
        copy_into(self._paged_kv_indices_buf, indices, "paged_kv_indices")
        graph = self._graph_tables.get(page_size)
        if graph is None:
            graph = self._graph_tables[page_size] = GraphTable(
                self._paged_kv_indptr_buf, self._paged_kv_indices_buf, page_size,
                last_page_len_buf=self._paged_kv_last_page_len_buf, workspace=self._float_workspace_buffer)
        graph.check(page_counts(indptr), "paged_kv_indices_buf")
        graph.refresh()
        self._graph = graph
        self._graph_queries = first or queries
        return graph.table, graph.max_kv_len, self._qo_indptr_buf

    def _native(self, step: Step, sm_scale: float, cap: float | None, window: int | None, causal: bool,
                return_lse: bool, lse_base2: bool, kv_scale_tensor: bool) -> Any:
        assert step.table is not None and step.qo_indptr is not None
        return attention.plan_prefill(
            step.table, step.qo_indptr, num_q_heads=step.num_qo_heads, num_kv_heads=step.num_kv_heads,
            head_dim=step.head_dim, head_dim_v=step.head_dim_v, dtype=step.q_dtype, kv_dtype=step.kv_dtype,
            layout=self._kv_layout, page_size=step.page_size, causal=causal, sm_scale=sm_scale, logits_soft_cap=cap,
            window_left=window, return_lse=return_lse, lse_base2=lse_base2, max_kv_len=step.max_kv_len,
            capturable=self._use_cuda_graph, kv_scale_tensor=kv_scale_tensor)

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False, enable_pdl: bool | None = None,
            window_left: int | None = None, sinks: torch.Tensor | None = None, kv_cache_sf: Any = None,
            skip_softmax_threshold_scale_factor: float | None = None, use_fp16_softmax: bool | None = None,
            uses_spcompress: bool | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Prefill attention of q (qo_indptr[-1], Hq, D) over the planned pages: out (…, Hq, Dv) in q's dtype
        [, lse (…, Hq) float32, base 2]."""
        if (args or sinks is not None or kv_cache_sf is not None or skip_softmax_threshold_scale_factor is not None
                or use_fp16_softmax is not None or uses_spcompress is not None):
            check_run_extras(args, sinks=sinks, kv_cache_sf=kv_cache_sf,
                             skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                             use_fp16_softmax=use_fp16_softmax, uses_spcompress=uses_spcompress)
        if window_left is not None and window_left != self._window_left:
            raise fail("window_left", window_left, f"None or the planned window_left ({self._window_left})")
        return self._attend(q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale: float | None = None, v_scale: float | None = None,
                window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
                rope_scale: float | None = None, rope_theta: float | None = None) -> torch.Tensor:
        """Deprecated by FlashInfer: sets these attention parameters for this and later runs, then :meth:`run`."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)  # type: ignore[return-value]

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           k_scale: float | None = None, v_scale: float | None = None, window_left: int = -1,
                           logits_soft_cap: float | None = None, sm_scale: float | None = None,
                           rope_scale: float | None = None, rope_theta: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated by FlashInfer: :meth:`forward` returning (out, lse)."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale,  # type: ignore[return-value]
                        return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(PagedWrapper):
    """FlashInfer's ragged prefill wrapper (contiguous K/V packed by ``kv_indptr``): ``plan`` once per step, ``run``
    per layer. ``backend`` is accepted and does not change the result."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: torch.Tensor | None = None, kv_indptr_buf: torch.Tensor | None = None,
                 custom_mask_buf: torch.Tensor | None = None, mask_indptr_buf: torch.Tensor | None = None,
                 backend: str = "auto", jit_args: list[Any] | None = None,
                 jit_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        check_unserved(custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf, jit_kwargs=jit_kwargs)
        if use_cuda_graph:
            check_graph_buffers("the caller's fixed buffers", {"qo_indptr_buf": qo_indptr_buf,
                                                               "kv_indptr_buf": kv_indptr_buf})
            assert qo_indptr_buf is not None and kv_indptr_buf is not None
            self._fixed_batch_size = qo_indptr_buf.numel() - 1
            if kv_indptr_buf.numel() != qo_indptr_buf.numel():
                raise fail("kv_indptr_buf", f"{kv_indptr_buf.numel()} entries", f"{qo_indptr_buf.numel()} as qo_indptr_buf")
        else:
            self._fixed_batch_size = 0
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr_buf, kv_indptr_buf
        self._graph_shape: tuple[Any, ...] | None = None

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, head_dim_vo: int | None = None, custom_mask: torch.Tensor | None = None,
             packed_custom_mask: torch.Tensor | None = None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, window_left: int = -1, logits_soft_cap: float | None = None,
             sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             q_data_type: Any = "float16", kv_data_type: Any = None, o_data_type: Any = None,
             non_blocking: bool = True, prefix_len_ptr: torch.Tensor | None = None,
             token_pos_in_items_ptr: torch.Tensor | None = None, token_pos_in_items_len: int = 0,
             max_item_len_ptr: torch.Tensor | None = None, fixed_split_size: int | None = None,
             disable_split_kv: bool = False, seq_lens: torch.Tensor | None = None,
             seq_lens_q: torch.Tensor | None = None, max_token_per_sequence: int | None = None,
             max_sequence_kv: int | None = None, v_indptr: torch.Tensor | None = None,
             o_indptr: torch.Tensor | None = None) -> None:
        """Plan one step: ``qo_indptr`` / ``kv_indptr`` (B+1,) pack the queries and the keys / values of each
        request. Separate ``v_indptr`` / ``o_indptr`` layouts are refused."""
        _check_prefill_args(custom_mask, packed_custom_mask, prefix_len_ptr, token_pos_in_items_ptr,
                            token_pos_in_items_len, max_item_len_ptr, fixed_split_size)
        check_unserved(v_indptr=v_indptr, o_indptr=o_indptr)
        check_heads(num_qo_heads, num_kv_heads, head_dim_qk)
        head_dim_v = head_dim_qk if head_dim_vo is None else head_dim_vo
        q_dtype, kv_dtype = plan_dtypes(q_data_type, kv_data_type, o_data_type)
        if kv_dtype != q_dtype:
            raise fail("kv_data_type", kv_dtype, f"q_data_type ({q_dtype}): ragged K/V in fp8 is not served")
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1:
                raise fail(name, type(t).__name__, "a 1-d int32 tensor")
        queries, keys = _query_shape(qo_indptr.tolist()), _query_shape(kv_indptr.tolist())
        total_q = queries[0]
        if self._use_cuda_graph:
            self._graph_check(qo_indptr.numel() - 1, queries, keys)
            assert self._qo_indptr_buf is not None and self._kv_indptr_buf is not None
            copy_into(self._qo_indptr_buf, qo_indptr, "qo_indptr")
            copy_into(self._kv_indptr_buf, kv_indptr, "kv_indptr")
            qo, kv = self._qo_indptr_buf, self._kv_indptr_buf
        else:
            qo = qo_indptr.to(self.device, torch.int32, non_blocking=True).contiguous()
            kv = kv_indptr.to(self.device, torch.int32, non_blocking=True).contiguous()
        self._batch_size, self._num_qo_heads, self._num_kv_heads = qo.numel() - 1, num_qo_heads, num_kv_heads
        self._cached_q_data_type, self._cached_kv_data_type, self._cached_o_data_type = q_dtype, kv_dtype, q_dtype
        self._qo_indptr_last = total_q
        self._start_step(Step(None, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_v, 0, q_dtype, kv_dtype,
                              (total_q, num_qo_heads, head_dim_v), None, qo, kv))

    begin_forward = plan

    def _graph_check(self, batch: int, queries: tuple[int, int, bool], keys: tuple[int, int, bool]) -> None:
        """CUDA-graph ``plan``: the switchboard plan made at the first one serves later steps with the same batch and
        row counts, no longer request and the same mix of query lengths."""
        shape = (batch, queries[0], keys[0], queries[1], keys[1], queries[2])
        first = self._graph_shape
        if batch != self._fixed_batch_size:
            raise fail("qo_indptr", f"{batch} requests",
                       f"the batch size fixed at construction ({self._fixed_batch_size}) when use_cuda_graph=True")
        if first is not None and (shape[:3] != first[:3] or shape[3] > first[3] or shape[4] > first[4]
                                  or shape[5] != first[5]):
            raise fail("qo_indptr/kv_indptr", f"(batch, rows, kv rows, longest q, longest kv, mixed) = {shape}",
                       f"the first CUDA-graph plan's {first}: same rows, no longer request, same mix")
        self._graph_shape = first or shape

    def _native(self, step: Step, sm_scale: float, cap: float | None, window: int | None, causal: bool,
                return_lse: bool, lse_base2: bool, kv_scale_tensor: bool) -> Any:
        assert step.qo_indptr is not None and step.kv_indptr is not None
        return attention.plan_prefill_ragged(
            step.qo_indptr, step.kv_indptr, num_q_heads=step.num_qo_heads, num_kv_heads=step.num_kv_heads,
            head_dim=step.head_dim, head_dim_v=step.head_dim_v, dtype=step.q_dtype, causal=causal, sm_scale=sm_scale,
            logits_soft_cap=cap, window_left=window, return_lse=return_lse, lse_base2=lse_base2,
            capturable=self._use_cuda_graph)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, o_scale: float | None = None,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None, return_lse: bool = False,
            enable_pdl: bool | None = None, kv_cache_sf: Any = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Prefill attention of q (qo_indptr[-1], Hq, D) over k (kv_indptr[-1], Hkv, D), v (…, Hkv, Dv): out in q's
        dtype [, lse float32, base 2]; ``out`` / ``lse`` given are written (by the kernel, or a copy where the
        chosen kernel allocates its own)."""
        if args or kv_cache_sf is not None or o_scale is not None:
            check_run_extras(args, kv_cache_sf=kv_cache_sf, o_scale=o_scale)
        return self._ragged(q, k, v, q_scale, k_scale, v_scale, out, lse, return_lse)

    def _ragged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: Any, k_scale: Any, v_scale: Any,
                out: torch.Tensor | None, lse: torch.Tensor | None,
                return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The ragged run: FlashInfer's scales (q / k scales fold into the softmax scale, v_scale multiplies the
        output) over a plan whose LSE, when returned, is base 2."""
        step = self._step
        if step is None:
            raise fail("plan", "not called", "plan() before run()")
        factor = _factor(q_scale, "q_scale")
        ks = _factor(k_scale, "k_scale")
        if ks is not None:
            factor = ks * (factor or 1.0)
        post = _factor(v_scale, "v_scale")
        plan = self._current.get((factor, return_lse, return_lse, False))  # an LSE wanted is FlashInfer's, base 2
        if plan is None:
            plan = self._plan_for(factor, return_lse, return_lse)
        if out is not None and not (isinstance(out, torch.Tensor) and out.stride(-1) == 1):
            _check_out(out, "out", step.out_shape, step.q_dtype, q)
        if not return_lse:
            o = plan.run(q, k, v, out=out)
            return o if post is None else o.mul_(post)
        if lse is not None and not (isinstance(lse, torch.Tensor) and lse.stride(-1) == 1):
            _check_out(lse, "lse", step.out_shape[:2], torch.float32, q)
        o, s = plan.run(q, k, v, out=out, lse=lse)
        return (o if post is None else o.mul_(post)), s

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, window_left: int = -1,
                logits_soft_cap: float | None = None, sm_scale: float | None = None, rope_scale: float | None = None,
                rope_theta: float | None = None) -> torch.Tensor:
        """Deprecated by FlashInfer: sets these attention parameters for this and later runs, then :meth:`run`."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        return self.run(q, k, v)  # type: ignore[return-value]

    def forward_return_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                           window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
                           rope_scale: float | None = None, rope_theta: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated by FlashInfer: :meth:`forward` returning (out, lse)."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, causal)
        return self.run(q, k, v, return_lse=True)  # type: ignore[return-value]


# -- single request ---------------------------------------------------------------------------------------------
def single_prefill_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 scale_q: torch.Tensor | None = None, scale_k: torch.Tensor | None = None,
                                 scale_v: torch.Tensor | None = None, o_dtype: torch.dtype | None = None,
                                 custom_mask: torch.Tensor | None = None,
                                 packed_custom_mask: torch.Tensor | None = None, causal: bool = False,
                                 kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                 use_fp16_qk_reduction: bool = False, sm_scale: float | None = None,
                                 window_left: int = -1, logits_soft_cap: float | None = None,
                                 rope_scale: float | None = None, rope_theta: float | None = None,
                                 backend: str = "auto", return_lse: bool = False, kv_cache_sf: Any = None,
                                 k_scale: float | None = None,
                                 v_scale: float | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention of one request: q (qo_len, Hq, D) over k (kv_len, Hkv, D), v (kv_len, Hkv, Dv) (``"NHD"``;
    ``"HND"``: (Hkv, kv_len, ...)) -> out (qo_len, Hq, Dv) [, lse (qo_len, Hq) float32, base 2]. ``custom_mask``
    (qo_len, kv_len) bool (True = attend) is served without LSE, window or soft cap."""
    check_layout(kv_layout)
    check_pos_encoding(pos_encoding_mode)
    check_unserved(scale_q=scale_q, scale_k=scale_k, scale_v=scale_v, packed_custom_mask=packed_custom_mask,
                   kv_cache_sf=kv_cache_sf)
    if o_dtype is not None and o_dtype != q.dtype:
        raise fail("o_dtype", o_dtype, f"None or q's dtype ({q.dtype})")
    if custom_mask is not None:
        return _masked(q, k, v, custom_mask, causal, kv_layout, sm_scale, window_left, logits_soft_cap, return_lse,
                       k_scale, v_scale)
    out, lse = single_attention(q, k, v, kv_layout, causal=causal, q_scale=None, k_scale=k_scale, v_scale=v_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                                return_lse=return_lse)
    return (out, lse) if return_lse else out  # type: ignore[return-value]


#: :func:`single_prefill_with_kv_cache` with ``return_lse=True`` (a partial, as FlashInfer's)
single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, causal: bool, kv_layout: str,
            sm_scale: Any, window_left: int, logits_soft_cap: Any, return_lse: bool, k_scale: Any,
            v_scale: Any) -> torch.Tensor:
    """A custom (qo_len, kv_len) mask through ``attention.dense`` (which has no LSE, window or soft cap). As in
    FlashInfer, the mask replaces ``causal``."""
    check_unserved(logits_soft_cap=logits_soft_cap or None)
    if return_lse:
        raise fail("return_lse", return_lse, "False when custom_mask is given (the masked path has no LSE)")
    if window_left != -1:
        raise fail("window_left", window_left, "-1 when custom_mask is given")
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
        raise fail("custom_mask", type(mask).__name__ if not isinstance(mask, torch.Tensor) else mask.dtype,
                   "a (qo_len, kv_len) bool tensor")
    if kv_layout == "NHD":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    sm = (1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)) * scale_value(k_scale, "k_scale")
    out = attention.dense(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, sm_scale=sm)
    out = out[0].transpose(0, 1).contiguous()
    post = scale_value(v_scale, "v_scale")
    return out * post if post != 1.0 else out
