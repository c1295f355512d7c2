"""Triton comm kernels: ``comm.all_reduce`` and ``comm.all_reduce_fused_rms_norm`` as a one-shot all-reduce over
peer memory (decode-sized messages; the fused op adds the residual and normalises in the same kernel), and for the
fused op ``torch.distributed``'s all-reduce followed by one fused add + RMSNorm pass.

One-shot: each rank copies its x into a buffer of torch's symmetric memory (mapped into every rank of the group); a barrier
makes the copies visible; one kernel reads each row from every rank, sums in float32 in rank order (so every rank
gets bit-identical outputs) and applies the residual add and RMSNorm (:mod:`._comm_kernels`); a second barrier
holds the buffers until every rank has read them. Four launches and no NCCL call: the latency path for
decode-sized messages. Every rank reads the whole message from every peer, so past :data:`.catalog.comm.ONE_SHOT_MAX_BYTES`
the capability declines. Needs GPU ranks of one host in an NCCL group.

All-reduce then norm: the collective (NCCL's ring on GPUs) sums a copy of x in x's dtype, as NCCL sums, then
:func:`.norm.fused_add_rms_norm` adds the residual and normalises in one pass: the pair an engine would write by
hand, and half the bytes on the wire of the reference's float32 sum. Serves every message size and group.
Signature: see :mod:`kernel_switchboard.ops.comm`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import triton

from kernel_switchboard.errors import KernelUnavailableError

from . import _comm_kernels as K
from .norm import MAX_BLOCK, block_config, fused_add_rms_norm

T = TypeVar("T")


@dataclass
class _Exchange:
    allocation: torch.Tensor  # this rank's symmetric allocation (kept alive while the exchange is)
    handle: Any  # torch's _SymmetricMemory of it: barrier(channel), get_buffer(rank, sizes, dtype)
    local: torch.Tensor  # (capacity,) of the message dtype: this rank's buffer, as its peers address it
    peers: torch.Tensor  # (world,) int64 device addresses of every rank's buffer, rank order


_EXCHANGES: dict[tuple[str, str, torch.dtype], _Exchange] = {}


def _exchange(group: Any, device: torch.device, dtype: torch.dtype, numel: int) -> _Exchange:
    """This rank's exchange buffer for ``group`` (None: the default group), grown to hold ``numel`` elements.
    Creating or growing one is collective; every rank calls with the same shapes (the op's contract), so the ranks
    reach it together."""
    from torch.distributed import _symmetric_memory as symm_mem

    if not hasattr(symm_mem, "empty"):
        raise KernelUnavailableError(f"torch {torch.__version__}'s symmetric memory has no empty(): a newer torch is "
                                     "needed (pip install -U torch)")
    name = (group if group is not None else torch.distributed.group.WORLD).group_name  # type: ignore[union-attr]
    key = (name, str(device), dtype)
    ex = _EXCHANGES.get(key)
    if ex is None or ex.local.numel() < numel:
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required by older torch, a deprecated no-op later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(name)
        capacity = triton.next_power_of_2(max(numel, 1))
        allocation = symm_mem.empty(capacity, dtype=dtype, device=device)
        handle = symm_mem.rendezvous(allocation, name)
        views = [handle.get_buffer(rank, (capacity,), dtype) for rank in range(handle.world_size)]
        peers = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64, device=device)
        ex = _EXCHANGES[key] = _Exchange(allocation, handle, views[handle.rank], peers)
    return ex


def sum_add_rms_norm(peers: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s): s = the sum of the (rows, hidden) contributions at ``peers`` + residual, y = rms_norm(s) * weight.

    peers: (world,) int64 addresses of contiguous (rows, hidden) tensors of residual's dtype, on its device;
    residual: (rows, hidden) contiguous, hidden <= :data:`MAX_BLOCK`; weight: (hidden,) contiguous.
    """
    rows, n = residual.shape
    y, s = torch.empty_like(residual), torch.empty_like(residual)
    if rows == 0:
        return y, s
    cfg = block_config(min(rows, 16), n)
    assert cfg is not None, f"hidden={n} > {MAX_BLOCK}: the capability declines it"
    bm, bn, nw = cfg
    K._sum_add_rms_norm_block[(triton.cdiv(rows, bm),)](peers, residual, weight, y, s, rows, n, eps,
                                                        WORLD=peers.numel(), BLOCK_M=bm, BLOCK_N=bn, num_warps=nw)
    return y, s


#: elements per program of the one-shot sum
SUM_BLOCK = 2048


def sum_peers(peers: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The float32 sum (in ``like``'s dtype and shape) of the contiguous contributions at ``peers`` ((world,) int64
    addresses of ``like.numel()`` elements of its dtype each, on its device)."""
    out = torch.empty_like(like)
    if like.numel():
        K._sum_block[(triton.cdiv(like.numel(), SUM_BLOCK),)](peers, out, like.numel(), WORLD=peers.numel(),
                                                             BLOCK=SUM_BLOCK, num_warps=8)
    return out


def _exchanged(x: torch.Tensor, group: Any, reduce: Callable[[torch.Tensor], T]) -> T:
    """``reduce(peers)`` between the two barriers of a one-shot exchange of x (this rank's buffer holds x)."""
    ex = _exchange(group, x.device, x.dtype, x.numel())
    ex.local[: x.numel()].view_as(x).copy_(x)
    ex.handle.barrier(channel=0)  # every rank's contribution is in its buffer
    result = reduce(ex.peers)
    ex.handle.barrier(channel=1)  # every rank has read every buffer: the next call may overwrite them
    return result


def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _exchanged(x, group, lambda peers: sum_peers(peers, x))


def all_reduce_fused_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _exchanged(x, group, lambda peers: sum_add_rms_norm(peers, residual, weight.contiguous(), eps))


def all_reduce_then_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                         group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.distributed's all-reduce of a copy of x (summed in x's dtype), then one fused add + RMSNorm pass."""
    y, s = x.clone(), residual.clone()
    torch.distributed.all_reduce(y, group=group)
    fused_add_rms_norm(y, s, weight.contiguous(), eps, gemma=False)  # s <- sum + residual, y <- rms_norm(s) * w
    return y, s
