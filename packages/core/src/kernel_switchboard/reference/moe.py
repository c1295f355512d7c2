"""Reference moe kernels (see :mod:`kernel_switchboard.ops.moe` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
