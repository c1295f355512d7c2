"""Reference kv_cache kernels (see :mod:`kernel_switchboard.ops.kv_cache` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
