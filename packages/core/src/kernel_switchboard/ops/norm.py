"""Normalisation ops: ``norm.rms_norm``, ``norm.fused_add_rms_norm``, ``norm.layer_norm``.

Kernel ``run`` signatures (x is 2-d ``(rows, hidden)`` with unit stride in the last dim):

- ``norm.rms_norm``: ``run(x, weight, eps, gemma) -> y``; y = x / rms(x) * w (Gemma: * (1 + w)).
- ``norm.fused_add_rms_norm``: ``run(x, residual, weight, eps, gemma) -> None``, in place:
  ``residual <- x + residual``; ``x <- rms_norm(x + residual)`` (the sum taken in float32).
- ``norm.layer_norm``: ``run(x, weight, bias, eps) -> y`` (bias may be None).

Accumulation is float32 for every dtype; outputs have x's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail, positive_float
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features


class NormProblem(NamedTuple):
    """Signature of a normalisation call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    hidden: int
    rows: int  # bucketed
    gemma: bool
    features: frozenset[str]


def _validate(x: torch.Tensor, weight: torch.Tensor, eps: float, name: str = "x") -> torch.Tensor:
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
    positive_float("eps", eps)
    return x if x.dim() == 2 else x.reshape(-1, hidden)


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
    if torch.compiler.is_compiling():
        return RMS_NORM.compiled(x, weight, positive_float("eps", eps), gemma, backend)  # type: ignore[no-any-return]
    return _rms_norm_eager(x, weight, positive_float("eps", eps), gemma, backend)


def rms_norm_call(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  gemma: bool = False) -> tuple[NormProblem, torch.Tensor]:
    """Validate an :func:`rms_norm` call: its problem and x as (rows, hidden)."""
    x2 = _validate(x, weight, eps)
    return _problem(x2, gemma), x2


def _rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, backend: BackendArg) -> torch.Tensor:
    problem, x2 = rms_norm_call(x, weight, eps, gemma)
    y = select("norm.rms_norm", problem, backend).kernel.run(x2, weight, eps, gemma)
    return y if x2 is x else y.view(x.shape)


# -- fused_add_rms_norm ----------------------------------------------------------------------------
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                       gemma: bool = False, backend: BackendArg = None) -> None:
    """In place: ``residual <- x + residual``, then ``x <- rms_norm(residual)``.

    x, residual: (..., hidden), same shape, dtype and device, contiguous; weight: (hidden,).
    """
    if torch.compiler.is_compiling():
        FUSED_ADD_RMS_NORM.compiled(x, residual, weight, positive_float("eps", eps), gemma, backend)
        return
    _fused_add_eager(x, residual, weight, positive_float("eps", eps), gemma, backend)


def _validate_fused_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Check x and residual (written in place) and weight; returns x as (rows, hidden)."""
    x2 = _validate(x, weight, eps)
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
    return x2


def fused_add_rms_norm_call(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                            gemma: bool = False) -> tuple[NormProblem, torch.Tensor]:
    """Validate a :func:`fused_add_rms_norm` call: its problem and x as (rows, hidden)."""
    x2 = _validate_fused_add(x, residual, weight, eps)
    return _problem(x2, gemma, frozenset({"in_place"})), x2


def _fused_add_eager(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
                     backend: BackendArg) -> None:
    problem, x2 = fused_add_rms_norm_call(x, residual, weight, eps, gemma)
    select("norm.fused_add_rms_norm", problem, backend).kernel.run(x2, residual.view(x2.shape), weight, eps, gemma)


# -- layer_norm ------------------------------------------------------------------------------------
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               backend: BackendArg = None) -> torch.Tensor:
    """LayerNorm over the last dim. x: (..., hidden); weight, bias: (hidden,) or bias None."""
    if torch.compiler.is_compiling():
        return LAYER_NORM.compiled(x, weight, bias, positive_float("eps", eps), backend)  # type: ignore[no-any-return]
    return _layer_norm_eager(x, weight, bias, positive_float("eps", eps), backend)


def _validate_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Check x, weight and bias; returns x as (rows, hidden)."""
    x2 = _validate(x, weight, eps)
    if bias is not None:
        check_tensor(bias, "bias", dims=1, dtypes=FLOAT_DTYPES)
        if bias.shape != weight.shape:
            raise fail("bias.shape", tuple(bias.shape), f"weight's shape {tuple(weight.shape)}")
        check_same_device("bias", bias, "x", x)
    return x2


def layer_norm_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    eps: float = 1e-5) -> tuple[NormProblem, torch.Tensor]:
    """Validate a :func:`layer_norm` call: its problem and x as (rows, hidden)."""
    x2 = _validate_layer_norm(x, weight, bias, eps)
    return _problem(x2, False), x2


def _layer_norm_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                      backend: BackendArg) -> torch.Tensor:
    problem, x2 = layer_norm_call(x, weight, bias, eps)
    y = select("norm.layer_norm", problem, backend).kernel.run(x2, weight, bias, eps)
    return y if x2 is x else y.view(x.shape)


# -- specs -----------------------------------------------------------------------------------------
_BACKEND = Arg("backend", "backend")
RMS_NORM = define(OpSpec(
    "norm.rms_norm", rms_norm, NormProblem, rms_norm_call, reference="rms_norm", cases="norm", op="rms_norm",
    args=(Arg("x"), Arg("weight"), Arg("eps", "float"), Arg("gemma", "bool"), _BACKEND),
    fake=lambda x, *rest: torch.empty_like(x),
))
FUSED_ADD_RMS_NORM = define(OpSpec(
    "norm.fused_add_rms_norm", fused_add_rms_norm, NormProblem, fused_add_rms_norm_call,
    reference="fused_add_rms_norm", cases="norm", op="fused_add_rms_norm",
    args=(Arg("x", mutated=True), Arg("residual", mutated=True), Arg("weight"), Arg("eps", "float"),
          Arg("gemma", "bool"), _BACKEND),
    returns="()", fake=lambda *args: None,
))
LAYER_NORM = define(OpSpec(
    "norm.layer_norm", layer_norm, NormProblem, layer_norm_call, reference="layer_norm", cases="norm",
    op="layer_norm", args=(Arg("x"), Arg("weight"), Arg("bias", "Tensor?"), Arg("eps", "float"), _BACKEND),
    fake=lambda x, *rest: torch.empty_like(x),
))
