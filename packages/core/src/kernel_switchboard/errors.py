"""Exceptions raised by the switchboard, and the argument checks that raise them."""

from __future__ import annotations

import math
from typing import Any


class SwitchboardError(Exception):
    """Base class of every error the switchboard raises on purpose."""


class InvalidArgumentError(SwitchboardError, ValueError):
    """An argument has a bad value, shape, dtype or device. The message names the argument."""


class NoEligibleKernelError(SwitchboardError, RuntimeError):
    """No registered kernel can run this problem; the message lists every kernel's reasons."""


class KernelUnavailableError(SwitchboardError, RuntimeError):
    """An explicitly requested backend or kernel cannot run this problem."""


class UnknownBackendError(InvalidArgumentError, KernelUnavailableError):
    """A preference (``backend=``, :func:`kernel_switchboard.use`, ``KSB_PREFER``) names no known backend or
    kernel; the message lists the known backend names."""


class KernelResultError(SwitchboardError, RuntimeError):
    """A kernel broke its contract: it returned a result of the wrong shape, dtype or device, or tried to end the
    process (``SystemExit``). A broken backend, never bad input."""


def fail(name: str, value: Any, allowed: str) -> InvalidArgumentError:
    """Build the standard error for argument ``name``: its value and what is allowed."""
    return InvalidArgumentError(f"{name}={value!r} is invalid: expected {allowed}")


def check(cond: bool, name: str, value: Any, allowed: str) -> None:
    """Raise :class:`InvalidArgumentError` naming ``name`` unless ``cond`` holds."""
    if not cond:
        raise fail(name, value, allowed)


def positive_float(name: str, value: Any) -> float:
    """``value`` as a float; raise naming ``name`` unless it is a finite real number > 0 (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise fail(name, value, "a finite float > 0")
    return float(value)
