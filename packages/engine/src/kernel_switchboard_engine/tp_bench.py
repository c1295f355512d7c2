"""Benchmark ``comm.all_reduce_fused_rms_norm`` against NCCL/gloo all-reduce followed by our ``fused_add_rms_norm``.

    torchrun --nproc-per-node 2 -m kernel_switchboard_engine.tp_bench            # 2 GPUs: bf16, hidden 8192
    python -m kernel_switchboard_engine.tp_bench --nproc 2 --smoke               # CPU gloo, tiny sizes

Per message size (rows x hidden): ``fused`` is the op as dispatched (its kernel id is printed); ``pair`` is
``torch.distributed.all_reduce`` in the input dtype on a copy of x, then ``ksb.norm.fused_add_rms_norm``
(residual add + RMSNorm, in place on copies). Both include the copy of their inputs they need. Times are
the median over ``--iters`` of the slowest rank (CUDA events on GPU, perf_counter on CPU). The aims
on 2 GPUs: fused >= 1.3x the pair at 8192 x 8192 bf16, >= 2x at <= 256 rows.
NVLink multicast stays off (:data:`.tp.SAFE_ENV`, set by :func:`.tp.init_distributed`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kernel_switchboard as ksb

from .tp import rank_and_world
from .tp_main import launch

GPU_ROWS = (1, 8, 32, 128, 256, 8192)
SMOKE_ROWS = (1, 4, 16)


def _time(fn: Callable[[], Any], iters: int, warmup: int, device: torch.device) -> float:
    """Median seconds of one ``fn()`` call, the slowest rank's (every rank returns the same number)."""
    for _ in range(warmup):
        fn()
    samples = []
    cuda = device.type == "cuda"
    for _ in range(iters):
        torch.distributed.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(med, op=torch.distributed.ReduceOp.MAX)
    return float(med.item())


def bench_size(rows: int, hidden: int, dtype: torch.dtype, device: torch.device, iters: int, warmup: int,
               eps: float = 1e-5) -> dict[str, Any]:
    """One message size: {rows, hidden, dtype, world, kernel, fused_ms, pair_ms, speedup, max_diff}."""
    rank, world = rank_and_world()
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(rows, hidden, generator=g).to(device=device, dtype=dtype)
    residual = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(2))).to(device=device, dtype=dtype)
    xb, rb = torch.empty_like(x), torch.empty_like(residual)

    def fused() -> Any:
        return ksb.comm.all_reduce_fused_rms_norm(x, residual, weight, eps)

    def pair() -> Any:
        xb.copy_(x)
        rb.copy_(residual)
        torch.distributed.all_reduce(xb)
        ksb.norm.fused_add_rms_norm(xb, rb, weight, eps)
        return xb, rb

    y, _ = fused()
    pair()
    diff = (y.float() - xb.float()).abs().max().item()  # the pair rounds the sum to dtype: a dtype-sized gap
    kernel = ksb.explain("comm.all_reduce_fused_rms_norm", x, residual, weight, eps).kernel.id
    fused_s = _time(fused, iters, warmup, device)
    pair_s = _time(pair, iters, warmup, device)
    return dict(rows=rows, hidden=hidden, dtype=str(dtype).removeprefix("torch."), world=world,
                kernel=kernel, fused_ms=fused_s * 1e3, pair_ms=pair_s * 1e3,
                speedup=pair_s / fused_s, max_diff=diff)


def _run(args: argparse.Namespace, device: torch.device) -> None:
    rank, world = rank_and_world()
    dtype = getattr(torch, args.dtype)
    rows = [int(r) for r in args.rows.split(",")] if args.rows else (SMOKE_ROWS if args.smoke else GPU_ROWS)
    results = [bench_size(r, args.hidden, dtype, device, args.iters, args.warmup) for r in rows]
    if rank != 0:
        return
    print(f"all_reduce + residual + RMSNorm, world={world}, device={device}, {args.dtype}, hidden={args.hidden}")
    print(f"{'rows':>6} {'fused ms':>10} {'pair ms':>10} {'speedup':>8} {'target':>7}  kernel")
    for r in results:
        target = "" if world < 2 else ("2.0x" if r["rows"] <= 256 else "1.3x" if r["rows"] >= 8192 else "")
        print(f"{r['rows']:>6} {r['fused_ms']:>10.4f} {r['pair_ms']:>10.4f} {r['speedup']:>7.2f}x {target:>7}  {r['kernel']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernel_switchboard_engine.tp_bench", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=None, help="spawn this many local processes (without torchrun)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl with CUDA, else gloo")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU gloo): hidden 256, rows 1,4,16, float32")
    p.add_argument("--hidden", type=int, default=None, help="default 8192 (256 with --smoke)")
    p.add_argument("--rows", default=None, help="comma-separated row counts (default 1,8,32,128,256,8192)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default bfloat16 (float32 with --smoke)")
    p.add_argument("--iters", type=int, default=None, help="default 50 (5 with --smoke)")
    p.add_argument("--warmup", type=int, default=None, help="default 10 (1 with --smoke)")
    p.add_argument("--out", default=None, help="write the results as JSON (rank 0)")
    a = p.parse_args(argv)
    a.hidden = a.hidden or (256 if a.smoke else 8192)
    a.dtype = a.dtype or ("float32" if a.smoke else "bfloat16")
    a.iters = a.iters or (5 if a.smoke else 50)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.smoke else 10)
    launch(_run, a.nproc, a, backend=a.backend)


if __name__ == "__main__":
    main()
