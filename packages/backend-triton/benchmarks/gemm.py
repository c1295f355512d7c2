"""Benchmark: Triton bf16 mm and fp8 block-scaled mm at 8192^3, against torch.mm and torch._scaled_mm.

    python packages/backend-triton/benchmarks/gemm.py          # on a GPU

``bench_gemm(device) -> list[dict]``: rows with ``ms``, ``tflops`` and ``rel_err`` (Frobenius, against a
float32 product of the same operands), plus ``vs`` = TFLOP/s over the baseline measured in the same run
(cuBLAS bf16 for mm, torch._scaled_mm per-tensor for fp8). Every row is checked before it is timed.
"pointer kernel" rows switch the TMA path off, "Gluon off" the sm_90 Gluon kernel, for comparison; "sweep" rows
try other fp8 tiles (``FP8_SWEEP``: the former 128 x 128 per-tensor default and other candidates, on the Triton
kernels) and other stage counts and tile-row groups of the Gluon kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

SIZE = 8192
#: fp8 tiles tried besides the default, per scale mode: (block_m, block_n, block_k, group_m, warps, stages);
#: block scales need block_n dividing 128. Left out after timing on the H200: block scales on 5 stages (slower than
#: the default's 4), 256x128 as two 128-row accumulators (they spill), and 64x128 tiles on one warpgroup with two or
#: three persistent programs per SM (slower than the default).
FP8_SWEEP = (("block", (128, 128, 128, 8, 8, 3)), ("tensor", (128, 128, 128, 8, 8, 4)))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def _row(workload: str, impl: str, fn: Callable[[], Any], want: torch.Tensor, flops: float,
         max_rel: float = 2e-2) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "impl": impl}
    print(f"[gemm bench] {workload}: {impl}", file=sys.stderr, flush=True)  # progress, should a kernel hang
    try:
        row["rel_err"] = round(_rel(fn(), want), 6)
        if not row["rel_err"] < max_rel:
            raise AssertionError(f"relative error {row['rel_err']} above {max_rel}")
        ms = median_ms(fn, rep_ms=100, warmup=10)
        row.update(ms=round(ms, 4), tflops=round(flops / (ms * 1e-3) / 1e12, 1))
    except Exception as exc:  # a benchmark row reports, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(f"[gemm bench] {row}", file=sys.stderr, flush=True)  # kept should a later row hang
    return row


def _ratio(rows: list[dict[str, Any]], base: str) -> list[dict[str, Any]]:
    ref = next((r.get("tflops") for r in rows if r["impl"] == base), None)
    for r in rows:
        if ref and r.get("tflops"):
            r["vs"] = f"{r['tflops'] / ref:.2f}x {base}"
        print(r, flush=True)
    return rows


def _fp8(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    from kernel_switchboard.testing.cases.gemm import quantize_fp8

    return quantize_fp8(x, rows, cols)


def _patched(fn: Callable[[], Any], **attrs: Any) -> Callable[[], Any]:
    """``fn`` with attributes of the Triton ``gemm`` module replaced while it runs (comparison and sweep rows)."""
    from kernel_switchboard_triton import gemm

    def run() -> Any:
        saved = {name: getattr(gemm, name) for name in attrs}
        for name, value in attrs.items():
            setattr(gemm, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(gemm, name, value)
    return run


def _pointer_kernels(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the TMA path (and so the Gluon kernel) switched off: the pointer kernels, for comparison."""
    return _patched(fn, TMA_MIN_M=1 << 62)


def _fp8_tiles(fn: Callable[[], Any], tiles: tuple[int, ...]) -> Callable[[], Any]:
    """``fn`` with every large fp8 matmul on the Triton kernels with ``tiles`` (a sweep row)."""
    from kernel_switchboard_triton import gemm

    default = gemm.fp8_tiles
    return _patched(fn, GLUON_FP8=False, fp8_tiles=lambda m, n, k, mode, tma=False: gemm.Tiles(*tiles) if m > 64
                    else default(m, n, k, mode, tma))


def bench_gemm(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    from kernel_switchboard_triton import gemm

    dev = torch.device(device)
    n = SIZE
    flops = 2.0 * n**3
    g = torch.Generator(device=dev).manual_seed(0)
    a32 = torch.randn(n, n, device=dev, generator=g)
    w32 = torch.randn(n, n, device=dev, generator=g) * n**-0.5  # (N, K) weight; b = w.t()
    a, b = a32.bfloat16(), w32.bfloat16().t()
    want = a.float() @ b.float()
    rows = [_row("mm bf16 8192^3", "triton", lambda: gemm.mm(a, b), want, flops),
            _row("mm bf16 8192^3", "triton pointer kernel", _pointer_kernels(lambda: gemm.mm(a, b)), want, flops),
            _row("mm bf16 8192^3", "torch.mm (cuBLAS)", lambda: torch.mm(a, b), want, flops)]
    out = _ratio(rows, "torch.mm (cuBLAS)")

    qa, sa = _fp8(a32, 1, 128)
    qw, sw = _fp8(w32, 128, 128)
    qb, sb = qw.t(), sw.t()
    want_b = (qa.float() * sa.repeat_interleave(128, 1)) @ (qw.float() * sw.repeat_interleave(128, 0)
                                                             .repeat_interleave(128, 1)).t()
    ta, tsa = _fp8(a32, n, n)
    tw, tsw = _fp8(w32, n, n)
    tsa, tsw = tsa.reshape(()), tsw.reshape(())
    want_t = (ta.float() @ tw.float().t()) * (tsa * tsw)
    fns = {"block": lambda: gemm.mm_fp8(qa, qb, sa, sb, "block", torch.bfloat16),
           "tensor": lambda: gemm.mm_fp8(ta, tw.t(), tsa, tsw, "tensor", torch.bfloat16)}
    wants = {"block": want_b, "tensor": want_t}
    rows = [
        _row("mm fp8 e4m3 8192^3", "triton block 128x128", fns["block"], want_b, flops),
        _row("mm fp8 e4m3 8192^3", "triton block 128x128 Triton TMA kernel (Gluon off)",
             _patched(fns["block"], GLUON_FP8=False), want_b, flops),
        _row("mm fp8 e4m3 8192^3", "triton block 128x128 pointer kernel", _pointer_kernels(fns["block"]), want_b, flops),
        _row("mm fp8 e4m3 8192^3", "triton per-tensor", fns["tensor"], want_t, flops),
        _row("mm fp8 e4m3 8192^3", "triton per-tensor pointer kernel", _pointer_kernels(fns["tensor"]), want_t, flops),
        *(_row("mm fp8 e4m3 8192^3", f"triton {mode} tiles {gemm.Tiles(*t)} (sweep)",
               _fp8_tiles(fns[mode], t), wants[mode], flops) for mode, t in FP8_SWEEP),
        _row("mm fp8 e4m3 8192^3", "torch._scaled_mm per-tensor",
             lambda: torch._scaled_mm(ta, tw.t(), scale_a=tsa, scale_b=tsw, out_dtype=torch.bfloat16), want_t, flops),
        *_gluon_rows(qa, qb, sa, sb, want_b, flops),
    ]
    return out + _ratio(rows, "torch._scaled_mm per-tensor")


def _gluon_rows(qa: torch.Tensor, qb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, want: torch.Tensor,
                flops: float) -> list[dict[str, Any]]:
    """The Gluon block-scaled kernel (``_gemm_gluon``, sm_90) with other TMA stages and tile-row groups than the
    default's 4 and 8, then the default again (clocks drift over a run)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return []
    from kernel_switchboard_triton import _gemm_gluon

    out = torch.empty_like(want, dtype=torch.bfloat16)
    return [_row("mm fp8 e4m3 8192^3", f"gluon block 128x128 stages={stages} group_m={group_m} (sweep)",
                 lambda stages=stages, group_m=group_m: _gemm_gluon.mm_fp8_block(qa, qb, sa, sb, out, stages=stages,
                                                                                 group_m=group_m), want, flops)
            for stages, group_m in ((3, 8), (5, 8), (4, 4), (4, 16), (4, 8))]


if __name__ == "__main__":
    bench_gemm("cuda")
