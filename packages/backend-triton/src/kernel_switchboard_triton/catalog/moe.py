"""Record of the Triton fused mixture-of-experts (launcher in :mod:`..moe`): expert-sorted blocks, gate/up GEMM
with a fused SiLU-and-mul epilogue, down GEMM with the routing weight; bf16/fp16/fp32 or fp8 block-scaled weights."""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import compute_bound
from . import launcher

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


def _cost(problem: Any) -> float:
    assign = problem.tokens * problem.top_k
    flops = 2.0 * assign * 3 * problem.hidden * problem.intermediate
    weights = problem.num_experts * 3 * problem.hidden * problem.intermediate * problem.w_dtype.itemsize
    acts = assign * (problem.hidden * 3 + problem.intermediate * 2) * problem.dtype.itemsize
    mma_dtype = torch.float8_e4m3fn if problem.quant == "fp8_block" else problem.dtype
    return compute_bound(problem, flops, weights + acts, mma_dtype, launches=10)


def _math_dtype(problem: Any) -> torch.dtype | None:
    """fp8 block-scaled weights: the MMAs take activations quantized to float8_e4m3fn."""
    return torch.float8_e4m3fn if problem.quant == "fp8_block" else None


def _fp8_needs_sm89(problem: Any) -> list[str]:
    if problem.quant == "fp8_block" and problem.cc is not None and problem.cc < (8, 9):
        return [f"float8_e4m3fn weights need compute capability >= 8.9 (got {problem.cc[0]}.{problem.cc[1]})"]
    return []


_CAP = Capability(devices=DEVICES, dtypes=DTYPES, features=frozenset({"cuda_graph", "deterministic", "batch_invariant"}),
                  allowed={"quant": frozenset({"none", "fp8_block"})}, check=_fp8_needs_sm89)


def kernels() -> list[Kernel]:
    return [
        Kernel("moe.fused_moe", "fused_moe", BACKEND, _CAP, launcher("moe:fused_moe"), priority=PRIORITY, cost=_cost,
               math_dtype=_math_dtype,
               doc="expert-sorted blocks; gate/up GEMM with fused SiLU-and-mul, down GEMM with routing weight; "
                   "fp8 weights: fp8 MMAs on activations quantized per row and 128 columns"),
    ]
