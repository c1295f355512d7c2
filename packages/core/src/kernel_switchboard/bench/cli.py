"""``switchboard bench | tune``: measured ranking.

For each point of a workload preset: every eligible kernel, the automatic choice and external
baselines (torch SDPA, cuBLAS, FlashInfer when installed) are timed with CUDA events (median,
L2 flushed between repetitions by ``triton.testing.do_bench``); results are reported as TB/s or
TFLOP/s, as a percentage of the ceilings measured at start (device copy bandwidth, bf16 matmul
rate), and as the regret of the automatic choice (its time over the best kernel's). Output: a
terminal table, ``bench.json`` / ``bench.csv`` with the environment, and PNG plots per op.

On a CPU, ``--preset dispatch`` measures the switchboard's overhead per call with a warm cache.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cli import unknown_op
from ..device import fingerprint


@dataclass
class Point:
    """One workload point: an op and the params of its example builder."""

    op: str
    params: dict[str, Any]
    label: str


@dataclass
class RunPoint(Point):
    """A point that runs itself: ``runner(point, preset, device, reps_ms)`` gives its rows (a comparison of its
    own, as the ``beyond`` and ``flashinfer-compat`` presets make, instead of the generic one of :func:`run_point`).
    A runner that raises gives one row with the error; the preset goes on."""

    runner: Callable[[RunPoint, str, torch.device, float], list[Row]]

    def run(self, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
        try:
            return self.runner(self, preset, device, reps_ms)
        except Exception as exc:  # noqa: BLE001 - one failing point does not stop the preset
            return [Row(preset, self.op, self.label, "-", None, error=f"{type(exc).__name__}: {exc}"[:300])]


@dataclass
class Row:
    preset: str
    op: str
    label: str
    kernel: str
    ms: float | None
    metric: float | None = None
    unit: str = ""
    auto: bool = False
    regret: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _decode_points(batches: tuple[int, ...], lens: tuple[int, ...], pages: tuple[int, ...], q: int = 32,
                   kv: int = 8, d: int = 128, layouts: tuple[str, ...] = ("NHD", "HND")) -> list[Point]:
    """Decode points; both page layouts, since some kernels take only one (cuDNN: HND)."""
    return [Point("attention.decode", {"batch": b, "kv_len": n, "page_size": p, "num_q_heads": q, "num_kv_heads": kv,
                                       "head_dim": d, "dtype": "bfloat16", "layout": lay},
                  f"B={b} L={n} p{p} {lay}") for p in pages for b in batches for n in lens for lay in layouts]


def _prefill_points(shapes: tuple[tuple[int, int], ...], q: int = 32, kv: int = 8, d: int = 128) -> list[Point]:
    return [Point("attention.prefill_ragged", {"batch": b, "q_len": n, "kv_len": n, "num_q_heads": q,
                                               "num_kv_heads": kv, "head_dim": d, "dtype": "bfloat16", "causal": True},
                  f"{b}x{n} causal") for b, n in shapes]


PRESETS: dict[str, Callable[[], list[Point]]] = {
    "attention": lambda: _decode_points((1, 16, 64, 128, 256), (1024, 4096, 8192), (16, 128))
    + _prefill_points(((1, 8192), (8, 2048), (4, 4096))),
    "variants": lambda: [
        Point(op, {**params, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", **extra},
              f"{label} {tag}")
        for op, params, label in (("attention.decode", {"batch": 128, "kv_len": 8192, "page_size": 16}, "B=128 L=8192"),
                                  ("attention.prefill_ragged", {"batch": 1, "q_len": 8192, "kv_len": 8192}, "1x8192"))
        for tag, extra in (("plain", {}), ("soft_cap=30", {"soft_cap": 30.0}), ("variant soft_cap", {"variant": "soft_cap"}),
                           ("variant alibi", {"variant": "alibi"}))],
    "llama3-8b": lambda: _decode_points((16, 128), (2048, 8192), (16,)) + _prefill_points(((1, 8192), (8, 2048))),
    "llama3-70b": lambda: _decode_points((16, 128), (2048, 8192), (16,), q=64, kv=8)
    + _prefill_points(((1, 8192),), q=64, kv=8),
    # all 128 heads on one GPU (data-parallel attention), and the 16 of eight-way tensor parallelism
    "deepseek-v3-mla": lambda: [Point("attention.mla_decode", {"batch": b, "kv_len": n, "num_heads": h,
                                                                "page_size": 64, "dtype": "bfloat16"},
                                      f"B={b} L={n} p64" + ("" if h == 128 else f" H={h} (TP8)"))
                                for b, n, h in ((16, 4096, 128), (128, 8192, 128), (128, 8192, 16))],
    "moe": lambda: [
        Point("moe.fused_moe", {"tokens": 4096, "experts": 8, "top_k": 2, "hidden": 4096, "inter": 14336,
                                "dtype": "bfloat16"}, "mixtral 4096 tok"),
        Point("moe.fused_moe", {"tokens": 4096, "experts": 256, "top_k": 8, "hidden": 7168, "inter": 2048,
                                "dtype": "bfloat16"}, "deepseek-v3 4096 tok"),
    ],
    # from probabilities, no data check (one host sync): the shapes FlashInfer's sampling is usually compared on
    "sampling": lambda: [Point("sampling.top_k_top_p", {"batch": 128, "vocab": v, "top_p": 0.9, "top_k": k, "logits": 0,
                                                        "check_nan": 0}, f"vocab {v} {tag}")
                         for v in (128256, 152064) for tag, k in (("top-p", 0), ("top-k+top-p", 50))],
    "norm": lambda: [Point("norm.rms_norm", {"rows": 8192, "hidden": 8192, "dtype": "bfloat16"}, "8192x8192"),
                     Point("norm.fused_add_rms_norm", {"rows": 8192, "hidden": 8192, "dtype": "bfloat16"}, "8192x8192")],
    "dense": lambda: [
        Point("attention.dense", {"batch": b, "q_len": lq, "kv_len": lk, "num_q_heads": 16, "num_kv_heads": 16,
                                  "head_dim": 64, "dtype": "bfloat16", "bias": bias, "causal": causal}, label)
        for b, lq, lk, bias, causal, label in ((8, 1024, 1024, "bool", False, "encoder 8x1024 mask"),
                                               (8, 1024, 1024, "float", False, "encoder 8x1024 bias"),
                                               (1, 4096, 4096, "float", True, "1x4096 causal + bias"),
                                               (16, 77, 1024, "none", False, "cross-attention 77x1024"))],
    "beyond": lambda: importlib.import_module(".beyond", __package__).points(),  # POD, invariance, fp8, MLA
    "flashinfer-compat": lambda: importlib.import_module(".flashinfer", __package__).points(),
    "flashinfer-ops": lambda: importlib.import_module(".flashinfer", __package__).op_points(),  # norm ... sampling
    # one op per family, each in a fresh process (first_call.py); here for `switchboard build --preset first-call`
    "first-call": lambda: importlib.import_module("kernel_switchboard.bench.first_call").points(),
    "gemm": lambda: [Point("gemm.mm", {"m": 8192, "n": 8192, "k": 8192, "dtype": "bfloat16"}, "8192^3 bf16"),
                     Point("gemm.mm_fp8", {"m": 8192, "n": 8192, "k": 8192, "scale_mode": "block"}, "8192^3 fp8 block")],
}


# -- timing ---------------------------------------------------------------------------------------
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


# -- work counts ------------------------------------------------------------------------------------
def work(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[float, str]:
    """(units of work, unit): bytes for memory-bound ops (TB/s), flops for compute-bound ones (TFLOP/s)."""
    if op in ("attention.decode", "attention.mla_decode"):
        table = next(a for a in args if type(a).__name__ == "PageTable")
        tokens = float(table.seq_lens.sum())
        if op == "attention.decode":
            cache = args[1]
            per_token = cache.num_kv_heads * (cache.head_dim + cache.head_dim_v) * cache.k_pages.element_size()
        else:
            per_token = (args[2].shape[-1] + args[3].shape[-1]) * args[2].element_size()
        return tokens * per_token, "TB/s"
    if op in ("attention.prefill_ragged", "attention.prefill"):
        q = args[0]
        qo = args[3] if op == "attention.prefill_ragged" else args[1]
        kvp = args[4] if op == "attention.prefill_ragged" else None
        qlens = (qo[1:] - qo[:-1]).tolist()
        klens = (kvp[1:] - kvp[:-1]).tolist() if kvp is not None else qlens
        causal = kwargs.get("causal", True)
        d, dv = q.shape[-1], (args[2].shape[-1] if op == "attention.prefill_ragged" else q.shape[-1])
        pairs = sum((ql * kl - (ql * (ql - 1)) / 2) if causal else ql * kl for ql, kl in zip(qlens, klens))
        return 2.0 * pairs * q.shape[1] * (d + dv), "TFLOP/s"
    if op == "attention.dense":  # every (query, key) pair, whatever the mask keeps
        q, v = args[0], args[2]
        return 2.0 * q.numel() * args[1].shape[2] * (q.shape[-1] + v.shape[-1]) / q.shape[-1], "TFLOP/s"
    if op in ("gemm.mm", "gemm.mm_fp8"):
        a, b = args[0], args[1]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1], "TFLOP/s"
    if op == "moe.fused_moe":
        x, w13, w2, top_k = args[0], args[2], args[3], args[4]
        return 2.0 * x.shape[0] * top_k * (w13.shape[1] * w13.shape[2] + w2.shape[1] * w2.shape[2]), "TFLOP/s"
    if op.startswith("norm."):
        x = args[0]
        factor = 4 if op == "norm.fused_add_rms_norm" else 2
        return float(factor * x.numel() * x.element_size()), "TB/s"
    if op.startswith("activation."):
        x = args[0]
        return float(1.5 * x.numel() * x.element_size()), "TB/s"
    return 0.0, ""


# -- externals --------------------------------------------------------------------------------------
def externals(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Baselines outside the switchboard, when installed: torch / cuBLAS, torch SDPA, FlashInfer."""
    out: dict[str, Callable[[], Any]] = {}
    if op == "gemm.mm":
        a, b = args[0], args[1]
        out["torch.mm (cuBLAS)"] = lambda: torch.mm(a, b)
    elif op == "norm.rms_norm" and hasattr(torch.nn.functional, "rms_norm"):
        x, w = args[0], args[1]
        out["torch F.rms_norm"] = lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
    elif op == "attention.prefill_ragged" and args[0].is_cuda:
        q, k, v, qo = args[0], args[1], args[2], args[3]
        batch = qo.numel() - 1
        n = q.shape[0] // batch
        if bool((qo[1:] - qo[:-1] == n).all()):
            qd = q.view(batch, n, q.shape[1], -1).transpose(1, 2)
            kd = k.view(batch, n, k.shape[1], -1).transpose(1, 2)
            vd = v.view(batch, n, v.shape[1], -1).transpose(1, 2)
            causal = kwargs.get("causal", True)
            out["torch SDPA"] = lambda: torch.nn.functional.scaled_dot_product_attention(
                qd, kd, vd, is_causal=causal, enable_gqa=True)
    if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
        out.update(_flashinfer_externals(op, args, kwargs))
    return out


def _flashinfer_externals(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """FlashInfer's own automatic choice for an attention point (its default wrappers; decode also with tensor
    cores), planned once: the same mask, window and soft cap; none for custom variants."""
    import os

    if os.environ.get("KSB_BENCH_FLASHINFER", "1") == "0":  # its JIT costs 12-320 s per module on first use
        return {}
    if op not in ("attention.decode", "attention.prefill_ragged", "attention.mla_decode") or "variant" in kwargs:
        return {}
    try:
        flashinfer = importlib.import_module("flashinfer")
    except Exception:
        return {}
    out: dict[str, Callable[[], Any]] = {}
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=args[0].device)
    masking = {"window_left": kwargs.get("window_left", -1), "logits_soft_cap": kwargs.get("logits_soft_cap")}
    if op == "attention.prefill_ragged":  # its default backend: FA3 on sm_90
        q, k, v, qo_indptr, kv_indptr = args[:5]
        try:
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            w.plan(qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[2], v.shape[2],
                   causal=kwargs.get("causal", True), q_data_type=q.dtype, kv_data_type=k.dtype, **masking)
            out["flashinfer prefill"] = lambda: w.run(q, k, v)
        except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
            pass
    if op == "attention.mla_decode":  # its default backend: FA3 on sm_90
        qn, qp, ckv, kpe, table = args[:5]
        try:
            indptr, indices, _ = table.to_csr(ckv.shape[1])
            sm_scale = kwargs.get("sm_scale") or (ckv.shape[2] + kpe.shape[2]) ** -0.5
            new = qn.shape[1] if qn.dim() == 4 else 1  # new tokens per request, causal among themselves
            qn, qp = qn.reshape(-1, *qn.shape[-2:]), qp.reshape(-1, *qp.shape[-2:])
            qo_indptr = torch.arange(0, qn.shape[0] + 1, new, dtype=torch.int32, device=qn.device)
            w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
            w.plan(qo_indptr, indptr, indices, table.seq_lens, qn.shape[1], ckv.shape[2], kpe.shape[2], ckv.shape[1],
                   new > 1, sm_scale, qn.dtype, ckv.dtype)
            out["flashinfer mla"] = lambda: w.run(qn, qp, ckv, kpe)
        except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
            pass
    if op == "attention.decode":
        q, cache, table = args[0], args[1], args[2]
        indptr, indices, last = table.to_csr(cache.page_size)
        for name, tc in (("flashinfer decode", False), ("flashinfer decode (tensor cores)", True)):
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, cache.layout, use_tensor_cores=tc)
                w.plan(indptr, indices, last, q.shape[1], cache.num_kv_heads, cache.head_dim, cache.page_size,
                       q_data_type=q.dtype, kv_data_type=cache.dtype, **masking)
                kv = (cache.k_pages, cache.v_pages)
                out[name] = lambda w=w, kv=kv: w.run(q, kv)
            except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
                pass
    return out


# -- running ----------------------------------------------------------------------------------------
def _example(op: str, device: torch.device, params: dict[str, Any]) -> Any:
    family = op.partition(".")[0]
    return importlib.import_module(f"kernel_switchboard.testing.cases.{family}").example(op, device, **params)


def run_point(preset: str, point: Point, device: torch.device, reps_ms: float) -> list[Row]:
    from ..dispatch import explain

    if isinstance(point, RunPoint):
        return point.run(preset, device, reps_ms)
    rows: list[Row] = []
    try:
        case = _example(point.op, device, point.params)
        sel = explain(point.op, *case.args, **case.kwargs)
    except Exception as exc:
        return [Row(preset, point.op, point.label, "-", None, error=f"{type(exc).__name__}: {exc}"[:300])]
    units, unit = work(point.op, case.args, case.kwargs)
    fn = case.function
    calls: dict[str, Callable[[], Any]] = {}

    def timed(name: str, call: Callable[[], Any], auto: bool = False) -> None:
        calls[name] = call
        try:
            ms = time_ms(call, device, reps_ms)
            rows.append(Row(preset, point.op, point.label, name, ms, _rate(units, ms), unit, auto))
        except Exception as exc:
            rows.append(Row(preset, point.op, point.label, name, None, error=f"{type(exc).__name__}: {exc}"[:300]))

    plans = point.op in _PLANNERS
    for cand in _measured(sel, device):
        timed(cand.kernel.id, lambda k=cand.kernel.id: fn(*case.args, backend=k, **case.kwargs))
        if plans:
            _timed_plans(timed, rows, preset, point, cand.kernel.id, case.args, case.kwargs)
    timed(f"auto -> {sel.kernel.id}", lambda: fn(*case.args, **case.kwargs), auto=True)
    if plans:
        _timed_plans(timed, rows, preset, point, None, case.args, case.kwargs)
    for name, call in externals(point.op, case.args, case.kwargs).items():
        timed(f"[ext] {name}", call)
    _regrets(rows, calls, device, reps_ms, units)
    return rows


#: a regret above this is timed again, back to back with the best kernel (see :func:`_regrets`)
RETIME_ABOVE = 1.03


def _regrets(rows: list[Row], calls: dict[str, Callable[[], Any]], device: torch.device, reps_ms: float,
             units: float | None) -> None:
    """Set each auto row's regret: its time over the best kernel row's of the same call kind (eager, plan,
    graph). Rows are timed one after another, minutes apart on a big grid, and clocks drift (the same kernel can
    time 10% apart at the end of a run of full-bandwidth kernels), so an auto row above
    :data:`RETIME_ABOVE` and its best row are timed again in turn by :func:`fastest_of_rounds`, and both take
    those times: keeping the first time of the best row would keep its luck (a lucky first timing can be 3% under
    every later one). Should another row then be the best, it is timed against the auto row in turn too (at most
    three rows). ``extra['retimed']`` records the first times."""
    for r in rows:
        kind = _call_kind(r.kernel)
        best = _best_row(rows, kind)
        if not r.auto or r.ms is None or best is None or best.ms is None:
            continue
        retimed: set[str] = set()
        while (r.ms > best.ms * RETIME_ABOVE and best.kernel not in retimed and len(retimed) < 3
               and r.kernel in calls and best.kernel in calls):
            first = {"auto_ms": r.ms, "best_ms": best.ms}
            again = fastest_of_rounds({row.kernel: calls[row.kernel] for row in (r, best)}, device, reps_ms)
            for row in (r, best):
                row.ms = again.get(row.kernel, row.ms)
                row.metric = _rate(units, row.ms) if row.ms is not None else None
                row.extra.setdefault("retimed", first)
            retimed.add(best.kernel)
            best = _best_row(rows, kind) or best
        r.regret = r.ms / best.ms if r.ms is not None and best.ms else None


def _best_row(rows: list[Row], kind: str) -> Row | None:
    """The fastest non-auto, non-external row of one call kind."""
    timed = [r for r in rows if r.ms is not None and not r.auto and not r.kernel.startswith("[ext]")
             and _call_kind(r.kernel) == kind]
    return min(timed, key=lambda r: r.ms or math.inf) if timed else None


def _rate(units: float | None, ms: float) -> float | None:
    """TB/s or TFLOP/s of ``units`` (bytes or flops) done in ``ms``."""
    return units / (ms * 1e-3) / 1e12 if units else None


def _captured(call: Callable[[], Any]) -> Any:
    """A CUDA graph of one ``call`` (already warmed up outside capture): ``.replay()`` times the GPU work alone."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _measured(sel: Any, device: torch.device) -> list[Any]:
    """The eligible candidates worth timing, in rank order: all but the reference kernels on a GPU (slow by design)."""
    return [c for c in sel.candidates if c.eligible and not (device.type == "cuda" and c.kernel.backend == "reference")]


def _adhoc_point(args: argparse.Namespace) -> Point:
    """The point ``--op`` and its ``--param key=value`` options name; a malformed option exits with status 2 and one
    line on stderr, as argparse does for its own options."""
    from ..cli import _parse_params
    from ..errors import SwitchboardError

    try:
        params = _parse_params(args.param, args.op)
    except SwitchboardError as exc:
        print(f"switchboard: --param: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return Point(args.op, params, " ".join(args.param) or args.op)


def _call_kind(name: str) -> str:
    """``eager``, ``plan`` or ``graph``: how a row's kernel was called."""
    return "plan" if name.endswith("[plan]") else "graph" if name.endswith("[graph]") else "eager"


def _timed_plans(timed: Callable[..., None], rows: list[Row], preset: str, point: Point, kernel_id: str | None,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Rows for ``kernel_id`` (None: the automatic choice) called the way an engine calls it: a plan made
    once per step, and on a GPU a CUDA graph of ``plan.run``."""
    try:
        plan, call = _PLANNERS[point.op](kernel_id, args, kwargs)
    except Exception as exc:  # noqa: BLE001 - the eager row stands; say why the plan row is missing
        rows.append(Row(preset, point.op, point.label, f"{kernel_id or 'auto'} [plan]", None,
                        error=f"{type(exc).__name__}: {exc}"[:300]))
        return
    name = kernel_id or f"auto -> {plan.kernel.id}"
    call()  # warm up (compiles, builds graphs) outside capture
    timed(f"{name} [plan]", call, auto=kernel_id is None)
    if not args[0].is_cuda:
        return
    try:  # the GPU time alone: a plan whose host work outlasts the kernel shows the gap here
        graph = _captured(call)
    except Exception as exc:  # noqa: BLE001 - the plan row stands; say why the graph row is missing
        rows.append(Row(preset, point.op, point.label, f"{name} [graph]", None,
                        error=f"{type(exc).__name__}: {exc}"[:300]))
        return
    timed(f"{name} [graph]", graph.replay, auto=kernel_id is None)


def _decode_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_decode

    q, cache, table = args
    plan = plan_decode(table, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=cache.head_dim,
                       head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype, layout=cache.layout,
                       page_size=cache.page_size, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, cache)


def _prefill_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_prefill

    q, qo_indptr, cache, table = args
    plan = plan_prefill(table, qo_indptr, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads,
                        head_dim=cache.head_dim, head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype,
                        layout=cache.layout, page_size=cache.page_size, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, cache)


def _ragged_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_prefill_ragged

    q, k, v, qo_indptr, kv_indptr = args
    plan = plan_prefill_ragged(qo_indptr, kv_indptr, num_q_heads=q.shape[1], num_kv_heads=k.shape[1],
                               head_dim=q.shape[2], head_dim_v=v.shape[2], dtype=q.dtype, backend=kernel_id, **kwargs)
    return plan, lambda: plan.run(q, k, v)


def _mla_plan(kernel_id: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    from ..ops.attention import plan_mla_decode

    q_nope, q_pe, ckv, kpe, table = args
    plan = plan_mla_decode(table, num_heads=q_nope.shape[-2], head_dim_ckv=ckv.shape[2], head_dim_kpe=kpe.shape[2],
                           dtype=q_nope.dtype, page_size=ckv.shape[1], backend=kernel_id,
                           q_len=q_nope.shape[1] if q_nope.dim() == 4 else 1, **kwargs)
    return plan, lambda: plan.run(q_nope, q_pe, ckv, kpe)


#: op -> (kernel id or None, case args, case kwargs) -> (plan, call)
_PLANNERS: dict[str, Callable[..., tuple[Any, Callable[[], Any]]]] = {
    "attention.decode": _decode_plan, "attention.prefill": _prefill_plan, "attention.prefill_ragged": _ragged_plan,
    "attention.mla_decode": _mla_plan}


def _print_table(rows: list[Row], ceil: dict[str, float]) -> None:
    header = f"{'op':<26} {'point':<22} {'kernel':<52} {'ms':>9} {'rate':>14} {'%ceil':>6} {'regret':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.error:
            print(f"{r.op:<26} {r.label:<22} {r.kernel:<52} {'error':>9}  {r.error[:80]}")
            continue
        rate = f"{r.metric:.3g} {r.unit}" if r.metric is not None else ""
        ref = ceil.get("copy_tbs" if r.unit == "TB/s" else "mm_tflops")
        pct = f"{100 * r.metric / ref:.0f}%" if ref and r.metric else ""
        regret = f"{r.regret:.3f}" if r.regret is not None else ""
        print(f"{r.op:<26} {r.label:<22} {r.kernel:<52} {r.ms:>9.4f} {rate:>14} {pct:>6} {regret:>7}")


def _plots(rows: list[Row], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    made = []
    for op in sorted({r.op for r in rows}):
        ok = [r for r in rows if r.op == op and r.metric is not None and not r.auto]
        if not ok:
            continue
        labels = list(dict.fromkeys(r.label for r in ok))
        kernels = list(dict.fromkeys(r.kernel for r in ok))
        fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.6), 4))
        for k in kernels:
            ys = [next((r.metric for r in ok if r.kernel == k and r.label == lab), math.nan) for lab in labels]
            ax.plot(range(len(labels)), ys, marker="o", label=k)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ok[0].unit)
        ax.set_title(op)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out / f"{op.replace('.', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def dispatch_overhead(n: int = 5000, rounds: int = 9) -> list[Row]:
    """Per-call cost of the public op over calling the selected kernel directly (CPU, warm cache).

    Public and direct calls alternate in ``rounds`` rounds of ``n`` calls; the fastest round of each
    is kept, so load from other processes inflates neither side.
    """
    from .. import norm
    from ..dispatch import select_kernel
    from ..ops.norm import _problem

    x, w = torch.randn(4, 64), torch.randn(64)
    kernel = select_kernel("norm.rms_norm", _problem(x, False))
    public, direct = math.inf, math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            norm.rms_norm(x, w, 1e-6)
        public = min(public, (time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for _ in range(n):
            kernel.run(x, w, 1e-6, False)
        direct = min(direct, (time.perf_counter() - t0) / n)
    overhead_us = (public - direct) * 1e6
    return [Row("dispatch", "norm.rms_norm", "4x64 fp32 cpu", "dispatch overhead", overhead_us * 1e-3, overhead_us,
                "us/call", extra={"public_us": public * 1e6, "direct_us": direct * 1e6})]


def _write_tables(out: Path, rows: list[Row], ceil: dict[str, float], environment: dict[str, Any]) -> None:
    """bench.json (rows, ceilings, environment) and bench.csv (rows without their extras) under ``out``."""
    payload = {"environment": environment, "ceilings": ceil, "rows": [asdict(r) for r in rows]}
    (out / "bench.json").write_text(json.dumps(payload, indent=1, default=str))
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in asdict(rows[0]) if k != "extra"] if rows else ["op"])
        writer.writeheader()
        for r in rows:
            d = asdict(r)
            d.pop("extra")
            writer.writerow(d)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "first-call" in argv or "--preset=first-call" in argv:  # fresh processes per point: its own runner
        return int(importlib.import_module("kernel_switchboard.bench.first_call").main(argv))
    p = argparse.ArgumentParser(prog="switchboard bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", action="append", help=f"one of {[*sorted(PRESETS), 'dispatch']} (repeatable)")
    p.add_argument("--op", help="ad-hoc point: op name")
    p.add_argument("--param", action="append", default=[], help="ad-hoc point: key=value (repeatable)")
    p.add_argument("--out", default="bench-out", help="folder for bench.json, bench.csv and plots")
    p.add_argument("--reps-ms", type=float, default=200.0, help="timing budget per measurement (ms)")
    p.add_argument("--device", help="cpu or cuda")
    args = p.parse_args(argv)
    if unknown_op("switchboard bench", args.op):
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.preset:
        presets = args.preset
    elif args.op:
        presets = []
    else:
        presets = ["dispatch"] if device.type == "cpu" else ["attention"]
    if device.type == "cpu" and set(presets) - {"dispatch"} and args.device != "cpu":
        print("bench: the workload presets are model-sized GPU workloads; on a CPU use --preset dispatch, an ad-hoc "
              "--op/--param point, or force them with --device cpu", file=sys.stderr)
        return 2
    points: list[tuple[str, Point]] = []
    rows: list[Row] = []
    if "dispatch" in presets:
        rows.extend(dispatch_overhead())
    for name in presets:
        if name == "dispatch":
            continue
        if name not in PRESETS:
            print(f"bench: unknown preset {name!r}; known: {[*sorted(PRESETS), 'dispatch']}", file=sys.stderr)
            return 2
        points.extend((name, pt) for pt in PRESETS[name]())
    if args.op:
        points.append(("adhoc", _adhoc_point(args)))
    ceil = ceilings(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    environment = fingerprint()
    for i, (preset, point) in enumerate(points):
        print(f"\rbench [{i + 1}/{len(points)}] {point.op} {point.label}".ljust(80), end="", file=sys.stderr, flush=True)
        rows.extend(run_point(preset, point, device, args.reps_ms))
        _write_tables(out, rows, ceil, environment)  # after every point: a cut-short run keeps what it measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if points:
        print(file=sys.stderr)
    if ceil:
        print(f"ceilings: device copy {ceil['copy_tbs']:.2f} TB/s, bf16 matmul {ceil['mm_tflops']:.0f} TFLOP/s")
    _print_table(rows, ceil)
    _write_tables(out, rows, ceil, environment)
    plots = _plots(rows, out) if device.type == "cuda" else []
    print(f"bench: wrote {out / 'bench.json'}, {out / 'bench.csv'}" + (f" and {len(plots)} plots" if plots else ""))
    return 0


def tune_main(argv: list[str] | None = None) -> int:
    """Measure the eligible kernels of each preset point and store the winners in the autotune cache."""
    from .. import tuning

    p = _points_parser("switchboard tune")
    p.add_argument("--shortlist", type=int, default=4, help="measure at most this many top-ranked kernels")
    p.add_argument("--reps-ms", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=2, help="time the shortlist in turn this many times; each "
                   "kernel keeps its fastest time")
    args = p.parse_args(argv)
    if unknown_op("switchboard tune", args.op):
        return 2
    unwritable = tuning.unwritable()
    if unwritable is not None:
        print(f"switchboard tune: {unwritable}", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    failed: list[str] = []
    for point, case, sel in _explained_points("tune", args, device, failed):
        calls: dict[str, Callable[[], Any]] = {
            cand.kernel.id: functools.partial(case.function, *case.args, backend=cand.kernel.id, **case.kwargs)
            for cand in _measured(sel, device)[: args.shortlist]}
        times = {k: ms * 1e-3 for k, ms in fastest_of_rounds(calls, device, args.reps_ms, args.rounds).items()}
        if times:
            _report(point, "eager", tuning.store(point.op, sel.problem, times), times)
        graphed = _graph_times(point, case, list(times), device, args.reps_ms, args.rounds)
        if graphed is not None:
            _report(point, "plan in a CUDA graph", tuning.store(point.op, graphed[0], graphed[1]), graphed[1])
    print(f"tune: cache at {tuning.cache_path()}")
    return 1 if failed else 0


def _points_parser(prog: str) -> argparse.ArgumentParser:
    """The point options ``switchboard tune`` and ``build`` share: presets or one ad-hoc point, and a device."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="workload preset (repeatable; "
                   "default attention unless --op is given)")
    p.add_argument("--op", help="ad-hoc point: op name")
    p.add_argument("--param", action="append", default=[], help="ad-hoc point: key=value (repeatable)")
    p.add_argument("--device", help="cpu or cuda")
    return p


def _explained_points(prog: str, args: argparse.Namespace, device: torch.device,
                      failed: list[str] | None = None) -> Iterator[tuple[Point, Any, Any]]:
    """(point, example case, selection) for each point ``args`` names; a point that cannot be made or has no
    eligible kernel is reported on stderr, added to ``failed`` and skipped."""
    from ..dispatch import explain

    points = [pt for name in args.preset or ([] if args.op else ["attention"]) for pt in PRESETS[name]()]
    if args.op:
        points.append(_adhoc_point(args))
    for point in points:
        if isinstance(point, RunPoint):  # its comparison is its own: nothing here to build or tune
            print(f"{prog}: {point.op} {point.label}: runs its own comparison (switchboard bench only); skipped",
                  file=sys.stderr)
            continue
        try:
            case = _example(point.op, device, point.params)
            sel = explain(point.op, *case.args, **case.kwargs)
        except Exception as exc:
            print(f"{prog}: {point.op} {point.label}: {exc}", file=sys.stderr)
            if failed is not None:
                failed.append(point.label)
            continue
        yield point, case, sel


def _report(point: Point, how: str, winner: str, times: dict[str, float]) -> None:
    print(f"tune: {point.op} {point.label} ({how}): {winner} "
          + " ".join(f"{k}={v * 1e3:.4f}ms" for k, v in sorted(times.items(), key=lambda kv: kv[1])))


def _graph_times(point: Point, case: Any, kernel_ids: list[str], device: torch.device, reps_ms: float,
                 rounds: int) -> tuple[Any, dict[str, float]] | None:
    """(plan problem, seconds by kernel) of each kernel's plan replayed in a CUDA graph: the GPU time an engine
    that captures its steps pays, stored under the plan's problem (selected by ``plan_decode`` / ``plan_prefill``,
    whose problem requires ``cuda_graph``). None where the op has no plan or there is no GPU."""
    if point.op not in _PLANNERS or device.type != "cuda":
        return None
    problem, replays = None, {}
    for kernel_id in kernel_ids:
        try:
            plan, call = _PLANNERS[point.op](kernel_id, case.args, case.kwargs)
            call()  # compiles and builds outside capture
            replays[kernel_id] = _captured(call).replay
            problem = plan.problem
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot plan or capture simply does not win
            print(f"tune: {kernel_id} plan in a CUDA graph failed on {point.label}: {exc}"[:300], file=sys.stderr)
    times = {k: ms * 1e-3 for k, ms in fastest_of_rounds(replays, device, reps_ms, rounds).items()}
    return (problem, times) if times else None
