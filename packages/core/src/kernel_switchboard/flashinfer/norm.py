"""``flashinfer.norm`` over the switchboard's ``norm`` ops: RMSNorm (and Gemma's ``1 + weight`` form), the fused
residual add + RMSNorm (in place), and LayerNorm. ``enable_pdl`` is a launch hint and changes nothing here."""

from __future__ import annotations

import torch

from ..ops import norm
from ._common import write_out


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """``input / rms(input) * weight`` over the last dim; input (N, hidden) or (N, heads, hidden). ``out``, when
    given, is written and returned."""
    y = norm.rms_norm(input, weight, eps)
    return write_out(out, y)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
                  enable_pdl: bool | None = None) -> torch.Tensor:
    """Gemma's RMSNorm: ``input / rms(input) * (1 + weight)``."""
    y = norm.rms_norm(input, weight, eps, gemma=True)
    return write_out(out, y)


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual) * weight``."""
    norm.fused_add_rms_norm(input, residual, weight, eps)


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                            enable_pdl: bool | None = None) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual) * (1 + weight)``."""
    norm.fused_add_rms_norm(input, residual, weight, eps, gemma=True)


def layernorm(input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm over the last dim: input (N, hidden), ``gemma`` the scale and ``beta`` the shift (hidden,)."""
    return norm.layer_norm(input, gemma, beta, eps)
