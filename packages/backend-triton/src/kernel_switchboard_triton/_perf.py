"""Cost estimates shared by the Triton kernels: seconds from bytes moved or flops done.

Rates are what these kernels reach on an H100/H200-class GPU; they only rank kernels against each
other, so being within a factor of about 1.5 is enough. On any device other than CUDA the estimate
is infinite: interpreted Triton on the CPU must never out-rank the reference kernels by cost.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: sustained HBM bandwidth of a memory-bound Triton kernel (bytes/s)
BANDWIDTH = 3.3e12
#: fixed cost of one kernel launch (s)
LAUNCH = 4e-6
#: dense tensor-core rate of our Triton matmuls by operand dtype (flop/s)
MATMUL_RATE = {torch.float16: 600e12, torch.bfloat16: 600e12, torch.float8_e4m3fn: 1000e12, torch.float32: 40e12}


def on_gpu(problem: Any) -> bool:
    return getattr(problem, "device", None) == "cuda"


def memory_bound(problem: Any, nbytes: float, launches: int = 1) -> float:
    """Seconds to move ``nbytes`` through HBM plus ``launches`` launch overheads (inf off the GPU)."""
    if not on_gpu(problem):
        return math.inf
    return launches * LAUNCH + nbytes / BANDWIDTH


def compute_bound(problem: Any, flops: float, nbytes: float, dtype: torch.dtype, launches: int = 1,
                  rate: float | None = None) -> float:
    """Roofline seconds: the larger of the matmul time at ``rate`` (default: ours for ``dtype``) and the memory
    time (inf off the GPU)."""
    if not on_gpu(problem):
        return math.inf
    rate = rate or MATMUL_RATE.get(dtype, 300e12)
    return launches * LAUNCH + max(flops / rate, nbytes / BANDWIDTH)
