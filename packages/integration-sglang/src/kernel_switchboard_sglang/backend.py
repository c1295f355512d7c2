"""The switchboard as an SGLang attention backend.

SGLang keeps each layer's K and V as token-major buffers (slots, kv_heads, head_dim); with page size S,
slot ``s`` lies in page ``s // S`` at offset ``s % S``, so the buffers are an NHD ``ksb.PagedKVCache`` viewed as
(slots / S, S, kv_heads, head_dim). A request's pages are every S-th entry of its ``req_to_token`` row.

- ``init_forward_metadata`` runs once per step: it builds the ``ksb.PageTable`` (block table from
  ``req_to_token``, lengths from ``seq_lens``) and plans the step once per distinct layer configuration:
  ``plan_decode`` for decode batches, ``plan_prefill`` for extend and mixed batches (new tokens after a cached
  prefix, decode rows among them).
- ``forward_decode`` / ``forward_extend`` write the layer's new K/V at ``out_cache_loc``
  (``ksb.kv_cache.append_slots``) and run the step's plan.

CUDA graphs: decode batches. ``init_cuda_graph_state`` allocates a block table and lengths that the plans made
at capture read; ``init_forward_metadata_in_graph`` refills them from SGLang's buffers inside the graph, so a
replay plans nothing and reads the new step's pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

import kernel_switchboard as ksb

from . import BACKEND_NAME

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class LayerKey:
    """What a plan fixes about a layer: its head counts and dims, softmax scale, soft-cap and window."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    sm_scale: float
    logits_soft_cap: float | None
    window_left: int | None


def layer_key(layer: RadixAttention) -> LayerKey:
    """The plan key of ``layer``; refuses what the switchboard's paged attention does not implement, by name."""
    refused = []
    if layer.is_cross_attention:
        refused.append("cross-attention")
    if layer.attn_type != AttentionType.DECODER:
        refused.append(f"attn_type={layer.attn_type}")
    if getattr(layer, "use_irope", False):
        refused.append("chunked local attention (use_irope)")
    if layer.logit_cap and getattr(layer, "logit_capping_method", "tanh") != "tanh":
        refused.append(f"logit_capping_method={layer.logit_capping_method!r}")
    if getattr(layer, "pos_encoding_mode", "NONE") != "NONE":
        refused.append(f"pos_encoding_mode={layer.pos_encoding_mode!r}")
    if refused:
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend does not support {', '.join(refused)}")
    window = layer.sliding_window_size
    return LayerKey(layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim, layer.v_head_dim, float(layer.scaling),
                    float(layer.logit_cap) if layer.logit_cap else None, window if window is not None and window >= 0
                    else None)


@dataclass
class StepMetadata:
    """One step: the page table, the packed query offsets of an extend step, and the plans made so far."""

    table: ksb.PageTable
    qo_indptr: torch.Tensor | None  # (batch + 1,) int32 for extend steps; None for decode
    plans: dict[LayerKey, Any] = field(default_factory=dict)


class SwitchboardAttnBackend(AttentionBackend):
    """SGLang's ``AttentionBackend`` on the switchboard (MHA / GQA, any page size, fp8 KV with per-tensor scales)."""

    def __init__(self, model_runner: Any) -> None:
        super().__init__()
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        self.device = torch.device(model_runner.device)
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        if isinstance(self.token_to_kv_pool, SWAKVPool):
            raise NotImplementedError(f"the {BACKEND_NAME} attention backend does not read SGLang's hybrid "
                                      "sliding-window KV pool (separate index spaces); serve the model with one pool")
        self.page_size = int(model_runner.page_size)
        self.data_type = model_runner.dtype
        self.kv_cache_dtype = model_runner.kv_cache_dtype
        self.max_context_len = int(model_runner.model_config.context_len)
        model = getattr(model_runner, "model", None)
        #: the plan keys of the model's attention layers, planned in every step (others are planned when first met)
        self.layer_keys = sorted({layer_key(m) for m in model.modules() if isinstance(m, RadixAttention)}
                                 if model is not None else set(), key=repr)
        self.forward_metadata: StepMetadata | None = None
        self._graph_block_table: torch.Tensor | None = None
        self._graph_seq_lens: torch.Tensor | None = None
        self._graph_metadata: dict[int, StepMetadata] = {}

    # -- per-step metadata ------------------------------------------------------------------------------------
    def _block_table(self, req_pool_indices: torch.Tensor, pages: int) -> torch.Tensor:
        """(batch, pages) int32: the page of each request's every S-th token slot."""
        rows = self.req_to_token_pool.req_to_token[req_pool_indices]
        return (rows[:, : pages * self.page_size: self.page_size] // self.page_size).to(torch.int32)

    def _plan(self, metadata: StepMetadata, key: LayerKey, capturable: bool = False) -> Any:
        args = dict(num_q_heads=key.num_q_heads, num_kv_heads=key.num_kv_heads, head_dim=key.head_dim,
                    head_dim_v=key.head_dim_v, dtype=self.data_type, kv_dtype=self.kv_cache_dtype, layout="NHD",
                    page_size=self.page_size, sm_scale=key.sm_scale, logits_soft_cap=key.logits_soft_cap,
                    window_left=key.window_left, capturable=capturable)
        plan: Any
        if metadata.qo_indptr is None:
            plan = ksb.attention.plan_decode(metadata.table, **args)
        else:
            plan = ksb.attention.plan_prefill(metadata.table, metadata.qo_indptr, causal=True, **args)
        metadata.plans[key] = plan
        return plan

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
            return
        if not (mode.is_decode() or mode.is_extend()) or mode.is_target_verify() or mode.is_draft_extend_v2():
            raise NotImplementedError(f"the {BACKEND_NAME} attention backend does not run {mode.name} batches "
                                      "(speculative decoding)")
        bs = forward_batch.batch_size
        lens_cpu = forward_batch.seq_lens_cpu
        max_len = int(lens_cpu[:bs].max()) if lens_cpu is not None else int(forward_batch.seq_lens[:bs].max())
        pages = max(1, -(-max_len // self.page_size))
        table = ksb.PageTable(self._block_table(forward_batch.req_pool_indices[:bs], pages),
                              forward_batch.seq_lens[:bs].to(torch.int32), max_seq_len=max_len)
        qo_indptr = None
        if mode.is_extend():
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            qo_indptr[1:] = torch.cumsum(forward_batch.extend_seq_lens[:bs], 0)
        self.forward_metadata = StepMetadata(table, qo_indptr)
        for key in self.layer_keys:
            self._plan(self.forward_metadata, key)

    # -- CUDA graphs (decode) -----------------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        width = -(-self.req_to_token_pool.req_to_token.shape[1] // self.page_size)
        self._graph_block_table = torch.zeros(max_bs, width, dtype=torch.int32, device=self.device)
        self._graph_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False) -> None:
        """At capture: plan a decode step over the graph's own block table and lengths for every layer
        configuration, serving any length up to the context length. At replay: select those plans."""
        if not forward_batch.forward_mode.is_decode():
            raise NotImplementedError(f"the {BACKEND_NAME} attention backend captures decode batches only")
        if self._graph_block_table is None or self._graph_seq_lens is None:
            raise RuntimeError("init_cuda_graph_state must run before a CUDA graph is captured")
        bs = forward_batch.batch_size
        if in_capture:
            table = ksb.PageTable(self._graph_block_table[:bs], self._graph_seq_lens[:bs],
                                  max_seq_len=min(self.max_context_len, self._graph_block_table.shape[1] * self.page_size))
            metadata = StepMetadata(table, None)
            if not self.layer_keys:
                raise RuntimeError(f"the {BACKEND_NAME} attention backend found no RadixAttention layer to plan for")
            for key in self.layer_keys:
                self._plan(metadata, key, capturable=True)
            self._graph_metadata[bs] = metadata
        self.forward_metadata = self._graph_metadata[bs]

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch) -> None:
        """Inside the graph: the step's block table and lengths into the buffers the captured plans read."""
        assert self._graph_block_table is not None and self._graph_seq_lens is not None
        bs = forward_batch.batch_size
        rows = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices[:bs]]
        self._graph_block_table[:bs].copy_(rows[:, :: self.page_size] // self.page_size)
        self._graph_seq_lens[:bs].copy_(forward_batch.seq_lens[:bs])

    # -- forward ---------------------------------------------------------------------------------------------
    def _cache(self, layer: RadixAttention) -> ksb.PagedKVCache:
        k, v = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if k.dtype != self.kv_cache_dtype:  # fp8 pools may store bytes
            k, v = k.view(self.kv_cache_dtype), v.view(self.kv_cache_dtype)
        ps = self.page_size
        if k.shape[0] % ps:
            raise ksb.InvalidArgumentError(f"the KV buffer of layer {layer.layer_id} has {k.shape[0]} slots: expected a "
                                           f"multiple of the page size {ps}")
        k_pages, v_pages = k.view(-1, ps, *k.shape[1:]), v.view(-1, ps, *v.shape[1:])
        if self.kv_cache_dtype in _FP8:
            return ksb.PagedKVCache(k_pages, v_pages, "NHD", layer.k_scale_float or 1.0, layer.v_scale_float or 1.0)
        return ksb.PagedKVCache(k_pages, v_pages, "NHD")

    def _forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: RadixAttention,
                 forward_batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        metadata = self.forward_metadata
        if metadata is None:
            raise RuntimeError("init_forward_metadata must run before the attention forward")
        cache = self._cache(layer)
        if save_kv_cache and k is not None and v is not None:
            # SGLang's allocator owns the slots: the per-layer range check (a device read) is skipped
            ksb.kv_cache.append_slots(k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                                      v.view(-1, layer.tp_v_head_num, layer.v_head_dim), cache,
                                      forward_batch.out_cache_loc, check_indices=False)
        key = layer_key(layer)
        plan = metadata.plans.get(key) or self._plan(metadata, key)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim).contiguous()
        out = q.new_empty(q3.shape[0], layer.tp_q_head_num, layer.v_head_dim)
        plan.run(q3, cache, out=out)
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: RadixAttention,
                       forward_batch: ForwardBatch, save_kv_cache: bool = True, **kwargs: Any) -> torch.Tensor:
        _refuse_extras(kwargs)
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: RadixAttention,
                       forward_batch: ForwardBatch, save_kv_cache: bool = True, **kwargs: Any) -> torch.Tensor:
        _refuse_extras(kwargs)
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache)


def _refuse_extras(kwargs: dict[str, Any]) -> None:
    """Per-call attention inputs a model may add (sinks, masks, ...) are not implemented here: refused by name."""
    given = sorted(name for name, value in kwargs.items() if value is not None)
    if given:
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend does not support {', '.join(given)}")
