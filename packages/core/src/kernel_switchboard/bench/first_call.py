"""``switchboard bench --preset first-call``: each op family's first result in a fresh process, as users meet it.

Every point runs in its own ``python`` process with the default install and automatic dispatch (no backend
named), and reports separately:

- ``import_s``: ``import torch`` + ``import kernel_switchboard`` (``import_torch_s`` of it is torch's);
- ``select_s``: the first selection (backend discovery through the entry points, then ranking);
- ``first_call_s``: the first call to a synchronised result (vendor imports, JIT compile or cache load, graph
  builds, the run); ``compile_s`` is that minus the second call (``second_call_s``), ``vendor_imports`` the seconds
  each vendor library took to import during it;
- ``first_result_s`` = import + selection + first call: what the switchboard adds before the first result. Input
  creation (``inputs_s``, which includes creating the CUDA context) and the interpreter's start (``python_start_s``)
  are reported apart: a user's process pays them for its own reasons. ``wall_s`` is the whole child process;
- ``gc_s``: seconds the interpreter's garbage collector ran during selection and the first call (its first full
  collection after torch's import takes a noticeable part of a second wherever it falls);
- ``triton_kernels``: when Triton is imported, each Triton / Gluon kernel's compile (a cache hit: its load from the
  cache) with the seconds of each stage of a real compile (ttir ... cubin: the last is ptxas), and its first load
  onto the GPU.

Compile caches: ``cold`` gives each point empty ones (the switchboard's ``KSB_CACHE_DIR``, where Triton's and
FA4's caches then live, and FlashInfer's, inductor's and CUDA's); ``warm`` runs the point again on the caches its
cold run filled; ``built`` gives it empty caches filled by ``switchboard build`` for that point first. Each row
counts the files its process added to the caches (0 when everything was loaded). The first result is compared with
the reference kernel on the same inputs (``correct``); ``here`` uses the caches this process's environment names
(``KSB_CACHE_DIR``...; a container image's baked cache) as they are. ``--flashinfer`` adds FlashInfer's own first calls on the
same shapes, in fresh processes with an empty FlashInfer cache.

On a machine without a GPU the points run the reference kernels on small shapes, which the table says.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRESET = "first-call"
#: top-level modules of the vendor libraries; their imports are timed in the child
VENDORS = ("triton", "cudnn", "flash_attn", "flash_attn_interface", "cutlass", "cutlass_cppgen", "flashinfer",
           "tensorrt_llm")
#: variables that move a library's compile cache; a child gets them pointed into its own directory
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
                   "KSB_CUTLASS_CACHE", "KSB_CACHE_DIR", "KSB_TUNE_CACHE", "FLASHINFER_WORKSPACE_BASE",
                   "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")
MODES = ("cold", "warm", "built", "here")


@dataclass(frozen=True)
class FirstCall:
    """One point: an op, its example parameters on a GPU, and smaller ones for the CPU's reference kernels."""

    op: str
    label: str
    gpu: dict[str, Any]
    cpu: dict[str, Any] = field(default_factory=dict)

    def params(self, device: str) -> dict[str, Any]:
        return self.gpu if device == "cuda" else {**self.gpu, **self.cpu}


_LLAMA = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
#: one point per op family (attention: decode, ragged prefill and MLA decode); Llama-3-8B-sized where it applies
POINTS = (
    FirstCall("attention.decode", "B=16 L=2048 p16", {**_LLAMA, "batch": 16, "kv_len": 2048, "page_size": 16},
              {"batch": 2, "kv_len": 256}),
    FirstCall("attention.prefill_ragged", "1x8192 causal", {**_LLAMA, "batch": 1, "q_len": 8192, "kv_len": 8192,
                                                            "causal": True}, {"q_len": 256, "kv_len": 256}),
    FirstCall("attention.mla_decode", "B=16 L=4096 p64 H=128", {"batch": 16, "kv_len": 4096, "num_heads": 128,
                                                                "page_size": 64, "dtype": "bfloat16"},
              {"batch": 2, "kv_len": 256, "num_heads": 16}),
    FirstCall("kv_cache.append", "B=16 L=2048 p16", {"batch": 16, "kv_len": 2048, "page_size": 16, "dtype": "bfloat16"},
              {"batch": 2, "kv_len": 256}),
    FirstCall("sampling.top_k_top_p", "128x128256 k50 p0.9", {"batch": 128, "vocab": 128256, "top_k": 50,
                                                              "top_p": 0.9, "logits": 0}, {"batch": 4, "vocab": 4096}),
    FirstCall("norm.rms_norm", "4096x4096", {"rows": 4096, "hidden": 4096, "dtype": "bfloat16"},
              {"rows": 64, "hidden": 1024}),
    FirstCall("rope.apply", "4096 tokens", {"tokens": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128},
              {"tokens": 64}),
    FirstCall("activation.silu_and_mul", "4096x14336", {"tokens": 4096, "hidden": 14336}, {"tokens": 64,
                                                                                          "hidden": 512}),
    FirstCall("gemm.mm", "4096^3 bf16", {"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16"},
              {"m": 128, "n": 128, "k": 128}),
    FirstCall("moe.fused_moe", "256 tok, 8 experts top-2", {"tokens": 256, "experts": 8, "top_k": 2, "hidden": 4096,
                                                            "inter": 14336}, {"tokens": 16, "hidden": 128,
                                                                              "inter": 256}),
    FirstCall("comm.all_reduce_fused_rms_norm", "256x8192, one rank", {"rows": 256, "hidden": 8192},
              {"rows": 16, "hidden": 512}),
)
#: FlashInfer's counterparts, where it has one
FLASHINFER_OPS = ("attention.decode", "attention.prefill_ragged", "attention.mla_decode", "norm.rms_norm",
                  "activation.silu_and_mul", "sampling.top_k_top_p")


def points() -> list[Any]:
    """The preset's points as :class:`kernel_switchboard.bench.points.Point` (``switchboard build --preset first-call``)."""
    import torch

    from .points import Point

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [Point(p.op, p.params(device), p.label) for p in POINTS]


# -- the child process ------------------------------------------------------------------------------------------
#: what a child runs: its clock starts before torch is imported
_BOOT = """
import sys, time
t0 = time.perf_counter()
wall0 = time.time()
import torch
t1 = time.perf_counter()
import kernel_switchboard
t2 = time.perf_counter()
from kernel_switchboard.bench.first_call import child
child(sys.argv[1], wall0, t0, t1, t2)
"""


class _ImportTimer:
    """A meta-path finder that times the import of each vendor package (its ``__init__`` and what that imports):
    the package's own loader stays in place, wrapped so its ``exec_module`` is timed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in VENDORS or name in self.seconds:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _TimedLoader(spec.loader, name, self.seconds)  # type: ignore[assignment]
        return spec


class _TimedLoader:
    """Delegates everything to ``loader``; records how long ``exec_module`` took under ``name``."""

    def __init__(self, loader: Any, name: str, seconds: dict[str, float]) -> None:
        self._loader, self._name, self._seconds = loader, name, seconds

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        start = time.perf_counter()
        try:
            self._loader.exec_module(module)
        finally:
            self._seconds[self._name] = round(time.perf_counter() - start, 3)
        if self._name == "triton":
            _watch_triton()


#: what :func:`_watch_triton` records in this process
TRITON_KERNELS: list[dict[str, Any]] = []


def _watch_triton() -> None:
    """Record each Triton / Gluon kernel's compile (``triton.compiler.compile``, a cache lookup first) with the seconds
    of each stage of the CUDA pipeline, and its first load (cubin load and launcher) in :data:`TRITON_KERNELS`."""
    try:
        import triton.compiler as tc
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return
    stages: dict[str, float] = {}
    compile_fn, init_handles, add_stages = tc.compile, CompiledKernel._init_handles, CUDABackend.add_stages

    def timed_compile(src, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        stages.clear()
        start = time.perf_counter()
        kernel = compile_fn(src, *args, **kwargs)
        TRITON_KERNELS.append({"kernel": getattr(getattr(src, "fn", None), "__name__", "?"),
                               "compile_s": round(time.perf_counter() - start, 3), "stages_s": dict(stages)})
        return kernel

    def timed_init(self):  # noqa: ANN001, ANN202
        fresh = self.module is None
        start = time.perf_counter()
        init_handles(self)
        if fresh:
            TRITON_KERNELS.append({"kernel": self.name, "load_s": round(time.perf_counter() - start, 3)})

    def timed_add_stages(self, found, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        add_stages(self, found, *args, **kwargs)
        for name, stage in list(found.items()):
            def timed(src, metadata, stage=stage, name=name):  # noqa: ANN001, ANN202
                start = time.perf_counter()
                result = stage(src, metadata)
                stages[name] = round(time.perf_counter() - start, 3)
                return result
            found[name] = timed

    tc.compile, CompiledKernel._init_handles, CUDABackend.add_stages = timed_compile, timed_init, timed_add_stages


#: seconds of garbage collection since the inputs were made (:func:`_time_gc`)
GC_SECONDS = [0.0]


def _time_gc() -> None:
    """Accumulate the seconds of every garbage collection in :data:`GC_SECONDS` (zeroed once the inputs exist)."""
    import gc

    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            GC_SECONDS[0] += time.perf_counter() - started[0]

    gc.callbacks.append(callback)


def _vendors_loaded() -> list[str]:
    return sorted(v for v in VENDORS if v in sys.modules)


def child(spec_json: str, wall0: float, t0: float, t1: float, t2: float) -> None:
    """Measure one point (see the module docstring) and print one JSON line."""
    spec = json.loads(spec_json)
    timer = _ImportTimer()
    sys.meta_path.insert(0, timer)
    _time_gc()
    row: dict[str, Any] = {"python_start_s": round(wall0 - spec["spawned"], 3), "import_torch_s": round(t1 - t0, 3),
                           "import_s": round(t2 - t0, 3), "vendors_at_import": _vendors_loaded(),
                           "torch_dynamo_at_import": "torch._dynamo" in sys.modules}
    try:
        (_flashinfer_first_call if spec.get("flashinfer") else _switchboard_first_call)(spec, row, timer)
    except Exception as exc:  # noqa: BLE001 - the row reports it; the parent goes on with the next point
        row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    row["vendor_imports"] = timer.seconds
    row["gc_s"] = round(GC_SECONDS[0], 3)
    if TRITON_KERNELS:
        row["triton_kernels"] = TRITON_KERNELS
    print("FIRST-CALL " + json.dumps(row, default=str), flush=True)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _case(spec: dict[str, Any], row: dict[str, Any]) -> Any:
    import importlib

    import torch

    start = time.perf_counter()
    builder = importlib.import_module(f"kernel_switchboard.testing.cases.{spec['op'].partition('.')[0]}").example
    case = builder(spec["op"], torch.device(spec["device"]), **spec["params"])
    _sync(spec["device"])
    row["inputs_s"] = round(time.perf_counter() - start, 3)
    GC_SECONDS[0] = 0.0
    return case


def _switchboard_first_call(spec: dict[str, Any], row: dict[str, Any], timer: _ImportTimer) -> None:
    from ..dispatch import explain
    from ..registry import registry

    case = _case(spec, row)
    start = time.perf_counter()
    sel = explain(spec["op"], *case.args, **case.kwargs)
    row["select_s"] = round(time.perf_counter() - start, 3)
    row["chosen"], row["source"] = sel.kernel.id, sel.source
    row["vendors_after_select"] = _vendors_loaded()
    row["backends"] = {name: b.available for name, b in registry.all_backends().items()}
    times = []
    for _ in range(2):
        start = time.perf_counter()
        case.function(*case.args, **case.kwargs)
        _sync(spec["device"])
        times.append(time.perf_counter() - start)
    row["first_call_s"], row["second_call_s"] = round(times[0], 3), round(times[1], 4)
    row["compile_s"] = round(max(0.0, times[0] - times[1]), 3)
    row["first_result_s"] = round(row["import_s"] + row["select_s"] + times[0], 3)
    row["vendors_after_call"] = _vendors_loaded()
    row["torch_dynamo_loaded"] = "torch._dynamo" in sys.modules
    kernel = sel.kernel
    if kernel.backend == "reference":
        row["correct"] = "is the reference"
        return
    try:
        math = kernel.math_dtype(sel.problem) if kernel.math_dtype is not None else None
        case.compare(kernel.id, computes_in=math, finite_stale_slots=kernel.reads_stale_slots)
        row["correct"] = True
    except AssertionError as exc:
        row["correct"] = f"MISMATCH: {str(exc)[:400]}"


def _flashinfer_first_call(spec: dict[str, Any], row: dict[str, Any], timer: _ImportTimer) -> None:
    case = _case(spec, row)
    start = time.perf_counter()
    import flashinfer

    row["import_flashinfer_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    call = _flashinfer_call(flashinfer, spec["op"], case)
    row["plan_s"] = round(time.perf_counter() - start, 3)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        call()
        _sync(spec["device"])
        times.append(time.perf_counter() - start)
    row["chosen"] = f"flashinfer {getattr(flashinfer, '__version__', '')}".strip()
    row["first_call_s"], row["second_call_s"] = round(times[0], 3), round(times[1], 4)
    row["compile_s"] = round(max(0.0, row["plan_s"] + times[0] - times[1]), 3)
    row["first_result_s"] = round(row["import_torch_s"] + row["import_flashinfer_s"] + row["plan_s"] + times[0], 3)


def _flashinfer_call(flashinfer: Any, op: str, case: Any) -> Callable[[], Any]:
    """FlashInfer's default path for ``op`` on the case's inputs, planned (plans may compile: timed as ``plan_s``)."""
    import torch

    args = case.args
    if op == "norm.rms_norm":
        return lambda: flashinfer.norm.rmsnorm(args[0], args[1], 1e-6)
    if op == "activation.silu_and_mul":
        return lambda: flashinfer.activation.silu_and_mul(args[0])
    if op == "sampling.top_k_top_p":
        probs = args[0] if not case.kwargs.get("is_logits", False) else torch.softmax(args[0].float(), -1)
        return lambda: flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9)
    from .baselines import flashinfer_externals

    calls = flashinfer_externals(op, args, case.kwargs)
    name = {"attention.decode": "flashinfer decode", "attention.prefill_ragged": "flashinfer prefill",
            "attention.mla_decode": "flashinfer mla"}[op]
    if name not in calls:
        raise RuntimeError(f"FlashInfer could not plan {op} on these inputs")
    return calls[name]


# -- the parent -------------------------------------------------------------------------------------------------
def _count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path)) if path.exists() else 0


def _environment(base: Path | None) -> dict[str, str]:
    """This process's environment with every compile cache moved under ``base`` (None: as it is)."""
    if base is None:
        return dict(os.environ)
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env.update(KSB_CACHE_DIR=str(base / "ksb"), KSB_TUNE_CACHE=str(base / "tune.json"),
               FLASHINFER_WORKSPACE_BASE=str(base / "flashinfer"), TORCHINDUCTOR_CACHE_DIR=str(base / "inductor"),
               CUDA_CACHE_PATH=str(base / "cuda"))
    return env


def _run_child(spec: dict[str, Any], base: Path | None, timeout_s: float) -> dict[str, Any]:
    from ..artefacts import root

    counted = base if base is not None else root()
    before = _count_files(counted) if counted is not None else 0
    spec = {**spec, "spawned": time.time()}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", _BOOT, json.dumps(spec)], env=_environment(base),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s:.0f} s (timed out)", "wall_s": round(timeout_s, 1)}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("FIRST-CALL ")]
    row: dict[str, Any] = json.loads(lines[-1][len("FIRST-CALL "):]) if lines else {
        "error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-800:]}"}
    row["wall_s"] = round(time.perf_counter() - start, 3)
    if counted is not None:
        row["cache_files_added"] = _count_files(counted) - before
    return row


def _build(point: FirstCall, device: str, base: Path, timeout_s: float) -> str | None:
    """``switchboard build`` of one point into the caches under ``base``; the error text, or None."""
    params = [f"{k}={v}" for k, v in point.params(device).items()]
    cmd = [sys.executable, "-m", "kernel_switchboard.cli", "build", "--op", point.op, "--device", device,
           *[a for p in params for a in ("--param", p)]]
    try:
        done = subprocess.run(cmd, env=_environment(base), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"switchboard build did not finish within {timeout_s:.0f} s"
    return None if done.returncode == 0 else f"switchboard build exit {done.returncode}: {done.stderr[-400:]}"


def run(points: list[FirstCall], modes: tuple[str, ...], device: str, flashinfer_ops: tuple[str, ...],
        timeout_s: float, deadline: float) -> Iterator[dict[str, Any]]:
    """Every (point, mode) row, then FlashInfer's; rows past ``deadline`` (perf_counter) are reported skipped."""
    for point in points:
        cold_base: Path | None = None
        for mode in modes:
            row = {"op": point.op, "label": point.label, "mode": mode, "device": device}
            if time.perf_counter() > deadline:
                yield {**row, "error": "skipped: the run's time budget is spent"}
                continue
            spec: dict[str, Any] = {"op": point.op, "params": point.params(device), "device": device}
            if mode == "here":
                yield {**row, **_run_child(spec, None, timeout_s)}
                continue
            if mode == "warm" and cold_base is not None:
                base = cold_base
            else:
                base = Path(tempfile.mkdtemp(prefix=f"ksb-first-call-{mode}-"))
                if mode == "built":
                    error = _build(point, device, base, timeout_s)
                    if error is not None:
                        yield {**row, "error": error}
                        shutil.rmtree(base, ignore_errors=True)
                        continue
            if mode == "warm" and cold_base is None:  # warm alone: fill the caches with one unreported run
                _run_child(spec, base, timeout_s)
            yield {**row, **_run_child(spec, base, timeout_s)}
            if mode == "cold":
                cold_base = base
            elif base != cold_base:
                shutil.rmtree(base, ignore_errors=True)
        if cold_base is not None:
            shutil.rmtree(cold_base, ignore_errors=True)
    for point in (p for p in points if p.op in flashinfer_ops):
        row = {"op": point.op, "label": point.label, "mode": "flashinfer cold", "device": device}
        if time.perf_counter() > deadline:
            yield {**row, "error": "skipped: the run's time budget is spent"}
            continue
        base = Path(tempfile.mkdtemp(prefix="ksb-first-call-flashinfer-"))
        spec = {"op": point.op, "params": point.params(device), "device": device, "flashinfer": True}
        yield {**row, **_run_child(spec, base, timeout_s)}
        shutil.rmtree(base, ignore_errors=True)


def _fmt(value: Any, width: int) -> str:
    text = "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
    return text[:width].rjust(width)


def print_table(rows: list[dict[str, Any]], file: Any = sys.stdout) -> None:
    cols = (("import_s", "import", 7), ("select_s", "select", 7), ("first_call_s", "1st call", 8),
            ("compile_s", "compile", 8), ("first_result_s", "1st result", 10), ("second_call_s", "2nd call", 8),
            ("inputs_s", "inputs", 7), ("wall_s", "wall", 7), ("cache_files_added", "new files", 9))
    print(f"{'op':<30} {'mode':<15} {'kernel':<42}" + "".join(f" {title:>{w}}" for _, title, w in cols)
          + "  correct / error", file=file)
    for r in rows:
        tail = r.get("error") or ("ok" if r.get("correct") is True else str(r.get("correct", "")))
        print(f"{r['op']:<30} {r['mode']:<15} {str(r.get('chosen', '-'))[:42]:<42}"
              + "".join(f" {_fmt(r.get(key), w)}" for key, _, w in cols) + f"  {tail[:100]}", file=file)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="switchboard bench --preset first-call", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=[PRESET], default=PRESET)
    p.add_argument("--op", action="append", help="only these ops (repeatable; default: one per op family)")
    p.add_argument("--cache", default="cold,warm", help=f"comma-separated modes from {', '.join(MODES)}, or none "
                   "(with --flashinfer: FlashInfer's rows only)")
    p.add_argument("--flashinfer", action="store_true", help="also FlashInfer's first calls (cold), where installed")
    p.add_argument("--flashinfer-op", action="append", help=f"FlashInfer ops to run (default: {', '.join(FLASHINFER_OPS)})")
    p.add_argument("--timeout-s", type=float, default=300.0, help="limit per child process")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting children after this many seconds")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when present")
    p.add_argument("--out", default="bench-out", help="folder for first-call.json")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = tuple(m.strip() for m in args.cache.split(",") if m.strip() and m.strip() != "none")
    unknown = [m for m in modes if m not in MODES]
    ops = {pt.op for pt in POINTS}
    if unknown or (args.op and set(args.op) - ops):
        print(f"bench: unknown cache mode or op; modes: {', '.join(MODES)}; ops: {', '.join(sorted(ops))}",
              file=sys.stderr)
        return 2
    chosen = [pt for pt in POINTS if not args.op or pt.op in args.op]
    flashinfer_ops = tuple(args.flashinfer_op or FLASHINFER_OPS) if args.flashinfer and device == "cuda" else ()
    deadline = time.perf_counter() + (args.budget_s if args.budget_s is not None else float("inf"))
    if device == "cpu":
        print("first-call: no GPU here: the points run the reference kernels on small shapes", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for row in run(chosen, modes, device, flashinfer_ops, args.timeout_s, deadline):
        rows.append(row)
        print(f"first-call: {row['op']} {row['mode']}: " + (row.get("error") or
              f"{row.get('first_result_s')} s to the first result ({row.get('chosen')})"), file=sys.stderr, flush=True)
        (out / "first-call.json").write_text(json.dumps(rows, indent=1, default=str))
    print_table(rows)
    print(f"first-call: wrote {out / 'first-call.json'}")
    return 0 if all("error" not in r for r in rows) else 1
