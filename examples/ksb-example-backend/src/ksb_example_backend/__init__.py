"""Example third-party backend for Kernel Switchboard."""
