"""Registration of the Triton backend. Each family module of :mod:`.catalog` exposes ``kernels() -> list[Kernel]``.

Discovery imports no Triton: availability comes from package metadata (:func:`missing_module`), and each
record's ``run`` is a launcher that imports Triton and the kernel's module on its first call.

On a GPU the kernels run compiled. With ``TRITON_INTERPRET=1`` they also declare the CPU (the
interpreter runs them in numpy): that is how CI tests them, and they then rank below the reference
kernels so only an explicit ``backend="triton"`` picks them there.
"""

from __future__ import annotations

import importlib

from kernel_switchboard import Backend, Kernel, hookimpl
from kernel_switchboard.availability import missing_cuda, missing_module, triton_interpreting
from kernel_switchboard.device import package_version

from . import __version__
from .catalog import FAMILIES, INSTALL

NEEDS_GPU = "a CUDA build of torch on an NVIDIA GPU (sm_80+); TRITON_INTERPRET=1 runs the kernels on the CPU for testing"


@hookimpl
def ksb_backend() -> Backend:
    providers = {"triton": package_version("triton")}
    missing = missing_module("triton", "triton", minimum="3.2")
    if missing is not None:  # nothing could run: nothing to list
        return Backend("triton", __version__, [], unavailable=missing, install=INSTALL, providers=providers)
    kernels: list[Kernel] = []
    for family in FAMILIES:
        kernels.extend(importlib.import_module(f"{__package__}.catalog.{family}").kernels())
    no_gpu = None if triton_interpreting() else missing_cuda(min_cc=(8, 0))
    # without a GPU the kernels stay listed, unavailable with the reason (the registry marks them)
    return Backend("triton", __version__, kernels, unavailable=no_gpu, install=NEEDS_GPU if no_gpu else None,
                   providers=providers)
