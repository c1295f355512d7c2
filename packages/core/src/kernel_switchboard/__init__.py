"""Kernel Switchboard: one API for the kernels of LLM inference, many backends, ranked per GPU
and workload, with the reasons for every choice.

    import kernel_switchboard as ksb
    y = ksb.norm.rms_norm(x, w)
    print(ksb.explain("norm.rms_norm", x, w))
"""

from __future__ import annotations

__version__ = "0.1.0"

from .capability import Capability
from .dispatch import Selection, autotune, clear_cache, explain, select, use
from .errors import InvalidArgumentError, KernelUnavailableError, NoEligibleKernelError, SwitchboardError
from .hookspecs import hookimpl
from .invariance import batch_invariant
from .ops import activation, attention, comm, gemm, kv_cache, moe, norm, rope, sampling
from .paged import PagedKVCache, PageTable
from .registry import Backend, Kernel, eager_host_floor, registry
from .variants import Variant

__all__ = [
    "Backend",
    "Capability",
    "InvalidArgumentError",
    "Kernel",
    "KernelUnavailableError",
    "NoEligibleKernelError",
    "PageTable",
    "PagedKVCache",
    "Selection",
    "SwitchboardError",
    "Variant",
    "__version__",
    "activation",
    "attention",
    "autotune",
    "batch_invariant",
    "clear_cache",
    "comm",
    "eager_host_floor",
    "explain",
    "gemm",
    "hookimpl",
    "kv_cache",
    "moe",
    "norm",
    "registry",
    "rope",
    "sampling",
    "select",
    "use",
]
