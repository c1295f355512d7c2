"""Gated activations: ``activation.silu_and_mul``, ``activation.gelu_and_mul``, ``activation.gelu_tanh_and_mul``
and ``activation.swiglu_oai_and_mul``.

Kernel ``run`` signatures, x (N, 2d) fp16/bf16/fp32 with unit stride in the last dim (any row stride), y (N, d)
contiguous in x's dtype, computed in float32:

- the first three: ``run(x) -> y`` with ``y = act(x[:, :d]) * x[:, d:]``; ``act``: silu(a) = a * sigmoid(a);
  gelu (erf) = a/2 * (1 + erf(a / sqrt 2)); gelu_tanh = a/2 * (1 + tanh(sqrt(2/pi) * (a + 0.044715 a^3)));
- ``activation.swiglu_oai_and_mul`` (gpt-oss's clamped SwiGLU, vLLM's ``swigluoai_and_mul``): ``run(x, alpha,
  limit) -> y`` over interleaved pairs, gate ``g = min(x[:, 0::2], limit)``, up ``u = clamp(x[:, 1::2], -limit,
  limit)``, ``y = g * sigmoid(alpha * g) * (u + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_tensor, device_key, graph_features


class ActivationProblem(NamedTuple):
    """Signature of a gated-activation call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    hidden: int  # d, the output width
    rows: int  # bucketed
    features: frozenset[str]


def _validate(x: torch.Tensor) -> torch.Tensor:
    """x (..., 2d) -> its 2-d view (N, 2d) (a copy only when the leading dims cannot be flattened)."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] % 2 != 0 or x.shape[-1] == 0:
        raise fail("x.shape", tuple(x.shape), "(..., 2d) with an even, non-zero last dim")
    if x.stride(-1) != 1:
        raise fail("x.stride", x.stride(), "unit stride in the last dim")
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def activation_call(x: torch.Tensor) -> tuple[ActivationProblem, torch.Tensor]:
    """Validate a gated-activation call: its problem and x as (N, 2d)."""
    x2 = _validate(x)
    dev, cc = device_key(x2)
    return ActivationProblem(dev, cc, x2.dtype, x2.shape[1] // 2, bucket(x2.shape[0]), graph_features(dev)), x2


def _eager(op: str, x: torch.Tensor, backend: BackendArg) -> torch.Tensor:
    problem, x2 = activation_call(x)
    y = select(op, problem, backend).kernel.run(x2)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], x.shape[-1] // 2)


def silu_and_mul(x: torch.Tensor, *, backend: BackendArg = None) -> torch.Tensor:
    """SwiGLU gate: x (..., 2d) -> silu(x[..., :d]) * x[..., d:], shape (..., d), x's dtype."""
    if torch.compiler.is_compiling():
        return SILU_AND_MUL.compiled(x, backend)  # type: ignore[no-any-return]
    return _eager("activation.silu_and_mul", x, backend)


def gelu_and_mul(x: torch.Tensor, *, backend: BackendArg = None) -> torch.Tensor:
    """GeGLU gate with exact (erf) gelu: x (..., 2d) -> gelu(x[..., :d]) * x[..., d:], shape (..., d)."""
    if torch.compiler.is_compiling():
        return GELU_AND_MUL.compiled(x, backend)  # type: ignore[no-any-return]
    return _eager("activation.gelu_and_mul", x, backend)


def gelu_tanh_and_mul(x: torch.Tensor, *, backend: BackendArg = None) -> torch.Tensor:
    """GeGLU gate with tanh-approximated gelu: x (..., 2d) -> gelu_tanh(x[..., :d]) * x[..., d:], shape (..., d)."""
    if torch.compiler.is_compiling():
        return GELU_TANH_AND_MUL.compiled(x, backend)  # type: ignore[no-any-return]
    return _eager("activation.gelu_tanh_and_mul", x, backend)


def swiglu_oai_and_mul(x: torch.Tensor, *, alpha: float = 1.702, limit: float = 7.0,
                       backend: BackendArg = None) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU: x (..., 2d) of interleaved (gate, up) pairs -> (..., d), x's dtype.

    ``y = g * sigmoid(alpha * g) * (u + 1)`` with ``g = min(x[..., 0::2], limit)`` and
    ``u = clamp(x[..., 1::2], -limit, limit)``; gpt-oss uses the defaults (alpha 1.702, limit 7).
    """
    if torch.compiler.is_compiling():
        return SWIGLU_OAI_AND_MUL.compiled(x, float(alpha), float(limit), backend)  # type: ignore[no-any-return]
    problem, x2 = swiglu_oai_call(x, alpha, limit)
    y = select("activation.swiglu_oai_and_mul", problem, backend).kernel.run(x2, float(alpha), float(limit))
    return y if x.dim() == 2 else y.view(*x.shape[:-1], x.shape[-1] // 2)


def swiglu_oai_call(x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> tuple[ActivationProblem, torch.Tensor]:
    """Validate a :func:`swiglu_oai_and_mul` call: its problem and x as (N, 2d)."""
    for name, value in (("alpha", alpha), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise fail(name, value, "a positive finite float")
    return activation_call(x)


def _fake(x: torch.Tensor, *_: object) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _spec(name: str, function: Callable[..., torch.Tensor]) -> OpSpec:
    return define(OpSpec(f"activation.{name}", function, ActivationProblem, activation_call, reference=name,
                         cases="activation", op=name, args=(Arg("x"), Arg("backend", "backend")), fake=_fake))


SILU_AND_MUL = _spec("silu_and_mul", silu_and_mul)
GELU_AND_MUL = _spec("gelu_and_mul", gelu_and_mul)
GELU_TANH_AND_MUL = _spec("gelu_tanh_and_mul", gelu_tanh_and_mul)
SWIGLU_OAI_AND_MUL = define(OpSpec(
    "activation.swiglu_oai_and_mul", swiglu_oai_and_mul, ActivationProblem, swiglu_oai_call,
    reference="swiglu_oai_and_mul", cases="activation", op="swiglu_oai_and_mul",
    args=(Arg("x"), Arg("alpha", "float"), Arg("limit", "float"), Arg("backend", "backend")), fake=_fake,
))
