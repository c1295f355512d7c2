"""Conformance cases for the gated activations (silu / gelu / gelu_tanh and mul)."""

from __future__ import annotations

import torch

from ..case import Case

OPS = ("activation.silu_and_mul", "activation.gelu_and_mul", "activation.gelu_tanh_and_mul")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: (shape of x, dtypes); the last dim is 2d
_SMALL: tuple[tuple[tuple[int, ...], tuple[torch.dtype, ...]], ...] = (
    ((3, 128), DTYPES),
    ((5, 200), DTYPES),  # d = 100: not a multiple of 16
    ((2, 3, 96), DTYPES),  # 3-d input
    ((1, 34), DTYPES),  # d = 17
)
_LARGE: tuple[tuple[tuple[int, ...], tuple[torch.dtype, ...]], ...] = (
    ((8192, 2 * 14336), (torch.bfloat16,)),  # Llama-3-8B MLP at 8192 tokens
    ((4096, 2 * 11008), (torch.float16,)),
    ((1024, 2 * 4096), (torch.float32,)),
    ((333, 2 * 1000), DTYPES),
    ((7, 2 * 18944), (torch.bfloat16,)),  # decode-sized batch, Qwen2-7B width
)


def _case(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Case:
    if op not in OPS:
        raise ValueError(f"unknown activation op {op!r}")
    x = (2 * torch.randn(shape, generator=g, device=device)).to(dtype)
    return Case(op, f"{str(dtype)[6:]}-{'x'.join(map(str, shape))}", (x,), {}, dtype)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator(device=device).manual_seed(0)
    table = _SMALL if size == "small" else _LARGE
    return [_case(op, shape, dtype, device, g) for shape, dtypes in table for dtype in dtypes]


def example(op: str, device: torch.device, tokens: int = 8192, hidden: int = 14336, dtype: str = "bfloat16") -> Case:
    """One case of ``op``: x (tokens, 2 * hidden) (``switchboard explain`` / ``bench``)."""
    g = torch.Generator(device=device).manual_seed(0)
    return _case(op, (tokens, 2 * hidden), getattr(torch, dtype), device, g)
