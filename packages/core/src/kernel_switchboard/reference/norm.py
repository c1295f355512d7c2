"""Reference normalisation kernels (see :mod:`kernel_switchboard.ops.norm` for signatures)."""

from __future__ import annotations

import torch

from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY
from ._rows import rowwise


def _scale(weight: torch.Tensor, gemma: bool) -> torch.Tensor:
    w = weight.float()
    return w + 1.0 if gemma else w


def _rms(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    x32 = x.float()
    return (x32 * _rms(x32, eps) * _scale(weight, gemma)).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> None:
    s = x.float() + residual.float()
    residual.copy_(s)
    x.copy_(s * _rms(s, eps) * _scale(weight, gemma))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    x32 = x.float()
    mean = x32.mean(dim=-1, keepdim=True)
    var = (x32 - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x32 - mean) * torch.rsqrt(var + eps) * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


KERNELS = [
    Kernel("norm.rms_norm", "rms_norm", "reference", INVARIANT_CAPTURABLE, rowwise(rms_norm, rows=(0,)),
           priority=PRIORITY),
    Kernel("norm.fused_add_rms_norm", "fused_add_rms_norm", "reference", INVARIANT_CAPTURABLE,
           rowwise(fused_add_rms_norm, rows=(0, 1), mutated=lambda args: (0, 1)), priority=PRIORITY),
    Kernel("norm.layer_norm", "layer_norm", "reference", INVARIANT_CAPTURABLE, rowwise(layer_norm, rows=(0,)),
           priority=PRIORITY),
]
