"""Benchmark: the cuDNN attention kernels on Llama-3-8B shapes.

    python packages/backend-cudnn/benchmarks/attention.py [--out rows.json]

``bench_attention(device) -> list[dict]``, one row per (workload, implementation): ``ms`` (median of
triton.testing.do_bench: an eager call through the public API, host work included), ``graph_ms``
(median of do_bench_cudagraph on the planned call: GPU time only; decode and paged prefill),
``tb_s`` / ``graph_tb_s`` (decode: K and V bytes read / time) or ``tflop_s`` / ``graph_tflop_s``
(causal prefill: 2 * 2 * B * Hq * D * S^2 / 2 flops / time), ``max_err`` against the reference kernel
on a slice of the same inputs (checked on a NaN-poisoned output before timing), ``first_call_s``
(graph build + first run) and ``error`` when a row fails (the run goes on).

Workloads (bf16, 32 q / 8 kv heads, d 128, inputs larger than the 60 MB L2): paged decode B in
{16, 128} x L in {2048, 8192}, page 16, HND pools (cuDNN's layout); the same decode on an NHD pool
passed by strides (a probe: is NHD accepted and right?); causal prefill 1x8192 and 8x2048, ragged
(dense) and paged (page 16); anchors in the same run: torch SDPA's cuDNN backend (prefill) and
FlashInfer's cuDNN decode when flashinfer is installed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

HQ, HKV, D, PAGE = 32, 8, 128, 16
DECODE = [(16, 2048), (16, 8192), (128, 2048), (128, 8192)]
PREFILL = [(1, 8192), (8, 2048)]
DTYPE = torch.bfloat16
#: prefill checks: the last TAIL queries of request 0 against all its keys (an exact slice of the problem)
TAIL = 256
_WORKSPACE: dict[torch.device, torch.Tensor] = {}


def _sync() -> None:
    torch.cuda.synchronize()


def _row(workload: str, impl: str, run: Callable[[], Any], check: Callable[[], float], amount: float, unit: str,
         graph_run: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Check, then time ``run`` (eager) and ``graph_run`` (captured); ``amount`` bytes (tb_s) or flops (tflop_s)."""
    import triton.testing

    row: dict[str, Any] = {"workload": workload, "impl": impl}
    try:
        t0 = time.perf_counter()
        run()
        _sync()
        row["first_call_s"] = round(time.perf_counter() - t0, 3)
        row["max_err"] = float(check())
        if not math.isfinite(row["max_err"]) or row["max_err"] > 0.1:
            raise AssertionError(f"max abs error {row['max_err']:.3g} against the reference")
        ms = float(triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median"))
        row.update(ms=round(ms, 4), **{unit: round(amount / (ms * 1e-3) / 1e12, 3)})
        if graph_run is not None:
            gms = float(triton.testing.do_bench_cudagraph(graph_run, rep=100, return_mode="median"))
            row.update(graph_ms=round(gms, 4), **{f"graph_{unit}": round(amount / (gms * 1e-3) / 1e12, 3)})
    except Exception as exc:  # a row reports its failure, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()
    return row


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max())


def _paged(batch: int, length: int, layout: str, dev: torch.device, seed: int) -> tuple[torch.Tensor, Any, Any]:
    """q (B, Hq, D) and a paged cache holding ``length`` tokens per request on shuffled pages."""
    import kernel_switchboard as ksb

    g = torch.Generator(device=dev).manual_seed(seed)
    per = -(-length // PAGE)
    num_pages = batch * per
    table = torch.randperm(num_pages, generator=g, device=dev).to(torch.int32).view(batch, per)
    shape = (num_pages, PAGE, HKV, D) if layout == "NHD" else (num_pages, HKV, PAGE, D)
    k = torch.randn(shape, generator=g, device=dev, dtype=DTYPE)
    v = torch.randn(shape, generator=g, device=dev, dtype=DTYPE)
    q = torch.randn(batch, HQ, D, generator=g, device=dev, dtype=DTYPE)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=dev)
    return q, ksb.PagedKVCache(k, v, layout), ksb.PageTable(table, seq_lens, max_seq_len=length)


def _decode_slice_ref(q: torch.Tensor, cache: Any, table: Any, rows: int = 4) -> torch.Tensor:
    """The reference decode of the first ``rows`` requests (requests are independent)."""
    import kernel_switchboard as ksb

    sub = ksb.PageTable(table.block_table[:rows].contiguous(), table.seq_lens[:rows].contiguous())
    return ksb.attention.decode(q[:rows], cache, sub, backend="reference")


def _decode_rows(dev: torch.device) -> list[dict[str, Any]]:
    import kernel_switchboard as ksb

    rows = []
    for batch, length in DECODE:
        q, cache, table = _paged(batch, length, "HND", dev, seed=batch + length)
        kv = float(batch * length * HKV * 2 * D * q.element_size())
        workload = f"decode B={batch} L={length} page={PAGE}"
        want = _decode_slice_ref(q, cache, table)
        plan = ksb.attention.plan_decode(table, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE,
                                         layout="HND", page_size=PAGE, backend="cudnn")
        out = torch.empty(batch, HQ, D, dtype=DTYPE, device=dev)

        def check(plan: Any = plan, q: torch.Tensor = q, cache: Any = cache, out: torch.Tensor = out,
                  want: torch.Tensor = want) -> float:
            out.fill_(float("nan"))
            plan.run(q, cache, out=out)
            return _err(out[: want.shape[0]], want)

        rows.append(_row(workload, "cudnn:sdpa_paged_decode HND", lambda q=q, c=cache, t=table: ksb.attention.decode(
            q, c, t, backend="cudnn"), check, kv, "tb_s", graph_run=lambda p=plan, q=q, c=cache, o=out: p.run(q, c, out=o)))
        rows.append(_flashinfer_decode(workload, q, cache, table, want, kv))
        del q, cache, table, plan, out
    rows.append(_nhd_probe(dev))
    return rows


def _flashinfer_decode(workload: str, q: torch.Tensor, cache: Any, table: Any, want: torch.Tensor, kv: float
                       ) -> dict[str, Any]:
    """Anchor: FlashInfer's own cuDNN decode on the same HND pool."""
    def run() -> torch.Tensor:
        from flashinfer.cudnn import cudnn_batch_decode_with_kv_cache

        ws = _WORKSPACE.get(q.device)
        if ws is None:
            ws = _WORKSPACE[q.device] = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
        return cudnn_batch_decode_with_kv_cache(q, cache.k_pages, cache.v_pages, 1.0 / math.sqrt(D), ws,
                                                max_sequence_kv=table.max_pages * PAGE, actual_seq_lens_kv=table.seq_lens,
                                                block_tables=table.block_table)

    return _row(workload, "flashinfer cudnn decode (anchor)", run, lambda: _err(run()[: want.shape[0]], want), kv, "tb_s")


def _nhd_probe(dev: torch.device) -> dict[str, Any]:
    """Does cuDNN take an NHD pool by strides, and compute it right? (support.Support.layouts declares HND only.)"""
    from kernel_switchboard.ops.attention import AttnParams
    from kernel_switchboard_cudnn import attention

    batch, length = 16, 2048
    q, cache, table = _paged(batch, length, "NHD", dev, seed=7)
    p = AttnParams(1.0 / math.sqrt(D), None, -1, True, False, 1, length)
    want = _decode_slice_ref(q, cache, table)
    kv = float(batch * length * HKV * 2 * D * q.element_size())
    return _row(f"decode B={batch} L={length} page={PAGE} NHD pool (probe)", "cudnn graph with NHD strides",
                lambda: attention.decode(q, cache, table, p), lambda: _err(attention.decode(q, cache, table, p)[0][:4], want),
                kv, "tb_s")


def _causal_flops(batch: int, length: int) -> float:
    return 4.0 * batch * HQ * D * length * length / 2


def _prefill_rows(dev: torch.device) -> list[dict[str, Any]]:
    import kernel_switchboard as ksb

    rows = []
    for batch, length in PREFILL:
        g = torch.Generator(device=dev).manual_seed(length)
        t = batch * length
        q = torch.randn(t, HQ, D, generator=g, device=dev, dtype=DTYPE)
        k = torch.randn(t, HKV, D, generator=g, device=dev, dtype=DTYPE)
        v = torch.randn(t, HKV, D, generator=g, device=dev, dtype=DTYPE)
        ind = torch.arange(0, t + 1, length, dtype=torch.int32, device=dev)
        flops = _causal_flops(batch, length)
        workload = f"prefill causal {batch}x{length}"
        tail_ind = torch.tensor([0, TAIL], dtype=torch.int32, device=dev)
        kv_ind = torch.tensor([0, length], dtype=torch.int32, device=dev)
        want = ksb.attention.prefill_ragged(q[length - TAIL:length].contiguous(), k[:length], v[:length], tail_ind, kv_ind,
                                            backend="reference")

        def run(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, ind: torch.Tensor = ind) -> torch.Tensor:
            return ksb.attention.prefill_ragged(q, k, v, ind, ind, backend="cudnn")

        rows.append(_row(workload, "cudnn:sdpa_ragged_prefill", run,
                         lambda run=run, want=want, length=length: _err(run()[length - TAIL:length], want), flops, "tflop_s"))
        rows.append(_paged_prefill(workload, q, k, v, batch, length, want, flops))
        rows.append(_torch_cudnn(workload, q, k, v, batch, length, want, flops))
        del q, k, v
    return rows


def _paged_prefill(workload: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int,
                   want: torch.Tensor, flops: float) -> dict[str, Any]:
    import kernel_switchboard as ksb

    dev = q.device
    per = length // PAGE
    table = torch.arange(batch * per, dtype=torch.int32, device=dev).view(batch, per)
    kp = k.view(batch * per, PAGE, HKV, D).transpose(1, 2).contiguous()  # HND pages, request b = pages b*per..
    vp = v.view(batch * per, PAGE, HKV, D).transpose(1, 2).contiguous()
    cache = ksb.PagedKVCache(kp, vp, "HND")
    pt = ksb.PageTable(table, torch.full((batch,), length, dtype=torch.int32, device=dev), max_seq_len=length)
    ind = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=dev)
    plan = ksb.attention.plan_prefill(pt, ind, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, layout="HND",
                                      page_size=PAGE, backend="cudnn")
    out = torch.empty_like(q)

    def check() -> float:
        out.fill_(float("nan"))
        plan.run(q, cache, out=out)
        return _err(out[length - TAIL:length], want)

    return _row(workload, f"cudnn:sdpa_paged_prefill HND page={PAGE}",
                lambda: ksb.attention.prefill(q, ind, cache, pt, backend="cudnn"), check, flops, "tflop_s",
                graph_run=lambda: plan.run(q, cache, out=out))


def _torch_cudnn(workload: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int,
                 want: torch.Tensor, flops: float) -> dict[str, Any]:
    """Anchor: torch SDPA's cuDNN backend on the same dense batch (K/V heads repeated for it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qd = q.view(batch, length, HQ, D).transpose(1, 2)
    kd = k.view(batch, length, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1)
    vd = v.view(batch, length, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1)

    def run() -> torch.Tensor:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True)

    return _row(workload, "torch sdpa CUDNN_ATTENTION (anchor)", run,
                lambda: _err(run()[0, :, length - TAIL:].transpose(0, 1), want), flops, "tflop_s")


def bench_attention(device: torch.device | str = "cuda") -> list[dict[str, Any]]:
    """Every row (see the module docstring); needs a CUDA GPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return [{"workload": "all", "impl": "cudnn", "error": f"needs a CUDA device, got {dev}"}]
    from kernel_switchboard.registry import registry

    backend = registry.all_backends().get("cudnn")
    header = {"workload": "environment", "impl": "cudnn", "available": bool(backend and backend.available),
              "providers": backend.providers if backend else None, "reason": backend.unavailable if backend else None,
              "gpu": torch.cuda.get_device_name(dev)}
    print(json.dumps(header), flush=True)
    rows = [header]
    for part in (_decode_rows, _prefill_rows):
        try:
            rows.extend(part(dev))
        except Exception as exc:  # inputs that could not even be built
            rows.append({"workload": part.__name__, "impl": "cudnn", "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
    return rows


def main(argv: list[str]) -> int:
    rows = bench_attention("cuda")
    out = argv[argv.index("--out") + 1] if "--out" in argv else os.path.join(os.environ.get("OUT", "."),
                                                                               "bench_cudnn_attention.json")
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{len(rows)} rows -> {out}; {sum('error' in r for r in rows)} with errors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
