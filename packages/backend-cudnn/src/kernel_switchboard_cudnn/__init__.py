"""Kernel Switchboard backend cudnn."""

__version__ = "0.1.0"
