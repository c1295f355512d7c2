"""Benchmark: the CUTLASS GEMMs against cuBLAS (torch) and our Triton kernels.

    python packages/backend-cutlass/benchmarks/gemm.py            # prints one dict per row
    python packages/backend-cutlass/benchmarks/gemm.py out.jsonl  # and writes them as JSON lines

``bench_gemm(device) -> list[dict]``: one dict per (workload, implementation, config) with ``ms``
(median of triton.testing.do_bench), ``tflop_s``, ``rel_err`` (relative Frobenius error against a
float32 product of the same operands) and ``first_call_s``. Each row is checked before it is
timed; a failure becomes a row with ``error``, never an exception. Rows:

- bf16 mm 8192^3, b row-major ("RR") and K-major ("RC"): torch.mm (cuBLAS), CUTLASS with the shape
  heuristic, with each tile forced (KSB_CUTLASS_MM_TILE) and the large tile at swizzles 2 / 4 / 8
  (KSB_CUTLASS_SWIZZLE), Triton;
- fp8 8192^3: torch._scaled_mm per-tensor (cuBLAS), CUTLASS per-tensor, CUTLASS 1x128/128x128
  block scales (the default tile and each of ``FP8_BLOCK_CANDIDATES``), Triton block scales;
- speed ratios measured in turn (``_in_turn``): CUTLASS against cuBLAS (bf16), CUTLASS block scales
  against ``torch._scaled_mm`` per-tensor and against Triton block scales, CUTLASS grouped against Triton;
- fp8 block scales at 64-256 rows (``SKINNY``): torch._scaled_mm, the automatic choice, CUTLASS's default tile and
  each tile of ``SKINNY_TILES``, each replayed from a CUDA graph (the GPU's time alone), and each call's eager host
  time (50 calls, then one sync); every call gets the scales in the layout its kernel reads (no transposes);
- fp8 per-tensor scales at 128-1024 rows (``SKINNY_TENSOR``): the same rows beside torch._scaled_mm per-tensor;
- grouped mm, DeepSeek-V3 experts (256 x 7168 -> 2048, 4096 tokens top-8 routed uniformly at random):
  CUTLASS, Triton, torch._grouped_mm when this torch has it;
- on a GPU, the time nvcc took to build every kernel above (in parallel), and the first call after a process
  restart with a warm disk cache (library load only).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

ROWS: list[dict[str, Any]] = []


#: the H200 sizes; ``bench_gemm(..., sizes=SMOKE)`` runs the same code on tiny shapes (CPU smoke test)
FULL = {"n": 8192, "experts": 256, "hidden": 7168, "inter": 2048, "tokens": 4096, "top_k": 8}
SMOKE = {"n": 128, "experts": 4, "hidden": 128, "inter": 64, "tokens": 16, "top_k": 2}
#: fp8 block-scaled problems of 64-256 rows (M, N, K), where the tile decides how many of the 132 SMs work
SKINNY = ((64, 8192, 8192), (128, 8192, 8192), (256, 8192, 8192), (128, 7168, 2048), (128, 2112, 7168))
#: fp8 block-scaled tiles forced at the ``SKINNY`` shapes: the defaults up to 1024 rows, ``coop`` and the large-M one
SKINNY_TILES = ("small_m", "coop", "coop_c1x1", "coop_c2x1_ovl")
#: fp8 per-tensor problems of 128-1024 rows, and the tiles forced there (``configs.FP8_TENSOR_TILES``)
SKINNY_TENSOR = ((128, 8192, 8192), (256, 8192, 8192), (1024, 8192, 8192), (256, 2112, 7168))
SKINNY_TENSOR_TILES = ("small_m", "coop_c1x1", "coop_c2x1", "coop_c2x1_ovl")
#: fp8 block-scaled tiles forced besides the shape's default (``configs.FP8_BLOCK_TILES``)
FP8_BLOCK_CANDIDATES = ("coop", "coop_c1x1", "coop_c2x1", "coop_sk2")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.float(), want.float()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def _row(workload: str, impl: str, config: str, run: Callable[[], torch.Tensor], want: torch.Tensor | None,
         flops: float, env: dict[str, str] | None = None, max_err: float = 2e-2) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "impl": impl, "config": config}
    try:
        with _env(env):
            t0 = time.perf_counter()
            out = run()
            _sync()
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            if want is not None:
                row["rel_err"] = _rel_err(out, want)
                if not math.isfinite(row["rel_err"]) or row["rel_err"] > max_err:
                    raise AssertionError(f"relative error {row['rel_err']:.3g} against the float32 product")
            ms = median_ms(run, rep_ms=200, warmup=25)
        row.update(ms=round(ms, 4), tflop_s=round(flops / (ms * 1e-3) / 1e12, 1))
    except Exception as exc:  # one failing point never stops the others
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)
    return row


@contextlib.contextmanager
def _env(env: dict[str, str] | None) -> Iterator[None]:
    """Environment variables set for the block (a forced CUTLASS tile), restored after it."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _in_turn(workload: str, impl: str, run: Callable[[], Any], anchor: str, anchor_run: Callable[[], Any],
             rounds: int = 7, window_ms: float = 50.0, env: dict[str, str] | None = None) -> None:
    """A kernel's speed ratio to an anchor, measured in turn: ``run`` and ``anchor_run`` alternate for ``rounds``
    rounds of ``window_ms`` each, and the row's ``ratio`` is the median of the rounds' anchor ms / ms (with the lowest
    and highest). Clocks drift during a long GEMM run: timed minutes apart, one kernel's ratio to its anchor moves by
    more than 10%; timed in turn, a drift moves both alike. ``env`` is set for both (a forced tile)."""
    row: dict[str, Any] = {"workload": workload, "impl": f"{impl} / {anchor}", "config": f"in turn, {rounds} rounds"}
    try:
        ratios = []
        with _env(env):
            for _ in range(rounds):
                anchor_ms = median_ms(anchor_run, rep_ms=window_ms, warmup=5)
                ratios.append(anchor_ms / median_ms(run, rep_ms=window_ms, warmup=5))
        ratios.sort()
        row.update(ratio=round(ratios[len(ratios) // 2], 3), ratio_low=round(ratios[0], 3),
                   ratio_high=round(ratios[-1], 3))
    except Exception as exc:  # as in _row: a failing call is a row, never an exception
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)


def _ratios(workload: str, anchor: str) -> None:
    """Add ``x_<anchor>`` (speed relative to the anchor implementation) to the rows of one workload."""
    rows = [r for r in ROWS if r["workload"] == workload and "tflop_s" in r]
    base = next((r["tflop_s"] for r in rows if r["impl"] == anchor), None)
    for r in rows:
        if base:
            r[f"x_{anchor}"] = round(r["tflop_s"] / base, 3)


def _prebuild(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> None:
    from kernel_switchboard_cutlass import build, configs, prebuild

    row: dict[str, Any] = {"workload": "build", "impl": "cutlass", "config": "nvcc, parallel"}
    try:
        t0 = time.perf_counter()
        cfgs = [c for c in (prebuild.config_for_call(op, args, kw) for op, args, kw in calls) if c is not None]
        cfgs += [c for lb in ("row", "col") for c in configs.mm_configs("bf16", "row", lb)]  # every forced tile
        cfgs += [configs.fp8_block_config("bf16", 4096, role) for role in configs.FP8_BLOCK_TILES]
        cfgs += [configs.fp8_tensor_config("bf16", 4096, role) for role in configs.FP8_TENSOR_TILES]
        cfgs = list(dict.fromkeys(cfgs))
        build.compile_many(cfgs)
        row.update(kernels=len(cfgs), seconds=round(time.perf_counter() - t0, 1))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)


def bench_gemm(device: torch.device | str = "cuda", sizes: dict[str, int] | None = None) -> list[dict[str, Any]]:
    import kernel_switchboard as ksb
    from kernel_switchboard.reference import gemm as ref
    from kernel_switchboard.testing.cases.gemm import quantize_fp8

    device = torch.device(device)
    ROWS.clear()
    sz = sizes or FULL
    n = sz["n"]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
    b_rr = (torch.randn(n, n, generator=g, device=device) * n**-0.5).to(torch.bfloat16)
    b_rc = b_rr.t().contiguous().t()  # same values, K-major (the layout of an nn.Linear weight)
    a32, b32 = a.float(), b_rr.float()

    # fp8 operands: per-tensor and 1x128 / 128x128 block quantisations of the same values
    bk = b32.t().contiguous().t()
    qa_t, sa_t = quantize_fp8(a32, n, n)
    qb_t, sb_t = quantize_fp8(bk, n, n)
    qa_b, sa_b = quantize_fp8(a32, 1, 128)
    qb_b, sb_b = quantize_fp8(bk, 128, 128)
    sa_t, sb_t = sa_t.reshape(()), sb_t.reshape(())

    # grouped: DeepSeek-V3 routed experts, 4096 tokens x top-8 over 256 experts
    experts, hidden, inter, tokens, top_k = (sz[k] for k in ("experts", "hidden", "inter", "tokens", "top_k"))
    ids = torch.randint(0, experts, (tokens * top_k,), generator=g, device=device)
    counts = torch.bincount(ids, minlength=experts)
    offsets = torch.zeros(experts + 1, dtype=torch.int32, device=device)
    offsets[1:] = counts.cumsum(0).to(torch.int32)
    ga = torch.randn(tokens * top_k, hidden, generator=g, device=device).to(torch.bfloat16)
    gb = (torch.randn(experts, hidden, inter, generator=g, device=device) * hidden**-0.5).to(torch.bfloat16)
    gb_k = gb.transpose(1, 2).contiguous().transpose(1, 2)

    if device.type == "cuda":  # kernels built on a CPU could not run here (the CPU smoke test skips the nvcc minutes)
        _prebuild([("gemm.mm", (a, b_rr), {}), ("gemm.mm", (a, b_rc), {}),
                   ("gemm.mm_fp8", (qa_t, qb_t, sa_t, sb_t), {}), ("gemm.mm_fp8", (qa_b, qb_b, sa_b, sb_b), {}),
                   ("gemm.grouped_mm", (ga, gb, offsets), {}), ("gemm.grouped_mm", (ga, gb_k, offsets), {})])

    flops = 2.0 * n**3
    want = a32 @ b32
    for lay, b in (("RR", b_rr), ("RC", b_rc)):
        w = f"bf16 mm {n}^3 {lay}"
        _row(w, "torch.mm (cuBLAS)", "", lambda b=b: torch.mm(a, b), want, flops)
        _row(w, "cutlass", "heuristic", lambda b=b: ksb.gemm.mm(a, b, backend="cutlass"), want, flops)
        for role in ("large", "medium", "small_m"):
            _row(w, "cutlass", f"tile={role}", lambda b=b: ksb.gemm.mm(a, b, backend="cutlass"), want, flops,
                 env={"KSB_CUTLASS_MM_TILE": role})
        for sw in ("2", "4", "8"):  # rasterisation swizzle of the persistent scheduler (L2 reuse of A and B panels)
            _row(w, "cutlass", f"tile=large swizzle={sw}", lambda b=b: ksb.gemm.mm(a, b, backend="cutlass"), want,
                 flops, env={"KSB_CUTLASS_MM_TILE": "large", "KSB_CUTLASS_SWIZZLE": sw})
        _row(w, "triton", "", lambda b=b: ksb.gemm.mm(a, b, backend="triton"), want, flops)
        _ratios(w, "torch.mm (cuBLAS)")
        _in_turn(w, "cutlass", lambda b=b: ksb.gemm.mm(a, b, backend="cutlass"), "torch.mm (cuBLAS)",
                 lambda b=b: torch.mm(a, b))
    del want

    w = f"fp8 mm {n}^3"
    scaled_mm, anchor = (lambda: torch._scaled_mm(qa_t, qb_t, scale_a=sa_t, scale_b=sb_t, out_dtype=torch.bfloat16),
                         "torch._scaled_mm per-tensor (cuBLAS)")
    tensor = (lambda: ksb.gemm.mm_fp8(qa_t, qb_t, sa_t, sb_t, backend="cutlass"))
    block = (lambda: ksb.gemm.mm_fp8(qa_b, qb_b, sa_b, sb_b, backend="cutlass"))
    want_t = ref.mm_fp8(qa_t, qb_t, sa_t, sb_t, "tensor", torch.float32)
    _row(w, anchor, "tensor", scaled_mm, want_t, flops)
    _row(w, "cutlass", "tensor", tensor, want_t, flops)
    _row(w, "cutlass", "tensor swizzle=1", tensor, want_t, flops, env={"KSB_CUTLASS_SWIZZLE": "1"})
    _row(w, "cutlass", "tensor tile=coop_c2x1", tensor, want_t, flops,
         env={"KSB_CUTLASS_FP8_TENSOR_TILE": "coop_c2x1"})
    del want_t
    want_b = ref.mm_fp8(qa_b, qb_b, sa_b, sb_b, "block", torch.float32)
    _row(w, "cutlass", "block 1x128/128x128", block, want_b, flops)
    for role in FP8_BLOCK_CANDIDATES:
        _row(w, "cutlass", f"block 1x128/128x128 tile={role}", block, want_b, flops,
             env={"KSB_CUTLASS_FP8_BLOCK_TILE": role})
    _row(w, "triton", "block 1x128/128x128", lambda: ksb.gemm.mm_fp8(qa_b, qb_b, sa_b, sb_b, backend="triton"),
         want_b, flops)
    del want_b
    _ratios(w, anchor)
    _in_turn(w, "cutlass block", block, anchor, scaled_mm)
    _in_turn(w, "cutlass block", block, "triton block",
             lambda: ksb.gemm.mm_fp8(qa_b, qb_b, sa_b, sb_b, backend="triton"))
    _in_turn(w, "cutlass tensor", tensor, anchor, scaled_mm)
    # the mainloop without the overlapped promotion (overlap_promotion.hpp), against the same anchor
    _in_turn(w, "cutlass block tile=coop_c2x1", block, anchor, scaled_mm, env={"KSB_CUTLASS_FP8_BLOCK_TILE": "coop_c2x1"})

    for mode, shapes in (("block", SKINNY), ("tensor", SKINNY_TENSOR)):
        for shape in shapes if n >= 4096 else ((128, n, n),):
            _skinny_fp8(*shape, mode, device)

    w = f"grouped mm {experts}x{hidden}->{inter}, {tokens} tok top-{top_k}"
    gflops = 2.0 * tokens * top_k * hidden * inter
    want_g = ref.grouped_mm(ga, gb, offsets)
    for lay, bb in (("b row-major", gb), ("b K-major", gb_k)):
        _row(w, "cutlass", lay, lambda bb=bb: ksb.gemm.grouped_mm(ga, bb, offsets, backend="cutlass"), want_g, gflops)
        _row(w, "triton", lay, lambda bb=bb: ksb.gemm.grouped_mm(ga, bb, offsets, backend="triton"), want_g, gflops)
    if hasattr(torch, "_grouped_mm"):
        ends = offsets[1:].contiguous()
        _row(w, "torch._grouped_mm", "b K-major", lambda: torch._grouped_mm(ga, gb_k, offs=ends), want_g, gflops)
    _ratios(w, "triton")
    _in_turn(w, "cutlass b row-major", lambda: ksb.gemm.grouped_mm(ga, gb, offsets, backend="cutlass"),
             "triton b row-major", lambda: ksb.gemm.grouped_mm(ga, gb, offsets, backend="triton"))

    _first_call(a, b_rr)
    return ROWS


def _graphed(run: Callable[[], torch.Tensor], env: dict[str, str] | None) -> Callable[[], torch.Tensor]:
    """``run`` (under ``env``) captured in a CUDA graph: calling the result replays it and returns its output. On a
    CPU, ``run`` itself."""
    if not torch.cuda.is_available():
        return run
    from kernel_switchboard.bench.timing import captured_graph

    with _env(env):
        run()  # compiled and loaded outside the capture
        out: list[torch.Tensor] = []
        graph = captured_graph(lambda: out.append(run()))
    return lambda: (graph.replay(), out[0])[1]


def _host_us(run: Callable[[], Any], env: dict[str, str] | None, calls: int = 50) -> float:
    """Eager host time of one call: ``calls`` calls back to back, then one synchronisation."""
    with _env(env):
        run()
        _sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        _sync()
    return (time.perf_counter() - t0) / calls * 1e6


def _skinny_operands(m: int, n: int, k: int, mode: str, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(a, b, scale_a, scale_b, the float32 product) of one skinny fp8 problem, the scales as torch and CUTLASS read
    them, so no call pays a transpose. Block: sa M-major (cuBLAS: outer-dimension major), sb the transposed view of
    the weight's (N/128, K/128) scales. Per-tensor: 0-d powers of two; b K-major, as cuBLAS wants it."""
    if mode == "block":
        from kernel_switchboard.bench.flashinfer import _block_scaled

        a, w, sa, sw, want = _block_scaled(m, n, k, device)
        return a, w.t(), sa.t().contiguous().t(), sw.t(), want
    fp8 = torch.float8_e4m3fn
    a = (torch.randn(m, k, device=device) * 100).clamp(-448, 448).to(fp8)
    b = (torch.randn(n, k, device=device) * 100).clamp(-448, 448).to(fp8).t()
    sa, sb = torch.tensor(2.0**-8, device=device), torch.tensor(2.0**-7, device=device)
    return a, b, sa, sb, (a.float() @ b.float()) * (sa * sb)


def _skinny_fp8(m: int, n: int, k: int, mode: str, device: torch.device) -> None:
    """One ``SKINNY`` (block) or ``SKINNY_TENSOR`` problem: torch's kernel for the scale mode, the automatic choice,
    CUTLASS's default and forced tiles, each replayed from a CUDA graph, with its eager host time; the automatic
    choice names the kernel the ranking took."""
    import kernel_switchboard as ksb
    from kernel_switchboard.dispatch import select_kernel
    from kernel_switchboard.ops.gemm import mm_fp8_call

    a, b, sa, sb, want = _skinny_operands(m, n, k, mode, device)

    def cutlass() -> torch.Tensor:
        return ksb.gemm.mm_fp8(a, b, sa, sb, backend="cutlass")

    forcing, tiles = (("KSB_CUTLASS_FP8_BLOCK_TILE", SKINNY_TILES) if mode == "block"
                      else ("KSB_CUTLASS_FP8_TENSOR_TILE", SKINNY_TENSOR_TILES))
    word = "block" if mode == "block" else "per-tensor"
    calls: dict[str, tuple[Callable[[], torch.Tensor], dict[str, str] | None]] = {
        f"torch._scaled_mm {word}": (lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                                     None),
        "automatic choice": (lambda: ksb.gemm.mm_fp8(a, b, sa, sb), None),
        "cutlass default tile": (cutlass, None)}
    calls.update({f"cutlass tile={role}": (cutlass, {forcing: role}) for role in tiles})
    chosen = select_kernel("gemm.mm_fp8", mm_fp8_call(a, b, sa, sb)[0]).id
    workload = f"fp8 {word} {m}x{n}x{k}, CUDA graph replays"
    for name, (run, env) in calls.items():
        row = _row(workload, name, chosen if name == "automatic choice" else "", _graphed(run, env), want,
                   2.0 * m * n * k)
        if "error" not in row:
            row["eager_host_us"] = round(_host_us(run, env), 1)
            print(f"  {name}: eager host time {row['eager_host_us']} us a call", flush=True)


def _first_call(a: torch.Tensor, b: torch.Tensor) -> None:
    """The first call after a restart with a warm disk cache: load the .so, run once."""
    import kernel_switchboard as ksb
    from kernel_switchboard_cutlass import build

    row: dict[str, Any] = {"workload": "first call, warm disk cache", "impl": "cutlass",
                           "config": f"bf16 mm {a.shape[0]}^3"}
    try:
        build._loaded.clear()
        _sync()
        t0 = time.perf_counter()
        ksb.gemm.mm(a, b, backend="cutlass")
        _sync()
        row["seconds"] = round(time.perf_counter() - t0, 3)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)


if __name__ == "__main__":
    rows = bench_gemm("cuda")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
