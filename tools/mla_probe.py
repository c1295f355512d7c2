"""MLA decode on a GPU, timed in turn (issue 3): the default Triton plan and FlashInfer, each with the L2 flushed
three ways and in a CUDA graph replayed back to back. A kernel under trial goes beside them as another entry of
``calls`` (run 27 timed FlashMLA's pair schedule this way).

    python3 tools/mla_probe.py [--batch 128] [--kv-len 8192] [--heads 128] [--q-len 1] [--rounds 3]

Flush modes per call (40 calls, median of each call's CUDA events): ``zero`` (``triton.testing.do_bench``'s: 256 MB
written, so L2 is left full of dirty lines: the bench's number), ``read`` (256 MB read: L2 left clean) and ``none``
(back to back). ``graph``: 50 replays of one captured call, timed together. Prints one JSON line per (call, mode,
round), then the best of the rounds per call and mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard import bench as kb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device("cuda")
    params: dict[str, Any] = {"batch": a.batch, "kv_len": a.kv_len, "num_heads": a.heads, "page_size": 64,
                              "dtype": "bfloat16"}
    if a.q_len > 1:
        params["q_len"] = a.q_len
    case = kb._example("attention.mla_decode", dev, params)
    units, _ = kb.work("attention.mla_decode", case.args, case.kwargs)
    _, ours = kb._mla_plan(None, case.args, case.kwargs)
    calls: dict[str, Callable[[], Any]] = {"default": ours}
    calls.update(kb._flashinfer_externals("attention.mla_decode", case.args, case.kwargs))
    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=dev)
    sink = torch.empty((), dtype=torch.int64, device=dev)
    flushes = {"zero": cache.zero_, "read": lambda: torch.sum(cache, 0, out=sink), "none": lambda: None}
    graphs = {name: _graph(name, fn) for name, fn in calls.items()}
    best: dict[tuple[str, str], float] = {}
    for r in range(a.rounds):
        for name, fn in calls.items():
            for mode, flush in flushes.items():
                ms = _per_call_ms(fn, flush)
                best[name, mode] = min(best.get((name, mode), 1e9), ms)
                print(json.dumps({"round": r, "call": name, "mode": mode, "ms": round(ms, 4),
                                  "tb_s": round(units / ms / 1e9, 3)}), flush=True)
            graph = graphs[name]
            if graph is None:
                continue
            ms = _graph_ms(graph)
            best[name, "graph"] = min(best.get((name, "graph"), 1e9), ms)
            print(json.dumps({"round": r, "call": name, "mode": "graph", "ms": round(ms, 4),
                              "tb_s": round(units / ms / 1e9, 3)}), flush=True)
    print(f"best of {a.rounds} rounds, TB/s (B={a.batch} L={a.kv_len} H={a.heads} q_len={a.q_len}):")
    for name in calls:
        print(f"  {name:16s} " + "  ".join(f"{m} {units / best[name, m] / 1e9:.3f}"
                                          for m in ("zero", "read", "none", "graph") if (name, m) in best))


def _per_call_ms(fn: Callable[[], Any], flush: Callable[[], Any], calls: int = 40) -> float:
    fn()
    times = []
    for _ in range(calls):
        flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def _graph(name: str, fn: Callable[[], Any]) -> torch.cuda.CUDAGraph | None:
    """``fn`` captured in a CUDA graph, or None (printed) where it cannot be captured."""
    fn()
    try:
        return kb._captured(fn)
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured keeps its eager timings
        print(json.dumps({"call": name, "graph": f"not captured: {type(exc).__name__}: {exc}"[:300]}), flush=True)
        torch.cuda.synchronize()
        return None


def _graph_ms(g: torch.cuda.CUDAGraph, replays: int = 50) -> float:
    g.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(replays):
        g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / replays


if __name__ == "__main__":
    main()
