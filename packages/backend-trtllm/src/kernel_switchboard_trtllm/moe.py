"""TensorRT-LLM's CUTLASS fused MoE for ``moe.fused_moe`` (the experts), from two providers:

- flashinfer-python's ``cutlass_fused_moe`` (TensorRT-LLM's kernels compiled by flashinfer; ~minutes
  on first build): fp16/bf16 weights on sm_89+, and bf16 activations with fp8 e4m3 weights and
  DeepSeek 128x128 block scales on sm_90 only (flashinfer raises elsewhere);
- ``torch.ops.trtllm.fused_moe`` from an installed ``tensorrt_llm`` (same kernels, same argument
  order); written against tensorrt_llm's ``_torch/custom_ops/torch_custom_ops.py`` and never run here.

Both take fc1 rows as ``[up; gate]``; the switchboard's w13 is ``[gate; up]``, so w13 (and its
scales) are translated once per weight tensor and kept in a bounded cache
(``KSB_TRTLLM_MOE_CACHE_GB``, default 16): the cache doubles the memory of the weights it holds.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.availability import import_vendor

from . import jit, translate
from .providers import INSTALL, TRTLLM_INSTALL, provider_tag

HALF = frozenset({torch.float16, torch.bfloat16})
FP8 = torch.float8_e4m3fn
RATE = 500e12  # flop/s these grouped GEMMs sustain on an H100/H200 (bf16); only for ranking
BANDWIDTH = 3.3e12
LAUNCH_S = 30e-6  # routing permutation, two grouped GEMMs, finalize

weight_cache = translate.WeightCache(int(float(os.environ.get("KSB_TRTLLM_MOE_CACHE_GB", "16")) * 2**30))


def moe_check(problem: Any) -> list[str]:
    """Alignment of the expert GEMMs and the quantization modes each architecture has."""
    out = []
    fp8 = problem.quant == "fp8_block"
    align = 128 if fp8 else 64
    if problem.hidden % align or problem.intermediate % align:
        out.append(f"hidden={problem.hidden}, intermediate={problem.intermediate}: declared for multiples of {align}")
    if fp8:
        if problem.dtype != torch.bfloat16:
            out.append(f"dtype={problem.dtype}: fp8 block-scaled experts take bfloat16 activations")
        if problem.cc is not None and problem.cc != (9, 0):
            out.append(f"compute capability {problem.cc[0]}.{problem.cc[1]}: flashinfer's fp8 block-scaled CUTLASS MoE "
                       "exists for sm_90 only")
    elif problem.w_dtype != problem.dtype:
        out.append(f"w_dtype={problem.w_dtype}: unquantized weights must have the activations' dtype")
    return out


def _cost(problem: Any) -> float:
    if problem.device != "cuda":
        return float("inf")
    t, h, i, k, e = problem.tokens, problem.hidden, problem.intermediate, problem.top_k, problem.num_experts
    flops = 2.0 * t * k * 3 * h * i
    w_item = 1 if problem.quant == "fp8_block" else 2
    active = min(e, t * k)  # experts that get tokens (upper bound)
    nbytes = active * 3 * h * i * w_item + 4 * t * h
    return LAUNCH_S + max(flops / (RATE * (2 if w_item == 1 else 1)), nbytes / BANDWIDTH)


def _first(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, (list, tuple)) else result  # type: ignore[no-any-return]


def flashinfer_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                   w2: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> torch.Tensor:
    """moe.fused_moe through ``flashinfer.fused_moe.cutlass_fused_moe``; y (T, H) in x's dtype."""
    cutlass_fused_moe = import_vendor("flashinfer.fused_moe", INSTALL).cutlass_fused_moe
    a = translate.moe_args(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, weight_cache)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    result = cutlass_fused_moe(a.input, a.token_selected_experts, a.token_final_scales, a.fc1_expert_weights,
                               a.fc2_expert_weights, a.output_dtype, a.quant_scales, output=out,
                               use_deepseek_fp8_block_scale=a.use_deepseek_fp8_block_scale)
    if x.device.type == "cuda" and x.device.index not in _noted:
        _noted.add(x.device.index)
        jit.note_moe_built(torch.cuda.get_device_capability(x.device))
    return _first(result)


#: devices whose fused-MoE module this process has recorded built (after its first call there)
_noted: set[int | None] = set()


def tensorrt_llm_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                     w2: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> torch.Tensor:
    """moe.fused_moe through ``torch.ops.trtllm.fused_moe`` (tensorrt_llm's PyTorch custom op)."""
    import_vendor("tensorrt_llm._torch.custom_ops", TRTLLM_INSTALL)  # registers torch.ops.trtllm.fused_moe

    a = translate.moe_args(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, weight_cache)
    result = torch.ops.trtllm.fused_moe(a.input, a.token_selected_experts, a.token_final_scales,
                                        a.fc1_expert_weights, None, a.fc2_expert_weights, None, a.output_dtype,
                                        a.quant_scales, use_deepseek_fp8_block_scale=a.use_deepseek_fp8_block_scale)
    return _first(result)


def _cap(min_cc: tuple[int, int]) -> Capability:
    return Capability(devices=frozenset({"cuda"}), min_cc=min_cc, dtypes=HALF,
                      allowed={"quant": frozenset({"none", "fp8_block"}), "w_dtype": HALF | {FP8}}, check=moe_check)


def kernels(flashinfer_version: str | None, trtllm_version: str | None, trtllm_unavailable: str | None,
            trtllm_install: str | None) -> list[Kernel]:
    tag = f"tensorrt_llm-{trtllm_version}" if trtllm_version else "tensorrt_llm"
    return [
        Kernel("moe.fused_moe", provider_tag("trtllm-cutlass-moe", flashinfer_version), "trtllm", _cap((8, 9)),
               flashinfer_moe, version=flashinfer_version or "", cost=_cost, needs_build=jit.moe_needs_build,
               build=jit.moe_build,
               doc="TensorRT-LLM CUTLASS fused MoE as compiled by flashinfer-python (w13 halves swapped once, cached)"),
        Kernel("moe.fused_moe", f"fused_moe@{tag}", "trtllm", _cap((8, 0)), tensorrt_llm_moe,
               version=trtllm_version or "", cost=_cost, priority=-1, unavailable=trtllm_unavailable,
               install=trtllm_install,
               doc="torch.ops.trtllm.fused_moe from tensorrt_llm; written against its custom-op API, unverified here"),
    ]
