"""Where TensorRT-LLM's kernels come from, and whether each source is usable here.

Two providers:

- ``flashinfer-python`` ships TensorRT-LLM's XQA decode kernels and its CUTLASS fused-MoE kernels
  as C++/CUDA source that it compiles on first use (its JIT cache). The argument conventions used
  here were read from flashinfer-python 0.6.18.post1 and tested with it on an H200; the entry points
  called here have the same signatures in 0.7.2.post1 and 0.7.4 (keyword arguments added only), the
  releases current vLLM and SGLang pin, so the window admits 0.7.x.
- ``tensorrt_llm`` (its torch ops) for users who can install it. PyPI's ``tensorrt-llm`` is a stub
  that downloads the real wheel from NVIDIA's index at install time.

No probe runs at import time; every function here is called from the backend hook or a kernel, and none
imports flashinfer or tensorrt_llm (package metadata and the import system's finders only): they are
imported when one of their kernels first runs.
"""

from __future__ import annotations

import importlib.util

from kernel_switchboard.availability import missing_cuda, missing_module
from kernel_switchboard.device import package_version

FLASHINFER_DIST = "flashinfer-python"
FLASHINFER_MIN, FLASHINFER_BELOW = "0.6.18", "0.8"
INSTALL = 'pip install "kernel-switchboard[trtllm]"'
TRTLLM_INSTALL = "pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com"
GPU_NEEDED = "an NVIDIA GPU with a CUDA build of torch (XQA: sm_90 / sm_100 / sm_120; fused MoE: sm_89+)"


def flashinfer_version() -> str | None:
    return package_version(FLASHINFER_DIST)


def tensorrt_llm_version() -> str | None:
    return package_version("tensorrt_llm") or package_version("tensorrt-llm")


def provider_tag(name: str, version: str | None) -> str:
    """``trtllm-xqa@flashinfer-0.6.18.post1``: the provider and its version in a kernel name."""
    return f"{name}@flashinfer-{version}" if version else f"{name}@flashinfer"


def installed(module: str) -> bool:
    """Whether ``module`` can be found (nothing is imported)."""
    return importlib.util.find_spec(module) is not None


def missing_flashinfer() -> tuple[str | None, str | None]:
    """(reason, install command) flashinfer's TensorRT-LLM kernels cannot run here, or (None, None)."""
    if not installed("flashinfer"):
        return f"python module 'flashinfer' is not installed ({FLASHINFER_DIST} {FLASHINFER_MIN}+)", INSTALL
    reason = missing_cuda(min_cc=(8, 9))
    if reason is not None:
        return reason, GPU_NEEDED
    reason = missing_module("flashinfer", FLASHINFER_DIST, FLASHINFER_MIN, FLASHINFER_BELOW)
    if reason is not None:
        return reason, INSTALL
    return None, None


def missing_tensorrt_llm() -> tuple[str | None, str | None]:
    """(reason, install command) tensorrt_llm's torch ops cannot run here, or (None, None)."""
    stub = " (PyPI's tensorrt-llm is a stub that fetches the real wheel from NVIDIA's index at install time)"
    if not installed("tensorrt_llm"):
        return "python module 'tensorrt_llm' is not installed" + stub, TRTLLM_INSTALL
    reason = missing_cuda(min_cc=(8, 0))
    if reason is not None:
        return reason, GPU_NEEDED
    reason = missing_module("tensorrt_llm")
    if reason is not None:
        return reason + stub, TRTLLM_INSTALL
    return None, None
