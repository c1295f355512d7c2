"""Seconds of each kernel's first call in a fresh process: JIT compile or graph build plus one run,
with an empty Triton cache (what a new machine pays; imports and input creation not counted); for Triton
kernels also each compiled kernel's compile and load seconds (``triton_kernels``), the compile's by stage.

    python3 tools/first_call.py [OUT.jsonl [KERNEL_PREFIX ...]]  # the kernels below (or those named), one child each
    python3 tools/first_call.py --one OP KERNEL k=v ...            # the child: prints one JSON line

Shapes: Llama-3-8B heads, bf16; decode B=16 L=2048, prefill one request of 2048 tokens; DeepSeek-V3 MLA decode
B=16 L=4096 page 64; fp8 block-scaled mm 4096^3 with a K-major b.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

DECODE = ("attention.decode", "batch=16", "kv_len=2048")
PREFILL = ("attention.prefill_ragged", "batch=1", "kv_len=2048", "q_len=2048")
#: (kernel id or its prefix, op and shape); each kernel with the pages it is fastest on
KERNELS = [
    ("triton:decode_splitkv", (*DECODE, "page_size=16", "layout=HND")),
    ("triton:prefill_ragged", PREFILL),
    ("cudnn:sdpa_paged_decode", (*DECODE, "page_size=16", "layout=HND")),
    ("cudnn:sdpa_ragged_prefill", PREFILL),
    ("fa:fa4@", (*DECODE, "page_size=128", "layout=NHD")),
    ("fa:fa4@", PREFILL),
    ("triton:mla_decode", ("attention.mla_decode", "batch=16", "kv_len=4096", "num_heads=128", "page_size=64")),
    ("triton:mm_fp8", ("gemm.mm_fp8", "m=4096", "n=4096", "k=4096", "layout=RC", "scale_mode=block")),
]


def _time_triton_compiles() -> list[dict[str, object]]:
    """Record each Triton / Gluon kernel's compile (``triton.compile``) and its first load (cubin load and
    launcher build) in the returned list, one entry per kernel: the issue's per-kernel first-call figures."""
    try:
        import triton.compiler as tc
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return []
    spans: list[dict[str, object]] = []
    stages = _time_cuda_stages()
    compile_fn, init_handles = tc.compile, CompiledKernel._init_handles

    def timed_compile(src, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        stages.clear()
        t0 = time.perf_counter()
        kernel = compile_fn(src, *args, **kwargs)
        spans.append({"kernel": getattr(getattr(src, "fn", None), "__name__", "?"),
                      "compile_s": round(time.perf_counter() - t0, 3), "stages_s": dict(stages)})
        return kernel

    def timed_init(self):  # noqa: ANN001, ANN202
        fresh = self.module is None
        t0 = time.perf_counter()
        init_handles(self)
        if fresh:
            spans.append({"kernel": self.name, "load_s": round(time.perf_counter() - t0, 3)})

    tc.compile, CompiledKernel._init_handles = timed_compile, timed_init
    return spans


def _time_cuda_stages() -> dict[str, float]:
    """Time each stage of Triton's CUDA compile pipeline (ttir, ttgir, llir, ptx, cubin: the last is ptxas) into the
    returned dict, overwritten by each compile. The rest of a compile's seconds is the frontend (the kernel's AST
    to IR) and the cache key (Triton hashes its own library once per process)."""
    seconds: dict[str, float] = {}
    try:
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:
        return seconds
    add_stages = CUDABackend.add_stages

    def timed_add_stages(self, stages, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        add_stages(self, stages, *args, **kwargs)
        for name, stage in list(stages.items()):
            def timed(src, metadata, stage=stage, name=name):  # noqa: ANN001, ANN202
                t0 = time.perf_counter()
                result = stage(src, metadata)
                seconds[name] = round(time.perf_counter() - t0, 3)
                return result
            stages[name] = timed

    CUDABackend.add_stages = timed_add_stages
    return seconds


def one(op: str, prefix: str, params: list[str]) -> dict[str, object]:
    """The child: build the inputs, then time the first call of the kernel whose id starts with ``prefix``."""
    import importlib

    import torch

    spans = _time_triton_compiles()

    from kernel_switchboard import registry

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: checks this script with reference kernels
    kernel = next(k.id for k in registry.kernels(op) if k.id.startswith(prefix))
    example = importlib.import_module(f"kernel_switchboard.testing.cases.{op.partition('.')[0]}").example
    shape = {key: int(value) if value.isdigit() else value for key, value in (p.split("=", 1) for p in params)}
    case = example(op, torch.device(device), **shape)
    times = []
    for _ in range(2):
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        case.function(*case.args, backend=kernel, **case.kwargs)
        sync()
        times.append(time.perf_counter() - t0)
    return {"op": op, "kernel": kernel, "params": params, "first_call_s": round(times[0], 3),
            "second_call_s": round(times[1], 4), "triton_kernels": spans}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(one(argv[1], argv[2], argv[3:])), flush=True)
        return 0
    out = open(argv[0], "w") if argv else None
    chosen = [(kernel, rest) for kernel, rest in KERNELS if len(argv) < 2 or any(kernel.startswith(a) for a in argv[1:])]
    for kernel, (op, *params) in chosen:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
            proc = subprocess.run([sys.executable, __file__, "--one", op, kernel, *params], env=env,
                                  capture_output=True, text=True, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"op": op, "kernel": kernel, "error": proc.stderr[-600:]}
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
