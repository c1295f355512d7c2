"""Benchmark: TensorRT-LLM's XQA decode and CUTLASS fused MoE (through flashinfer-python) on
Llama-3-8B / Mixtral shapes, beside cuDNN and our Triton kernels in the same run.

    python packages/backend-trtllm/benchmarks/decode.py            # prints one dict per row
    python packages/backend-trtllm/benchmarks/decode.py out.jsonl  # and writes them as JSON lines

``bench_decode(device) -> list[dict]``: one dict per (workload, implementation) with ``ms`` (median of
triton.testing.do_bench), ``tb_s`` (decode: K and V bytes read / time) or ``tflop_s`` (MoE),
``max_err`` against the reference on the same inputs, and ``first_call_s`` (JIT build + first run).
Each row is checked before it is timed; a failure becomes a row with ``error``, never an exception.

Decode (Llama-3-8B heads: 32 q, 8 kv, d 128, bf16, HND pages): B=16 L=2048 page 64, B=128 L=8192
page 64 and page 16; implementations: the switchboard's trtllm plan (``plan_decode``, eager and replayed
from a CUDA graph), its eager ``decode``, flashinfer's XQA called directly (eager and from a graph: the
backend's overhead is the difference), cuDNN, Triton. One extra row calls XQA directly on a batch with
an empty request, to report whether its output for that request is zero (the backend zeroes it either way).

Fused MoE: Mixtral-8x7B (8 experts, 4096 -> 14336, top-2), 4096 tokens, bf16: the trtllm kernel with
flashinfer's default tactic and after its autotuner ran, and our Triton fused MoE.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

HEADS = (32, 8, 128)
#: the H200 sizes; ``bench_decode(..., sizes=SMOKE)`` runs the same code on tiny shapes (CPU smoke test)
FULL = {"decode": ((16, 2048, 64), (128, 8192, 64), (128, 8192, 16)), "heads": HEADS,
        "moe": (4096, 4096, 14336, 8, 2)}
SMOKE = {"decode": ((2, 40, 16),), "heads": (4, 2, 64), "moe": (4, 128, 128, 4, 2)}
ROWS: list[dict[str, Any]] = []


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _row(workload: str, impl: str, run: Callable[[], torch.Tensor], want: torch.Tensor | None, amount: float,
         unit: str, max_err: float, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "impl": impl, **extra}
    try:
        t0 = time.perf_counter()
        out = run()
        _sync()
        row["first_call_s"] = round(time.perf_counter() - t0, 2)
        if want is not None:
            row["max_err"] = float((out.float() - want.float()).abs().max())
            if not math.isfinite(row["max_err"]) or row["max_err"] > max_err:
                raise AssertionError(f"max abs error {row['max_err']:.3g} against the reference")
        ms = median_ms(run, rep_ms=200, warmup=25)
        row.update(ms=round(ms, 4), **{unit: round(amount / (ms * 1e-3) / 1e12, 3)})
    except Exception as exc:  # one failing point never stops the others
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)
    return row


def _ratios(workload: str, unit: str, anchor: str) -> None:
    rows = [r for r in ROWS if r["workload"] == workload and unit in r]
    base = next((r[unit] for r in rows if r["impl"] == anchor), None)
    for r in rows:
        if base:
            r[f"x_{anchor}"] = round(r[unit] / base, 3)


def _decode_inputs(batch: int, length: int, page: int, heads: tuple[int, int, int], device: torch.device):
    import kernel_switchboard as ksb

    hq, hkv, d = heads
    pages_per = -(-length // page)
    g = torch.Generator(device=device).manual_seed(batch * 31 + page)
    num_pages = batch * pages_per
    k = torch.randn(num_pages, hkv, page, d, generator=g, device=device).to(torch.bfloat16)
    v = torch.randn(num_pages, hkv, page, d, generator=g, device=device).to(torch.bfloat16)
    perm = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
    table = ksb.PageTable(perm.view(batch, pages_per).contiguous(),
                          torch.full((batch,), length, dtype=torch.int32, device=device), max_seq_len=length)
    q = torch.randn(batch, hq, d, generator=g, device=device).to(torch.bfloat16)
    return q, ksb.PagedKVCache(k, v, "HND"), table


def _bench_decode_point(batch: int, length: int, page: int, heads: tuple[int, int, int], device: torch.device) -> None:
    import kernel_switchboard as ksb

    hq, hkv, d = heads
    w = f"decode B={batch} L={length} page {page}"
    try:
        q, cache, table = _decode_inputs(batch, length, page, heads, device)
        want = ksb.attention.decode(q, cache, table, backend="reference")
    except Exception as exc:
        ROWS.append({"workload": w, "impl": "inputs", "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
        print(ROWS[-1], flush=True)
        return
    nbytes = 2.0 * batch * length * hkv * d * 2
    plan_box: dict[str, Any] = {}

    def plan_run() -> torch.Tensor:
        if "plan" not in plan_box:
            plan_box["plan"] = ksb.attention.plan_decode(table, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                                         dtype=torch.bfloat16, layout="HND", page_size=page,
                                                         backend="trtllm")
            plan_box["out"] = torch.empty_like(q)
        return plan_box["plan"].run(q, cache, out=plan_box["out"])  # type: ignore[no-any-return]

    _row(w, "trtllm xqa (plan)", plan_run, want, nbytes, "tb_s", 0.05)
    _row(w, "trtllm xqa (plan, CUDA graph)", _graphed(plan_run), want, nbytes, "tb_s", 0.05)
    _row(w, "trtllm xqa (decode)", lambda: ksb.attention.decode(q, cache, table, backend="trtllm"), want, nbytes,
         "tb_s", 0.05)
    _row(w, "flashinfer xqa direct", lambda: _xqa_direct(q, cache, table), want, nbytes, "tb_s", 0.05)
    _row(w, "flashinfer xqa direct (CUDA graph)", _graphed(lambda: _xqa_direct(q, cache, table)), want, nbytes,
         "tb_s", 0.05)
    for other in ("cudnn", "triton"):
        _row(w, other, lambda other=other: ksb.attention.decode(q, cache, table, backend=other), want, nbytes, "tb_s",
             0.05)
    _ratios(w, "tb_s", "cudnn")


def _graphed(run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``run`` captured once in a CUDA graph (after a warm-up call); each call replays it. Small decode batches
    are host-bound when timed eagerly: the replay times the GPU work alone, as an engine runs it."""
    box: dict[str, Any] = {}

    def replay() -> torch.Tensor:
        if "graph" not in box:
            side = torch.cuda.Stream()  # warm up on the capture stream: per-stream state (XQA's workspace) exists
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.synchronize()
            box["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(box["graph"], stream=side):
                box["out"] = run()
        box["graph"].replay()
        return box["out"]  # type: ignore[no-any-return]
    return replay


def _xqa_direct(q: torch.Tensor, cache: Any, table: Any) -> torch.Tensor:
    """flashinfer's XQA called as its users do (no switchboard), on the same inputs."""
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache

    from kernel_switchboard_trtllm.xqa import workspace

    return trtllm_batch_decode_with_kv_cache(q, (cache.k_pages, cache.v_pages), workspace(q.device), table.block_table,
                                             table.seq_lens, table.max_seq_len, bmm1_scale=q.shape[-1] ** -0.5,
                                             kv_layout="HND", backend="xqa")


def _empty_request_row(heads: tuple[int, int, int], device: torch.device) -> None:
    row: dict[str, Any] = {"workload": "xqa with an empty request", "impl": "flashinfer xqa direct"}
    try:
        q, cache, table = _decode_inputs(4, 256, 64, heads, device)
        table.seq_lens[1] = 0
        out = _xqa_direct(q, cache, table)
        _sync()
        empty = out[1].float()
        row.update(empty_row_finite=bool(torch.isfinite(empty).all()), empty_row_max_abs=float(empty.abs().max()))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(row, flush=True)
    ROWS.append(row)


def _bench_moe(tokens: int, hidden: int, inter: int, experts: int, top_k: int, device: torch.device) -> None:
    import kernel_switchboard as ksb
    from kernel_switchboard.reference import moe as ref

    w = f"fused MoE T={tokens} H={hidden} I={inter} E={experts} top-{top_k} bf16"
    try:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(tokens, hidden, generator=g, device=device).to(torch.bfloat16)
        w13 = (torch.randn(experts, 2 * inter, hidden, generator=g, device=device) * hidden**-0.5).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, generator=g, device=device) * inter**-0.5).to(torch.bfloat16)
        logits = torch.randn(tokens, experts, generator=g, device=device)
        weights, ids = ref.route(logits, top_k, "softmax", True, None, None, None, 1.0)
        want = ref.fused_moe(x, weights, ids, w13, w2, None, None)
    except Exception as exc:
        ROWS.append({"workload": w, "impl": "inputs", "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
        print(ROWS[-1], flush=True)
        return
    flops = 2.0 * tokens * top_k * 3 * hidden * inter

    def run(backend: str) -> Callable[[], torch.Tensor]:
        return lambda: ksb.moe.experts(x, weights, ids, w13, w2, check_ids=False, backend=backend)

    _row(w, "trtllm cutlass moe (default tactic)", run("trtllm"), want, flops, "tflop_s", 0.1)
    try:  # flashinfer's autotuner profiles its CUTLASS tactics on the first call inside autotune()
        from flashinfer.autotuner import autotune

        with autotune(True):
            run("trtllm")()
        _sync()
        _row(w, "trtllm cutlass moe (autotuned)", run("trtllm"), want, flops, "tflop_s", 0.1)
    except Exception as exc:
        ROWS.append({"workload": w, "impl": "trtllm cutlass moe (autotuned)",
                     "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
        print(ROWS[-1], flush=True)
    _row(w, "triton", run("triton"), want, flops, "tflop_s", 0.1)
    _ratios(w, "tflop_s", "triton")


def bench_decode(device: torch.device | str = "cuda", sizes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    device = torch.device(device)
    sz = sizes or FULL
    ROWS.clear()
    for batch, length, page in sz["decode"]:
        _bench_decode_point(batch, length, page, sz["heads"], device)
    _empty_request_row(sz["heads"], device)
    _bench_moe(*sz["moe"], device)
    return ROWS


if __name__ == "__main__":
    rows = bench_decode("cuda")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
