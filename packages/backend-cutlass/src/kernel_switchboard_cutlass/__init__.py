"""Kernel Switchboard backend cutlass."""

__version__ = "0.1.0"
