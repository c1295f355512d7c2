"""Conformance cases for the gated activations (silu / gelu / gelu_tanh and mul, gpt-oss's clamped SwiGLU)."""

from __future__ import annotations

import torch

from ..case import Case

OPS = ("activation.silu_and_mul", "activation.gelu_and_mul", "activation.gelu_tanh_and_mul",
       "activation.swiglu_oai_and_mul")
#: the clamped SwiGLU's (alpha, limit): gpt-oss's, and a tighter clamp that more values cross
SWIGLU_PARAMS = ((1.702, 7.0), (1.0, 3.0))
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


def _case(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, g: torch.Generator,
          swiglu: tuple[float, float] = SWIGLU_PARAMS[0]) -> Case:
    if op not in OPS:
        raise ValueError(f"unknown activation op {op!r}")
    tag = f"{str(dtype)[6:]}-{'x'.join(map(str, shape))}"
    if op == "activation.swiglu_oai_and_mul":  # wide enough that some gates and ups cross the clamp
        x = (4 * torch.randn(shape, generator=g, device=device)).to(dtype)
        alpha, limit = swiglu
        return Case(op, f"{tag}-a{alpha}-l{limit}", (x,), {"alpha": alpha, "limit": limit}, dtype)
    x = (2 * torch.randn(shape, generator=g, device=device)).to(dtype)
    return Case(op, tag, (x,), {}, dtype)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator(device=device).manual_seed(0)
    table = _SMALL if size == "small" else _LARGE
    params = SWIGLU_PARAMS if op == "activation.swiglu_oai_and_mul" else SWIGLU_PARAMS[:1]
    return [_case(op, shape, dtype, device, g, swiglu) for shape, dtypes in table for dtype in dtypes
            for swiglu in params]


def example(op: str, device: torch.device, tokens: int = 8192, hidden: int = 14336, dtype: str = "bfloat16") -> Case:
    """One case of ``op``: x (tokens, 2 * hidden) (``switchboard explain`` / ``bench``)."""
    g = torch.Generator(device=device).manual_seed(0)
    return _case(op, (tokens, 2 * hidden), getattr(torch, dtype), device, g)
