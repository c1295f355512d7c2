"""Reference gated-activation kernels (see :mod:`kernel_switchboard.ops.activation` for signatures).

Written from the formulas (not torch.nn.functional), so that the tests can compare against torch.
"""

from __future__ import annotations

import math

import torch

from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY
from ._rows import rowwise


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    x32 = x.float()
    return x32[..., :d], x32[..., d:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    return (0.5 * a * (1.0 + torch.erf(a * (1.0 / math.sqrt(2.0)))) * b).to(x.dtype)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    inner = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a * a * a)
    return (0.5 * a * (1.0 + torch.tanh(inner)) * b).to(x.dtype)


def swiglu_oai_and_mul(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate, up = x[..., 0::2].float(), x[..., 1::2].float()
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + 1.0)).to(x.dtype)


KERNELS = [
    Kernel("activation.silu_and_mul", "silu_and_mul", "reference", INVARIANT_CAPTURABLE,
           rowwise(silu_and_mul, rows=(0,)),
           priority=PRIORITY),
    Kernel("activation.gelu_and_mul", "gelu_and_mul", "reference", INVARIANT_CAPTURABLE,
           rowwise(gelu_and_mul, rows=(0,)),
           priority=PRIORITY),
    Kernel("activation.gelu_tanh_and_mul", "gelu_tanh_and_mul", "reference", INVARIANT_CAPTURABLE,
           rowwise(gelu_tanh_and_mul, rows=(0,)),
           priority=PRIORITY),
    Kernel("activation.swiglu_oai_and_mul", "swiglu_oai_and_mul", "reference", INVARIANT_CAPTURABLE,
           rowwise(swiglu_oai_and_mul, rows=(0,)), priority=PRIORITY),
]
