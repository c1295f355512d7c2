"""Compile ahead of time, in parallel, the kernels a set of calls will need.

``configs_for_calls`` maps public-op calls (op name, args) to the configurations their CUTLASS
kernels would pick (pure torch, nothing compiled); ``prebuild`` compiles them with
``build.compile_many``. Tests and benchmarks use it so that nvcc runs once, in parallel, instead of
once per first call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from kernel_switchboard.ops.gemm import scale_mode_of

from . import build, gemm
from .configs import GemmConfig


def config_for_call(op: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> GemmConfig | None:
    """The configuration the CUTLASS kernel of ``op`` would use for these public-op arguments (None if
    the call is outside what it declares)."""
    kwargs = kwargs or {}
    a, b = args[0], args[1]
    if op == "gemm.mm" and a.dtype in gemm.HALF:
        return gemm.prepare_mm(a, b).cfg
    if op == "gemm.mm_fp8":
        sa, sb = args[2], args[3]
        mode = scale_mode_of(sa, sb, a.shape[0], b.shape[1], a.shape[1])
        out = kwargs.get("out_dtype", torch.bfloat16)
        return gemm.fp8_config_for(mode, out, a.shape[0], b.shape[1]) if mode in ("tensor", "block") else None
    if op == "gemm.grouped_mm" and a.dtype in gemm.HALF:
        return gemm.prepare_grouped(a, b, args[2]).cfg
    return None


def prebuild(calls: Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]], jobs: int | None = None) -> list[GemmConfig]:
    """Compile every configuration the calls need; returns them."""
    cfgs = [c for c in (config_for_call(op, args, kw) for op, args, kw in calls) if c is not None]
    todo = list(dict.fromkeys(cfgs))
    build.compile_many(todo, jobs)
    return todo
