"""Communication ops: ``comm.all_reduce`` and ``comm.all_reduce_fused_rms_norm``.

Kernel ``run`` signatures (x, residual (rows, hidden) contiguous, same dtype; weight (hidden,); group a
``torch.distributed`` process group or None, the default group):

- ``comm.all_reduce``: ``run(x, group) -> y``, a new tensor of x's dtype holding the sum of x over the group's ranks;
- ``comm.all_reduce_fused_rms_norm``: ``run(x, residual, weight, eps, group) -> (y, residual_out)`` with
  ``residual_out = all_reduce(x) + residual`` and ``y = rms_norm(residual_out) * weight`` in float32; both
  outputs have x's dtype.

The sum over the ranks is taken in float32 by the reference; a kernel built on NCCL's all-reduce sums in x's
dtype, as NCCL does. With no initialised process group (one process) the all-reduce is the identity."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail, positive_float
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features


class CommProblem(NamedTuple):
    """Signature of an all-reduce (+ residual + RMSNorm) call: x viewed as (rows, hidden)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    hidden: int
    rows: int  # bucketed
    world_size: int
    #: the group's torch.distributed backend ("nccl", "gloo", ...); "none" in one process
    group_backend: str
    features: frozenset[str]


def _initialized() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def world_size(group: Any = None) -> int:
    """Ranks in ``group`` (the default group when None); 1 without an initialised process group."""
    return torch.distributed.get_world_size(group) if _initialized() else 1


def group_backend(group: Any = None) -> str:
    """The torch.distributed backend of ``group`` (the default group when None); "none" in one process."""
    return str(torch.distributed.get_backend(group)) if _initialized() else "none"


def all_reduce(x: torch.Tensor, *, group: Any = None, backend: BackendArg = None) -> torch.Tensor:
    """The sum of x over ``group``'s ranks (the default group when None), as a new tensor; x is not modified.

    x: (..., hidden) float; every rank of the group calls it with the same shape and dtype. Under torch.compile
    only ``group=None`` (the default group) is supported: a process group cannot cross a custom op.
    """
    if torch.compiler.is_compiling():
        if group is not None:
            raise fail("group", group, "None (the default process group) under torch.compile")
        return ALL_REDUCE.compiled(x, backend)  # type: ignore[no-any-return]
    return _all_reduce_eager(x, group, backend)


def _check_group(group: Any) -> None:
    if group is not None:
        if not _initialized():
            raise fail("group", group, "None when torch.distributed is not initialised")
        if not isinstance(group, torch.distributed.ProcessGroup):
            raise fail("group", type(group).__name__, "a torch.distributed.ProcessGroup or None")


def _problem(x2: torch.Tensor, group: Any) -> CommProblem:
    dev, cc = device_key(x2)
    return CommProblem(dev, cc, x2.dtype, x2.shape[1], bucket(x2.shape[0]), world_size(group), group_backend(group),
                       graph_features(dev))


def all_reduce_call(x: Any, group: Any = None) -> tuple[CommProblem, torch.Tensor]:
    """Validate an :func:`all_reduce` call: its problem and x as (rows, hidden), contiguous."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise fail("x.shape", tuple(x.shape), "(..., hidden) with hidden >= 1")
    _check_group(group)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return _problem(x2, group), x2


def _all_reduce_eager(x: Any, group: Any, backend: BackendArg) -> torch.Tensor:
    problem, x2 = all_reduce_call(x, group)
    y: torch.Tensor = select("comm.all_reduce", problem, backend).kernel.run(x2, group)
    return y if y.shape == x.shape else y.view(x.shape)


def all_reduce_fused_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                              group: Any = None, backend: BackendArg = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce x over ``group``, add ``residual``, RMSNorm the sum: returns (y, residual_out).

    x, residual: (..., hidden), same shape, dtype and device; weight: (hidden,). Every rank of the group
    calls it with the same shapes. Under torch.compile only ``group=None`` (the default group) is
    supported: a process group cannot cross a custom op.
    """
    if torch.compiler.is_compiling():
        if group is not None:
            raise fail("group", group, "None (the default process group) under torch.compile")
        return ALL_REDUCE_FUSED_RMS_NORM.compiled(x, residual, weight, positive_float("eps", eps),  # type: ignore[no-any-return]
                                                  backend)
    return _ar_norm_eager(x, residual, weight, positive_float("eps", eps), group, backend)


def _validate(x: Any, residual: Any, weight: Any, eps: float, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise fail("x.shape", tuple(x.shape), "(..., hidden) with hidden >= 1")
    check_tensor(residual, "residual")
    if residual.shape != x.shape:
        raise fail("residual.shape", tuple(residual.shape), f"x's shape {tuple(x.shape)}")
    if residual.dtype != x.dtype:
        raise fail("residual.dtype", residual.dtype, f"x's dtype ({x.dtype})")
    check_same_device("residual", residual, "x", x)
    check_tensor(weight, "weight", dims=1, dtypes=FLOAT_DTYPES)
    if weight.shape[0] != x.shape[-1]:
        raise fail("weight.shape", tuple(weight.shape), f"({x.shape[-1]},) = x's hidden size")
    check_same_device("weight", weight, "x", x)
    _check_group(group)
    hidden = x.shape[-1]
    return x.reshape(-1, hidden).contiguous(), residual.reshape(-1, hidden).contiguous()


def all_reduce_fused_rms_norm_call(x: Any, residual: Any, weight: Any, eps: float = 1e-6,
                                   group: Any = None) -> tuple[CommProblem, torch.Tensor, torch.Tensor]:
    """Validate an :func:`all_reduce_fused_rms_norm` call: its problem and x and residual as (rows, hidden)."""
    x2, r2 = _validate(x, residual, weight, eps, group)
    return _problem(x2, group), x2, r2


def _ar_norm_eager(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: Any,
                   backend: BackendArg) -> tuple[torch.Tensor, torch.Tensor]:
    problem, x2, r2 = all_reduce_fused_rms_norm_call(x, residual, weight, eps, group)
    y, r = select("comm.all_reduce_fused_rms_norm", problem, backend).kernel.run(x2, r2, weight, eps, group)
    if y.shape == x.shape:
        return y, r
    return y.view(x.shape), r.view(x.shape)


# -- specs ---------------------------------------------------------------------------------------
def _own(result: Any) -> Any:
    """A custom op's outputs must not be views (of its inputs or of each other): views are copied."""
    if isinstance(result, tuple):
        return tuple(_own(t) for t in result)
    return result.clone() if result._base is not None else result


ALL_REDUCE = define(OpSpec(
    "comm.all_reduce", all_reduce, CommProblem, all_reduce_call, reference="all_reduce", cases="comm",
    op="all_reduce", args=(Arg("x"), Arg("backend", "backend")), outputs=_own,
    fake=lambda x, backend: torch.empty_like(x),
))
ALL_REDUCE_FUSED_RMS_NORM = define(OpSpec(
    "comm.all_reduce_fused_rms_norm", all_reduce_fused_rms_norm, CommProblem, all_reduce_fused_rms_norm_call,
    reference="all_reduce_fused_rms_norm", cases="comm", op="all_reduce_fused_rms_norm",
    args=(Arg("x"), Arg("residual"), Arg("weight"), Arg("eps", "float"), Arg("backend", "backend")),
    returns="(Tensor, Tensor)", outputs=_own,
    fake=lambda x, residual, weight, eps, backend: (torch.empty_like(x), torch.empty_like(x)),
))
