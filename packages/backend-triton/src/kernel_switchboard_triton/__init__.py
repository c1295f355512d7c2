"""Kernel Switchboard's own Triton kernels for every op family."""

__version__ = "0.1.0"
