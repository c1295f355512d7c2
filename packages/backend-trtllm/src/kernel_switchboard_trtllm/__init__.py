"""Kernel Switchboard backend trtllm."""

__version__ = "0.1.0"
