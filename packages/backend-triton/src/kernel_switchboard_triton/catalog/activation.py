"""Records of the Triton gated activations (launchers in :mod:`..activation`): ``silu_and_mul``, ``gelu_and_mul``
(erf), ``gelu_tanh_and_mul`` and ``swiglu_oai_and_mul``; float32 math, one read and one write."""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import memory_bound
from . import launcher

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: batch invariant: each element's result depends on its own inputs only
_CAP = Capability(devices=DEVICES, dtypes=DTYPES, features=frozenset({"cuda_graph", "deterministic", "batch_invariant"}))


def _cost(problem: Any) -> float:
    # reads (rows, 2d), writes (rows, d); ActivationProblem.hidden is d
    return memory_bound(problem, 3 * problem.rows * problem.hidden * problem.dtype.itemsize)


def kernels() -> list[Kernel]:
    return [
        Kernel(f"activation.{name}", name, BACKEND, _CAP, launcher(f"activation:{name}"), priority=PRIORITY, cost=_cost,
               doc="fused gate activation and multiply; float32 math, one read and one write")
        for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "swiglu_oai_and_mul")
    ]
