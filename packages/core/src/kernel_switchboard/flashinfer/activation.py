"""``flashinfer.activation`` over the switchboard's ``activation`` ops: gated activations of x (..., 2d) ->
``act(x[..., :d]) * x[..., d:]`` (..., d). ``out``, when given, is written and returned; ``enable_pdl`` is a launch
hint and changes nothing here."""

from __future__ import annotations

import torch

from ..ops import activation
from ._common import write_out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """SwiGLU gate: ``silu(x[..., :d]) * x[..., d:]``."""
    y = activation.silu_and_mul(input)
    return write_out(out, y)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """GeGLU gate with the exact (erf) GELU."""
    y = activation.gelu_and_mul(input)
    return write_out(out, y)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None,
                      enable_pdl: bool | None = None) -> torch.Tensor:
    """GeGLU gate with the tanh-approximated GELU."""
    y = activation.gelu_tanh_and_mul(input)
    return write_out(out, y)
