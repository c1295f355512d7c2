"""``switchboard build``: compile ahead of time what the first calls of a workload would compile, into the
persistent caches a later process loads from (:mod:`kernel_switchboard.artefacts`).

For every point of the chosen presets (or one ``--op`` point) it runs the kernels' own build steps (CUTLASS
libraries, FlashInfer's JIT modules) and then calls each kernel once on example inputs, which compiles and stores
what that kernel JIT-compiles: Triton kernels (``TRITON_CACHE_DIR``, pointed at this environment's directory) and
FlashAttention-4's CuTe DSL kernels (its persistent cache, in the same directory). Which kernels: the automatic
choice of each point (default), or every eligible kernel (``--all``). cuDNN graphs are built in memory only (the
switchboard does not serialise them; a build takes 0.4-2 s per graph on first use).

    switchboard build --preset first-call             # what `switchboard bench --preset first-call` calls
    KSB_CACHE_DIR=/opt/ksb-cache switchboard build --preset llama3-8b --all

Shapes matter: Triton specialises a kernel on its constant arguments and on which integer arguments are
divisible by 16, so build on the shapes (or shape classes) the workload runs.
"""

from __future__ import annotations

import os
import sys
import time

import torch


def _where() -> list[str]:
    from . import artefacts

    lines = []
    path = artefacts.directory(create=False)
    if path is not None:
        lines.append(f"compiled artefacts for this environment: {path}")
    for var in ("TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        if os.environ.get(var):
            lines.append(f"{var}={os.environ[var]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from .bench.cli import explained_points, points_parser
    from .cli import unknown_op
    from .device import is_capturing

    p = points_parser("switchboard build")
    p.add_argument("--all", action="store_true", help="every eligible kernel of each point, not only the automatic choice")
    args = p.parse_args(argv)
    if unknown_op("switchboard build", args.op):
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        print("build: no GPU here: nothing is compiled (the kernels that compile need one)", file=sys.stderr)
    built = failed = 0
    for point, case, sel in explained_points("build", args, device):
        candidates = [c for c in sel.candidates if c.eligible] if args.all else [c for c in sel.candidates
                                                                                   if c.kernel.id == sel.kernel.id]
        for cand in candidates:
            kernel = cand.kernel
            if kernel.backend == "reference" or is_capturing():
                continue
            start = time.perf_counter()
            try:
                if kernel.build is not None and kernel.needs_build and kernel.needs_build(sel.problem):
                    kernel.build(sel.problem)
                case.run(kernel.id)  # on copies of the inputs: in-place ops leave the case as it was
                if device.type == "cuda":
                    torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - one kernel that cannot build does not stop the others
                failed += 1
                print(f"build: {kernel.id} for {point.op} {point.label} failed: {type(exc).__name__}: {exc}"[:400],
                      file=sys.stderr)
                continue
            built += 1
            print(f"build: {kernel.id} for {point.op} {point.label} in {time.perf_counter() - start:.1f} s")
    from .dispatch import clear_cache

    clear_cache()
    for line in _where():
        print(f"build: {line}")
    print(f"build: {built} kernels built and run once" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0
