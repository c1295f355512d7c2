"""Conformance cases for the gemm family: mm (every layout, and with a bias), fp8 mm in three scale modes, grouped mm."""

from __future__ import annotations

import torch

from ..case import Case, tolerance

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128

#: (M, N, K, layout of a then b: "R" row-major, "C" column-major)
_MM_SMALL = ((32, 48, 40, "RR"), (37, 29, 53, "CR"), (17, 33, 24, "RC"))
_MM_LARGE = ((4096, 4096, 4096, "RR"), (1023, 2049, 999, "RC"), (2048, 1024, 4096, "CC"))
#: (M, N, K, layout, scale_mode, out dtype)
_FP8_SMALL = (
    (16, 144, 320, "RC", "tensor", torch.bfloat16),
    (16, 144, 320, "RC", "row_col", torch.bfloat16),
    (16, 144, 320, "RC", "block", torch.bfloat16),
    (32, 256, 256, "RR", "block", torch.float32),
    (9, 40, 136, "RC", "row_col", torch.float16),
)
_FP8_LARGE = (
    (4096, 4096, 4096, "RC", "tensor", torch.bfloat16),
    (4096, 4096, 4096, "RC", "row_col", torch.bfloat16),
    (4096, 4096, 4096, "RC", "block", torch.bfloat16),
    (333, 2112, 7168, "RC", "block", torch.bfloat16),  # DeepSeek-V3 shapes, odd M
    (1000, 3000, 1000, "RR", "row_col", torch.float16),
    (64, 7168, 2048, "RC", "block", torch.float32),
)
#: (group sizes, N, K, layout of b's (K, N) slices)
_GROUPED_SMALL = (((7, 0, 18, 15), 48, 32, "R"), ((10, 20, 7), 20, 24, "C"))
_GROUPED_LARGE = (((1024, 0, 3000, 17, 1024, 2000, 1100, 35), 2816, 4096, "R"), ((512,) * 16, 1408, 2048, "C"))


def _dtag(dtype: torch.dtype) -> str:
    return str(dtype)[6:]


def _matrix(rows: int, cols: int, order: str, g: torch.Generator, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """float32 (rows, cols), row-major ("R") or column-major ("C") in memory."""
    if order == "C":
        return (scale * torch.randn(cols, rows, generator=g, device=device)).t()
    return scale * torch.randn(rows, cols, generator=g, device=device)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype, keeping its memory order."""
    return x.t().to(dtype).t() if x.stride(0) == 1 and x.stride(1) != 1 else x.to(dtype)


def quantize_fp8(x: torch.Tensor, group_rows: int, group_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, C) float32 -> (e4m3 values, float32 scales (ceil(R/gr), ceil(C/gc))) with x ~ q * scale.

    One scale per (group_rows x group_cols) tile, amax / 448; the fp8 tensor keeps x's memory order.
    """
    rows, cols = x.shape
    sr, sc = -(-rows // group_rows), -(-cols // group_cols)
    padded = torch.zeros(sr * group_rows, sc * group_cols, device=x.device)
    padded[:rows, :cols] = x.abs()
    amax = padded.view(sr, group_rows, sc, group_cols).amax(dim=(1, 3))
    scale = amax.clamp_min(1e-12) / FP8_MAX
    full = scale.repeat_interleave(group_rows, 0).repeat_interleave(group_cols, 1)[:rows, :cols]
    q = (x / full).clamp(-FP8_MAX, FP8_MAX)
    return _as(q, FP8), scale


def _fp8_operands(m: int, n: int, k: int, layout: str, mode: str, g: torch.Generator,
                  device: torch.device) -> tuple[torch.Tensor, ...]:
    a = _matrix(m, k, layout[0], g, device)
    b = _matrix(k, n, layout[1], g, device, scale=k**-0.5)
    groups_a, groups_b = {"tensor": ((m, k), (k, n)), "row_col": ((1, k), (k, 1)),
                          "block": ((1, BLOCK), (BLOCK, BLOCK))}[mode]
    qa, sa = quantize_fp8(a, *groups_a)
    qb, sb = quantize_fp8(b, *groups_b)
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(())
    return qa, qb, sa, sb


def _offsets(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *sizes], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def _mm_case(m: int, n: int, k: int, layout: str, dtype: torch.dtype, g: torch.Generator,
             device: torch.device) -> Case:
    a = _as(_matrix(m, k, layout[0], g, device), dtype)
    b = _as(_matrix(k, n, layout[1], g, device, scale=k**-0.5), dtype)
    return Case("gemm.mm", f"{_dtag(dtype)}-{m}x{n}x{k}-{layout}", (a, b), {}, dtype)


def _mm_bias_case(m: int, n: int, k: int, layout: str, dtype: torch.dtype, g: torch.Generator,
                  device: torch.device) -> Case:
    case = _mm_case(m, n, k, layout, dtype, g, device)
    bias = torch.randn(n, generator=g, device=device).to(dtype)
    return Case("gemm.mm", f"bias-{case.id}", case.args, {"bias": bias}, dtype)


def _fp8_case(m: int, n: int, k: int, layout: str, mode: str, out: torch.dtype, g: torch.Generator,
              device: torch.device) -> Case:
    qa, qb, sa, sb = _fp8_operands(m, n, k, layout, mode, g, device)
    # fp8 tensor cores may accumulate with fewer than 24 mantissa bits (Hopper): no tighter than 2e-3
    tol = tuple(max(t, 2e-3) for t in tolerance(out))
    return Case("gemm.mm_fp8", f"{mode}-{_dtag(out)}-{m}x{n}x{k}-{layout}", (qa, qb, sa, sb), {"out_dtype": out}, out,
                tol=(tol[0], tol[1]))


def _grouped_case(sizes: tuple[int, ...], n: int, k: int, order: str, dtype: torch.dtype, g: torch.Generator,
                  device: torch.device) -> Case:
    t = sum(sizes)
    a = torch.randn(t, k, generator=g, device=device).to(dtype)
    b = k**-0.5 * torch.randn(len(sizes), k, n, generator=g, device=device)
    if order == "C":
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    b = b.to(dtype) if order == "R" else b.transpose(1, 2).to(dtype).transpose(1, 2)
    tag = f"{_dtag(dtype)}-G{len(sizes)}-T{t}-{n}x{k}-{order}"
    return Case("gemm.grouped_mm", tag, (a, b, _offsets(sizes, device)), {}, dtype)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator(device=device).manual_seed(0)
    small = size == "small"
    if op == "gemm.mm":
        plain = [_mm_case(*shape, dtype, g, device) for shape in (_MM_SMALL if small else _MM_LARGE) for dtype in DTYPES]
        return plain + [_mm_bias_case(*(_MM_SMALL if small else _MM_LARGE)[1], dtype, g, device) for dtype in DTYPES]
    if op == "gemm.mm_fp8":
        return [_fp8_case(*spec, g, device) for spec in (_FP8_SMALL if small else _FP8_LARGE)]
    if op == "gemm.grouped_mm":
        specs = _GROUPED_SMALL if small else _GROUPED_LARGE
        return [_grouped_case(sizes, n, k, order, dtype, g, device) for sizes, n, k, order in specs for dtype in DTYPES]
    raise ValueError(f"unknown gemm op {op!r}")


def example(op: str, device: torch.device, m: int = 4096, n: int = 4096, k: int = 4096, dtype: str = "bfloat16",
            layout: str = "RR", scale_mode: str = "block", groups: int = 8) -> Case:
    """One case of ``op`` (``switchboard explain`` / ``bench``).

    ``dtype`` is the operand dtype of mm / grouped_mm and the output dtype of mm_fp8; ``layout`` the memory
    order of a then b ("R"/"C"); grouped_mm splits m rows into ``groups`` equal groups (the last takes the rest).
    """
    g = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, dtype)
    if op == "gemm.mm":
        return _mm_case(m, n, k, layout, dt, g, device)
    if op == "gemm.mm_fp8":
        return _fp8_case(m, n, k, layout, scale_mode, dt, g, device)
    if op == "gemm.grouped_mm":
        sizes = (m // groups,) * (groups - 1) + (m - (m // groups) * (groups - 1),)
        return _grouped_case(sizes, n, k, layout[-1], dt, g, device)
    raise ValueError(f"unknown gemm op {op!r}")
