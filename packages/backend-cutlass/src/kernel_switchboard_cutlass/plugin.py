"""Registration of the CUTLASS backend.

The kernels are CUTLASS 3.x Hopper GEMMs emitted as C++ (:mod:`.emit`), compiled with nvcc for
``sm_90a`` into an on-disk cache (:mod:`.build`) and called through a C entry point. They need:
nvcc >= 12.3, the CUTLASS C++ headers (shipped in the ``nvidia-cutlass`` wheel), and a GPU of
compute capability 9.0 (sm_90a binaries run nowhere else). Each missing piece is a reason with
the command that fixes it; the kernels stay listed.

Not provided: CUTLASS's memory-efficient attention (torch SDPA's efficient backend) would serve
dense attention with an additive bias or an arbitrary mask, and the core has no such op.
"""

from __future__ import annotations

from kernel_switchboard import Backend, hookimpl
from kernel_switchboard.availability import missing_cuda
from kernel_switchboard.device import package_version

from . import __version__, toolchain
from .gemm import CC, kernels

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
    reason, install = unavailable_reason()
    headers = None if toolchain.missing_headers() else toolchain.headers().version
    providers = {"nvidia-cutlass": package_version("nvidia-cutlass"), "cutlass-headers": headers}
    return Backend("cutlass", __version__, kernels(__version__), unavailable=reason, install=install,
                   providers=providers)
