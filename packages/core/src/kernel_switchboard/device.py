"""What hardware and which library versions are here. Nothing probes the GPU at import time."""

from __future__ import annotations

import ctypes
import functools
import platform
from importlib import metadata
from typing import Any

import torch

CC = tuple[int, int]


@functools.lru_cache(maxsize=64)
def compute_capability(device: torch.device) -> CC | None:
    """(major, minor) of a CUDA device, ``None`` for anything else. Cached per device."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)


def device_name(device: torch.device) -> str:
    """A human name for the device: the GPU model or the CPU architecture."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()})"


def default_device() -> torch.device:
    """The first CUDA device when there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def package_version(distribution: str) -> str | None:
    """Installed version of a distribution, or ``None`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def driver_version() -> str | None:
    """The NVIDIA driver's version (e.g. ``"580.159.04"``), read through NVML (``libnvidia-ml``, which every
    driver installs; torch does not report it), or ``None`` where NVML is missing or fails."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            text = ctypes.create_string_buffer(96)
            ok = nvml.nvmlSystemGetDriverVersion(text, ctypes.c_uint(len(text))) == 0
        finally:
            nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return text.value.decode() if ok and text.value else None


def fingerprint() -> dict[str, Any]:
    """The environment a measurement or a cache entry belongs to."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "kernel-switchboard": package_version("kernel-switchboard"),
        "triton": package_version("triton"),
    }
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        info["gpu"] = device_name(dev)
        info["compute_capability"] = ".".join(map(str, compute_capability(dev) or ()))
        info["cudnn"] = torch.backends.cudnn.version()
        info["driver"] = driver_version()
    else:
        info["gpu"] = None
    return info


def pairs_without_peer_access(count: int) -> list[str]:
    """``"i->j"`` for each pair of the first ``count`` GPUs where i cannot map j's memory (no NVLink or PCIe P2P)."""
    return [f"{i}->{j}" for i in range(count) for j in range(count)
            if i != j and not torch.cuda.can_device_access_peer(i, j)]


def is_capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
