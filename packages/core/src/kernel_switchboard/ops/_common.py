"""Shared plumbing of the public op functions: device keys, capture features, argument checks."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from ..device import compute_capability, is_capturing
from ..errors import fail

#: ``backend=`` argument type of every public op: a backend name, a ``backend:kernel`` id,
#: or a preference list of those
BackendArg = str | Sequence[str] | None

@functools.lru_cache(maxsize=64)
def device_info(device: torch.device) -> tuple[str, tuple[int, int] | None]:
    """(device type, compute capability or None) of a device, cached (a warm call is one C-level lookup)."""
    return device.type, compute_capability(device)


def device_key(t: torch.Tensor) -> tuple[str, tuple[int, int] | None]:
    """(device type, compute capability or None) of a tensor, cached per device."""
    return device_info(t.device)


_NO_FEATURES: frozenset[str] = frozenset()
_CAPTURE_FEATURES = frozenset({"cuda_graph"})


def graph_features(device_type: str) -> frozenset[str]:
    """``{"cuda_graph"}`` while a CUDA graph is being captured, else empty (shared constants: a hot path)."""
    if device_type == "cuda" and is_capturing():
        return _CAPTURE_FEATURES
    return _NO_FEATURES


def check_tensor(t: Any, name: str, dims: int | None = None, dtypes: Any = None) -> None:
    """Raise an error naming ``name`` unless ``t`` is a tensor of ``dims`` dims and an allowed dtype."""
    if not isinstance(t, torch.Tensor):
        raise fail(name, type(t).__name__, "a torch.Tensor")
    if dims is not None and t.dim() != dims:
        raise fail(f"{name}.shape", tuple(t.shape), f"a {dims}-d tensor")
    if dtypes is not None and t.dtype not in dtypes:
        raise fail(f"{name}.dtype", t.dtype, f"one of {sorted(str(d) for d in dtypes)}")


def check_same_device(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise fail(f"{name}.device", t.device, f"the device of {ref_name} ({ref.device})")


FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
