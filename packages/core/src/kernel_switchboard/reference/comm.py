"""Reference comm kernels (see :mod:`kernel_switchboard.ops.comm` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
