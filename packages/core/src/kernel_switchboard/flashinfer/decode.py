"""``flashinfer.decode`` over the switchboard: :class:`BatchDecodeWithPagedKVCacheWrapper` (and its CUDA-graph
subclass), :func:`fast_decode_plan` and :func:`single_decode_with_kv_cache`.

The wrapper's ``plan`` builds a :class:`~kernel_switchboard.PageTable` from FlashInfer's CSR pages and makes a
``kernel_switchboard.attention.plan_decode`` plan; ``run`` calls that plan's ``run``. With ``use_cuda_graph=True``
the caller's fixed indptr / indices / last-page-length buffers are read at every run (see
:class:`~kernel_switchboard.flashinfer._common.GraphTable`), so they may be rewritten in place between replays.
Several query tokens per request (``q_len_per_req > 1``) run as a causal paged prefill.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..errors import fail
from ..ops import attention
from ._common import (
    LOG2E,
    GraphTable,
    check_graph_buffers,
    check_layout,
    check_page_size,
    check_pos_encoding,
    copy_into,
    csr_table,
    merge_legacy_args,
    page_counts,
    scale_value,
    soft_cap_of,
    window_of,
)
from ._paged import PagedWrapper, Step, check_heads, check_run_extras, plan_dtypes

#: plan's optional arguments in their positional order (FlashInfer still accepts them positionally)
_PLAN_ARGS = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type",
              "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens",
              "fixed_split_size", "disable_split_kv", "q_len_per_req")


class BatchDecodeWithPagedKVCacheWrapper(PagedWrapper):
    """FlashInfer's batch decode wrapper: ``plan`` once per step, ``run`` per layer.

    ``backend`` and ``use_tensor_cores`` are accepted and do not change the result: the switchboard ranks its own
    kernels. ``jit_args`` (custom FlashInfer kernels) is refused.
    """

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None, backend: str = "auto",
                 jit_args: list[Any] | None = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        self._use_tensor_cores = bool(use_tensor_cores)
        if use_cuda_graph:
            check_graph_buffers("the caller's fixed buffers", {"paged_kv_indptr_buffer": paged_kv_indptr_buffer,
                                                               "paged_kv_indices_buffer": paged_kv_indices_buffer,
                                                               "paged_kv_last_page_len_buffer":
                                                                   paged_kv_last_page_len_buffer})
            assert paged_kv_indptr_buffer is not None and paged_kv_last_page_len_buffer is not None
            self._fixed_batch_size = paged_kv_last_page_len_buffer.numel()
            if paged_kv_indptr_buffer.numel() != self._fixed_batch_size + 1:
                raise fail("paged_kv_indptr_buffer", f"{paged_kv_indptr_buffer.numel()} entries",
                           f"batch_size + 1 = {self._fixed_batch_size + 1} (one more than paged_kv_last_page_len_buffer)")
        else:
            self._fixed_batch_size = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._graph_tables: dict[int, GraphTable] = {}
        self._qo_indptrs: dict[tuple[int, int], torch.Tensor] = {}
        self._q_len_per_req = 1

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    # -- plan ------------------------------------------------------------------------------------------------------
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *deprecated_positional_args: Any, **kwargs: Any) -> None:
        """Plan the runs of one step: ``indptr`` (B+1,), ``indices`` (indptr[-1],) and ``last_page_len`` (B,) int32
        describe each request's pages. Keyword arguments as FlashInfer's (``window_left``, ``logits_soft_cap``,
        ``q_data_type``, ``kv_data_type``, ``sm_scale``, ``q_len_per_req``, ...); positional ones are accepted in
        FlashInfer's legacy order."""
        kwargs = merge_legacy_args(type(self).__name__, _PLAN_ARGS, deprecated_positional_args, kwargs)
        self._plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    begin_forward = plan

    def _plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
              num_kv_heads: int, head_dim: int, page_size: int, *, pos_encoding_mode: str = "NONE",
              window_left: int = -1, window_right: int = 0, logits_soft_cap: float | None = None,
              q_data_type: Any = "float16", kv_data_type: Any = None, o_data_type: Any = None, data_type: Any = None,
              sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
              non_blocking: bool = True, block_tables: torch.Tensor | None = None, seq_lens: torch.Tensor | None = None,
              fixed_split_size: int | None = None, disable_split_kv: bool = False, q_len_per_req: int = 1,
              copy_buffers: bool = True, host_indptr: torch.Tensor | None = None) -> None:
        check_heads(num_qo_heads, num_kv_heads, head_dim)
        page_size = check_page_size(page_size)
        if window_right != 0:
            raise fail("window_right", window_right, "0 (a right window is not served)")
        if fixed_split_size is not None and fixed_split_size > 0:
            raise fail("fixed_split_size", fixed_split_size,
                       "None or -1: fixed KV split sizes (batch-invariant reductions) are not served")
        if not (isinstance(q_len_per_req, int) and q_len_per_req >= 1):
            raise fail("q_len_per_req", q_len_per_req, "a positive int")
        q_dtype, kv_dtype = plan_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                         q_len_per_req > 1)
        batch = last_page_len.numel() if isinstance(last_page_len, torch.Tensor) else -1
        if self._use_cuda_graph:
            table, max_kv = self._graph_step(indptr, indices, last_page_len, batch, page_size, q_len_per_req,
                                             copy_buffers, host_indptr)
        else:
            table, max_kv = csr_table(indptr, indices, page_size, self.device, last_page_len=last_page_len), None
        qo = self._qo_indptr(table.batch_size, q_len_per_req) if q_len_per_req > 1 else None
        rows = table.batch_size * q_len_per_req
        self._batch_size, self._num_qo_heads, self._num_kv_heads = table.batch_size, num_qo_heads, num_kv_heads
        self._cached_q_data_type, self._cached_kv_data_type, self._cached_o_data_type = q_dtype, kv_dtype, q_dtype
        self._q_len_per_req = q_len_per_req
        self._start_step(Step(table, num_qo_heads, num_kv_heads, head_dim, head_dim, page_size, q_dtype, kv_dtype,
                              (rows, num_qo_heads, head_dim), max_kv, qo))

    def _graph_step(self, indptr: Any, indices: Any, last_page_len: Any, batch: int, page_size: int, q_len: int,
                    copy_buffers: bool, host_indptr: Any) -> tuple[Any, int]:
        """CUDA-graph ``plan``: the step's values go into the caller's buffers, which the table reads at every run."""
        if batch != self._fixed_batch_size:
            raise fail("last_page_len", f"{batch} requests",
                       f"the batch size fixed at construction ({self._fixed_batch_size}) when use_cuda_graph=True")
        if self._step is not None and q_len != self._q_len_per_req:
            raise fail("q_len_per_req", q_len, f"{self._q_len_per_req}: part of the frozen CUDA-graph shape")
        assert self._paged_kv_indptr_buf is not None and self._paged_kv_indices_buf is not None
        assert self._paged_kv_last_page_len_buf is not None
        if copy_buffers:
            copy_into(self._paged_kv_indptr_buf, indptr, "indptr")
            copy_into(self._paged_kv_last_page_len_buf, last_page_len, "last_page_len")
            copy_into(self._paged_kv_indices_buf, indices, "indices")
        graph = self._graph_tables.get(page_size)
        if graph is None:
            graph = self._graph_tables[page_size] = GraphTable(
                self._paged_kv_indptr_buf, self._paged_kv_indices_buf, page_size,
                last_page_len_buf=self._paged_kv_last_page_len_buf, workspace=self._float_workspace_buffer)
        graph.check(page_counts(host_indptr if host_indptr is not None else indptr))
        graph.refresh()
        self._graph = graph
        return graph.table, graph.max_kv_len

    def _qo_indptr(self, batch: int, q_len: int) -> torch.Tensor:
        key = (batch, q_len)
        qo = self._qo_indptrs.get(key) if self._use_cuda_graph else None
        if qo is None:
            qo = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=self.device)
            if self._use_cuda_graph:
                self._qo_indptrs[key] = qo
        return qo

    def _native(self, step: Step, sm_scale: float, cap: float | None, window: int | None, causal: bool,
                return_lse: bool, lse_base2: bool, kv_scale_tensor: bool) -> Any:
        assert step.table is not None
        common: dict[str, Any] = {
            "num_q_heads": step.num_qo_heads, "num_kv_heads": step.num_kv_heads, "head_dim": step.head_dim,
            "dtype": step.q_dtype, "kv_dtype": step.kv_dtype, "layout": self._kv_layout, "page_size": step.page_size,
            "sm_scale": sm_scale, "logits_soft_cap": cap, "window_left": window, "return_lse": return_lse,
            "lse_base2": lse_base2, "max_kv_len": step.max_kv_len, "capturable": self._use_cuda_graph,
            "kv_scale_tensor": kv_scale_tensor}
        if step.qo_indptr is None:
            return attention.plan_decode(step.table, **common)
        return attention.plan_prefill(step.table, step.qo_indptr, causal=True, **common)

    # -- run -------------------------------------------------------------------------------------------------------
    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False, enable_pdl: bool | None = None,
            window_left: int | None = None, sinks: torch.Tensor | None = None, q_len_per_req: int | None = None,
            skip_softmax_threshold_scale_factor: float | None = None,
            kv_cache_sf: Any = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decode attention of q (B * q_len_per_req, Hq, D) over the planned pages: out (…, Hq, D) in q's dtype
        [, lse (…, Hq) float32, base 2]. ``paged_kv_cache``: a (k, v) pair or one (pages, 2, ...) tensor in the
        wrapper's layout; fp8 pages dequantise by ``k_scale`` / ``v_scale``. ``enable_pdl`` is a launch hint."""
        if args or sinks is not None or skip_softmax_threshold_scale_factor is not None or kv_cache_sf is not None:
            check_run_extras(args, sinks=sinks, skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                             kv_cache_sf=kv_cache_sf)
        if window_left is not None and window_left != self._window_left:
            raise fail("window_left", window_left, f"None or the planned window_left ({self._window_left})")
        if q_len_per_req is not None and q_len_per_req != self._q_len_per_req:
            raise fail("q_len_per_req", q_len_per_req, f"None or the planned q_len_per_req ({self._q_len_per_req})")
        return self._attend(q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, pos_encoding_mode: str = "NONE",
                q_scale: float | None = None, k_scale: float | None = None, v_scale: float | None = None,
                window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
                rope_scale: float | None = None, rope_theta: float | None = None) -> torch.Tensor:
        """Deprecated by FlashInfer: sets these attention parameters for this and later runs, then :meth:`run`."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                         self._causal)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)  # type: ignore[return-value]

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, pos_encoding_mode: str = "NONE",
                           q_scale: float | None = None, k_scale: float | None = None, v_scale: float | None = None,
                           window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
                           rope_scale: float | None = None, rope_theta: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated by FlashInfer: :meth:`forward` returning (out, lse)."""
        self._set_params(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                         self._causal)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,  # type: ignore[return-value]
                        return_lse=True)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: :class:`BatchDecodeWithPagedKVCacheWrapper` with
    ``use_cuda_graph=True`` and the caller's fixed buffers."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor, indices_buffer: torch.Tensor,
                 last_page_len_buffer: torch.Tensor, kv_layout: str = "NHD", use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


def fast_decode_plan(self: BatchDecodeWithPagedKVCacheWrapper, indptr: torch.Tensor, indices: torch.Tensor,
                     last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
                     pos_encoding_mode: str = "NONE", window_left: int = -1, logits_soft_cap: float | None = None,
                     q_data_type: Any = None, kv_data_type: Any = None, data_type: Any = None,
                     sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
                     non_blocking: bool = True, fixed_split_size: int | None = None, disable_split_kv: bool = False,
                     q_len_per_req: int = 1, global_override_indptr_cpu: torch.Tensor | None = None) -> None:
    """FlashInfer's ``plan`` without the copies into a CUDA-graph wrapper's buffers (the caller has written them);
    ``global_override_indptr_cpu``, when given, is the host copy of ``indptr`` used for the page counts."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise fail("self", type(self).__name__, "a kernel_switchboard.flashinfer BatchDecodeWithPagedKVCacheWrapper")
    self._plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
               pos_encoding_mode=pos_encoding_mode, window_left=window_left, logits_soft_cap=logits_soft_cap,
               q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale,
               rope_scale=rope_scale, rope_theta=rope_theta, non_blocking=non_blocking,
               fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req,
               copy_buffers=False, host_indptr=global_override_indptr_cpu)


# -- single request ---------------------------------------------------------------------------------------------
def single_decode_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str = "NHD",
                                pos_encoding_mode: str = "NONE", use_tensor_cores: bool = False,
                                q_scale: float | None = None, k_scale: float | None = None,
                                v_scale: float | None = None, window_left: int = -1,
                                logits_soft_cap: float | None = None, sm_scale: float | None = None,
                                rope_scale: float | None = None, rope_theta: float | None = None,
                                return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one request: q (Hq, D) over k, v (kv_len, Hkv, D) (``"NHD"``) or (Hkv, kv_len, D)
    (``"HND"``) -> out (Hq, D) [, lse (Hq,) float32, base 2]. fp8 k / v are read as stored × scale."""
    check_layout(kv_layout)
    check_pos_encoding(pos_encoding_mode)
    out, lse = single_attention(q.unsqueeze(0), k, v, kv_layout, causal=True, q_scale=q_scale, k_scale=k_scale,
                                v_scale=v_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                                sm_scale=sm_scale, return_lse=return_lse)
    if return_lse:
        assert lse is not None
        return out.squeeze(0), lse.squeeze(0)
    return out.squeeze(0)


def single_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str, *, causal: bool,
                     q_scale: Any, k_scale: Any, v_scale: Any, window_left: int, logits_soft_cap: Any, sm_scale: Any,
                     return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One request's attention, q (Tq, Hq, D) over contiguous k / v, through ``attention.prefill_ragged``: FlashInfer's
    scale handling (q and k scales fold into the softmax scale, v_scale multiplies the output; fp8 k / v widen
    exactly to q's dtype), LSE in base 2."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise fail(name, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__, "a 3-d tensor")
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    k, v = k.contiguous(), v.contiguous()
    sm = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    sm *= scale_value(q_scale, "q_scale") * scale_value(k_scale, "k_scale")
    device = q.device
    qo = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=device)
    kv = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=device)
    res = attention.prefill_ragged(q, k, v, qo, kv, causal=causal, sm_scale=sm,
                                   logits_soft_cap=soft_cap_of(logits_soft_cap), window_left=window_of(window_left),
                                   return_lse=return_lse)
    out, lse = res if isinstance(res, tuple) else (res, None)
    post = scale_value(v_scale, "v_scale")
    if post != 1.0:
        out = out * post
    if lse is not None:
        lse = lse * LOG2E
    return out, lse  # type: ignore[return-value]
