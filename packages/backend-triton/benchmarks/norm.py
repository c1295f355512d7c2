"""Benchmark: Triton rms_norm, fused_add_rms_norm and silu_and_mul against torch, in TB/s.

    python packages/backend-triton/benchmarks/norm.py          # on a GPU

``bench_norm(device) -> list[dict]``: one dict per (workload, implementation), with ``ms``,
``tb_s`` (bytes the op must move / time) and ``max_err`` against the float32 reference computed
on the same inputs. Every row is checked for correctness before it is timed; failures become a
row with ``error`` instead of an exception, so one broken kernel never hides the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

SHAPE = (8192, 8192)
ACT_SHAPE = (8192, 2 * 14336)


def _row(workload: str, impl: str, fn: Callable[[], Any], check: Callable[[], float], nbytes: float) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "impl": impl}
    try:
        row["max_err"] = check()
        ms = median_ms(fn, rep_ms=100, warmup=25)
        row.update(ms=round(ms, 4), tb_s=round(nbytes / (ms * 1e-3) / 1e12, 3))
    except Exception as exc:  # a benchmark row reports, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(row, flush=True)
    return row


def _bench_rms(dev: torch.device, g: torch.Generator, eps: float = 1e-6) -> list[dict[str, Any]]:
    from kernel_switchboard_triton import norm

    rows, hidden = SHAPE
    x = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16, generator=g)
    r = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.rand(hidden, device=dev, dtype=torch.bfloat16, generator=g) + 0.5
    want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()
    nbytes = 2 * x.numel() * x.element_size()
    out = [_row("rms_norm 8192x8192 bf16", "triton", lambda: norm.rms_norm(x, w, eps, False),
                lambda: _err(norm.rms_norm(x, w, eps, False), want), nbytes)]
    if hasattr(torch.nn.functional, "rms_norm"):
        f = lambda: torch.nn.functional.rms_norm(x, (hidden,), w, eps)
        out.append(_row("rms_norm 8192x8192 bf16", "torch F.rms_norm", f, lambda: _err(f(), want), nbytes))

    s = x.float() + r.float()
    want_fused = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    def check_fused() -> float:
        xa, ra = x.clone(), r.clone()
        norm.fused_add_rms_norm(xa, ra, w, eps, False)
        return max(_err(xa, want_fused), _err(ra, s))

    # timed in place on copies: values drift across repetitions, the bytes moved do not
    xs, rs = x.clone(), r.clone()
    out.append(_row("fused_add_rms_norm 8192x8192 bf16", "triton", lambda: norm.fused_add_rms_norm(xs, rs, w, eps, False),
                    check_fused, 2 * nbytes))
    return out


def _bench_silu(dev: torch.device, g: torch.Generator) -> list[dict[str, Any]]:
    from kernel_switchboard_triton import activation

    a = torch.randn(*ACT_SHAPE, device=dev, dtype=torch.bfloat16, generator=g)
    d = ACT_SHAPE[1] // 2
    want = torch.nn.functional.silu(a[:, :d].float()) * a[:, d:].float()
    nbytes = 1.5 * a.numel() * a.element_size()
    t = lambda: torch.nn.functional.silu(a[:, :d]) * a[:, d:]
    return [_row("silu_and_mul 8192x(2x14336) bf16", "triton", lambda: activation.silu_and_mul(a),
                 lambda: _err(activation.silu_and_mul(a), want), nbytes),
            _row("silu_and_mul 8192x(2x14336) bf16", "torch eager", t, lambda: _err(t(), want), nbytes)]


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max())


def bench_norm(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    return _bench_rms(dev, g) + _bench_silu(dev, g)


if __name__ == "__main__":
    bench_norm("cuda")
