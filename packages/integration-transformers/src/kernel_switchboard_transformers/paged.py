"""``"paged|ksb"``: continuous batching (``model.generate_batch`` / ``ContinuousBatchingManager``) on switchboard plans.

transformers 5.16-5.18 switch a model loaded with ``attn_implementation="ksb"`` to ``"paged|ksb"`` when continuous
batching starts; 5.16 and 5.17 then call this function per layer with the packed batch: query ``(1, Hq, T, D)``
and the step's new key/value ``(1, Hkv, T, D)``, the paged cache object (``cache``), ``cu_seq_lens_q`` /
``cu_seq_lens_k`` (per layer type for hybrid models), ``max_seqlen_q`` / ``max_seqlen_k`` and the physical slots
every token is read from and written to (``read_index`` / ``write_index``, one per layer group). 5.18 reorganised
that cache (refused here by name); from 5.19 on, continuous batching accepts only transformers' own implementations
and raises before reaching this function.

Full-attention layers run on plans. The layer's cache tensor ``((pages + 2) * page_size, Hkv, D)`` is an NHD
:class:`~kernel_switchboard.PagedKVCache`; the block table of each request is read off the slots transformers reads
its tokens from (one slot per page, checked against every slot); new tokens go in with ``ksb.kv_cache.append``; then
``ksb.attention.plan_decode`` (one query token per request) or ``plan_prefill`` (chunked prefill and mixed batches)
is planned once per step and layer group and run by every layer of the group.

Sliding-window layers keep a rolling buffer whose slots are not a page table: their keys are gathered by the cache's
own ``update`` and attended with ``ksb.attention.plan_prefill_ragged`` under the window.

Refused by name: CUDA-graph capture (the plans read the batch's lengths on the host once per step: pass
``ContinuousBatchingConfig(use_cuda_graph=False)``), and the decode fast path's block table (transformers offers it
to flash implementations only).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
import transformers

import kernel_switchboard as ksb
from kernel_switchboard.errors import fail
from kernel_switchboard.ops.kv_cache import batch_indices_positions

from .attention import NAME, window_left_of

_Tensor = torch.Tensor
PAGED_NAME = f"paged|{NAME}"
_FULL, _SLIDING = "full_attention", "sliding_attention"
#: what this module reads of transformers' PagedAttentionCache (5.16-5.17; 5.18 reorganised it)
_CACHE_ATTRIBUTES = ("layer_index_to_group_indices", "sliding_windows", "key_cache", "value_cache", "block_size",
                     "num_key_value_heads", "head_dim", "update")


class _StepPlans:
    """Plans (and the tables they read) of the last few steps, keyed by the step's index tensors.

    The index tensors are views of transformers' static buffers, rewritten in place each step; the key holds the
    view itself (so its id cannot be reused) and its version counter (which every in-place write bumps)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: OrderedDict[tuple[Any, ...], tuple[tuple[_Tensor, ...], Any]] = OrderedDict()

    def get(self, tensors: tuple[_Tensor, ...], extra: tuple[Any, ...], build: Any) -> Any:
        key = (*((id(t), t._version) for t in tensors), *extra)
        hit = self.entries.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], tensors)):
            self.entries.move_to_end(key)
            return hit[1]
        value = build()
        self.entries[key] = (tensors, value)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value


_PLANS = _StepPlans()


def _per_type(value: Any, layer_type: str, name: str) -> Any:
    if isinstance(value, dict):
        if layer_type not in value:
            raise fail(name, sorted(value), f"an entry for {layer_type!r}")
        return value[layer_type]
    return value


def _rows(t: _Tensor) -> _Tensor:
    """(1, H, T, D) -> (T, H, D) contiguous."""
    if t.dim() != 4 or t.shape[0] != 1:
        raise fail("query/key/value.shape", tuple(t.shape), "(1, heads, tokens, head_dim): a packed batch")
    return t[0].transpose(0, 1).contiguous()


def _block_table(slots: _Tensor, kv_indptr: _Tensor, max_kv: int, page_size: int) -> tuple[_Tensor, _Tensor]:
    """(block_table (B, pages) int32, seq_lens (B,) int32) of the requests whose tokens are read from ``slots``
    (request b's tokens are ``slots[kv_indptr[b]:kv_indptr[b+1]]``, position order). Raises unless every slot is
    ``page * page_size + position % page_size`` of its request's pages."""
    starts, ends = kv_indptr[:-1].long(), kv_indptr[1:].long()
    seq_lens = (ends - starts).to(torch.int32)
    pages = max(1, math.ceil(max_kv / page_size))
    first = starts[:, None] + torch.arange(pages, device=slots.device)[None, :] * page_size
    first = torch.minimum(first, (ends - 1).clamp(min=0)[:, None]).clamp(max=max(slots.numel() - 1, 0))
    table = torch.div(slots[first], page_size, rounding_mode="floor").to(torch.int32)
    if slots.numel():
        token = torch.arange(slots.numel(), device=slots.device)
        request = torch.searchsorted(ends, token, right=True)
        position = token - starts[request]
        expected = table[request, position // page_size].long() * page_size + position % page_size
        if not torch.equal(expected, slots.long()):
            raise fail("read_index", "slots that are not whole pages in order",
                       f"each request's tokens in pages of {page_size} slots, as transformers' full-attention cache "
                       "lays them out (this transformers release lays its cache out otherwise)")
    return table.contiguous(), seq_lens.contiguous()


def paged_attention_forward(module: torch.nn.Module, query: _Tensor, key: _Tensor, value: _Tensor,
                            attention_mask: Any = None, scaling: float | None = None, dropout: float = 0.0,
                            softcap: float | None = None, sliding_window: int | None = None, **kwargs: Any
                            ) -> tuple[_Tensor, None]:
    """The ``"paged|ksb"`` entry of transformers' ``AttentionInterface`` (see the module docstring)."""
    cache = kwargs.get("cache")
    if cache is None:
        raise fail("cache", None, f"transformers' PagedAttentionCache: {PAGED_NAME!r} serves continuous batching "
                   "(generate_batch); load the model with attn_implementation='ksb' instead")
    if not all(hasattr(cache, name) for name in _CACHE_ATTRIBUTES):
        raise fail("cache", f"{type(cache).__name__} of transformers {transformers.__version__}",
                   f"the paged cache of transformers 5.16-5.17, the one {PAGED_NAME!r} reads (per-layer page tensors "
                   "in layer groups); on this release use generate() instead of generate_batch()")
    if dropout:
        raise fail("dropout", dropout, "0.0 (continuous batching is inference)")
    if kwargs.get("block_table") is not None:
        raise fail("block_table", "a decode fast-path block table", "None (offered to flash implementations only)")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise fail("use_cuda_graph", True, f"False for {PAGED_NAME!r}: its plans read the batch's lengths on the host "
                   "once per step (ContinuousBatchingConfig(use_cuda_graph=False))")
    layer = module.layer_idx
    group, in_group = cache.layer_index_to_group_indices[layer]
    window = cache.sliding_windows[layer]
    layer_type = _SLIDING if window > 1 else _FULL
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_k = _per_type(kwargs["cu_seq_lens_k"], layer_type, "cu_seq_lens_k").to(torch.int32)
    max_q = int(kwargs["max_seqlen_q"])
    max_k = int(_per_type(kwargs["max_seqlen_k"], layer_type, "max_seqlen_k"))
    q = _rows(query)
    dims: dict[str, Any] = {"num_q_heads": q.shape[1], "num_kv_heads": key.shape[1], "head_dim": q.shape[2],
            "head_dim_v": value.shape[-1], "dtype": q.dtype, "sm_scale": scaling, "logits_soft_cap": softcap}
    if layer_type == _SLIDING:
        k_all, v_all = cache.update(key_states=key, value_states=value, layer_idx=layer,
                                    read_index=kwargs["read_index"], write_index=kwargs["write_index"])
        plan = _PLANS.get((cu_q, cu_k), (tuple(dims.items()), window), lambda: ksb.attention.plan_prefill_ragged(
            cu_q, cu_k, causal=True, window_left=window_left_of(window), capturable=False, **dims))
        out = plan.run(q, k_all.contiguous(), v_all.contiguous())
    else:
        out = _full_attention(cache, group, in_group, q, key, value, cu_q, cu_k, max_q, max_k, dims, kwargs)
    assert isinstance(out, torch.Tensor)
    return out.unsqueeze(0), None


def _full_attention(cache: Any, group: int, in_group: int, q: _Tensor, key: _Tensor, value: _Tensor, cu_q: _Tensor,
                    cu_k: _Tensor, max_q: int, max_k: int, dims: dict[str, Any], kwargs: dict[str, Any]) -> _Tensor:
    page_size = cache.block_size
    read, write = kwargs["read_index"][group], kwargs["write_index"][group]
    slots, indptr = (read, cu_k) if read.numel() else (write, cu_q)  # a first prefill reads nothing back
    shape = (-1, page_size, cache.num_key_value_heads, cache.head_dim)
    kv = ksb.PagedKVCache(cache.key_cache[in_group].view(shape), cache.value_cache[in_group].view(shape), "NHD")

    def build() -> tuple[ksb.PageTable, _Tensor, _Tensor, Any]:
        block_table, seq_lens = _block_table(slots, indptr, max_k, page_size)
        table = ksb.PageTable(block_table, seq_lens, max_seq_len=max_k)
        rows, positions = batch_indices_positions(cu_q, seq_lens, q.shape[0])
        plan: Any
        if max_q == 1:
            plan = ksb.attention.plan_decode(table, layout="NHD", page_size=page_size, capturable=False, **dims)
        else:
            plan = ksb.attention.plan_prefill(table, cu_q, layout="NHD", page_size=page_size, causal=True,
                                              capturable=False, **dims)
        return table, rows, positions, plan

    table, rows, positions, plan = _PLANS.get((slots, cu_q), (tuple(dims.items()), group, page_size), build)
    ksb.kv_cache.append(_rows(key), _rows(value), kv, table, positions, rows)
    return plan.run(q, kv)
