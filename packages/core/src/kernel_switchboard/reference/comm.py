"""Reference comm kernels (see :mod:`kernel_switchboard.ops.comm` for the signature and semantics).

``torch.distributed.all_reduce`` (NCCL on GPU, gloo on CPU) of a float32 copy of x, then the
residual add and RMSNorm in float32. Identity all-reduce without an initialised process group.
"""

from __future__ import annotations

from typing import Any

import torch

from ..registry import Kernel
from ._cap import PRIORITY, REFERENCE


def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    s = x.to(torch.float32, copy=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(s, group=group)
    return s.to(x.dtype)


def all_reduce_fused_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.to(torch.float32, copy=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(s, group=group)
    s += residual.float()
    y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), s.to(residual.dtype)


KERNELS = [
    Kernel("comm.all_reduce", "all_reduce", "reference", REFERENCE, all_reduce, priority=PRIORITY,
           doc="torch.distributed.all_reduce of a float32 copy"),
    Kernel("comm.all_reduce_fused_rms_norm", "all_reduce_fused_rms_norm", "reference", REFERENCE,
           all_reduce_fused_rms_norm, priority=PRIORITY, doc="torch.distributed.all_reduce + float32 RMSNorm"),
]
