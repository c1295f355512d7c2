"""Triton KV-cache kernels (``kv_cache.append``, ``append_slots``, ``append_csr``, ``append_mla``): records
and capabilities.

The kernels live in ``_append.py``: one program per (token, block of heads) finds its page (through the block
table or the CSR page table, or from its slot) and writes K and V (fp8 pages: value / scale, saturated, rounded to
nearest even). Any head dim and page size; NHD and HND; no host sync (CUDA-graph capturable).
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .. import __version__
from .._common import BACKEND, DEVICES, PRIORITY
from . import launcher
from .attention import cost_seconds, fp8_needs_sm89, nbytes

_FLOAT = frozenset({torch.float16, torch.bfloat16, torch.float32})

APPEND = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_FLOAT, kv_dtypes=_FLOAT | {torch.float8_e4m3fn, torch.float8_e5m2},
    layouts=frozenset({"NHD", "HND"}),
    features=frozenset({"paged", "in_place", "fp8_kv", "qk_v_dims_differ", "cuda_graph", "deterministic",
                        "batch_invariant"}),
    check=fp8_needs_sm89,
)
APPEND_MLA = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_FLOAT, kv_dtypes=_FLOAT,
    features=frozenset({"paged", "in_place", "cuda_graph", "deterministic", "batch_invariant"}),
)


def _append_cost(pr: Any) -> float:
    per_token = pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * (nbytes(pr.dtype) + nbytes(pr.kv_dtype))
    return cost_seconds(pr.tokens * per_token, 0.0, pr)


def _append_mla_cost(pr: Any) -> float:
    return cost_seconds(pr.tokens * (pr.head_dim + pr.head_dim_pe) * 2 * nbytes(pr.dtype), 0.0, pr)


def kernels() -> list[Kernel]:
    """The KV-cache kernels of the Triton backend."""
    return [
        Kernel("kv_cache.append", "append", BACKEND, APPEND, launcher("_append:append"), version=__version__, cost=_append_cost,
               priority=PRIORITY, doc="scatter of new K/V rows through the block table; fp8 quantisation"),
        Kernel("kv_cache.append_slots", "append_slots", BACKEND, APPEND, launcher("_append:append_slots"),
               version=__version__, cost=_append_cost, priority=PRIORITY,
               doc="scatter of new K/V rows to their slots; negative = padding"),
        Kernel("kv_cache.append_csr", "append_csr", BACKEND, APPEND, launcher("_append:append_csr"),
               version=__version__, cost=_append_cost, priority=PRIORITY,
               doc="scatter of new K/V rows through the CSR page table, one launch; targets outside write nothing"),
        Kernel("kv_cache.append_mla", "append_mla", BACKEND, APPEND_MLA, launcher("_append:append_mla"),
               version=__version__,
               cost=_append_mla_cost, priority=PRIORITY, doc="scatter of new latent / rope rows"),
    ]
