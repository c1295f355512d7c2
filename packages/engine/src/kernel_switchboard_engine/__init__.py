"""A compact paged-KV inference engine built only from switchboard ops.

Dense decoders of the Llama lineage (Llama 3.x, Qwen2/2.5, Qwen3, Mistral, Mixtral, Gemma 2, Gemma 3) and
DeepSeek-V3 (MLA with absorbed decode, grouped top-k MoE with shared experts, YaRN), weights taken from
``transformers`` model objects by :func:`from_hf`, which refuses any model type or config value it does not
implement (:mod:`.families`), or drawn from a spec; a page allocator with per-request block tables, continuous
batching that mixes prefill and decode requests in one step, sampling, speculative decoding, and
a decode step that compiles (``torch.compile(fullgraph=True)``) or is captured in a CUDA graph.
``switchboard demo`` runs it (:mod:`kernel_switchboard_engine.demo`).

    model = from_hf(hf_model)
    outputs = Engine(model, num_pages=256, page_size=16).generate(prompts, SamplingParams(max_new_tokens=32))
"""

from __future__ import annotations

from .cache import BlockTables, OutOfPagesError, PageAllocator, StepBatch, build_batch
from .calls import OpTracer
from .deepseek import DeepseekModel, MLACache
from .families import SUPPORTED, from_hf
from .graphs import DecodeRunner
from .llama import LlamaKVCache, LlamaModel
from .sampling import SamplingParams
from .scheduler import Engine, Request, StepReport
from .speculative import SpecStats, SpeculativeDecoder
from .weights import (
    DeepseekSpec,
    DeepseekWeights,
    LlamaSpec,
    LlamaWeights,
    deepseek_from_hf,
    llama_from_hf,
    truncate_layers,
)

__all__ = [
    "SUPPORTED",
    "BlockTables",
    "DecodeRunner",
    "DeepseekModel",
    "DeepseekSpec",
    "DeepseekWeights",
    "Engine",
    "LlamaKVCache",
    "LlamaModel",
    "LlamaSpec",
    "LlamaWeights",
    "MLACache",
    "OpTracer",
    "OutOfPagesError",
    "PageAllocator",
    "Request",
    "SamplingParams",
    "SpecStats",
    "SpeculativeDecoder",
    "StepBatch",
    "StepReport",
    "build_batch",
    "deepseek_from_hf",
    "from_hf",
    "llama_from_hf",
    "truncate_layers",
]
