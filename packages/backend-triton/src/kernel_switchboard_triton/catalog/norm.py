"""Records of the Triton normalisation kernels (launchers in :mod:`..norm`): rms_norm (and Gemma's 1 + w),
fused_add_rms_norm in place, layer_norm; one pass over memory."""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import memory_bound
from . import launcher

#: widest row (elements, power of two) a block kernel holds in registers (wider rows take the looped kernels;
#: the fused all-reduce + norm of :mod:`.comm` has no looped form and declines them)
MAX_BLOCK = 16384
DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: batch invariant: a row's reduction layout is fixed by its width (and 16 rows per tile inside the scope)
_FEATURES = frozenset({"cuda_graph", "deterministic", "batch_invariant"})
_CAP = Capability(devices=DEVICES, dtypes=DTYPES, features=_FEATURES)
_CAP_IN_PLACE = Capability(devices=DEVICES, dtypes=DTYPES, features=_FEATURES | {"in_place"})


def _bytes(problem: Any, tensors: int) -> float:
    return tensors * problem.rows * problem.hidden * problem.dtype.itemsize


def kernels() -> list[Kernel]:
    return [
        Kernel("norm.rms_norm", "rms_norm", BACKEND, _CAP, launcher("norm:rms_norm"), priority=PRIORITY,
               cost=lambda p: memory_bound(p, _bytes(p, 2)), doc="one pass, rows in registers; Gemma (1 + w) variant"),
        Kernel("norm.fused_add_rms_norm", "fused_add_rms_norm", BACKEND, _CAP_IN_PLACE,
               launcher("norm:fused_add_rms_norm"), priority=PRIORITY, cost=lambda p: memory_bound(p, _bytes(p, 4)),
               doc="in place: residual <- x + residual, x <- rms_norm(residual); one pass"),
        Kernel("norm.layer_norm", "layer_norm", BACKEND, _CAP, launcher("norm:layer_norm"), priority=PRIORITY,
               cost=lambda p: memory_bound(p, _bytes(p, 2)), doc="one pass, rows in registers, optional bias"),
    ]
