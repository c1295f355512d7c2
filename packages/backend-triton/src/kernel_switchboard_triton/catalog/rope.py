"""Records of the Triton rotary position embedding (launchers in :mod:`..rope`): NeoX halves or GPT-J pairs, from
``inv_freq`` or a cos/sin cache, partial rotary, in place or not."""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import memory_bound
from . import launcher

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: batch invariant: each token's rotation depends on its own position only
_CAP = Capability(devices=DEVICES, dtypes=DTYPES, features=frozenset({"cuda_graph", "deterministic", "in_place",
                                                                      "batch_invariant"}))


def _cost(problem: Any) -> float:
    tokens = getattr(problem, "tokens", 0) or 0
    heads = (getattr(problem, "q_heads", 0) or 0) + (getattr(problem, "kv_heads", 0) or 0)
    head_dim = getattr(problem, "head_dim", 0) or 0
    return memory_bound(problem, 2 * tokens * heads * head_dim * problem.dtype.itemsize)


def kernels() -> list[Kernel]:
    return [
        Kernel("rope.apply", "rope", BACKEND, _CAP, launcher("rope:apply"), priority=PRIORITY, cost=_cost,
               doc="NeoX or GPT-J rotation from inv_freq (cos/sin computed in-kernel), partial rotary, in place or not"),
        Kernel("rope.apply_cos_sin_cache", "rope_cos_sin_cache", BACKEND, _CAP, launcher("rope:apply_cos_sin_cache"),
               priority=PRIORITY, cost=_cost, doc="NeoX or GPT-J rotation from a (max_pos, rotary_dim) cos/sin cache"),
    ]
