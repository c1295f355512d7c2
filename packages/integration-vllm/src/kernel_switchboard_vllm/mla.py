"""The switchboard as vLLM's MLA backend (DeepSeek V2/V3 style latent attention), for the decode path.

vLLM's MLA layer splits each step: decode requests run as multi-query attention over the latent cache
(``forward_mqa``, after absorbing the up-projections into the queries), prefill requests run as ordinary
attention over up-projected keys through vLLM's MLA prefill backends (``forward_mha``, chosen by vLLM for the
platform). This backend serves the first and the KV write:

- :class:`SwitchboardMLAMetadataBuilder` plans the decode part once per step (``ksb.attention.plan_mla_decode``
  over a ``ksb.PageTable`` of the decode requests); the plans made for CUDA-graph capture are kept and serve the
  later decode batches of their size, as in :mod:`kernel_switchboard_vllm.attention`.
- :class:`SwitchboardMLAImpl` runs that plan on the layer's latent cache, whose (blocks, block_size, Dc + Dr)
  rows hold the latent (Dc) then the rope key (Dr), and writes new rows there by slot mapping
  (``ksb.kv_cache.append_slots`` with the latent as K and the rope key as V of one head).

Prefill stays on vLLM's MLA prefill kernels; fp8 latent caches are not served (``kv_cache_dtype`` auto, float16,
bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, CommonAttentionMetadata

import kernel_switchboard as ksb

from . import MLA_BACKEND_NAME


@dataclass
class SwitchboardMLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's decode metadata plus the step's switchboard plan."""

    plan: Any = None


class SwitchboardMLABackend(MLACommonBackend):
    """MLA decode on the switchboard; any block size; fp16 / bf16 / fp32 latent caches."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return MLA_BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[SwitchboardMLAImpl]:
        return SwitchboardMLAImpl

    @staticmethod
    def get_builder_cls() -> type[SwitchboardMLAMetadataBuilder]:
        return SwitchboardMLAMetadataBuilder


class SwitchboardMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's MLA metadata, whose decode part carries a switchboard plan made once per step."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        layer = vllm_config.compilation_config.static_forward_context[layer_names[0]]
        self.sm_scale = float(layer.impl.scale)
        self.dtype = cast(torch.dtype, self.model_config.dtype)  # a torch.dtype once the config is built
        self.max_model_len = self.model_config.max_model_len
        self._capturing = False
        #: decode plans made for CUDA-graph capture, by (decode requests, block table address, lengths address)
        self._graph_plans: dict[tuple[int, int, int], Any] = {}

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> MLACommonMetadata:
        self._capturing = True
        try:
            return super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._capturing = False

    def _build_decode(self, block_table_tensor: torch.Tensor, seq_lens_device: torch.Tensor, max_seq_len: int,
                      query_start_loc_cpu: torch.Tensor, query_start_loc_device: torch.Tensor,
                      num_decode_tokens: int, max_query_len: int,
                      dcp_tot_seq_lens_device: torch.Tensor | None) -> SwitchboardMLADecodeMetadata:
        if max_query_len != 1 or num_decode_tokens != seq_lens_device.shape[0]:
            raise NotImplementedError(f"{MLA_BACKEND_NAME}: decode requests of one new token each (no speculative "
                                      "decoding)")
        if dcp_tot_seq_lens_device is not None:
            raise NotImplementedError(f"{MLA_BACKEND_NAME}: decode context parallelism is not supported")
        block_table = block_table_tensor.to(torch.int32)
        seq_lens = seq_lens_device.to(torch.int32)
        key = (seq_lens.shape[0], block_table.data_ptr(), seq_lens.data_ptr())
        capacity = block_table.shape[1] * self.page_size
        if key in self._graph_plans and not self._capturing:
            plan = self._graph_plans[key]
        else:
            bound = min(self.max_model_len if self._capturing else max_seq_len, capacity)
            table = ksb.PageTable(block_table, seq_lens, max_seq_len=bound)
            plan = ksb.attention.plan_mla_decode(
                table, num_heads=self.num_heads, head_dim_ckv=self.mla_dims.kv_lora_rank,
                head_dim_kpe=self.mla_dims.qk_rope_head_dim, dtype=self.dtype, page_size=self.page_size,
                sm_scale=self.sm_scale, max_kv_len=bound,
                capturable=self._capturing and block_table.device.type == "cuda")
            if self._capturing:
                self._graph_plans[key] = plan
        return SwitchboardMLADecodeMetadata(block_table=block_table_tensor, seq_lens=seq_lens_device,
                                            dcp_tot_seq_lens=None, plan=plan)


class SwitchboardMLAImpl(MLACommonImpl[MLACommonMetadata]):
    """Decode attention over the latent cache through the step's plan; KV written by slot mapping."""

    can_return_lse_for_decode: bool = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 **mla_args: Any) -> None:
        refused = {"alibi_slopes": alibi_slopes is not None, "sliding_window": sliding_window is not None,
                   "logits_soft_cap": bool(logits_soft_cap), f"attn_type={attn_type}": attn_type != AttentionType.DECODER,
                   f"kv_cache_dtype={kv_cache_dtype!r}": kv_cache_dtype not in SwitchboardMLABackend.supported_kv_cache_dtypes,
                   "an indexer (sparse MLA)": mla_args.get("indexer") is not None}
        unsupported = [name for name, used in refused.items() if used]
        if unsupported:
            raise NotImplementedError(f"{MLA_BACKEND_NAME} attention does not support {', '.join(unsupported)}")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
        self.supports_quant_query_input = False  # queries arrive in the model's dtype

    def _latent_pages(self, kv_c_and_k_pe_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (blocks, block_size, Dc) latent and (blocks, block_size, Dr) rope-key views of the layer's cache."""
        cache = kv_c_and_k_pe_cache
        if cache.dim() == 4:  # a (blocks, 1, block_size, Dc + Dr) view of the one latent head
            cache = cache.squeeze(1)
        return cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank:]

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: MLACommonMetadata, layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (decode tokens, heads, Dc + Dr) or its (nope, rope) halves -> (decode tokens, heads, Dc)."""
        decode = attn_metadata.decode
        if not isinstance(decode, SwitchboardMLADecodeMetadata) or decode.plan is None:
            raise RuntimeError(f"{MLA_BACKEND_NAME}: the step's decode metadata has no plan (built by another builder)")
        q_nope, q_pe = q if isinstance(q, tuple) else q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        ckv, kpe = self._latent_pages(kv_c_and_k_pe_cache)
        out = decode.plan.run(q_nope.contiguous(), q_pe.contiguous(), ckv, kpe)
        return out, None

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """Write the new latents (as K) and rope keys (as V) of one head at their slots; padding slots (-1) skipped.

        vLLM's scheduler owns the slots, so the per-call range check (a device read per layer) is skipped."""
        if kv_cache.numel() == 0:
            return
        n = slot_mapping.shape[0]
        ckv, kpe = self._latent_pages(kv_cache)
        cache = ksb.PagedKVCache(ckv.unsqueeze(2), kpe.unsqueeze(2), "NHD")
        ksb.kv_cache.append_slots(kv_c_normed[:n].unsqueeze(1), k_pe.reshape(k_pe.shape[0], 1, -1)[:n], cache,
                                  slot_mapping.flatten(), check_indices=False)
