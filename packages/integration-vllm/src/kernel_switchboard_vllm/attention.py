"""The switchboard as a vLLM attention backend.

- :class:`SwitchboardMetadataBuilder` runs once per step for all the layers of a KV-cache group: it turns
  vLLM's ``CommonAttentionMetadata`` (block table, sequence lengths, query start locations) into a
  ``ksb.PageTable`` and plans the step once: ``plan_decode`` when every request has one new token,
  ``plan_prefill`` otherwise (prefill, chunked prefill and decode rows mixed in one batch). One plan per
  distinct (scale, soft-cap, window) among the group's layers.
- :class:`SwitchboardAttentionImpl` writes each layer's new K/V into vLLM's cache by slot mapping
  (``ksb.kv_cache.append_slots``) and runs the step's plan into the ``output`` vLLM hands it.

vLLM's cache of one layer is one tensor viewed as (blocks, kv_heads, block_size, head_size + head_size_v):
K and V are the two halves of its last dim, read and written in place as an HND ``ksb.PagedKVCache``
through strides. fp8 caches (``--kv-cache-dtype fp8/fp8_e4m3/fp8_e5m2``) use the layer's per-tensor scales.

CUDA graphs: full graphs of pure-decode batches (``UNIFORM_SINGLE_TOKEN_DECODE``). The decode plan made for a
capture reads the block table and the lengths from vLLM's persistent buffers and serves any length up to the
model's maximum, so the builder keeps it and every later decode batch of that size uses it: a replay runs the
captured kernels on the buffers vLLM has refilled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec

import kernel_switchboard as ksb

from . import BACKEND_NAME

#: vLLM's ``--kv-cache-dtype`` names this backend serves, and the page dtype of each (None: the model's dtype)
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def page_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the cache pages for vLLM's ``kv_cache_dtype`` name."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ksb.InvalidArgumentError(
            f"kv_cache_dtype={kv_cache_dtype!r} is invalid: expected one of {sorted(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype


def paged_cache(kv_cache: torch.Tensor, head_size: int, head_size_v: int, dtype: torch.dtype, k_scale: float,
                v_scale: float) -> ksb.PagedKVCache:
    """vLLM's (blocks, kv_heads, block_size, head_size + head_size_v) cache of one layer as a PagedKVCache
    (views, no copy). fp8 caches are stored as bytes; they are viewed as ``dtype``."""
    if kv_cache.dtype != dtype:
        kv_cache = kv_cache.view(dtype)
    k, v = kv_cache[..., :head_size], kv_cache[..., head_size:head_size + head_size_v]
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return ksb.PagedKVCache(k, v, "HND", k_scale, v_scale)
    return ksb.PagedKVCache(k, v, "HND")


#: extra per-layer arguments vLLM's Attention may pass an implementation, at the values that change nothing
_NEUTRAL_EXTRAS: dict[str, Any] = {"use_alibi_sqrt": False, "chunk_lookback": -1}


@dataclass(frozen=True)
class LayerParams:
    """What a plan fixes about a layer besides the shapes: its softmax scale, soft-cap and window."""

    sm_scale: float
    logits_soft_cap: float | None
    window_left: int | None


@dataclass
class SwitchboardMetadata(AttentionMetadata):
    """One step's attention metadata: the page table and one plan per distinct :class:`LayerParams`."""

    num_actual_tokens: int
    table: ksb.PageTable
    plans: dict[LayerParams, Any]
    decode: bool  # every request has exactly one new token


class SwitchboardAttentionBackend(AttentionBackend):
    """The switchboard's paged attention: any block size, NHD-in-HND K|V caches, fp16/bf16/fp32, fp8 caches."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(KV_CACHE_DTYPES)
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[SwitchboardAttentionImpl]:
        return SwitchboardAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[SwitchboardMetadataBuilder]:
        return SwitchboardMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


class SwitchboardMetadataBuilder(AttentionMetadataBuilder[SwitchboardMetadata]):
    """Plans the switchboard's attention once per step for every layer of one KV-cache group."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model = vllm_config.model_config
        self.page_size = kv_cache_spec.block_size
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_dim = kv_cache_spec.head_size
        self.head_dim_v = getattr(kv_cache_spec, "head_size_v", None) or self.head_dim
        self.dtype = cast(torch.dtype, model.dtype)  # a torch.dtype once the config is built
        self.max_model_len = model.max_model_len
        impls = [layer.impl for layer in get_layers_from_vllm_config(vllm_config, Attention, layer_names).values()
                 if isinstance(layer.impl, SwitchboardAttentionImpl)]
        if not impls:
            raise ksb.InvalidArgumentError(
                f"layer_names={layer_names!r} is invalid: expected attention layers on the {BACKEND_NAME} backend")
        self.num_q_heads = impls[0].num_heads
        self.kv_dtype = page_dtype(impls[0].kv_cache_dtype, self.dtype)
        self.params = sorted({impl.params for impl in impls}, key=repr)
        cudagraph_mode = vllm_config.compilation_config.cudagraph_mode
        self.capturable = device.type == "cuda" and cudagraph_mode is not None and cudagraph_mode.has_full_cudagraphs()
        #: decode plans made for CUDA-graph capture, by (batch, block table address, lengths address)
        self._graph_plans: dict[tuple[int, int, int], SwitchboardMetadata] = {}

    def _plan_args(self, p: LayerParams) -> dict[str, Any]:
        return dict(num_q_heads=self.num_q_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                    head_dim_v=self.head_dim_v, dtype=self.dtype, kv_dtype=self.kv_dtype, layout="HND",
                    page_size=self.page_size, sm_scale=p.sm_scale, logits_soft_cap=p.logits_soft_cap,
                    window_left=p.window_left)

    def _table(self, cm: CommonAttentionMetadata, max_seq_len: int) -> tuple[ksb.PageTable, tuple[int, int, int]]:
        n = cm.num_reqs
        block_table, seq_lens = cm.block_table_tensor[:n], cm.seq_lens[:n]
        capacity = block_table.shape[1] * self.page_size
        table = ksb.PageTable(block_table, seq_lens, max_seq_len=min(max_seq_len, capacity))
        return table, (n, block_table.data_ptr(), seq_lens.data_ptr())

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> SwitchboardMetadata:
        cm = common_attn_metadata
        if cm.causal is not True:
            raise NotImplementedError(f"{BACKEND_NAME}: non-causal decoder attention is not supported")
        decode = cm.max_query_len == 1 and cm.num_actual_tokens == cm.num_reqs
        table, key = self._table(cm, cm.max_seq_len)
        if decode and key in self._graph_plans:
            return self._graph_plans[key]  # the captured plans serve every length up to the model's maximum
        if decode:
            plans = {p: ksb.attention.plan_decode(table, capturable=False, **self._plan_args(p)) for p in self.params}
        else:
            qo_indptr = cm.query_start_loc[:cm.num_reqs + 1]
            plans = {p: ksb.attention.plan_prefill(table, qo_indptr, causal=True, capturable=False,
                                                   **self._plan_args(p)) for p in self.params}
        return SwitchboardMetadata(cm.num_actual_tokens, table, plans, decode)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> SwitchboardMetadata:
        cm = common_attn_metadata
        if not (cm.max_query_len == 1 and cm.num_actual_tokens == cm.num_reqs):
            raise NotImplementedError(f"{BACKEND_NAME}: CUDA graphs of pure-decode batches only")
        table, key = self._table(cm, self.max_model_len)
        plans = {p: ksb.attention.plan_decode(table, max_kv_len=table.max_seq_len, capturable=self.capturable,
                                              **self._plan_args(p)) for p in self.params}
        self._graph_plans[key] = SwitchboardMetadata(cm.num_actual_tokens, table, plans, True)
        return self._graph_plans[key]


class SwitchboardAttentionImpl(AttentionImpl[SwitchboardMetadata]):
    """Writes K/V by slot mapping and runs the step's plan for this layer."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None, **extra: Any) -> None:
        refused = {"alibi_slopes": alibi_slopes is not None, "sinks": sinks is not None,
                   f"attn_type={attn_type}": attn_type != AttentionType.DECODER}
        for name, value in extra.items():  # a layer feature this backend does not implement is refused by name
            refused[f"{name}={value!r}"] = value is not None and (name not in _NEUTRAL_EXTRAS
                                                                  or _NEUTRAL_EXTRAS[name] != value)
        unsupported = [name for name, used in refused.items() if used]
        if unsupported:
            raise NotImplementedError(f"{BACKEND_NAME} attention does not support {', '.join(unsupported)}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise NotImplementedError(f"{BACKEND_NAME} attention does not support kv_cache_dtype={kv_cache_dtype!r}; "
                                      f"supported: {sorted(KV_CACHE_DTYPES)}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self.params = LayerParams(self.scale, logits_soft_cap or None,
                                  sliding_window - 1 if sliding_window is not None else None)

    def _cache(self, layer: Any, kv_cache: torch.Tensor) -> ksb.PagedKVCache:
        head_size_v = getattr(layer, "head_size_v", self.head_size)
        dtype = page_dtype(self.kv_cache_dtype, kv_cache.dtype)  # "auto": the cache is allocated in the model's dtype
        return paged_cache(kv_cache, self.head_size, head_size_v, dtype, layer._k_scale_float, layer._v_scale_float)

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """Write this step's K/V; key/value may carry padding rows past the slot mapping, which are not written.

        vLLM's scheduler owns the slots, so the per-call range check (a device read per layer) is skipped."""
        if kv_cache.numel() == 0:
            return
        n = slot_mapping.shape[0]
        ksb.kv_cache.append_slots(key[:n], value[:n], self._cache(layer, kv_cache), slot_mapping, check_indices=False)

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: SwitchboardMetadata, output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        """query (tokens, heads, head_size) -> output (tokens, heads, head_size_v), written in place."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(f"{BACKEND_NAME} attention does not fuse output quantisation")
        if attn_metadata is None:  # vLLM's profiling run
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        plan = attn_metadata.plans[self.params]
        plan.run(query[:n], self._cache(layer, kv_cache), out=output[:n])
        return output
