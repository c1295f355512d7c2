"""A compact paged-KV inference engine built only from switchboard ops.

Llama family (GQA, RoPE with Llama-3.1 scaling, RMSNorm, SwiGLU) and DeepSeek-V3 family (MLA with
absorbed decode, grouped top-k MoE with shared experts), weights taken from ``transformers``
model objects; a page allocator with per-request block tables, continuous batching that mixes
prefill and decode requests in one step, sampling, speculative decoding, and a decode step that
compiles (``torch.compile(fullgraph=True)``) or is captured in a CUDA graph.
``switchboard demo`` runs it (:mod:`kernel_switchboard.engine.demo`).
"""

from __future__ import annotations

from .cache import BlockTables, OutOfPagesError, PageAllocator, StepBatch, build_batch
from .deepseek import DeepseekModel, MLACache
from .llama import LlamaModel
from .weights import DeepseekSpec, DeepseekWeights, LlamaSpec, LlamaWeights, deepseek_from_hf, llama_from_hf

__all__ = [
    "BlockTables",
    "DeepseekModel",
    "DeepseekSpec",
    "DeepseekWeights",
    "LlamaModel",
    "LlamaSpec",
    "LlamaWeights",
    "MLACache",
    "OutOfPagesError",
    "PageAllocator",
    "StepBatch",
    "build_batch",
    "deepseek_from_hf",
    "llama_from_hf",
]
