"""``flashinfer.cascade`` over the switchboard: :func:`merge_state`, :func:`merge_state_in_place`,
:func:`merge_states` (through ``attention.merge_states``, converting FlashInfer's base-2 log-sum-exp) and
:class:`MultiLevelCascadeAttentionWrapper` (one paged prefill plan per level, merged in natural log)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import fail
from ..ops import attention
from ._common import LN2, LOG2E, check_layout
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states over disjoint KV segments: v (T, H, D), s (T, H) base-2 log-sum-exp
    (-inf = empty segment) -> (v, s) of the union."""
    out, lse = attention.merge_states(v_a, _natural(s_a, "s_a"), v_b, _natural(s_b, "s_b"))
    return out, lse.mul_(LOG2E)


def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                         mask: torch.Tensor | None = None) -> None:
    """Merge ``(v_other, s_other)`` into ``(v, s)`` in place; with ``mask`` (T,) bool, only the rows where it holds."""
    out, lse = merge_state(v, s, v_other, s_other)
    if mask is not None:
        if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == v.shape[:1]):
            raise fail("mask", mask if not isinstance(mask, torch.Tensor) else f"{tuple(mask.shape)} {mask.dtype}",
                       f"None or a ({v.shape[0]},) bool tensor")
        out = torch.where(mask[:, None, None], out, v)
        lse = torch.where(mask[:, None], lse, s.to(torch.float32))
    v.copy_(out)
    s.copy_(lse)


def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge S attention states: v (T, S, H, D), s (T, S, H) base 2 -> (v (T, H, D), s (T, H)), pairwise through
    ``attention.merge_states`` (a merge of states is associative, so the order does not change the result)."""
    if not (isinstance(v, torch.Tensor) and v.dim() == 4 and v.shape[1] >= 1):
        raise fail("v", tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__,
                   "a (seq_len, num_states >= 1, num_heads, head_dim) tensor")
    if not (isinstance(s, torch.Tensor) and s.shape == v.shape[:3]):
        raise fail("s", tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__,
                   f"{tuple(v.shape[:3])}: one log-sum-exp per (token, state, head)")
    natural = _natural(s, "s")
    out, lse = v[:, 0].contiguous(), natural[:, 0].contiguous()
    for i in range(1, v.shape[1]):
        out, lse = attention.merge_states(out, lse, v[:, i].contiguous(), natural[:, i].contiguous())
    return out, lse * LOG2E


def _natural(s: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        raise fail(name, type(s).__name__, "a float32 tensor of base-2 log-sum-exps")
    return (s.to(torch.float32) * LN2).contiguous()


class MultiLevelCascadeAttentionWrapper:
    """FlashInfer's multi-level cascade: level i's KV (shared prefixes first, each request's own pages last) is
    attended by the queries ``qo_indptr_arr[i]`` groups together; only the last level is causal. One paged prefill
    wrapper per level; their states are merged."""

    def __init__(self, num_levels: int, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf_arr: list[torch.Tensor] | None = None,
                 paged_kv_indptr_buf_arr: list[torch.Tensor] | None = None,
                 paged_kv_indices_buf_arr: list[torch.Tensor] | None = None,
                 paged_kv_last_page_len_buf_arr: list[torch.Tensor] | None = None) -> None:
        if not (isinstance(num_levels, int) and num_levels >= 1):
            raise fail("num_levels", num_levels, "a positive int")
        check_layout(kv_layout)
        if use_cuda_graph:
            arrays = {"qo_indptr_buf_arr": qo_indptr_buf_arr, "paged_kv_indptr_buf_arr": paged_kv_indptr_buf_arr,
                      "paged_kv_indices_buf_arr": paged_kv_indices_buf_arr,
                      "paged_kv_last_page_len_buf_arr": paged_kv_last_page_len_buf_arr}
            for name, arr in arrays.items():
                if not isinstance(arr, (list, tuple)) or len(arr) != num_levels:
                    raise fail(name, type(arr).__name__, f"a list of {num_levels} buffers when use_cuda_graph=True")
            assert qo_indptr_buf_arr is not None and paged_kv_indptr_buf_arr is not None
            assert paged_kv_indices_buf_arr is not None and paged_kv_last_page_len_buf_arr is not None
            self._batch_prefill_wrappers = [
                BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph=True,
                                                    qo_indptr_buf=qo, paged_kv_indptr_buf=indptr,
                                                    paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last)
                for qo, indptr, indices, last in zip(qo_indptr_buf_arr, paged_kv_indptr_buf_arr,
                                                     paged_kv_indices_buf_arr, paged_kv_last_page_len_buf_arr)]
        else:
            self._batch_prefill_wrappers = [BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
                                            for _ in range(num_levels)]
        self._num_levels, self._kv_layout, self._use_cuda_graph = num_levels, kv_layout, bool(use_cuda_graph)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor,
                               int_workspace_buffers: list[torch.Tensor]) -> None:
        for wrapper, int_buffer in zip(self._batch_prefill_wrappers, int_workspace_buffers):
            wrapper.reset_workspace_buffer(float_workspace_buffer, int_buffer)

    def plan(self, qo_indptr_arr: list[torch.Tensor], paged_kv_indptr_arr: list[torch.Tensor],
             paged_kv_indices_arr: list[torch.Tensor], paged_kv_last_page_len: list[torch.Tensor], num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: float | None = None, window_left: int = -1,
             logits_soft_cap: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             q_data_type: Any = "float16", kv_data_type: Any = None) -> None:
        """Plan every level: one entry per level in each array, as FlashInfer's."""
        for name, arr in (("qo_indptr_arr", qo_indptr_arr), ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                          ("paged_kv_indices_arr", paged_kv_indices_arr),
                          ("paged_kv_last_page_len", paged_kv_last_page_len)):
            if not isinstance(arr, (list, tuple)) or len(arr) != self._num_levels:
                raise fail(name, type(arr).__name__, f"a list of {self._num_levels} tensors (one per level)")
        last = self._num_levels - 1
        for i, wrapper in enumerate(self._batch_prefill_wrappers):
            wrapper.plan(qo_indptr_arr[i], paged_kv_indptr_arr[i], paged_kv_indices_arr[i], paged_kv_last_page_len[i],
                         num_qo_heads, num_kv_heads, head_dim, page_size, causal=causal if i == last else False,
                         pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                         sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache: Any) -> torch.Tensor:
        """Cascade attention of q (total queries, Hq, D) over every level's pages -> out (…, Hq, D)."""
        out, lse = self._batch_prefill_wrappers[-1]._attend(q, paged_kv_cache, None, None, None, None, None, True,
                                                           base2=False)
        for wrapper in self._batch_prefill_wrappers[:-1]:
            out_i, lse_i = wrapper._attend(q, paged_kv_cache, None, None, None, None, None, True, base2=False)
            out, lse = attention.merge_states(out, lse, out_i, lse_i)
        return out  # type: ignore[no-any-return]

    forward = run
