"""The built-in ``reference`` backend: every family module's ``KERNELS``."""

from __future__ import annotations

import importlib

from ..hookspecs import hookimpl
from ..ops import FAMILIES
from ..registry import Backend, Kernel


def kernels() -> list[Kernel]:
    out: list[Kernel] = []
    for family in FAMILIES:
        out.extend(importlib.import_module(f"{__package__}.{family}").KERNELS)
    return out


@hookimpl
def ksb_backend() -> Backend:
    from .. import __version__

    return Backend(name="reference", version=__version__, kernels=kernels())
