"""Conformance cases for the norm family."""

from __future__ import annotations

import torch

from ..case import Case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 64), (5, 200)] if size == "small" else [(7, 4096), (8192, 8192)]
    out: list[Case] = []
    for dtype in DTYPES:
        for rows, hidden in shapes:
            x = torch.randn(rows, hidden, generator=g).to(device, dtype)
            w = (torch.rand(hidden, generator=g) + 0.5).to(device, dtype)
            tag = f"{str(dtype)[6:]}-{rows}x{hidden}"
            if op == "norm.rms_norm":
                out.append(Case(op, tag, (x, w), {"eps": 1e-6}, dtype))
                out.append(Case(op, tag + "-gemma", (x, w), {"eps": 1e-6, "gemma": True}, dtype))
            elif op == "norm.fused_add_rms_norm":
                r = torch.randn(rows, hidden, generator=g).to(device, dtype)
                out.append(Case(op, tag, (x, r, w), {"eps": 1e-6}, dtype, outputs=lambda a, _: [a[0], a[1]]))
            elif op == "norm.layer_norm":
                b = torch.randn(hidden, generator=g).to(device, dtype)
                out.append(Case(op, tag, (x, w, b), {"eps": 1e-5}, dtype))
                out.append(Case(op, tag + "-nobias", (x, w), {"eps": 1e-5}, dtype))
    return out


def example(op: str, device: torch.device, rows: int = 8192, hidden: int = 8192, dtype: str = "bfloat16",
            gemma: bool = False) -> Case:
    """One case of ``op`` at a chosen size (``switchboard explain`` / ``bench``)."""
    dt = getattr(torch, dtype)
    x = torch.randn(rows, hidden, device=device, dtype=dt)
    w = torch.rand(hidden, device=device, dtype=dt) + 0.5
    tag = f"{rows}x{hidden}"
    if op == "norm.rms_norm":
        return Case(op, tag, (x, w), {"eps": 1e-6, "gemma": gemma}, dt)
    if op == "norm.fused_add_rms_norm":
        return Case(op, tag, (x, torch.randn_like(x), w), {"eps": 1e-6, "gemma": gemma}, dt,
                    outputs=lambda a, _: [a[0], a[1]])
    if op == "norm.layer_norm":
        return Case(op, tag, (x, w, torch.randn_like(w)), {"eps": 1e-5}, dt)
    raise ValueError(f"unknown norm op {op!r}")
