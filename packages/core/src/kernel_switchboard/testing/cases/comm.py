"""Conformance cases for the comm family, in one process (the all-reduce over one rank is the identity).

Multi-rank behaviour is tested by the core test suite with gloo processes (packages/core/tests/test_comm.py);
a backend that needs several ranks declares so in its capability (``world_size``), and its
single-process cases are then reported as outside its declaration.
"""

from __future__ import annotations

from typing import Any

import torch

from ..case import Case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _case(op: str, rows: int, hidden: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Case:
    x = torch.randn(rows, hidden, generator=g).to(device, dtype)
    name = f"{str(dtype)[6:]}-{rows}x{hidden}"
    if op == "comm.all_reduce":
        return Case(op, name, (x,), {}, dtype)
    r = torch.randn(rows, hidden, generator=g).to(device, dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(device, dtype)
    return Case(op, name, (x, r, w), {"eps": 1e-6}, dtype)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    if op not in ("comm.all_reduce", "comm.all_reduce_fused_rms_norm"):
        return []
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 64), (5, 200)] if size == "small" else [(7, 4096), (256, 7168), (2048, 8192)]
    return [_case(op, rows, hidden, dtype, device, g) for dtype in DTYPES for rows, hidden in shapes]


#: the parameters :func:`example` reads, with their types (``switchboard explain`` / ``bench`` / ``tune`` check them)
EXAMPLE_PARAMS: dict[str, type] = {"rows": int, "hidden": int, "dtype": str, "seed": int}


def example(op: str, device: torch.device, **shape: Any) -> Case:
    """One case from CLI-style parameters: rows (256), hidden (8192), dtype ("bfloat16")."""
    from .sampling import _dtype

    g = torch.Generator().manual_seed(int(shape.get("seed", 0)))
    return _case(op, int(shape.get("rows", 256)), int(shape.get("hidden", 8192)),
                 _dtype(str(shape.get("dtype", "bfloat16"))), device, g)
