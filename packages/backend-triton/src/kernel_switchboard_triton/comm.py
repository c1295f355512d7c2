"""Triton comm kernels: ``comm.all_reduce`` and ``comm.all_reduce_fused_rms_norm`` as a one-shot all-reduce over
peer memory (decode-sized messages; the fused op adds the residual and normalises in the same kernel), and for the
fused op ``torch.distributed``'s all-reduce followed by one fused add + RMSNorm pass.

One-shot: each rank copies its x into a buffer of torch's symmetric memory (mapped into every rank of the group); a barrier
makes the copies visible; one kernel reads each row from every rank, sums in float32 in rank order (so every rank
gets bit-identical outputs) and applies the residual add and RMSNorm (:mod:`._comm_kernels`); a second barrier
holds the buffers until every rank has read them. Four launches and no NCCL call: the latency path for
decode-sized messages. Every rank reads the whole message from every peer, so past :data:`ONE_SHOT_MAX_BYTES`
the capability declines. Needs GPU ranks of one host in an NCCL group.

All-reduce then norm: the collective (NCCL's ring on GPUs) sums a copy of x in x's dtype, as NCCL sums, then
:func:`.norm.fused_add_rms_norm` adds the residual and normalises in one pass: the pair an engine would write by
hand, and half the bytes on the wire of the reference's float32 sum. Serves every message size and group.
Signature: see :mod:`kernel_switchboard.ops.comm`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import triton

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.device import pairs_without_peer_access

from . import _comm_kernels as K
from ._common import BACKEND, DEVICES, PRIORITY
from ._perf import memory_bound, on_gpu
from .norm import DTYPES, MAX_BLOCK, block_config, fused_add_rms_norm

#: largest message (rows x hidden x itemsize, rows bucketed) sent one-shot: 256 tokens of hidden 8192 in bf16.
#: Not yet measured on 2+ GPUs (issue 11): the crossover with NCCL's ring is an estimate.
ONE_SHOT_MAX_BYTES = 4 << 20
#: bytes/s one H100/H200 pulls from its NVLink peers (an estimate for ranking)
NVLINK_BANDWIDTH = 450e9
#: seconds of one symmetric-memory barrier across the group (an estimate for ranking)
BARRIER = 5e-6
#: seconds of an NCCL all-reduce besides its bytes (an estimate for ranking)
NCCL_LATENCY = 15e-6
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


def _message_bytes(p: Any) -> int:
    return int(p.rows * p.hidden * p.dtype.itemsize)


@functools.cache
def _peer_access(world: int) -> bool:
    """Every pair of the first ``world`` GPUs can access each other's memory (NVLink or PCIe P2P)."""
    return not pairs_without_peer_access(world)


def _one_shot_check(p: Any) -> list[str]:
    out = []
    if p.world_size < 2:
        out.append(f"world_size={p.world_size}: a one-shot exchange needs 2+ ranks (one rank has nothing to sum)")
    if p.group_backend != "nccl":
        out.append(f"group_backend={p.group_backend!r}: peer memory needs the GPU ranks of an 'nccl' group")
    elif p.device == "cuda" and p.world_size > torch.cuda.device_count():
        out.append(f"world_size={p.world_size} > {torch.cuda.device_count()} GPUs here: peer memory needs every rank "
                   f"on this host")
    elif p.device == "cuda" and not _peer_access(p.world_size):
        out.append(f"GPUs 0-{p.world_size - 1} cannot all map each other's memory (no P2P between some pair)")
    if _message_bytes(p) > ONE_SHOT_MAX_BYTES:
        out.append(f"message {_message_bytes(p) / 2**20:.1f} MiB > {ONE_SHOT_MAX_BYTES / 2**20:.0f} MiB: one-shot "
                   f"reads the whole message from every peer; NCCL's ring is faster past it")
    return out


def _one_shot_cost(p: Any, local_passes: int = 6) -> float:
    """Copy in and the kernel's local traffic through HBM (``local_passes`` times the message: the copy reads x and
    writes the buffer; the fused kernel reads its own buffer and the residual and writes two outputs), the peers'
    contributions over NVLink, two barriers."""
    if not on_gpu(p):
        return math.inf
    nbytes = _message_bytes(p)
    return (memory_bound(p, local_passes * nbytes, launches=2) + 2 * BARRIER
            + (p.world_size - 1) * nbytes / NVLINK_BANDWIDTH)


def _all_reduce_then_norm_check(p: Any) -> list[str]:
    if p.world_size < 2:
        return [f"world_size={p.world_size}: one rank has nothing to sum (the reference's identity all-reduce serves)"]
    return []


def _all_reduce_then_norm_cost(p: Any) -> float:
    """NCCL's ring (each rank sends and receives 2 (W - 1) / W of the message), the two copies and the fused pass."""
    if not on_gpu(p):
        return math.inf
    nbytes, world = _message_bytes(p), p.world_size
    ring = NCCL_LATENCY + 2 * (world - 1) / world * nbytes / NVLINK_BANDWIDTH
    return ring + memory_bound(p, 8 * nbytes, launches=3)  # copies of x and residual; the fused pass reads 2, writes 2


def _missing_symmetric_memory() -> str | None:
    try:
        from torch.distributed import _symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch {torch.__version__} has no torch.distributed symmetric memory ({e})"
    if not hasattr(symm_mem, "empty"):
        return f"torch {torch.__version__}'s symmetric memory has no empty(): a newer torch is needed"
    return None


_ONE_SHOT_SUM = Capability(devices=frozenset({"cuda"}), dtypes=DTYPES, limits={"world_size": 8},
                           check=_one_shot_check)
_ONE_SHOT = replace(_ONE_SHOT_SUM, limits={"hidden": MAX_BLOCK, "world_size": 8})  # the norm holds rows in registers
#: the collective runs wherever torch.distributed does (gloo on the CPU, where the interpreter runs the norm)
_THEN_NORM = Capability(devices=DEVICES, dtypes=DTYPES, check=_all_reduce_then_norm_check)


def kernels() -> list[Kernel]:
    missing = _missing_symmetric_memory()
    install = "pip install -U torch" if missing else None
    return [
        Kernel("comm.all_reduce_fused_rms_norm", "one_shot_all_reduce_rms_norm", BACKEND, _ONE_SHOT,
               all_reduce_fused_rms_norm, priority=PRIORITY, cost=_one_shot_cost, unavailable=missing,
               install=install,
               doc="one-shot all-reduce over symmetric (peer) memory fused with residual add + RMSNorm; "
                   f"messages <= {ONE_SHOT_MAX_BYTES >> 20} MiB"),
        Kernel("comm.all_reduce", "one_shot_all_reduce", BACKEND, _ONE_SHOT_SUM, all_reduce, priority=PRIORITY,
               cost=lambda p: _one_shot_cost(p, local_passes=4), unavailable=missing,
               install=install,
               doc=f"one-shot all-reduce over symmetric (peer) memory; messages <= {ONE_SHOT_MAX_BYTES >> 20} MiB"),
        Kernel("comm.all_reduce_fused_rms_norm", "all_reduce_then_norm", BACKEND, _THEN_NORM, all_reduce_then_norm,
               priority=PRIORITY, cost=_all_reduce_then_norm_cost,
               doc="torch.distributed all-reduce in x's dtype (NCCL's ring), then one fused add + RMSNorm pass"),
    ]
