"""Records of the Triton comm kernels (launchers in :mod:`..comm`): ``comm.all_reduce`` and
``comm.all_reduce_fused_rms_norm`` as a one-shot all-reduce over peer memory (decode-sized messages), and for the
fused op ``torch.distributed``'s all-reduce followed by one fused add + RMSNorm pass (every size and group)."""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.availability import module_installed, version_in_window
from kernel_switchboard.device import pairs_without_peer_access

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import memory_bound, on_gpu
from . import launcher
from .norm import DTYPES, MAX_BLOCK

#: largest message (rows x hidden x itemsize, rows bucketed) sent one-shot: 256 tokens of hidden 8192 in bf16.
#: Not yet measured on 2+ GPUs: the crossover with NCCL's ring is an estimate.
ONE_SHOT_MAX_BYTES = 4 << 20
#: bytes/s one H100/H200 pulls from its NVLink peers (an estimate for ranking)
NVLINK_BANDWIDTH = 450e9
#: seconds of one symmetric-memory barrier across the group (an estimate for ranking)
BARRIER = 5e-6
#: seconds of an NCCL all-reduce besides its bytes (an estimate for ranking)
NCCL_LATENCY = 15e-6


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


#: the first torch whose symmetric memory has ``empty()`` and ``rendezvous()`` as the one-shot kernels use them
SYMMETRIC_MEMORY_TORCH = "2.6"


def _missing_symmetric_memory() -> str | None:
    """Why torch's symmetric memory cannot serve here, from the torch version and its files (importing it takes
    ~0.1 s, paid when a one-shot kernel first runs)."""
    if not module_installed("torch.distributed._symmetric_memory"):
        return f"torch {torch.__version__} has no torch.distributed symmetric memory"
    if not version_in_window(torch.__version__, SYMMETRIC_MEMORY_TORCH):
        return f"torch {torch.__version__}'s symmetric memory predates empty(): torch >= {SYMMETRIC_MEMORY_TORCH} is needed"
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
               launcher("comm:all_reduce_fused_rms_norm"), priority=PRIORITY, cost=_one_shot_cost, unavailable=missing,
               install=install,
               doc="one-shot all-reduce over symmetric (peer) memory fused with residual add + RMSNorm; "
                   f"messages <= {ONE_SHOT_MAX_BYTES >> 20} MiB"),
        Kernel("comm.all_reduce", "one_shot_all_reduce", BACKEND, _ONE_SHOT_SUM, launcher("comm:all_reduce"),
               priority=PRIORITY,
               cost=lambda p: _one_shot_cost(p, local_passes=4), unavailable=missing,
               install=install,
               doc=f"one-shot all-reduce over symmetric (peer) memory; messages <= {ONE_SHOT_MAX_BYTES >> 20} MiB"),
        Kernel("comm.all_reduce_fused_rms_norm", "all_reduce_then_norm", BACKEND, _THEN_NORM,
               launcher("comm:all_reduce_then_norm"),
               priority=PRIORITY, cost=_all_reduce_then_norm_cost,
               doc="torch.distributed all-reduce in x's dtype (NCCL's ring), then one fused add + RMSNorm pass"),
    ]
