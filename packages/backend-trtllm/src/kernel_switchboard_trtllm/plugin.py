"""Registration of the trtllm backend: TensorRT-LLM's kernels from flashinfer-python and tensorrt_llm.

Kernels (each name carries its provider and version):

- ``attention.decode``: ``trtllm-xqa@flashinfer-<v>`` (XQA paged decode);
- ``attention.mla_decode``: ``trtllm-xqa-mla@flashinfer-<v>`` (sm_120 / sm_121 only);
- ``moe.fused_moe``: ``trtllm-cutlass-moe@flashinfer-<v>`` and ``fused_moe@tensorrt_llm-<v>``.

The backend is available when a GPU and a flashinfer-python in the supported window are here; the
tensorrt_llm kernel is separately unavailable (with its install command) when tensorrt_llm is not.
"""

from __future__ import annotations

from kernel_switchboard import Backend, Kernel, hookimpl

from . import __version__, moe, providers, xqa

INSTALL = providers.INSTALL


def kernels() -> list[Kernel]:
    """Every kernel of the backend (the tensorrt_llm one marked unavailable when it cannot run)."""
    fi = providers.flashinfer_version()
    trt_reason, trt_install = providers.missing_tensorrt_llm()
    return [*xqa.kernels(fi), *moe.kernels(fi, providers.tensorrt_llm_version(), trt_reason, trt_install)]


@hookimpl
def ksb_backend() -> Backend:
    reason, install = providers.missing_flashinfer()
    provider_versions = {providers.FLASHINFER_DIST: providers.flashinfer_version(),
                         "tensorrt_llm": providers.tensorrt_llm_version()}
    found = kernels()
    if reason is None:
        found = [_for_this_gpu(k) for k in found]
    if reason is not None:
        # the tensorrt_llm kernel keeps its own reason; the flashinfer ones get the backend's
        found = [k if k.name.startswith("fused_moe@tensorrt_llm") else _unavailable(k, reason, install) for k in found]
        trt_ok = any(k.unavailable is None for k in found)
        return Backend("trtllm", __version__, found, unavailable=None if trt_ok else reason,
                       install=None if trt_ok else install, providers=provider_versions)
    return Backend("trtllm", __version__, found, providers=provider_versions)


def _for_this_gpu(kernel: Kernel) -> Kernel:
    """Mark a kernel unavailable when the GPU here is outside the architectures it is built for."""
    import torch

    cc = torch.cuda.get_device_capability()
    if kernel.op == "attention.decode" and cc[0] not in xqa.XQA_MAJORS:
        return _unavailable(kernel, f"flashinfer builds XQA for sm_90, sm_100 and sm_120; this GPU is {cc[0]}.{cc[1]}",
                            None)
    if kernel.op == "attention.mla_decode" and cc[0] != 12:
        return _unavailable(kernel, f"flashinfer's XQA MLA runs on sm_120 / sm_121 only; this GPU is {cc[0]}.{cc[1]}",
                            None)
    return kernel


def _unavailable(kernel: Kernel, reason: str, install: str | None) -> Kernel:
    from dataclasses import replace

    return replace(kernel, unavailable=reason, install=install)
