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
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..cli import unknown_op
from ..device import fingerprint
from .measure import dispatch_overhead, example_case, measured_candidates, run_point
from .plans import PLANNERS
from .points import Point, Row, RunPoint
from .presets import PRESETS
from .report import print_table, write_plots, write_tables
from .timing import captured_graph, ceilings, fastest_of_rounds


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
    unknown = [name for name in presets if name != "dispatch" and name not in PRESETS]
    if unknown:  # before anything runs or the CPU advice: a misspelt preset is the first thing to hear about
        print(f"bench: unknown preset {unknown[0]!r}; known: {[*sorted(PRESETS), 'dispatch']}", file=sys.stderr)
        return 2
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
        write_tables(out, rows, ceil, environment)  # after every point: a cut-short run keeps what it measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if points:
        print(file=sys.stderr)
    if ceil:
        print(f"ceilings: device copy {ceil['copy_tbs']:.2f} TB/s, bf16 matmul {ceil['mm_tflops']:.0f} TFLOP/s")
    print_table(rows, ceil)
    write_tables(out, rows, ceil, environment)
    plots = write_plots(rows, out) if device.type == "cuda" else []
    print(f"bench: wrote {out / 'bench.json'}, {out / 'bench.csv'}" + (f" and {len(plots)} plots" if plots else ""))
    return 0


def tune_main(argv: list[str] | None = None) -> int:
    """Measure the eligible kernels of each preset point and store the winners in the autotune cache."""
    from .. import tuning

    p = points_parser("switchboard tune")
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
    for point, case, sel in explained_points("tune", args, device, failed):
        calls: dict[str, Callable[[], Any]] = {
            cand.kernel.id: functools.partial(case.function, *case.args, backend=cand.kernel.id, **case.kwargs)
            for cand in measured_candidates(sel, device)[: args.shortlist]}
        times = {k: ms * 1e-3 for k, ms in fastest_of_rounds(calls, device, args.reps_ms, args.rounds).items()}
        if times:
            _report(point, "eager", tuning.store(point.op, sel.problem, times), times)
        graphed = _graph_times(point, case, list(times), device, args.reps_ms, args.rounds)
        if graphed is not None:
            _report(point, "plan in a CUDA graph", tuning.store(point.op, graphed[0], graphed[1]), graphed[1])
    print(f"tune: cache at {tuning.cache_path()}")
    return 1 if failed else 0


def points_parser(prog: str) -> argparse.ArgumentParser:
    """The point options ``switchboard tune`` and ``build`` share: presets or one ad-hoc point, and a device."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="workload preset (repeatable; "
                   "default attention unless --op is given)")
    p.add_argument("--op", help="ad-hoc point: op name")
    p.add_argument("--param", action="append", default=[], help="ad-hoc point: key=value (repeatable)")
    p.add_argument("--device", help="cpu or cuda")
    return p


def explained_points(prog: str, args: argparse.Namespace, device: torch.device,
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
            case = example_case(point.op, device, point.params)
            sel = explain(point.op, *case.args, **case.kwargs)
        except Exception as exc:
            print(f"{prog}: {point.op} {point.label}: {exc}", file=sys.stderr)
            if failed is not None:
                failed.append(point.label)
            continue
        yield point, case, sel


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


def _report(point: Point, how: str, winner: str, times: dict[str, float]) -> None:
    print(f"tune: {point.op} {point.label} ({how}): {winner} "
          + " ".join(f"{k}={v * 1e3:.4f}ms" for k, v in sorted(times.items(), key=lambda kv: kv[1])))


def _graph_times(point: Point, case: Any, kernel_ids: list[str], device: torch.device, reps_ms: float,
                 rounds: int) -> tuple[Any, dict[str, float]] | None:
    """(plan problem, seconds by kernel) of each kernel's plan replayed in a CUDA graph: the GPU time an engine
    that captures its steps pays, stored under the plan's problem (selected by ``plan_decode`` / ``plan_prefill``,
    whose problem requires ``cuda_graph``). None where the op has no plan or there is no GPU."""
    if point.op not in PLANNERS or device.type != "cuda":
        return None
    problem, replays = None, {}
    for kernel_id in kernel_ids:
        try:
            plan, call = PLANNERS[point.op](kernel_id, case.args, case.kwargs)
            call()  # compiles and builds outside capture
            replays[kernel_id] = captured_graph(call).replay
            problem = plan.problem
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot plan or capture simply does not win
            print(f"tune: {kernel_id} plan in a CUDA graph failed on {point.label}: {exc}"[:300], file=sys.stderr)
    times = {k: ms * 1e-3 for k, ms in fastest_of_rounds(replays, device, reps_ms, rounds).items()}
    return (problem, times) if times else None
