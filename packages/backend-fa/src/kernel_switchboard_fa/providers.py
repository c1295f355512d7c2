"""The FlashAttention providers, their version windows, and whether each one can run here.

=============  =====================  ==================  ==========  ===========================
provider       module                 distribution        window      GPUs
=============  =====================  ==================  ==========  ===========================
fa4            flash_attn.cute        flash-attn-4        [4.0, 5)    sm_90, sm_100/103, sm_110
fa3            flash_attn_interface   flash_attn_3        [3.0, 4)    sm_90
fa2            flash_attn             flash-attn          [2.6, 3)    sm_80 .. sm_90
torch-flash    torch (SDPA flash)     torch               [2.5, -)    sm_80+
=============  =====================  ==================  ==========  ===========================

flash-attn-4 also installs into the ``flash_attn`` namespace, so FA2 is recognised by its
distribution, not by the package name alone. Probing reads package metadata and finds the module
without importing it (the CuTe DSL behind FA4 takes seconds to import); a provider is imported when
one of its kernels first runs, and its entry point (``Provider.entry``) is checked then.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.artefacts import prepare_flash_attn_cute
from kernel_switchboard.availability import import_vendor, missing_cuda, missing_module, version_in_window
from kernel_switchboard.device import package_version
from kernel_switchboard.errors import KernelUnavailableError


@dataclass(frozen=True)
class Provider:
    """One FlashAttention implementation and how to get it."""

    key: str
    module: str
    distribution: str
    minimum: str
    below: str | None
    min_cc: tuple[int, int]
    max_cc: tuple[int, int]
    install: str
    #: the attribute of ``module`` the kernels call (checked when the module is first imported)
    entry: str = ""


FA4 = Provider("fa4", "flash_attn.cute", "flash-attn-4", "4.0.0", "5", (9, 0), (11, 9),
               'pip install "kernel-switchboard[fa]"  (flash-attn-4, CuTe DSL)', "flash_attn_varlen_func")
FA3 = Provider("fa3", "flash_attn_interface", "flash_attn_3", "3.0.0", "4", (9, 0), (9, 0),
               "build FlashAttention-3 from source: pip install "
               "'git+https://github.com/Dao-AILab/flash-attention.git#subdirectory=hopper' --no-build-isolation",
               "flash_attn_with_kvcache")
FA2 = Provider("fa2", "flash_attn", "flash-attn", "2.6.0", "3", (8, 0), (9, 0),
               "pip install flash-attn --no-build-isolation", "flash_attn_varlen_func")
TORCH_FLASH = Provider("torch-flash", "torch", "torch", "2.5.0", None, (8, 0), (99, 0),
                       "install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
PROVIDERS = (FA4, FA3, FA2, TORCH_FLASH)


def version(provider: Provider) -> str | None:
    """The installed version of the provider's distribution, or None."""
    if provider is TORCH_FLASH:
        return torch.__version__.split("+")[0]
    return package_version(provider.distribution)


def unavailable(provider: Provider) -> str | None:
    """Why ``provider`` cannot run here (module, version window, GPU), or None."""
    if provider is TORCH_FLASH:
        reason = None if version_in_window(torch.__version__, provider.minimum) else (
            f"torch {torch.__version__} is older than {provider.minimum}")
    else:
        reason = missing_module(provider.module, provider.distribution, provider.minimum, provider.below)
        if reason is None and version(provider) is None:
            reason = (f"distribution {provider.distribution!r} is not installed "
                      f"(module {provider.module!r} comes from another one)")
    if reason is None:
        reason = missing_cuda(min_cc=provider.min_cc, max_cc=provider.max_cc)
    if reason is None and provider is TORCH_FLASH and not torch.backends.cuda.flash_sdp_enabled():
        reason = "torch's flash SDPA backend is disabled (torch.backends.cuda.enable_flash_sdp(False))"
    return reason


@functools.cache
def load(provider: Provider) -> Any:
    """The provider's module, imported for a kernel about to run; an import failure or a module without the
    provider's entry point raises :class:`KernelUnavailableError` with the install command. FA4 first gets its
    persistent compile cache in the switchboard's artefact directory (:func:`prepare_flash_attn_cute`)."""
    if provider is FA4:
        prepare_flash_attn_cute()
    module = import_vendor(provider.module, provider.install)
    if provider.entry and not hasattr(module, provider.entry):
        raise KernelUnavailableError(f"{provider.module}.{provider.entry} is missing (not the {provider.key} interface); "
                                     f"install: {provider.install}")
    return module
