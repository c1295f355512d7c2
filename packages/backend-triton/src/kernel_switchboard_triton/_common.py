"""What every Triton kernel module shares: the device set and rank for this environment, TMA checks.

Imports no Triton: the kernel records (:mod:`.catalog`) use it at discovery.
"""

from __future__ import annotations

import functools

import torch

from kernel_switchboard.availability import module_installed, triton_interpreting

#: devices Triton kernels run on here (the CPU only under TRITON_INTERPRET=1)
DEVICES = frozenset({"cuda", "cpu"}) if triton_interpreting() else frozenset({"cuda"})
#: priority: above the reference on a GPU, far below it when interpreted on the CPU
PRIORITY = -1000 if triton_interpreting() else 10
BACKEND = "triton"


@functools.lru_cache(maxsize=8)
def has_tma(device: torch.device) -> bool:
    """TMA needs Hopper or newer (the interpreter emulates it)."""
    return triton_interpreting() or (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9)


@functools.cache
def _gluon_importable() -> bool:
    """Whether this Triton has the Gluon Hopper language our Gluon kernels use (wgmma, TMA, mbarriers; 3.5+)."""
    try:
        from . import _gemm_gluon, _mla_gluon_ws  # noqa: F401  (_mla_gluon_ws imports _mla_gluon)
    except (ImportError, AttributeError):  # no Gluon, or one without the Hopper names the kernels use
        return False
    return True


@functools.lru_cache(maxsize=8)
def gluon_hopper(device: torch.device) -> bool:
    """The Gluon kernels can run on ``device``: an sm_90 GPU (their MMAs are Hopper's wgmma), never interpreted."""
    return (not triton_interpreting() and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] == 9 and _gluon_importable())


@functools.cache
def gluon_findable() -> bool:
    """Whether this Triton ships the Gluon Hopper language, read from its files (nothing imported): what cost
    estimates use to tell which kernel a call would take; the launchers check with :func:`gluon_hopper`."""
    return module_installed("triton.experimental.gluon.language.nvidia.hopper")


@functools.cache
def gluon_clusters() -> bool:
    """Whether this Triton's Gluon runs our multi-CTA kernels: 3.9+, whose cluster-wide mbarriers (count multiplied
    by the CTAs, every CTA's arrivals in CTA 0) and multicast TMA loads they rely on (3.7's multi-CTA barriers are
    per CTA)."""
    import triton

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 9) and _gluon_importable()


@functools.lru_cache(maxsize=8)
def pdl_launch(device: torch.device) -> dict[str, bool]:
    """The launch keywords of a kernel with a ``PDL`` constexpr (:mod:`._gdc`) on ``device``: ``PDL`` and Triton's
    ``launch_pdl``, on for sm_90 and newer GPUs with a Triton that has grid dependency control, never interpreted
    (the same dict each call: spread it, never change it)."""
    on = (not triton_interpreting() and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
          and module_installed("triton.language.extra.cuda.gdc"))
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def row_major_for_tma(t: torch.Tensor) -> bool:
    """TMA can describe the 2-D ``t`` as it is: unit last stride, 16-byte aligned row stride and base."""
    size = t.element_size()
    return (t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.stride(0) >= t.shape[1])
