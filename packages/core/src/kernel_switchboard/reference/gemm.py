"""Reference gemm kernels (see :mod:`kernel_switchboard.ops.gemm` for signatures)."""

from __future__ import annotations

from ..registry import Kernel

KERNELS: list[Kernel] = []
