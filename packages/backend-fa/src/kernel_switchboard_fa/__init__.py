"""Kernel Switchboard backend fa."""

__version__ = "0.1.0"
