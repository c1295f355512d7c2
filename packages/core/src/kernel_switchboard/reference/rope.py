"""Reference rope kernels (see :mod:`kernel_switchboard.ops.rope` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
