"""Registration of the CUTLASS backend.

The GEMM kernels are CUTLASS 3.x Hopper GEMMs emitted as C++ (:mod:`.emit`), compiled with nvcc for
``sm_90a`` into an on-disk cache (:mod:`.build`) and called through a C entry point. They need:
nvcc >= 12.3, the CUTLASS C++ headers (shipped in the ``nvidia-cutlass`` wheel), and a GPU of
compute capability 9.0 (sm_90a binaries run nowhere else). Each missing piece is a reason with
the command that fixes it; the kernels stay listed. ``attention.dense`` is CUTLASS's memory-efficient
attention as torch ships it (:mod:`.attention`): it needs only a CUDA build of torch and a GPU.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kernel_switchboard import Backend, hookimpl
from kernel_switchboard.availability import missing_cuda
from kernel_switchboard.device import package_version

from . import __version__, attention, gemm, toolchain
from .gemm import CC

INSTALL = toolchain.INSTALL
GPU_NEEDED = "an NVIDIA Hopper GPU (compute capability 9.0; the kernels are sm_90a binaries) and a CUDA build of torch"


def unavailable_reason() -> tuple[str | None, str | None]:
    """(reason, install command) the CUTLASS kernels cannot run here, or (None, None)."""
    reason = toolchain.missing_headers()
    if reason is not None:
        return reason, INSTALL
    reason = toolchain.missing_nvcc()
    if reason is not None:
        return reason, toolchain.NVCC_INSTALL
    reason = missing_cuda(min_cc=CC, max_cc=CC)
    if reason is not None:
        return reason, GPU_NEEDED
    return None, None


@hookimpl
def ksb_backend() -> Backend:
    """The GEMMs (unavailable with the toolchain's reason) and the dense attention (needs a CUDA GPU only);
    the backend itself is unavailable only when none of its kernels can run."""
    reason, install = unavailable_reason()
    gemms = [replace(k, unavailable=reason, install=install) if reason else k for k in gemm.kernels(__version__)]
    dense = attention.kernels(__version__)
    kernels = gemms + dense
    headers = None if toolchain.missing_headers() else toolchain.headers().version
    providers = {"nvidia-cutlass": package_version("nvidia-cutlass"), "cutlass-headers": headers,
                 "torch-sdpa-efficient": None if dense[0].unavailable else torch.__version__}
    everything_out = all(k.unavailable for k in kernels)
    return Backend("cutlass", __version__, kernels, unavailable=reason if everything_out else None,
                   install=install if everything_out else None, providers=providers)
