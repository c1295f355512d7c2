"""``switchboard bench --preset flashinfer-compat``: :mod:`kernel_switchboard.flashinfer` beside the real FlashInfer
on identical inputs, in one process, called the same way (a wrapper planned once, then ``run``).

Points (GPU): decode B in {16, 128} x L in {2048, 8192} (Llama-3-8B heads, page 16, bf16), ragged and paged causal
prefill 1x8192 and 8x2048, MLA decode B in {16, 128} (128 heads, 512 + 64, page 64), top-p and top-k + top-p
sampling 128 x 128256 from probabilities, RMSNorm 8192 x 8192. Each point gives a row per implementation (FlashInfer's
default and, for decode, its tensor-core wrapper) and a ``ratio vs FlashInfer`` row: the best FlashInfer time over
the compat layer's (>= 1: the compat layer is at least as fast). Calls are timed in alternating rounds
(:func:`~kernel_switchboard.bench.fastest_of_rounds`).

The ``host overhead`` point (CPU or GPU) measures what the compat layer adds to the switchboard plan's ``run``: a
decode wrapper and its plan, both driving a runner that does nothing, so only host work is timed (microseconds per
call, fastest of several rounds of many calls).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from .bench import Point, Row, RunPoint, fastest_of_rounds

LLAMA = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
WORKSPACE_BYTES = 256 * 1024 * 1024


def _point(op: str, params: dict[str, Any], label: str) -> RunPoint:
    """A point of this preset, run by its op's runner in ``_RUNNERS``."""
    return RunPoint(op, params, label, _RUNNERS[op])


def points() -> list[Point]:
    """The preset's points: every GPU point when CUDA is there, and the host-overhead point."""
    out: list[Point] = [_point("flashinfer.host_overhead", {}, "decode run, tiny problem")]
    if not torch.cuda.is_available():
        return out
    out += [_point("flashinfer.decode", {"batch": b, "kv_len": n}, f"B={b} L={n} p16")
            for b in (16, 128) for n in (2048, 8192)]
    out += [_point(f"flashinfer.{kind}_prefill", {"batch": b, "q_len": n}, f"{b}x{n} causal")
            for kind in ("ragged", "paged") for b, n in ((1, 8192), (8, 2048))]
    out += [_point("flashinfer.mla_decode", {"batch": b, "kv_len": n}, f"B={b} L={n} p64")
            for b, n in ((16, 4096), (128, 8192))]
    out += [_point("flashinfer.sampling", {"top_k": k}, f"128x128256 {tag}")
            for tag, k in (("top-p", 0), ("top-k+top-p", 50))]
    out.append(_point("flashinfer.rmsnorm", {}, "8192x8192 bf16"))
    return out


# -- helpers ------------------------------------------------------------------------------------------------------
def _flashinfer() -> Any:
    """The real FlashInfer, or None where it is not installed."""
    try:
        return importlib.import_module("flashinfer")
    except Exception:  # noqa: BLE001 - not installed (or broken): the compat rows stand alone
        return None


def _compat() -> Any:
    from . import flashinfer

    return flashinfer


def _rows(preset: str, point: Point, calls: dict[str, Callable[[], Any]], device: torch.device, reps_ms: float,
          units: float, unit: str) -> list[Row]:
    """Time ``calls`` in alternating rounds; one row each, then the compat layer's ratio to the best FlashInfer."""
    times = fastest_of_rounds(calls, device, reps_ms)
    rows = []
    for name in calls:
        ms = times.get(name)
        rate = units / (ms * 1e-3) / (1e12 if unit in ("TB/s", "TFLOP/s") else 1e9) if ms and units else None
        rows.append(Row(preset, point.op, point.label, name, ms, rate, unit if rate is not None else "",
                        error=None if ms is not None else "failed (see stderr)"))
    ours = [ms for name, ms in times.items() if name.startswith("kernel_switchboard")]
    theirs = [ms for name, ms in times.items() if name.startswith("flashinfer")]
    if ours and theirs:
        rows.append(Row(preset, point.op, point.label, "ratio vs FlashInfer", None, min(theirs) / ours[0], "x",
                        extra={"flashinfer_ms": min(theirs), "compat_ms": ours[0]}))
    return rows


def _pages(batch: int, kv_len: int, page_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """CSR pages of ``batch`` requests of ``kv_len`` tokens each, pages assigned in order."""
    per = -(-kv_len // page_size)
    indptr = torch.arange(0, (batch + 1) * per, per, dtype=torch.int32, device=device)
    indices = torch.arange(batch * per, dtype=torch.int32, device=device)
    last = torch.full((batch,), kv_len - (per - 1) * page_size, dtype=torch.int32, device=device)
    return indptr, indices, last


def _compat_name(wrapper: Any) -> str:
    plans = getattr(wrapper, "_plans", {})
    kernel = next(iter(plans.values())).kernel.id if plans else "?"
    return f"kernel_switchboard.flashinfer -> {kernel}"


# -- points -------------------------------------------------------------------------------------------------------
def _decode(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    b, n, page = point.params["batch"], point.params["kv_len"], 16
    hq, hkv, d, dtype = LLAMA["num_q_heads"], LLAMA["num_kv_heads"], LLAMA["head_dim"], torch.bfloat16
    indptr, indices, last = _pages(b, n, page, device)
    kv = (torch.randn(int(indptr[-1]), page, hkv, d, dtype=dtype, device=device),
          torch.randn(int(indptr[-1]), page, hkv, d, dtype=dtype, device=device))
    q = torch.randn(b, hq, d, dtype=dtype, device=device)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    calls: dict[str, Callable[[], Any]] = {}
    compat = _compat().BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    compat.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
    calls[_compat_name(compat)] = lambda: compat.run(q, kv)
    fi = _flashinfer()
    if fi is not None:
        for name, tc in (("flashinfer (default)", False), ("flashinfer (tensor cores)", True)):
            w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD", use_tensor_cores=tc)
            w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
            calls[name] = lambda w=w: w.run(q, kv)
    return _rows(preset, point, calls, device, reps_ms, 2.0 * b * n * hkv * d * 2, "TB/s")


def _prefill(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    b, n = point.params["batch"], point.params["q_len"]
    hq, hkv, d, dtype = LLAMA["num_q_heads"], LLAMA["num_kv_heads"], LLAMA["head_dim"], torch.bfloat16
    qo = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=device)
    q = torch.randn(b * n, hq, d, dtype=dtype, device=device)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    fi, compat = _flashinfer(), _compat()
    calls: dict[str, Callable[[], Any]] = {}
    if point.op == "flashinfer.ragged_prefill":
        k = torch.randn(b * n, hkv, d, dtype=dtype, device=device)
        v = torch.randn(b * n, hkv, d, dtype=dtype, device=device)
        ours = compat.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        ours.plan(qo, qo, hq, hkv, d, causal=True, q_data_type=dtype)
        calls[_compat_name(ours)] = lambda: ours.run(q, k, v)
        if fi is not None:
            theirs = fi.BatchPrefillWithRaggedKVCacheWrapper(torch.zeros_like(ws), "NHD")
            theirs.plan(qo, qo, hq, hkv, d, causal=True, q_data_type=dtype)
            calls["flashinfer (default)"] = lambda: theirs.run(q, k, v)
    else:
        page = 16
        indptr, indices, last = _pages(b, n, page, device)
        kv = (torch.randn(int(indptr[-1]), page, hkv, d, dtype=dtype, device=device),
              torch.randn(int(indptr[-1]), page, hkv, d, dtype=dtype, device=device))
        ours = compat.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        ours.plan(qo, indptr, indices, last, hq, hkv, d, page, causal=True, q_data_type=dtype)
        calls[_compat_name(ours)] = lambda: ours.run(q, kv)
        if fi is not None:
            theirs = fi.BatchPrefillWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD")
            theirs.plan(qo, indptr, indices, last, hq, hkv, d, page, causal=True, q_data_type=dtype)
            calls["flashinfer (default)"] = lambda: theirs.run(q, kv)
    flops = 2.0 * b * (n * n - n * (n - 1) / 2) * hq * 2 * d
    return _rows(preset, point, calls, device, reps_ms, flops, "TFLOP/s")


def _mla(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    b, n, page, heads, ckv_dim, kpe_dim, dtype = point.params["batch"], point.params["kv_len"], 64, 128, 512, 64, \
        torch.bfloat16
    indptr, indices, _ = _pages(b, n, page, device)
    lens = torch.full((b,), n, dtype=torch.int32, device=device)
    qo = torch.arange(b + 1, dtype=torch.int32, device=device)
    ckv = torch.randn(int(indptr[-1]), page, ckv_dim, dtype=dtype, device=device)
    kpe = torch.randn(int(indptr[-1]), page, kpe_dim, dtype=dtype, device=device)
    q_nope = torch.randn(b, heads, ckv_dim, dtype=dtype, device=device)
    q_pe = torch.randn(b, heads, kpe_dim, dtype=dtype, device=device)
    sm = 1 / math.sqrt(192)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    ours = _compat().BatchMLAPagedAttentionWrapper(ws)
    ours.plan(qo, indptr, indices, lens, heads, ckv_dim, kpe_dim, page, False, sm, dtype, dtype)
    kernel = next(iter(ours._plans.values())).kernel.id
    calls: dict[str, Callable[[], Any]] = {f"kernel_switchboard.flashinfer -> {kernel}":
                                           lambda: ours.run(q_nope, q_pe, ckv, kpe)}
    fi = _flashinfer()
    if fi is not None:
        theirs = fi.mla.BatchMLAPagedAttentionWrapper(torch.zeros_like(ws))
        theirs.plan(qo, indptr, indices, lens, heads, ckv_dim, kpe_dim, page, False, sm, dtype, dtype)
        calls["flashinfer (default)"] = lambda: theirs.run(q_nope, q_pe, ckv, kpe)
    return _rows(preset, point, calls, device, reps_ms, float(b * n * (ckv_dim + kpe_dim) * 2), "TB/s")


def _sampling(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    k = point.params["top_k"]
    probs = torch.softmax(torch.randn(128, 128256, device=device), -1)
    calls: dict[str, Callable[[], Any]] = {}
    for name, mod in (("kernel_switchboard.flashinfer", _compat()), ("flashinfer (default)", _flashinfer())):
        if mod is None:
            continue
        if k:
            calls[name] = lambda mod=mod: mod.top_k_top_p_sampling_from_probs(probs, k, 0.9)
        else:
            calls[name] = lambda mod=mod: mod.top_p_sampling_from_probs(probs, 0.9)
    return _rows(preset, point, calls, device, reps_ms, float(probs.numel() * 4), "GB/s")


def _rmsnorm(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    w = torch.randn(8192, dtype=torch.bfloat16, device=device)
    calls: dict[str, Callable[[], Any]] = {}
    for name, mod in (("kernel_switchboard.flashinfer", _compat()), ("flashinfer (default)", _flashinfer())):
        if mod is not None:
            calls[name] = lambda mod=mod: mod.rmsnorm(x, w)
    return _rows(preset, point, calls, device, reps_ms, float(2 * x.numel() * x.element_size()), "TB/s")


# -- host overhead --------------------------------------------------------------------------------------------------
class _NoKernel:
    """A plan runner that launches nothing: what remains of a call is its host work. Where the plan gives no
    buffer it returns the ones it holds, as a runner returns the tensors it allocates."""

    def __init__(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        self.out, self.lse = out, lse

    def run(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = args[-2], args[-1]
        return (self.out if out is None else out), lse


def _per_call_us(fn: Callable[[], Any], calls: int = 2000, rounds: int = 7) -> float:
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def host_overhead(device: torch.device) -> dict[str, float]:
    """Microseconds per call: the switchboard decode plan's ``run`` and the compat wrapper's ``run`` over it, both
    with a runner that launches nothing, for the pages as a (k, v) pair (SGLang), as one (pages, 2, ...) tensor
    (vLLM, writing a given ``out``) and with ``return_lse``."""
    from .paged import PagedKVCache

    compat = _compat()
    b, hq, hkv, d, page = 4, 4, 2, 64, 16
    indptr, indices, last = _pages(b, 40, page, device)
    pages = int(indptr[-1])
    kv5 = torch.randn(pages, 2, page, hkv, d, device=device)
    k, v = kv5[:, 0], kv5[:, 1]
    q = torch.randn(b, hq, d, device=device)
    out = torch.empty(b, hq, d, device=device)
    wrapper = compat.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=device), "NHD")
    wrapper.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=torch.float32)
    plan, plan_lse = wrapper._plan_for(None, False), wrapper._plan_for(None, True)
    lse = torch.empty(b, hq, device=device)
    plan._runner = plan_lse._runner = _NoKernel(torch.empty(b, hq, d, device=device), lse)
    cache = PagedKVCache(k, v, "NHD")
    native = _per_call_us(lambda: plan.run(q, cache))
    native_out = _per_call_us(lambda: plan.run(q, cache, out=out))
    native_lse = _per_call_us(lambda: plan_lse.run(q, cache, lse=lse))
    pair = _per_call_us(lambda: wrapper.run(q, (k, v)))
    combined = _per_call_us(lambda: wrapper.run(q, kv5, out=out))
    with_lse = _per_call_us(lambda: wrapper.run(q, (k, v), return_lse=True, lse=lse))
    return {"native_run_us": native, "compat_pair_us": pair, "overhead_pair_us": pair - native,
            "native_run_out_us": native_out, "compat_combined_out_us": combined,
            "overhead_combined_out_us": combined - native_out, "native_run_lse_us": native_lse,
            "compat_lse_us": with_lse, "overhead_lse_us": with_lse - native_lse}


def _host(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    m = host_overhead(device)
    rows = []
    for label, over, base in (("(k, v) pair", "overhead_pair_us", "native_run_us"),
                              ("(pages, 2, ...) tensor, out given", "overhead_combined_out_us", "native_run_out_us"),
                              ("(k, v) pair, return_lse", "overhead_lse_us", "native_run_lse_us")):
        rows.append(Row(preset, point.op, f"{point.label}: {label}", "compat run - plan.run", m[over] * 1e-3, m[over],
                        "us/call", extra={"native_us": m[base], **m}))
    return rows


_RUNNERS: dict[str, Callable[[Point, str, torch.device, float], list[Row]]] = {
    "flashinfer.host_overhead": _host, "flashinfer.decode": _decode, "flashinfer.ragged_prefill": _prefill,
    "flashinfer.paged_prefill": _prefill, "flashinfer.mla_decode": _mla, "flashinfer.sampling": _sampling,
    "flashinfer.rmsnorm": _rmsnorm}
