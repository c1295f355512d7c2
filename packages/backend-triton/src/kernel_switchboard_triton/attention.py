"""Triton attention kernels (being written)."""

from __future__ import annotations

from kernel_switchboard import Kernel


def kernels() -> list[Kernel]:
    return []
