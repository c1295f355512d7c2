"""Registration of the fa backend (kernels being written)."""

from __future__ import annotations

from kernel_switchboard import Backend, hookimpl

from . import __version__

INSTALL = 'pip install "kernel-switchboard[fa]"'


@hookimpl
def ksb_backend() -> Backend:
    return Backend("fa", __version__, [], unavailable="no kernels yet", install=INSTALL)
