"""Registration of the cudnn backend (kernels being written)."""

from __future__ import annotations

from kernel_switchboard import Backend, hookimpl

from . import __version__

INSTALL = 'pip install "kernel-switchboard[cudnn]"'


@hookimpl
def ksb_backend() -> Backend:
    return Backend("cudnn", __version__, [], unavailable="no kernels yet", install=INSTALL)
