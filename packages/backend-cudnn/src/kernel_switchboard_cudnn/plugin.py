"""Registration of the cuDNN backend.

Availability is checked when the hook runs (first dispatch), never at import: the
``nvidia-cudnn-frontend`` module within its version window, a CUDA GPU of compute capability 8.0+,
and a cuDNN library the frontend can load whose version has paged SDPA. Without them every kernel
stays listed, unavailable, with the reason and the install command.
"""

from __future__ import annotations

import torch

from kernel_switchboard import Backend, hookimpl
from kernel_switchboard.availability import missing_cuda, missing_module
from kernel_switchboard.device import package_version

from . import __version__
from .support import FRONTEND_BELOW, FRONTEND_MIN, REFERENCE_SUPPORT, Support, version_text

INSTALL = 'pip install "kernel-switchboard[cudnn]"'
FRONTEND = "nvidia-cudnn-frontend"


def probe() -> tuple[Support, str | None, str]:
    """(support row, reason the backend is unavailable or None, kernel version text)."""
    reason = missing_module("cudnn", FRONTEND, minimum=FRONTEND_MIN, below=FRONTEND_BELOW)
    if reason is None:
        reason = missing_cuda(min_cc=(8, 0))
    frontend = package_version(FRONTEND)
    if reason is not None:
        return REFERENCE_SUPPORT, reason, f"frontend {frontend}" if frontend else ""
    try:
        from .graphs import versions

        backend_version = versions()[0]
    except Exception as exc:
        return REFERENCE_SUPPORT, f"the cuDNN library could not be loaded: {type(exc).__name__}: {str(exc)[:200]}", ""
    support = Support(backend_version, torch.cuda.get_device_capability())
    return support, support.unavailable(), f"cuDNN {version_text(backend_version)}, frontend {frontend}"


@hookimpl
def ksb_backend() -> Backend:
    from .attention import kernels

    support, reason, version = probe()
    providers = {FRONTEND: package_version(FRONTEND),
                 "cudnn": version_text(support.version) if reason is None else None}
    return Backend("cudnn", __version__, kernels(support, version), unavailable=reason, install=INSTALL,
                   providers=providers)
