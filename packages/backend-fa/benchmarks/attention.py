"""Benchmark: the FlashAttention kernels on Llama-3-8B shapes.

    python packages/backend-fa/benchmarks/attention.py [--out rows.json]

``bench_attention(device) -> list[dict]``, one row per (workload, implementation): ``ms`` (median of
triton.testing.do_bench: an eager call through the public API, host work included), ``graph_ms``
(median of do_bench_cudagraph on the planned call: GPU time only; paged kernels), ``tb_s`` /
``graph_tb_s`` (decode: K and V bytes read / time) or ``tflop_s`` / ``graph_tflop_s`` (causal
prefill: 2 * 2 * B * Hq * D * S^2 / 2 flops / time), ``max_err`` against the reference kernel on a
slice of the same inputs (checked on a NaN-poisoned output before timing), ``first_call_s`` (JIT
compile + first run) and ``error`` when a row fails (the run goes on).

Workloads (bf16, 32 q / 8 kv heads, d 128, NHD pools, inputs larger than the 60 MB L2): FA4 paged
decode B in {16, 128} x L in {2048, 8192} at page 16 and page 128 (its TMA fast path); FA4 split-KV
(page-table slicing) against one chunk at B=4 L=8192; causal prefill 1x8192 and 8x2048 (ragged) for
FA4, FA3/FA2 when installed and torch's flash backend (declared for one request), FA4 paged prefill
(page 128) and FA4 with a logits soft cap of 30; anchor: torch SDPA's flash backend on the dense batch.
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

HQ, HKV, D = 32, 8, 128
DECODE = [(16, 2048), (16, 8192), (128, 2048), (128, 8192)]
PAGES = (16, 128)
PREFILL = [(1, 8192), (8, 2048)]
DTYPE = torch.bfloat16
#: prefill checks: the last TAIL queries of request 0 against all its keys (an exact slice of the problem)
TAIL = 256


def _row(workload: str, impl: str, run: Callable[[], Any], check: Callable[[], float], amount: float, unit: str,
         graph_run: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Check, then time ``run`` (eager) and ``graph_run`` (captured); ``amount`` bytes (tb_s) or flops (tflop_s)."""
    import triton.testing

    row: dict[str, Any] = {"workload": workload, "impl": impl}
    try:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
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


def kernel_id(prefix: str, op: str) -> str:
    """``fa:<name>`` of the provider's kernel for ``op`` (its name carries the installed version)."""
    from kernel_switchboard.registry import registry

    backend = registry.all_backends().get("fa")
    for k in backend.kernels if backend else []:
        if k.op == op and k.name.startswith(prefix + "@"):
            return k.id
    return f"fa:{prefix}@none:{op.split('.')[1]}"


def _paged(batch: int, length: int, page: int, dev: torch.device, seed: int) -> tuple[torch.Tensor, Any, Any]:
    """q (B, Hq, D) and an NHD paged cache holding ``length`` tokens per request on shuffled pages."""
    import kernel_switchboard as ksb

    g = torch.Generator(device=dev).manual_seed(seed)
    per = -(-length // page)
    num_pages = batch * per
    table = torch.randperm(num_pages, generator=g, device=dev).to(torch.int32).view(batch, per)
    k = torch.randn(num_pages, page, HKV, D, generator=g, device=dev, dtype=DTYPE)
    v = torch.randn(num_pages, page, HKV, D, generator=g, device=dev, dtype=DTYPE)
    q = torch.randn(batch, HQ, D, generator=g, device=dev, dtype=DTYPE)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=dev)
    return q, ksb.PagedKVCache(k, v, "NHD"), ksb.PageTable(table, seq_lens, max_seq_len=length)


def _decode_ref(q: torch.Tensor, cache: Any, table: Any, rows: int = 4) -> torch.Tensor:
    import kernel_switchboard as ksb

    sub = ksb.PageTable(table.block_table[:rows].contiguous(), table.seq_lens[:rows].contiguous())
    return ksb.attention.decode(q[:rows], cache, sub, backend="reference")


def _decode_row(workload: str, kid: str, q: torch.Tensor, cache: Any, table: Any, want: torch.Tensor,
                splits: int | None = None) -> dict[str, Any]:
    import kernel_switchboard as ksb

    kv = float(q.shape[0] * table.max_seq_len * HKV * 2 * D * q.element_size())
    out = torch.empty(q.shape[0], HQ, D, dtype=DTYPE, device=q.device)
    impl = kid if splits is None else f"{kid} splits={splits}"
    try:
        plan = ksb.attention.plan_decode(table, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE,
                                         page_size=cache.page_size, backend=kid)
    except Exception as exc:
        row = {"workload": workload, "impl": impl, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print(json.dumps(row), flush=True)
        return row
    if splits is not None:
        plan._runner.splits = splits  # type: ignore[attr-defined]  # FA4's own plan object

    def check() -> float:
        out.fill_(float("nan"))
        plan.run(q, cache, out=out)
        return _err(out[: want.shape[0]], want)

    if splits is None:
        run: Callable[[], Any] = lambda: ksb.attention.decode(q, cache, table, backend=kid)  # noqa: E731
    else:
        run = lambda: plan.run(q, cache, out=out)  # noqa: E731
    row = _row(workload, impl, run, check, kv, "tb_s", graph_run=lambda: plan.run(q, cache, out=out))
    if splits is None and "error" not in row:
        row["splits"] = getattr(plan._runner, "splits", None)  # type: ignore[attr-defined]
    return row


def _decode_rows(dev: torch.device) -> list[dict[str, Any]]:
    rows = []
    kid = kernel_id("fa4", "attention.decode")
    for page in PAGES:
        for batch, length in DECODE:
            q, cache, table = _paged(batch, length, page, dev, seed=batch + length + page)
            want = _decode_ref(q, cache, table)
            rows.append(_decode_row(f"decode B={batch} L={length} page={page}", kid, q, cache, table, want))
            for other in ("fa3", "fa2"):
                if page == 16 and other == "fa2":
                    continue  # FA2's paged kernels need pages of 256
                rows.append(_decode_row(f"decode B={batch} L={length} page={page}", kernel_id(other, "attention.decode"),
                                        q, cache, table, want))
            del q, cache, table
    q, cache, table = _paged(4, 8192, 16, dev, seed=3)
    want = _decode_ref(q, cache, table)
    for splits in (1, None):
        rows.append(_decode_row("decode B=4 L=8192 page=16 (split-KV)", kid, q, cache, table, want, splits=splits))
    return rows


def _causal_flops(batch: int, length: int) -> float:
    return 4.0 * batch * HQ * D * length * length / 2


def _prefill_rows(dev: torch.device) -> list[dict[str, Any]]:
    rows = []
    for batch, length in PREFILL:
        rows.extend(_prefill_point(dev, batch, length))
    return rows


def _prefill_point(dev: torch.device, batch: int, length: int) -> list[dict[str, Any]]:
    import kernel_switchboard as ksb

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
    q_tail = q[length - TAIL:length].contiguous()
    want = ksb.attention.prefill_ragged(q_tail, k[:length], v[:length], tail_ind, kv_ind, backend="reference")
    want_cap = ksb.attention.prefill_ragged(q_tail, k[:length], v[:length], tail_ind, kv_ind, logits_soft_cap=30.0,
                                            backend="reference")

    def runner(kid: str, cap: float | None = None) -> Callable[[], torch.Tensor]:
        return lambda: ksb.attention.prefill_ragged(q, k, v, ind, ind, logits_soft_cap=cap, backend=kid)

    def checker(run: Callable[[], torch.Tensor], ref: torch.Tensor) -> Callable[[], float]:
        return lambda: _err(run()[length - TAIL:length], ref)

    rows = []
    for prefix in ("fa4", "fa3", "fa2", "torch-flash"):
        kid = kernel_id(prefix, "attention.prefill_ragged")
        run = runner(kid)
        rows.append(_row(workload, kid, run, checker(run, want), flops, "tflop_s"))
    kid = kernel_id("fa4", "attention.prefill_ragged")
    capped = runner(kid, 30.0)
    rows.append(_row(workload + " soft_cap=30", kid, capped, checker(capped, want_cap), flops, "tflop_s"))
    rows.append(_paged_prefill(workload, q, k, v, batch, length, want, flops))
    rows.append(_torch_flash(workload, q, k, v, batch, length, want, flops))
    return rows


def _paged_prefill(workload: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int,
                   want: torch.Tensor, flops: float, page: int = 128) -> dict[str, Any]:
    import kernel_switchboard as ksb

    dev = q.device
    per = length // page
    cache = ksb.PagedKVCache(k.view(batch * per, page, HKV, D), v.view(batch * per, page, HKV, D), "NHD")
    pt = ksb.PageTable(torch.arange(batch * per, dtype=torch.int32, device=dev).view(batch, per),
                       torch.full((batch,), length, dtype=torch.int32, device=dev), max_seq_len=length)
    ind = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=dev)
    kid = kernel_id("fa4", "attention.prefill")
    out = torch.empty_like(q)
    try:
        plan = ksb.attention.plan_prefill(pt, ind, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE,
                                          page_size=page, backend=kid)
    except Exception as exc:
        row = {"workload": workload, "impl": kid, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print(json.dumps(row), flush=True)
        return row

    def check() -> float:
        out.fill_(float("nan"))
        plan.run(q, cache, out=out)
        return _err(out[length - TAIL:length], want)

    return _row(workload, f"{kid} page={page}", lambda: ksb.attention.prefill(q, ind, cache, pt, backend=kid), check,
                flops, "tflop_s", graph_run=lambda: plan.run(q, cache, out=out))


def _torch_flash(workload: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, length: int,
                 want: torch.Tensor, flops: float) -> dict[str, Any]:
    """Anchor: torch SDPA's flash backend on the dense batch, called directly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qd = q.view(batch, length, HQ, D).transpose(1, 2)
    kd = k.view(batch, length, HKV, D).transpose(1, 2)
    vd = v.view(batch, length, HKV, D).transpose(1, 2)

    def run() -> torch.Tensor:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)

    return _row(workload, "torch sdpa FLASH_ATTENTION dense (anchor)", run,
                lambda: _err(run()[0, :, length - TAIL:].transpose(0, 1), want), flops, "tflop_s")


def bench_attention(device: torch.device | str = "cuda") -> list[dict[str, Any]]:
    """Every row (see the module docstring); needs a CUDA GPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return [{"workload": "all", "impl": "fa", "error": f"needs a CUDA device, got {dev}"}]
    from kernel_switchboard.registry import registry

    backend = registry.all_backends().get("fa")
    header = {"workload": "environment", "impl": "fa", "available": bool(backend and backend.available),
              "providers": backend.providers if backend else None,
              "unavailable": {k.name: k.unavailable for k in (backend.kernels if backend else []) if k.unavailable},
              "gpu": torch.cuda.get_device_name(dev)}
    print(json.dumps(header), flush=True)
    rows = [header]
    for part in (_decode_rows, _prefill_rows):
        try:
            rows.extend(part(dev))
        except Exception as exc:  # inputs that could not even be built
            rows.append({"workload": part.__name__, "impl": "fa", "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
    return rows


def main(argv: list[str]) -> int:
    rows = bench_attention("cuda")
    out = argv[argv.index("--out") + 1] if "--out" in argv else os.path.join(os.environ.get("OUT", "."),
                                                                               "bench_fa_attention.json")
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{len(rows)} rows -> {out}; {sum('error' in r for r in rows)} with errors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
