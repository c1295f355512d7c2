"""Programmatic dependent launch (PDL, Hopper and newer) for the kernels that run right after another kernel on the
stream: launched with ``launch_pdl=True``, a kernel's programs may be scheduled while the kernel before it finishes;
:func:`after_prior` then holds each program until that kernel's writes are visible, before it touches memory, and lets
the next PDL-launched kernel be scheduled in turn. What overlaps is the launch and the prior kernel's tail, about a
microsecond: the share that counts in short kernels (norms, the split-KV merges). FlashInfer launches its norms this
way on sm_90 by default. :func:`kernel_switchboard_triton._common.pdl_launch` says where it is used."""

from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control: Triton 3.3 and newer
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - ``_common.pdl_launch`` turns PDL off then, and the branch below is never compiled
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def after_prior(PDL: tl.constexpr):
    """With ``PDL``: wait for the kernel before this one (all of its writes visible), then allow the next one to be
    scheduled. Called first in a kernel, before any load or store; nothing without ``PDL``."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
