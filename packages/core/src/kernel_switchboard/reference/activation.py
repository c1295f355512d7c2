"""Reference activation kernels (see :mod:`kernel_switchboard.ops.activation` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
