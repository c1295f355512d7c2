"""Normalisation ops: ``norm.rms_norm``, ``norm.fused_add_rms_norm``, ``norm.layer_norm``.

Kernel ``run`` signatures (x is 2-d ``(rows, hidden)`` with unit stride in the last dim):

- ``norm.rms_norm``: ``run(x, weight, eps, gemma) -> y``; y = x / rms(x) * w (Gemma: * (1 + w)).
- ``norm.fused_add_rms_norm``: ``run(x, residual, weight, eps, gemma) -> None``, in place:
  ``residual <- x + residual``; ``x <- rms_norm(x + residual)`` (the sum taken in float32).
- ``norm.layer_norm``: ``run(x, weight, bias, eps) -> y`` (bias may be None).

Accumulation is float32 for every dtype; outputs have x's dtype.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select_kernel
from ..errors import fail, positive_float
from ._common import (
    FLOAT_DTYPES,
    BackendArg,
    backend_from_str,
    backend_to_str,
    check_same_device,
    check_tensor,
    compiling,
    custom_op,
    device_key,
    graph_features,
)


class NormProblem(NamedTuple):
    """Signature of a normalisation call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    hidden: int
    rows: int  # bucketed
    gemma: bool
    features: frozenset[str]


def _validate(x: torch.Tensor, weight: torch.Tensor, name: str = "x") -> torch.Tensor:
    check_tensor(x, name, dtypes=FLOAT_DTYPES)
    if x.dim() < 1:
        raise fail(f"{name}.shape", tuple(x.shape), "at least 1-d (..., hidden)")
    if x.stride(-1) != 1:
        raise fail(f"{name}.stride", x.stride(), "unit stride in the last (hidden) dim")
    check_tensor(weight, "weight", dims=1, dtypes=FLOAT_DTYPES)
    hidden = x.shape[-1]
    if weight.shape[0] != hidden:
        raise fail("weight.shape", tuple(weight.shape), f"({hidden},) = {name}'s hidden size")
    check_same_device("weight", weight, name, x)
    return x if x.dim() == 2 else x.reshape(-1, hidden)


def _eps(eps: Any) -> float:
    """``eps`` as a float, refused by name unless it is a finite number > 0 (checked before any conversion)."""
    return positive_float("eps", eps)


def _problem(x2: torch.Tensor, gemma: bool, extra: frozenset[str] = frozenset()) -> NormProblem:
    dev, cc = device_key(x2)
    feats = graph_features(dev)
    return NormProblem(dev, cc, x2.dtype, x2.shape[1], bucket(x2.shape[0]), gemma, feats | extra if extra else feats)


# -- rms_norm --------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, gemma: bool = False,
             backend: BackendArg = None) -> torch.Tensor:
    """RMSNorm over the last dim. x: (..., hidden) fp16/bf16/fp32; weight: (hidden,). Returns x's shape and dtype.

    ``gemma=True`` scales by ``1 + weight`` (Gemma's convention).
    """
    if compiling():
        return _rms_norm_op(x, weight, _eps(eps), gemma, backend_to_str(backend))
    return _rms_norm_eager(x, weight, _eps(eps), gemma, backend)


def _rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, backend: BackendArg) -> torch.Tensor:
    x2 = _validate(x, weight)
    kernel = select_kernel("norm.rms_norm", _problem(x2, gemma), backend)
    y = kernel.run(x2, weight, eps, gemma)
    return y if x2 is x else y.view(x.shape)


def _rms_norm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, backend: str | None) -> torch.Tensor:
    return _rms_norm_eager(x, weight, eps, gemma, backend_from_str(backend))


_rms_norm_op = custom_op("rms_norm", _rms_norm_impl, lambda x, weight, eps, gemma, backend: torch.empty_like(x))


# -- fused_add_rms_norm ----------------------------------------------------------------------------
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                       gemma: bool = False, backend: BackendArg = None) -> None:
    """In place: ``residual <- x + residual``, then ``x <- rms_norm(residual)``.

    x, residual: (..., hidden), same shape, dtype and device, contiguous; weight: (hidden,).
    """
    if compiling():
        _fused_add_op(x, residual, weight, _eps(eps), gemma, backend_to_str(backend))
        return
    _fused_add_eager(x, residual, weight, _eps(eps), gemma, backend)


def _fused_add_eager(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                     backend: BackendArg) -> None:
    x2 = _validate(x, weight)
    if not x.is_contiguous():
        raise fail("x", "non-contiguous", "a contiguous tensor (it is written in place)")
    check_tensor(residual, "residual")
    if residual.shape != x.shape:
        raise fail("residual.shape", tuple(residual.shape), f"x's shape {tuple(x.shape)}")
    if residual.dtype != x.dtype:
        raise fail("residual.dtype", residual.dtype, f"x's dtype ({x.dtype})")
    check_same_device("residual", residual, "x", x)
    if not residual.is_contiguous():
        raise fail("residual", "non-contiguous", "a contiguous tensor (it is written in place)")
    kernel = select_kernel("norm.fused_add_rms_norm", _problem(x2, gemma, frozenset({"in_place"})), backend)
    kernel.run(x2, residual.view(x2.shape), weight, eps, gemma)


def _fused_add_impl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                    backend: str | None) -> None:
    _fused_add_eager(x, residual, weight, eps, gemma, backend_from_str(backend))


_fused_add_op = custom_op("fused_add_rms_norm", _fused_add_impl, lambda x, residual, weight, eps, gemma, backend: None,
                          mutates_args=("x", "residual"))


# -- layer_norm ------------------------------------------------------------------------------------
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               backend: BackendArg = None) -> torch.Tensor:
    """LayerNorm over the last dim. x: (..., hidden); weight, bias: (hidden,) or bias None."""
    if compiling():
        return _layer_norm_op(x, weight, bias, _eps(eps), backend_to_str(backend))
    return _layer_norm_eager(x, weight, bias, _eps(eps), backend)


def _layer_norm_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                      backend: BackendArg) -> torch.Tensor:
    x2 = _validate(x, weight)
    if bias is not None:
        check_tensor(bias, "bias", dims=1, dtypes=FLOAT_DTYPES)
        if bias.shape != weight.shape:
            raise fail("bias.shape", tuple(bias.shape), f"weight's shape {tuple(weight.shape)}")
        check_same_device("bias", bias, "x", x)
    kernel = select_kernel("norm.layer_norm", _problem(x2, False), backend)
    y = kernel.run(x2, weight, bias, eps)
    return y if x2 is x else y.view(x.shape)


def _layer_norm_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                     backend: str | None) -> torch.Tensor:
    return _layer_norm_eager(x, weight, bias, eps, backend_from_str(backend))


_layer_norm_op = custom_op("layer_norm", _layer_norm_impl, lambda x, weight, bias, eps, backend: torch.empty_like(x))
