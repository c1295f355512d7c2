"""``flashinfer.pod`` over the switchboard: the prefill-on-decode (POD) wrappers of a chunked-prefill step, whose
prefill and decode requests are attended together.

- :class:`BatchPODWithPagedKVCacheWrapper`: paged prefill requests and one-token decode requests over one paged
  cache, in one launch where the kernel allows, through ``attention.plan_pod``.
- :class:`PODWithPagedKVCacheWrapper`: one prefill request over its own contiguous K/V (as
  ``single_prefill_with_kv_cache``) beside paged decode requests. Its prefill K/V are not in the paged cache, which
  ``plan_pod`` reads both parts from, so it runs two switchboard plans: ``plan_prefill_ragged`` for the prefill and
  the decode wrapper's plan for the decode part.

As in FlashInfer, ``plan`` takes the decode part's (and the batch wrapper's prefill part's) pages, window and softmax
scale; ``run`` takes ``causal_p``; there is no soft cap; ``q_scale`` / ``k_scale`` / ``v_scale`` apply to the decode part
only; LSE is base 2.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import fail
from ..ops import attention
from ._common import (
    LOG2E_TENSOR,
    check_jit_args,
    check_layout,
    check_page_size,
    check_pos_encoding,
    check_unserved,
    check_workspace,
    csr_table,
    page_counts,
    window_of,
)
from ._kv import KVForms
from ._paged import _factor, check_heads, check_run_extras, plan_dtypes
from .decode import BatchDecodeWithPagedKVCacheWrapper

#: prefill plans of :class:`PODWithPagedKVCacheWrapper` kept (one per prefill shape and parameters)
_MAX_PREFILL_PLANS = 16


class BatchPODWithPagedKVCacheWrapper:
    """FlashInfer's batch POD wrapper: ``plan`` once per step with both parts' pages, ``run`` per layer. Both parts
    must read one paged cache (an engine's layer cache): ``run`` refuses two different ones by name."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)
        check_layout(kv_layout)
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._kv = KVForms(kv_layout)
        self._use_cuda_graph = False
        self._plans: dict[tuple[bool, bool], Any] = {}
        self._step: tuple[Any, ...] | None = None
        self._pos_encoding_mode, self._window_left, self._logits_soft_cap = "NONE", -1, 0.0
        self._sm_scale: float | None = None
        self._rope_scale: float | None = None
        self._rope_theta: float | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def end_forward(self) -> None:
        """Deprecated by FlashInfer; does nothing."""

    def plan(self, qo_indptr_p: torch.Tensor, kv_indptr_p: torch.Tensor, kv_indices_p: torch.Tensor,
             last_page_len_p: torch.Tensor, qo_indptr_d: torch.Tensor, kv_indptr_d: torch.Tensor,
             kv_indices_d: torch.Tensor, last_page_len_d: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
             q_data_type: Any = "float16", kv_data_type: Any = None, data_type: Any = None,
             sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             non_blocking: bool = True) -> None:
        """Plan one step: the prefill requests' queries (``qo_indptr_p``) and pages (``kv_indptr_p``,
        ``kv_indices_p``, ``last_page_len_p``), the decode requests' (``qo_indptr_d``: one query each) and pages.
        The pages already hold every request's new tokens."""
        check_pos_encoding(pos_encoding_mode)
        check_heads(num_qo_heads, num_kv_heads, head_dim)
        page_size = check_page_size(page_size)
        window = window_of(window_left)
        if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and 0 < sm_scale < math.inf):
            raise fail("sm_scale", sm_scale, "a positive float or None (1/sqrt(head_dim))")
        q_dtype, kv_dtype = plan_dtypes(q_data_type, kv_data_type, None, data_type)
        prefill = csr_table(kv_indptr_p, kv_indices_p, page_size, self.device, last_page_len=last_page_len_p,
                            names=("kv_indptr_p", "kv_indices_p", "last_page_len_p"))
        decode = csr_table(kv_indptr_d, kv_indices_d, page_size, self.device, last_page_len=last_page_len_d,
                           names=("kv_indptr_d", "kv_indices_d", "last_page_len_d"))
        for name, t in (("qo_indptr_p", qo_indptr_p), ("qo_indptr_d", qo_indptr_d)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
                raise fail(name, type(t).__name__ if not isinstance(t, torch.Tensor) else f"{tuple(t.shape)} {t.dtype}",
                           "a 1-d int32 tensor")
        if qo_indptr_p.numel() != prefill.batch_size + 1:
            raise fail("qo_indptr_p", f"{qo_indptr_p.numel()} entries",
                       f"prefill batch + 1 = {prefill.batch_size + 1} (as kv_indptr_p)")
        decode_queries = page_counts(qo_indptr_d)
        if len(decode_queries) != decode.batch_size or any(n != 1 for n in decode_queries):
            raise fail("qo_indptr_d", f"query counts {sorted(set(decode_queries))} for {len(decode_queries)} requests",
                       f"one query for each of the {decode.batch_size} decode requests (as kv_indptr_d)")
        qo = qo_indptr_p.to(self.device, torch.int32, non_blocking=True).contiguous()
        self._step = (prefill, qo, decode, num_qo_heads, num_kv_heads, head_dim, page_size, q_dtype, kv_dtype,
                      sm_scale, window)
        self._pos_encoding_mode, self._window_left, self._sm_scale = pos_encoding_mode, window_left, sm_scale
        self._rope_scale, self._rope_theta = rope_scale, rope_theta
        self._cached_q_data_type, self._cached_kv_data_type = q_dtype, kv_dtype
        self._plans.clear()
        qo_lens, kv_lens = page_counts(qo), prefill.seq_lens.tolist()
        # the causal plan (what engines run) unless a prefill request has more queries than keys, made now
        self._plan_for(all(nq <= nk for nq, nk in zip(qo_lens, kv_lens)), False)

    begin_forward = plan

    def _plan_for(self, causal: bool, return_lse: bool) -> Any:
        assert self._step is not None
        prefill, qo, decode, hq, hkv, d, page_size, q_dtype, kv_dtype, sm_scale, window = self._step
        plan = attention.plan_pod(prefill, qo, decode, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype=q_dtype,
                                  kv_dtype=kv_dtype, layout=self._kv_layout, page_size=page_size, causal=causal,
                                  sm_scale=sm_scale, window_left=window, return_lse=return_lse, capturable=False)
        self._plans[(causal, return_lse)] = plan
        return plan

    def run(self, q_p: torch.Tensor, paged_kv_cache_p: Any, q_d: torch.Tensor, paged_kv_cache_d: Any,
            custom_mask_p: torch.Tensor | None = None, packed_custom_mask_p: torch.Tensor | None = None,
            causal_p: bool = False, q_scale: float | None = None, k_scale: float | None = None,
            v_scale: float | None = None, return_lse: bool = False, use_fp16_qk_reduction: bool = False,
            enable_pdl: bool | None = None) -> Any:
        """POD attention of q_p (qo_indptr_p[-1], Hq, D) and q_d (decode batch, Hq, D) over the planned pages:
        (out_p, out_d) in q's dtype, or ((out_p, out_d), (lse_p, lse_d)) with ``return_lse`` (float32, base 2).
        ``use_fp16_qk_reduction`` is a precision shortcut not taken; ``enable_pdl`` a launch hint."""
        if custom_mask_p is not None or packed_custom_mask_p is not None:
            check_unserved(custom_mask_p=custom_mask_p, packed_custom_mask_p=packed_custom_mask_p)
        for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
            if value is not None and (isinstance(value, torch.Tensor) or _factor(value, name) is not None):
                raise fail(name, value if not isinstance(value, torch.Tensor) else "a tensor",
                           "None or 1.0: FlashInfer applies it to the decode part only, and one POD launch has one "
                           "softmax scale and cache scale for both parts (use the decode and prefill wrappers)")
        if self._step is None:
            raise fail("plan", "not called", "plan() before run()")
        cache = self._kv.cache(paged_kv_cache_p)
        if paged_kv_cache_d is not paged_kv_cache_p:
            _check_same_pages(cache, self._kv.cache(paged_kv_cache_d))
        plan = self._plans.get((bool(causal_p), bool(return_lse)))
        if plan is None:
            plan = self._plan_for(bool(causal_p), bool(return_lse))
        res = plan.run(q_p, q_d, cache)
        if not return_lse:
            return res
        out_p, out_d, lse_p, lse_d = res
        return (out_p, out_d), (lse_p.mul_(LOG2E_TENSOR), lse_d.mul_(LOG2E_TENSOR))


def _check_same_pages(a: Any, b: Any) -> None:
    """The decode part's cache is the prefill part's: the same K and V memory, shapes, strides and dtype."""
    same = all(x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
               for x, y in ((a.k_pages, b.k_pages), (a.v_pages, b.v_pages)))
    if not same:
        raise fail("paged_kv_cache_d", "pages other than paged_kv_cache_p's",
                   "the same paged cache as paged_kv_cache_p (one POD launch reads both parts from one cache)")


class PODWithPagedKVCacheWrapper:
    """FlashInfer's POD wrapper: ``plan`` the decode part once per step (as the decode wrapper's ``plan``, without
    a soft cap), ``run`` per layer with the prefill request's q / k / v and the decode queries and pages. Two
    switchboard plans run (see the module docstring): the prefill part's is made at its first run for each prefill
    shape and parameters, so a CUDA graph is captured after a warm-up run, as engines do.

    The decode options of ``run`` that FlashInfer ignores (taking the planned values) are accepted where they agree
    with the plan and refused by name where they would not be honoured."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None, jit_args: list[Any] | None = None) -> None:
        check_jit_args(jit_args)
        self._decode = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout, use_cuda_graph=use_cuda_graph, use_tensor_cores=True,
            paged_kv_indptr_buffer=paged_kv_indptr_buffer, paged_kv_indices_buffer=paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
        self.device = self._decode.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._prefill_plans: dict[tuple[Any, ...], Any] = {}

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor) -> None:
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def end_forward(self) -> None:
        """Deprecated by FlashInfer; does nothing."""

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
             q_data_type: Any = "float16", kv_data_type: Any = None, data_type: Any = None,
             sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             non_blocking: bool = True) -> None:
        """Plan the decode part of one step: ``indptr`` (B+1,), ``indices``, ``last_page_len`` (B,) describe each
        decode request's pages (one query each)."""
        self._decode.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                          pos_encoding_mode=pos_encoding_mode, window_left=window_left, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                          rope_theta=rope_theta, non_blocking=non_blocking)
        if not self._use_cuda_graph:
            self._prefill_plans.clear()

    begin_forward = plan

    def run(self, q_p: torch.Tensor, k_p: torch.Tensor, v_p: torch.Tensor, q_d: torch.Tensor, paged_kv_cache_d: Any,
            custom_mask_p: torch.Tensor | None = None, packed_custom_mask_p: torch.Tensor | None = None,
            causal_p: bool = False, kv_layout_p: str = "NHD", pos_encoding_mode_p: str = "NONE",
            sm_scale_p: float | None = None, window_left_p: int = -1, rope_scale_p: float | None = None,
            rope_theta_p: float | None = None, return_lse_p: bool = False,
            custom_mask_d: torch.Tensor | None = None, packed_custom_mask_d: torch.Tensor | None = None,
            causal_d: bool = False, kv_layout_d: str = "NHD", pos_encoding_mode_d: str = "NONE",
            sm_scale_d: float | None = None, window_left_d: int = -1, rope_scale_d: float | None = None,
            rope_theta_d: float | None = None, q_scale: float | None = None, k_scale: float | None = None,
            v_scale: float | None = None, return_lse_d: bool = False, use_fp16_qk_reduction: bool = False,
            enable_pdl: bool | None = None, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(out_p (qo_len, Hq, D), out_d (B, Hq, D)) in q's dtype: the prefill of q_p over k_p, v_p (kv_len, Hkv, D)
        (``"HND"``: (Hkv, kv_len, D)), causal per ``causal_p`` (query i at kv_len - qo_len + i), window
        ``window_left_p``, softmax scale ``sm_scale_p`` (1/sqrt(D)); and the planned decode of q_d over
        ``paged_kv_cache_d`` with the decode scales. As in FlashInfer, no LSE is returned (``return_lse_p`` /
        ``return_lse_d`` change nothing)."""
        if args:
            check_run_extras(args)
        check_unserved(custom_mask_p=custom_mask_p, packed_custom_mask_p=packed_custom_mask_p,
                       custom_mask_d=custom_mask_d, packed_custom_mask_d=packed_custom_mask_d)
        check_pos_encoding(pos_encoding_mode_p)
        if pos_encoding_mode_d != "NONE":
            raise fail("pos_encoding_mode_d", pos_encoding_mode_d, "'NONE' (the decode part takes plan()'s)")
        check_layout(kv_layout_d)  # FlashInfer reads the wrapper's layout for the decode part, as here
        decode = self._decode
        if sm_scale_d is not None and sm_scale_d != decode._sm_scale:
            raise fail("sm_scale_d", sm_scale_d, f"None or the planned sm_scale ({decode._sm_scale})")
        if window_left_d != -1 and window_left_d != decode._window_left:
            raise fail("window_left_d", window_left_d, f"-1 or the planned window_left ({decode._window_left})")
        out_p = self._prefill(q_p, k_p, v_p, bool(causal_p), kv_layout_p, sm_scale_p, window_left_p)
        out_d = decode.run(q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)
        return out_p, out_d  # type: ignore[return-value]

    def _prefill(self, q: Any, k: Any, v: Any, causal: bool, kv_layout: str, sm_scale: Any, window_left: Any
                 ) -> torch.Tensor:
        """The prefill part: one request through a ``plan_prefill_ragged`` plan kept for its shape and parameters."""
        check_layout(kv_layout)
        for name, t in (("q_p", q), ("k_p", k), ("v_p", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise fail(name, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__,
                           "a 3-d tensor (tokens, heads, dim); (heads, tokens, dim) for k_p / v_p in HND")
        if kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise fail("k_p", f"k_p / v_p of {k.dtype} / {v.dtype}", f"q_p's dtype ({q.dtype})")
        window = window_of(window_left)
        sm = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
        key = (q.shape, k.shape, v.shape[-1], q.dtype, q.device, causal, sm, window)
        plan = self._prefill_plans.get(key)
        if plan is None:
            device = q.device
            qo = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=device)
            kv = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=device)
            check_heads(q.shape[1], k.shape[1], q.shape[2])
            plan = attention.plan_prefill_ragged(qo, kv, num_q_heads=q.shape[1], num_kv_heads=k.shape[1],
                                                 head_dim=q.shape[2], head_dim_v=v.shape[2], dtype=q.dtype,
                                                 causal=causal, sm_scale=sm, window_left=window,
                                                 capturable=self._use_cuda_graph)
            if len(self._prefill_plans) >= _MAX_PREFILL_PLANS:
                self._prefill_plans.clear()
            self._prefill_plans[key] = plan
        return plan.run(q, k, v)  # type: ignore[return-value]
