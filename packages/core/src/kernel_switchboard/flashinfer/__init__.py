"""A FlashInfer-compatible API over the switchboard: FlashInfer's public names, arguments, defaults, shapes,
layouts, dtypes and semantics (0.6.x) for the attention wrappers, paged-KV helpers, norms, RoPE, gated activations,
sampling and GEMM that LLM engines call, in pure Python over the switchboard's ops and plans. It does not need the
``flashinfer`` package.

    import kernel_switchboard.flashinfer as flashinfer

    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 q_data_type=torch.bfloat16)
    out = wrapper.run(q, (k_pages, v_pages))

Every call runs the kernel the switchboard ranks first for this GPU and problem (``kernel_switchboard.explain``
says why); the same code runs on a CPU through the reference kernels. Log-sum-exp values are base 2, as
FlashInfer's. What FlashInfer offers and this layer does not serve (RoPE or ALiBi fused into attention, custom masks
in batch wrappers, JIT variants, fp8 queries, ...) raises :class:`~kernel_switchboard.InvalidArgumentError` naming the
argument; docs/flashinfer.md has the coverage table. :func:`install_as_flashinfer` lets unchanged
``import flashinfer`` / ``from flashinfer.decode import ...`` lines resolve here.
"""

from __future__ import annotations

import sys

from ..errors import fail
from . import activation, cascade, decode, gemm, mla, norm, page, pod, prefill, rope, sampling
from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .cascade import MultiLevelCascadeAttentionWrapper, merge_state, merge_state_in_place, merge_states
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
    single_decode_with_kv_cache,
)
from .gemm import SegmentGEMMWrapper, bmm_fp8
from .mla import BatchMLAPagedAttentionWrapper
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, layernorm, rmsnorm
from .page import append_paged_kv_cache, append_paged_mla_kv_cache, get_batch_indices_positions, get_seq_lens
from .pod import BatchPODWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from .sampling import (
    chain_speculative_sampling,
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)

#: the FlashInfer API version this layer mirrors (engines that gate on ``flashinfer.__version__`` read it)
__version__ = "0.6.18"

#: FlashInfer's module names served here, for :func:`install_as_flashinfer`
MODULES = {"activation": activation, "cascade": cascade, "decode": decode, "gemm": gemm, "mla": mla, "norm": norm,
           "page": page, "pod": pod, "prefill": prefill, "rope": rope, "sampling": sampling}


def install_as_flashinfer() -> None:
    """Register this package as ``flashinfer`` (and its modules as ``flashinfer.decode``, ``flashinfer.mla``, ...) in
    ``sys.modules``, so an engine's unchanged FlashInfer imports resolve to the switchboard. Call it before the engine
    imports FlashInfer; it refuses when the real ``flashinfer`` is already imported."""
    this = sys.modules[__name__]
    current = sys.modules.get("flashinfer")
    if current is not None and current is not this:
        raise fail("flashinfer", "the flashinfer package, already imported",
                   "install_as_flashinfer() called before anything imports flashinfer")
    sys.modules["flashinfer"] = this
    for name, module in MODULES.items():
        sys.modules[f"flashinfer.{name}"] = module


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
    "BatchPODWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "PODWithPagedKVCacheWrapper",
    "SegmentGEMMWrapper",
    "__version__",
    "activation",
    "append_paged_kv_cache",
    "append_paged_mla_kv_cache",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "bmm_fp8",
    "cascade",
    "chain_speculative_sampling",
    "decode",
    "fast_decode_plan",
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "get_batch_indices_positions",
    "get_seq_lens",
    "install_as_flashinfer",
    "layernorm",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "min_p_sampling_from_probs",
    "mla",
    "norm",
    "page",
    "pod",
    "prefill",
    "rmsnorm",
    "rope",
    "sampling",
    "sampling_from_logits",
    "sampling_from_probs",
    "silu_and_mul",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]
