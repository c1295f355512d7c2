"""Build FlashInfer's JIT modules for benchmark presets side by side, before they are timed (GPU machine).

FlashInfer compiles a module at its first call, 12-320 s each, one compiler process per module; inside one
``switchboard bench`` run those builds happen one after another. This runs every point of the given presets once, each
in a process of its own (its own CUDA context: a point's CUDA-graph capture cannot meet another point's launches),
``--jobs`` of them at a time, so the builds share the CPU cores and the presets then find them in FlashInfer's cache.
The timings of this run are thrown away (the points share the GPU); a point's error is reported, not raised.

    python3 tools/flashinfer_warm.py [--jobs N] [preset ...]   # default: 8 jobs; flashinfer-compat flashinfer-ops beyond

Prints one line per point (exit code, seconds, rows and errors); run it under a time limit (``timeout``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
import time

DEFAULT_PRESETS = ("flashinfer-compat", "flashinfer-ops", "beyond")


def run_one(preset: str, index: int) -> int:
    """Run point ``index`` of ``preset`` once on the GPU; print how many rows it gave and their errors."""
    import torch

    from kernel_switchboard import bench

    point = bench.PRESETS[preset]()[index]
    rows = bench.run_point(preset, point, torch.device("cuda"), 1.0)
    errors = sorted({r.error for r in rows if r.error})
    print(f"{len(rows)} rows" + (f"; errors: {' | '.join(errors)[:300]}" if errors else ""))
    return 0


def _job(preset: str, index: int, label: str) -> str:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--point", preset, str(index)], capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return f"{label}: exit {done.returncode}, {time.perf_counter() - start:.0f} s, {lines[-1] if lines else ''}"[:400]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="points run at once (default 8)")
    parser.add_argument("presets", nargs="*", default=list(DEFAULT_PRESETS))
    args = parser.parse_args(argv)
    import torch

    from kernel_switchboard import bench

    if not torch.cuda.is_available():
        print("flashinfer_warm: no CUDA GPU here; FlashInfer's modules build only for one", file=sys.stderr)
        return 2
    points = [(preset, i, f"{preset}: {p.op} {p.label}") for preset in args.presets
              for i, p in enumerate(bench.PRESETS[preset]())]
    print(f"flashinfer_warm: {len(points)} points, {args.jobs} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for line in pool.map(lambda job: _job(*job), points):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--point"]:
        sys.exit(run_one(sys.argv[2], int(sys.argv[3])))
    sys.exit(main(sys.argv[1:]))
