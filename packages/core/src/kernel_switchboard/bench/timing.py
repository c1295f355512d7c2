"""Timing: the median time of a call (CUDA events with the L2 flushed between repetitions on a GPU, wall clock on a
CPU), calls timed in turn, the ceilings results are reported against, and a call captured in a CUDA graph."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def median_ms(fn: Callable[[], Any], rep_ms: float = 100.0, warmup: float = 25.0) -> float:
    """Median ms of ``fn`` as the backends' benchmark scripts time it: ``triton.testing.do_bench`` (CUDA
    events, L2 flushed between repetitions) when CUDA is there, else one wall-clock call (CPU smoke runs)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep_ms, return_mode="median"))


def time_ms(fn: Callable[[], Any], device: torch.device, reps_ms: float = 200.0) -> float:
    """Median milliseconds of ``fn``: CUDA events with L2 flush on a GPU, wall clock on a CPU."""
    if device.type == "cuda":
        return median_ms(fn, rep_ms=reps_ms)
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + reps_ms / 1e3
    while time.perf_counter() < deadline or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fastest_of_rounds(calls: dict[str, Callable[[], Any]], device: torch.device, reps_ms: float,
                      rounds: int = 3) -> dict[str, float]:
    """Each call's fastest median ms over ``rounds`` rounds that time the calls in turn. Clocks drift over a
    run (one kernel can time 10% apart minutes later), so kernels timed one after the other can swap
    places; timed in turn, a drift moves them alike. A call that raises is reported on stderr and dropped."""
    best: dict[str, float] = {}
    live = dict(calls)
    for _ in range(rounds):
        for name, call in list(live.items()):
            try:
                best[name] = min(best.get(name, math.inf), time_ms(call, device, reps_ms))
            except Exception as exc:  # noqa: BLE001 - one failing kernel does not stop the others' timing
                print(f"timing {name} failed: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
                live.pop(name)
                best.pop(name, None)
    return best


def ceilings(device: torch.device) -> dict[str, float]:
    """Device copy bandwidth (TB/s, read + write) and bf16 matmul rate (TFLOP/s) measured here."""
    if device.type != "cuda":
        return {}
    copy_tbs = _copy_bandwidth(device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.mm(a, b), device)
    return {"copy_tbs": copy_tbs, "mm_tflops": 2 * 8192**3 / (ms * 1e-3) / 1e12}


def _copy_bandwidth(device: torch.device, nbytes: int = 2 * 1024**3) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def captured_graph(call: Callable[[], Any]) -> Any:
    """A CUDA graph of one ``call`` (already warmed up outside capture): ``.replay()`` times the GPU work alone."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph
