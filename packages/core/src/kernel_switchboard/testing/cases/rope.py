"""Conformance cases for the rope family: both layouts, partial rotary, Llama-3.1 scaling, in place; tables built
with linear and YaRN scaling (YaRN's attention factor scales the table)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ...ops.rope import LinearScaling, Llama3Scaling, Scaling, YarnScaling, cos_sin_cache
from ..case import Case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Config(NamedTuple):
    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int | None
    interleaved: bool
    scaling: Scaling | None
    inplace: bool
    positions_dtype: torch.dtype
    head_major: bool  # q, k stored (H, T, D) and viewed as (T, H, D): strided rows, unit last stride


_SMALL = (
    _Config(5, 4, 2, 64, None, False, None, False, torch.int64, False),
    _Config(7, 3, 1, 64, 32, True, None, False, torch.int32, False),
    _Config(6, 2, 2, 80, 40, False, Llama3Scaling(), False, torch.int64, True),
    _Config(5, 4, 2, 128, None, True, Llama3Scaling(factor=32.0), True, torch.int32, False),
    _Config(4, 2, 1, 64, 48, False, None, True, torch.int64, True),
)
#: scalings only the table builder takes (rope.apply_cos_sin_cache)
_TABLE_SMALL = (
    _Config(6, 4, 2, 64, None, False, YarnScaling(40.0, 64, mscale=1.0, mscale_all_dim=0.5), False, torch.int64, False),
    _Config(5, 2, 1, 64, 32, True, YarnScaling(4.0, 128), True, torch.int32, True),
    _Config(7, 3, 3, 128, None, False, LinearScaling(8.0), False, torch.int64, False),
)
_LARGE = (
    _Config(8192, 32, 8, 128, None, False, Llama3Scaling(), False, torch.int64, False),
    _Config(8192, 32, 8, 128, None, False, None, True, torch.int32, False),
    _Config(4099, 14, 2, 128, 64, True, None, False, torch.int64, True),
    _Config(1000, 32, 32, 80, 40, False, None, True, torch.int64, False),
    _Config(513, 16, 4, 256, 128, True, Llama3Scaling(factor=32.0), False, torch.int32, False),
)


def _qk(cfg: _Config, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    out = []
    for heads in (cfg.q_heads, cfg.kv_heads):
        if cfg.head_major:
            x = torch.randn(heads, cfg.tokens, cfg.head_dim, generator=g, device=device).to(dtype).transpose(0, 1)
        else:
            x = torch.randn(cfg.tokens, heads, cfg.head_dim, generator=g, device=device).to(dtype)
        out.append(x)
    return out[0], out[1]


def _tag(cfg: _Config, dtype: torch.dtype) -> str:
    rot = cfg.rotary_dim or cfg.head_dim
    bits = [str(dtype)[6:], f"T{cfg.tokens}", f"h{cfg.q_heads}-{cfg.kv_heads}", f"d{cfg.head_dim}", f"r{rot}",
            "gptj" if cfg.interleaved else "neox"]
    if cfg.scaling is not None:
        name = {Llama3Scaling: "llama3", LinearScaling: "linear", YarnScaling: "yarn"}[type(cfg.scaling)]
        bits.append(f"{name}x{cfg.scaling.factor:g}")
    if cfg.inplace:
        bits.append("inplace")
    if cfg.positions_dtype == torch.int32:
        bits.append("i32")
    if cfg.head_major:
        bits.append("strided")
    return "-".join(bits)


def _in_place_outputs(args: tuple[Any, ...], _: Any) -> list[torch.Tensor]:
    return [args[0], args[1]]


def _case(op: str, cfg: _Config, dtype: torch.dtype, device: torch.device, g: torch.Generator,
          max_position: int, theta: float) -> Case:
    q, k = _qk(cfg, dtype, device, g)
    positions = torch.randint(0, max_position, (cfg.tokens,), generator=g, device=device).to(cfg.positions_dtype)
    outputs = _in_place_outputs if cfg.inplace else None
    rot = cfg.rotary_dim or cfg.head_dim
    if op == "rope.apply":
        kwargs = {"theta": theta, "rotary_dim": cfg.rotary_dim, "interleaved": cfg.interleaved,
                  "scaling": cfg.scaling, "inplace": cfg.inplace}
        return Case(op, _tag(cfg, dtype), (q, k, positions), kwargs, dtype, outputs=outputs)
    if op == "rope.apply_cos_sin_cache":
        cache = cos_sin_cache(max_position, rot, theta, cfg.scaling, device)
        kwargs = {"interleaved": cfg.interleaved, "inplace": cfg.inplace}
        return Case(op, _tag(cfg, dtype), (q, k, positions, cache), kwargs, dtype, outputs=outputs)
    raise ValueError(f"unknown rope op {op!r}")


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator(device=device).manual_seed(0)
    configs: tuple[_Config, ...] = _SMALL if size == "small" else _LARGE
    max_position = 512 if size == "small" else 131072
    if op == "rope.apply_cos_sin_cache" and size == "small":
        configs = configs + _TABLE_SMALL
    out: list[Case] = []
    for i, cfg in enumerate(configs):
        theta = 1e4 if i % 2 == 0 else 5e5
        for dtype in DTYPES:
            out.append(_case(op, cfg, dtype, device, g, max_position, theta))
    if op == "rope.apply_cos_sin_cache":
        out += [_outside(cfg, device, g, max_position) for cfg in (_SMALL[1], _SMALL[4])]
    return out


def _outside(cfg: _Config, device: torch.device, g: torch.Generator, max_position: int) -> Case:
    """An unchecked call (``check_positions=False``) whose positions include some outside the table (negative, at
    the end, far past it): those tokens come out NaN in their rotated dims."""
    base = _case("rope.apply_cos_sin_cache", cfg, torch.bfloat16, device, g, max_position, 1e4)
    positions = base.args[2].clone()
    bad = torch.tensor([-1, max_position, 2**31 - 1], dtype=positions.dtype, device=device)
    positions[:3] = bad
    return Case(base.op, base.id + "-outside", (*base.args[:2], positions, *base.args[3:]),
                {**base.kwargs, "check_positions": False}, base.dtype, outputs=base.outputs)


def example(op: str, device: torch.device, tokens: int = 8192, heads: int = 32, kv_heads: int = 8,
            head_dim: int = 128, rotary_dim: int | None = None, dtype: str = "bfloat16", interleaved: bool = False,
            inplace: bool = False, theta: float = 5e5, llama3: bool = False, max_position: int = 131072) -> Case:
    """One case of ``op`` at a chosen size (``switchboard explain`` / ``bench``)."""
    cfg = _Config(tokens, heads, kv_heads, head_dim, rotary_dim, interleaved, Llama3Scaling() if llama3 else None,
                  inplace, torch.int64, False)
    g = torch.Generator(device=device).manual_seed(0)
    return _case(op, cfg, getattr(torch, dtype), device, g, max_position, theta)
