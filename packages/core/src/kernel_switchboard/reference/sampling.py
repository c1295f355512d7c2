"""Reference sampling kernels (see :mod:`kernel_switchboard.ops.sampling` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
