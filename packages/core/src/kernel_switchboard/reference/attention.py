"""Reference attention kernels (see :mod:`kernel_switchboard.ops.attention` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
