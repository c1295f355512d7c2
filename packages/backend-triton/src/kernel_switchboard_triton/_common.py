"""What every Triton kernel module shares: the device set and rank for this environment."""

from __future__ import annotations

from kernel_switchboard.availability import triton_interpreting

#: devices Triton kernels run on here (the CPU only under TRITON_INTERPRET=1)
DEVICES = frozenset({"cuda", "cpu"}) if triton_interpreting() else frozenset({"cuda"})
#: priority: above the reference on a GPU, far below it when interpreted on the CPU
PRIORITY = -1000 if triton_interpreting() else 10
BACKEND = "triton"
