"""Registration of the cuDNN backend.

Availability is checked when the hook runs (first dispatch), never at import, and imports nothing of
cuDNN's: the ``nvidia-cudnn-frontend`` distribution within its version window (package metadata), a
CUDA GPU of compute capability 8.0+, and a cuDNN library whose version has paged SDPA (the one torch
loaded, :func:`.support.library_version`). Without them every kernel stays listed, unavailable, with
the reason and the install command. The frontend is imported when a cuDNN kernel first runs.
"""

from __future__ import annotations

import torch

from kernel_switchboard import Backend, hookimpl
from kernel_switchboard.availability import missing_cuda, missing_module
from kernel_switchboard.device import package_version

from . import __version__
from .support import (
    FRONTEND,
    FRONTEND_BELOW,
    FRONTEND_MIN,
    INSTALL,
    LIBRARY_DISTRIBUTIONS,
    REFERENCE_SUPPORT,
    Support,
    library_version,
    version_text,
)


def probe() -> tuple[Support, str | None, str]:
    """(support row, reason the backend is unavailable or None, kernel version text)."""
    reason = missing_module("cudnn", FRONTEND, minimum=FRONTEND_MIN, below=FRONTEND_BELOW)
    if reason is None:
        reason = missing_cuda(min_cc=(8, 0))
    frontend = package_version(FRONTEND)
    if reason is not None:
        return REFERENCE_SUPPORT, reason, f"frontend {frontend}" if frontend else ""
    try:
        backend_version = library_version()
    except Exception as exc:
        return REFERENCE_SUPPORT, f"the cuDNN library could not be loaded: {type(exc).__name__}: {str(exc)[:200]}", ""
    if backend_version is None:
        return (REFERENCE_SUPPORT, f"the cuDNN library could not be found (torch {torch.__version__} reports none and "
                f"no {' / '.join(LIBRARY_DISTRIBUTIONS)} wheel is installed)", "")
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
