"""``switchboard bench --preset flashinfer-compat``: :mod:`kernel_switchboard.flashinfer` beside the real FlashInfer
on identical inputs, in one process, called the same way (a wrapper planned once, then ``run``).

Points (GPU): decode B in {16, 128} x L in {2048, 8192} (Llama-3-8B heads, page 16, bf16) and B=128 L=8192 on fp8
e4m3 pages, ragged and paged causal prefill 1x8192 and 8x2048, ragged with logits soft cap 30 too, MLA decode
B in {16, 128} (128 heads, 512 + 64, page 64), top-p and top-k + top-p sampling 128 x 128256 from probabilities,
RMSNorm 8192 x 8192. Each point gives a row per implementation (FlashInfer's default and, for decode, its tensor-core
wrapper) and a ``ratio vs FlashInfer`` row: the best FlashInfer time over the compat layer's (>= 1: the compat layer
is at least as fast). Calls are timed in alternating rounds (:func:`~kernel_switchboard.bench.timing.fastest_of_rounds`).

The ops beside attention (:func:`op_points`): fused add + RMSNorm (8192 x 8192 and a decode step of 128 x 4096,
bf16), RoPE (8192 tokens of Llama-3-8B heads, by position ids and from a cos/sin table in place), KV append through
the CSR page table (a decode step of 128 requests at 8192 tokens, and a 1 x 8192 prefill, page 16), the fp8 GEMM
with DeepSeek-V3 block scales (1x128 activations, 128x128 weights; 8192^3 and 128 x 8192 x 8192) beside FlashInfer's
``fp8_blockscale_gemm_sm90``, ``torch._scaled_mm`` with the same block scales and per-tensor (cuBLAS), and
``ksb.sampling`` top-p / top-k + top-p with default arguments beside FlashInfer's. These also time every eligible
switchboard kernel forced by name (``ksb kernel <id>``) and give an ``auto vs best kernel`` row (the best forced
time over the automatic choice's), and they check the outputs agree before timing (``extra``: the largest difference
from FlashInfer, or from a float32 reference for the GEMM). Their sizes come from the point's params, so the same
runners run on a CPU at small sizes.

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

from .points import Point, Row, RunPoint
from .timing import fastest_of_rounds

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
    out.append(_point("flashinfer.decode", {"batch": 128, "kv_len": 8192, "kv_dtype": "e4m3"},
                      "B=128 L=8192 p16, fp8 e4m3 pages"))
    out += [_point(f"flashinfer.{kind}_prefill", {"batch": b, "q_len": n}, f"{b}x{n} causal")
            for kind in ("ragged", "paged") for b, n in ((1, 8192), (8, 2048))]
    out += [_point("flashinfer.ragged_prefill", {"batch": b, "q_len": n, "soft_cap": 30.0},
                   f"{b}x{n} causal, logits soft cap 30") for b, n in ((1, 8192), (8, 2048))]
    out += [_point("flashinfer.mla_decode", {"batch": b, "kv_len": n}, f"B={b} L={n} p64")
            for b, n in ((16, 4096), (128, 8192))]
    out.append(_point("flashinfer.rmsnorm", {}, "8192x8192 bf16"))
    # last: FlashInfer's sampling modules take the longest to compile on first use (100-300 s)
    out += [_point("flashinfer.sampling", {"top_k": k}, f"128x128256 {tag}")
            for tag, k in (("top-p", 0), ("top-k+top-p", 50))]
    return out + op_points()


def op_points() -> list[Point]:
    """The points of the ops beside attention (module docstring), at their GPU sizes; each runs on a CPU too."""
    out: list[Point] = [_point("flashinfer.fused_add_rmsnorm", {"rows": r, "hidden": h}, f"{r}x{h} bf16")
                        for r, h in ((8192, 8192), (128, 4096))]
    out += [_point("flashinfer.rope", {"tokens": 8192, "form": form}, f"8192 tokens 32+8 heads {form}")
            for form in ("pos_ids", "cos_sin_cache_inplace")]
    out += [_point("flashinfer.append_kv", {"batch": b, "new": n, "kv_len": n_kv}, label)
            for b, n, n_kv, label in ((128, 1, 8192, "decode B=128 L=8192 p16"), (1, 8192, 8192, "prefill 1x8192 p16"))]
    out += [_point("flashinfer.fp8_block_gemm", {"m": m, "n": n, "k": k}, f"{m}x{n}x{k} fp8 block")
            for m, n, k in ((8192, 8192, 8192), (128, 8192, 8192))]
    out += [_point("flashinfer.sampling_defaults", {"batch": 128, "vocab": 128256, "top_k": k},
                   f"128x128256 {tag}, default arguments") for tag, k in (("top-p", 0), ("top-k+top-p", 50))]
    return out


# -- helpers ------------------------------------------------------------------------------------------------------
def _flashinfer() -> Any:
    """The real FlashInfer, or None where it is not installed (a folder named flashinfer on the path, such as a test
    directory, or this package's compat layer installed under that name, is not it)."""
    try:
        mod = importlib.import_module("flashinfer")
    except Exception:  # noqa: BLE001 - not installed (or broken): the compat rows stand alone
        return None
    if getattr(mod, "__file__", None) is None or mod.__name__.startswith("kernel_switchboard"):
        return None
    return mod


def _compat() -> Any:
    from .. import flashinfer

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
    """Llama-3-8B heads on NHD pages of 16; ``kv_dtype="e4m3"``: fp8 pages with scalar K / V scales (bytes counted at
    one per element)."""
    b, n, page = point.params["batch"], point.params["kv_len"], 16
    hq, hkv, d, dtype = LLAMA["num_q_heads"], LLAMA["num_kv_heads"], LLAMA["head_dim"], torch.bfloat16
    kv_dtype = torch.float8_e4m3fn if point.params.get("kv_dtype") == "e4m3" else dtype
    scales = {"k_scale": 0.5, "v_scale": 2.0} if kv_dtype != dtype else {}
    indptr, indices, last = _pages(b, n, page, device)
    kv = tuple(torch.randn(int(indptr[-1]), page, hkv, d, dtype=dtype, device=device).to(kv_dtype) for _ in range(2))
    q = torch.randn(b, hq, d, dtype=dtype, device=device)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    calls: dict[str, Callable[[], Any]] = {}
    compat = _compat().BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    compat.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, kv_data_type=kv_dtype)
    calls[_compat_name(compat)] = lambda: compat.run(q, kv, **scales)
    fi = _flashinfer()
    if fi is not None:
        for name, tc in (("flashinfer (default)", False), ("flashinfer (tensor cores)", True)):
            w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD", use_tensor_cores=tc)
            w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, kv_data_type=kv_dtype)
            calls[name] = lambda w=w: w.run(q, kv, **scales)
    return _rows(preset, point, calls, device, reps_ms, 2.0 * b * n * hkv * d * kv[0].element_size(), "TB/s")


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
        cap = {"logits_soft_cap": point.params["soft_cap"]} if point.params.get("soft_cap") else {}
        ours = compat.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        ours.plan(qo, qo, hq, hkv, d, causal=True, q_data_type=dtype, **cap)
        calls[_compat_name(ours)] = lambda: ours.run(q, k, v)
        if fi is not None:
            theirs = fi.BatchPrefillWithRaggedKVCacheWrapper(torch.zeros_like(ws), "NHD")
            theirs.plan(qo, qo, hq, hkv, d, causal=True, q_data_type=dtype, **cap)
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


# -- the ops beside attention ---------------------------------------------------------------------------------------
def _chosen(op: str, *args: Any, **kwargs: Any) -> str:
    """The kernel the switchboard picks for these arguments of ``op`` (its public ones)."""
    from ..dispatch import explain

    return explain(op, *args, **kwargs).kernel.id


def _forced(op: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device,
            fresh: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None = None) -> dict[str, Callable[[], Any]]:
    """One call per eligible switchboard kernel of ``op``, forced by name (``ksb kernel <id>``; the reference only on
    a CPU). ``fresh()``: arguments of the kernel's own (for ops that write in place), else every call shares args."""
    from ..dispatch import explain
    from .measure import measured_candidates

    calls: dict[str, Callable[[], Any]] = {}
    for cand in measured_candidates(explain(op, *args, **kwargs), device):
        a, kw = fresh() if fresh is not None else (args, kwargs)
        calls[f"ksb kernel {cand.kernel.id}"] = lambda a=a, kw=kw, k=cand.kernel.id: fn(*a, backend=k, **kw)
    return calls


def _op_rows(preset: str, point: Point, calls: dict[str, Callable[[], Any]], device: torch.device, reps_ms: float,
             units: float, unit: str, extra: dict[str, Any]) -> list[Row]:
    """:func:`_rows`, the ``extra`` checks on its last row (the ratio, when there is one), and ``auto vs best kernel``: the best
    forced kernel's time over the switchboard's own call (>= 0.97 is within 3% of the best installed)."""
    rows = _rows(preset, point, calls, device, reps_ms, units, unit)
    (rows[-1] if rows else Row(preset, point.op, point.label, "-", None)).extra.update(extra)
    times = {r.kernel: r.ms for r in rows if r.ms is not None}
    ours = next((ms for name, ms in times.items() if name.startswith("kernel_switchboard")), None)
    forced = [ms for name, ms in times.items() if name.startswith("ksb kernel")]
    if ours and forced:
        rows.append(Row(preset, point.op, point.label, "auto vs best kernel", None, min(forced) / ours, "x",
                        extra={"best_kernel_ms": min(forced), "auto_ms": ours}))
    return rows


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _fused_add_rmsnorm(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from .. import ops

    rows_, hidden = point.params["rows"], point.params["hidden"]
    dtype = torch.bfloat16
    x0 = torch.randn(rows_, hidden, dtype=dtype, device=device)
    r0 = torch.randn(rows_, hidden, dtype=dtype, device=device)
    w = torch.randn(hidden, dtype=dtype, device=device)

    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x0.clone(), r0.clone(), w), {}

    compat, fi = _compat(), _flashinfer()
    (x1, r1, _), _ = fresh()
    kernel = _chosen("norm.fused_add_rms_norm", x1, r1, w)
    calls: dict[str, Callable[[], Any]] = {f"kernel_switchboard.flashinfer -> {kernel}":
                                           lambda: compat.fused_add_rmsnorm(x1, r1, w)}
    calls.update(_forced("norm.fused_add_rms_norm", ops.norm.fused_add_rms_norm, *fresh(), device, fresh))
    extra: dict[str, Any] = {}
    if fi is not None:
        (xa, ra, _), _ = fresh()
        (xb, rb, _), _ = fresh()
        compat.fused_add_rmsnorm(xa, ra, w)
        fi.fused_add_rmsnorm(xb, rb, w)
        extra = {"max_abs_diff_x": _max_diff(xa, xb), "max_abs_diff_residual": _max_diff(ra, rb)}
        (x3, r3, _), _ = fresh()
        calls["flashinfer (default)"] = lambda: fi.fused_add_rmsnorm(x3, r3, w)
    return _op_rows(preset, point, calls, device, reps_ms, float(4 * x0.numel() * x0.element_size()), "TB/s", extra)


def _rope(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from .. import ops

    tokens, form = point.params["tokens"], point.params["form"]
    hq, hkv, d, dtype, theta = LLAMA["num_q_heads"], LLAMA["num_kv_heads"], LLAMA["head_dim"], torch.bfloat16, 5e5
    q = torch.randn(tokens, hq, d, dtype=dtype, device=device)
    k = torch.randn(tokens, hkv, d, dtype=dtype, device=device)
    compat, fi = _compat(), _flashinfer()
    calls: dict[str, Callable[[], Any]] = {}
    extra: dict[str, Any] = {}
    if form == "pos_ids":
        pos = torch.arange(tokens, dtype=torch.int32, device=device)
        kernel = _chosen("rope.apply", q, k, pos, theta=theta)
        calls[f"kernel_switchboard.flashinfer -> {kernel}"] = lambda: compat.apply_rope_pos_ids(q, k, pos, rope_theta=theta)
        calls.update(_forced("rope.apply", ops.rope.apply, (q, k, pos), {"theta": theta}, device))
        if fi is not None:
            got = compat.apply_rope_pos_ids(q, k, pos, rope_theta=theta)
            want = fi.apply_rope_pos_ids(q, k, pos, rope_theta=theta)
            extra = {"max_abs_diff_q": _max_diff(got[0], want[0]), "max_abs_diff_k": _max_diff(got[1], want[1])}
            calls["flashinfer (default)"] = lambda: fi.apply_rope_pos_ids(q, k, pos, rope_theta=theta)
    else:
        pos64 = torch.arange(tokens, dtype=torch.int64, device=device)
        table = ops.rope.cos_sin_cache(tokens, d, theta, device=device)
        qf, kf = q.view(tokens, hq * d), k.view(tokens, hkv * d)  # vLLM's and SGLang's flattened heads
        kernel = _chosen("rope.apply_cos_sin_cache", q, k, pos64, table, inplace=True)
        calls[f"kernel_switchboard.flashinfer -> {kernel}"] = \
            lambda: compat.apply_rope_with_cos_sin_cache_inplace(pos64, qf, kf, d, table)
        calls.update(_forced("rope.apply_cos_sin_cache", ops.rope.apply_cos_sin_cache, (q, k, pos64, table),
                             {"inplace": True, "check_positions": False}, device))
        if fi is not None:
            qa, ka, qb, kb = qf.clone(), kf.clone(), qf.clone(), kf.clone()
            compat.apply_rope_with_cos_sin_cache_inplace(pos64, qa, ka, d, table)
            fi.apply_rope_with_cos_sin_cache_inplace(pos64, qb, kb, d, table)
            extra = {"max_abs_diff_q": _max_diff(qa, qb), "max_abs_diff_k": _max_diff(ka, kb)}
            calls["flashinfer (default)"] = lambda: fi.apply_rope_with_cos_sin_cache_inplace(pos64, qf, kf, d, table)
    return _op_rows(preset, point, calls, device, reps_ms, float(2 * (q.numel() + k.numel()) * q.element_size()),
                    "TB/s", extra)


def _append_kv(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from .. import ops
    from ..paged import PagedKVCache

    b, new, kv_len, page = point.params["batch"], point.params["new"], point.params["kv_len"], 16
    hkv, d, dtype = LLAMA["num_kv_heads"], LLAMA["head_dim"], torch.bfloat16
    indptr, indices, last = _pages(b, kv_len, page, device)
    nnz = b * new
    compat, fi = _compat(), _flashinfer()
    append_indptr = torch.arange(0, (b + 1) * new, new, dtype=torch.int32, device=device)
    seq_lens = torch.full((b,), kv_len, dtype=torch.int32, device=device)
    batch_indices, positions = compat.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    k = torch.randn(nnz, hkv, d, dtype=dtype, device=device)
    v = torch.randn(nnz, hkv, d, dtype=dtype, device=device)

    def pages() -> tuple[torch.Tensor, torch.Tensor]:
        shape = (int(indptr[-1]), page, hkv, d)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    ours = pages()
    cache = PagedKVCache(*ours, "NHD")
    args = (k, v, cache, indptr, indices, positions, batch_indices)  # what the compat function calls
    kernel = _chosen("kv_cache.append_csr", *args, check_indices=False)
    calls: dict[str, Callable[[], Any]] = {
        f"kernel_switchboard.flashinfer -> {kernel}":
            lambda: compat.append_paged_kv_cache(k, v, batch_indices, positions, ours, indices, indptr, last, "NHD")}
    calls.update(_forced("kv_cache.append_csr", ops.kv_cache.append_csr, args, {"check_indices": False}, device))
    extra: dict[str, Any] = {}
    if fi is not None:
        theirs = pages()
        fi.append_paged_kv_cache(k, v, batch_indices, positions, theirs, indices, indptr, last, "NHD")
        compat.append_paged_kv_cache(k, v, batch_indices, positions, ours, indices, indptr, last, "NHD")
        extra = {"max_abs_diff_pages": max(_max_diff(ours[0], theirs[0]), _max_diff(ours[1], theirs[1]))}
        calls["flashinfer (default)"] = \
            lambda: fi.append_paged_kv_cache(k, v, batch_indices, positions, theirs, indices, indptr, last, "NHD")
    return _op_rows(preset, point, calls, device, reps_ms, float(4 * k.numel() * k.element_size()), "TB/s", extra)


def _block_scaled(m: int, n: int, k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """fp8 e4m3 a (M, K) and w (N, K) row-major, scales sa (M, K/128) per 1x128 group and sw (N/128, K/128) per
    128x128 block (DeepSeek-V3's layout), and the float32 product of the dequantised operands. The scales are powers
    of two, which every implementation (DeepGEMM's UE8M0 scales included) represents exactly."""
    fp8 = torch.float8_e4m3fn
    a = (torch.randn(m, k, device=device) * 100).clamp(-448, 448).to(fp8)
    w = (torch.randn(n, k, device=device) * 100).clamp(-448, 448).to(fp8)
    sa = torch.exp2(torch.randint(-10, -5, (m, -(-k // 128)), device=device).float())
    sw = torch.exp2(torch.randint(-10, -5, (-(-n // 128), -(-k // 128)), device=device).float())
    a_deq = a.float() * sa.repeat_interleave(128, 1)[:, :k]
    w_deq = w.float() * sw.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return a, w, sa, sw, a_deq @ w_deq.t()


def _rel_err(got: Any, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


def _fp8_block_gemm(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from .. import ops

    m, n, k = point.params["m"], point.params["n"], point.params["k"]
    out = torch.bfloat16
    a, w, sa, sw, want = _block_scaled(m, n, k, device)
    b, sb = w.t(), sw.t().contiguous()  # (K, N) column-major, (K/128, N/128): the switchboard's operands
    kernel = _chosen("gemm.mm_fp8", a, b, sa, sb, out_dtype=out)
    calls: dict[str, Callable[[], Any]] = {f"kernel_switchboard gemm.mm_fp8 -> {kernel}":
                                           lambda: ops.gemm.mm_fp8(a, b, sa, sb, out_dtype=out)}
    calls.update(_forced("gemm.mm_fp8", ops.gemm.mm_fp8, (a, b, sa, sb), {"out_dtype": out}, device))
    candidates: dict[str, Callable[[], Any]] = {}
    extra: dict[str, Any] = {}
    if _flashinfer() is not None:
        try:
            fi_gemm = importlib.import_module("flashinfer.gemm").fp8_blockscale_gemm_sm90
            candidates["flashinfer fp8_blockscale_gemm_sm90"] = lambda: fi_gemm(a, w, sa, sw, out_dtype=out)
        except Exception as exc:  # noqa: BLE001 - a FlashInfer without it: said in the rows, ours still timed
            extra["unavailable flashinfer fp8_blockscale_gemm_sm90"] = f"{type(exc).__name__}: {exc}"[:200]
    sa_col = sa.t().contiguous().t()  # cuBLAS's block scales: (M, K/128) outer-dim major, (K/128, N/128) from sw
    candidates["torch._scaled_mm block 1x128/128x128"] = \
        lambda: torch._scaled_mm(a, b, scale_a=sa_col, scale_b=sw.t(), out_dtype=out)
    one = torch.ones((), device=device)
    calls_tensor = {"torch._scaled_mm per-tensor (cuBLAS)":
                    lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out)}
    extra["rel_err kernel_switchboard"] = _rel_err(calls[next(iter(calls))](), want)
    for name, call in candidates.items():
        try:
            extra[f"rel_err {name}"] = _rel_err(call(), want)
            calls[name] = call
        except Exception as exc:  # noqa: BLE001 - not served here (architecture, version): a row with the reason
            extra[f"unavailable {name}"] = f"{type(exc).__name__}: {exc}"[:200]
    calls.update(calls_tensor)  # the per-tensor anchor computes another product: timed, not compared
    rows = _op_rows(preset, point, calls, device, reps_ms, 2.0 * m * n * k, "TFLOP/s", extra)
    times = {r.kernel: r.ms for r in rows if r.ms is not None}
    ours = next((ms for name, ms in times.items() if name.startswith("kernel_switchboard")), None)
    for name in ("torch._scaled_mm block 1x128/128x128", "torch._scaled_mm per-tensor (cuBLAS)"):
        if ours and times.get(name):
            rows.append(Row(preset, point.op, point.label, f"ratio vs {name}", None, times[name] / ours, "x",
                            extra={"theirs_ms": times[name], "compat_ms": ours}))
    return rows


def _sampling_defaults(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    """``ksb.sampling`` with its default arguments (invalid rows answered on the device, no host read) beside
    FlashInfer's defaults, and the opt-in host check (``check_nan=True``) for its cost."""
    from .. import ops

    batch, vocab, k = point.params["batch"], point.params["vocab"], point.params["top_k"]
    probs = torch.softmax(torch.randn(batch, vocab, device=device), -1)
    top_k = k or None
    kernel = _chosen("sampling.top_k_top_p", probs, top_k, 0.9)
    calls: dict[str, Callable[[], Any]] = {
        f"kernel_switchboard sampling.top_k_top_p -> {kernel}": lambda: ops.sampling.top_k_top_p(probs, top_k, 0.9)}
    calls.update(_forced("sampling.top_k_top_p", ops.sampling.top_k_top_p, (probs, top_k, 0.9), {}, device))
    calls["ksb check_nan=True (host check)"] = lambda: ops.sampling.top_k_top_p(probs, top_k, 0.9, check_nan=True)
    fi = _flashinfer()
    if fi is not None:
        calls["flashinfer (default)"] = ((lambda: fi.top_k_top_p_sampling_from_probs(probs, k, 0.9)) if k
                                         else (lambda: fi.top_p_sampling_from_probs(probs, 0.9)))
    tokens = calls[next(iter(calls))]()
    keep = ops.sampling.renorm(probs, top_k, 0.9) > 0
    extra = {"tokens_in_support": bool(keep.gather(1, tokens[:, None].clamp_min(0)).all() and (tokens >= 0).all())}
    return _op_rows(preset, point, calls, device, reps_ms, float(probs.numel() * 4), "GB/s", extra)


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


def host_overhead(device: torch.device) -> dict[str, Any]:
    """Microseconds per call: the switchboard decode plan's ``run`` and the compat wrapper's ``run`` over it, both
    with a runner that launches nothing, for the pages as a (k, v) pair (SGLang), as one (pages, 2, ...) tensor
    (vLLM, writing a given ``out``) and with ``return_lse`` (FlashInfer's base-2 LSE against the native plan's natural
    one: free where the kernel writes base 2, one conversion launch otherwise; ``lse_kernel`` says which)."""
    from ..ops.attention_runner import Base2LSE, lse_base
    from ..paged import PagedKVCache

    compat = _compat()
    b, hq, hkv, d, page = 4, 4, 2, 64, 16
    indptr, indices, last = _pages(b, 40, page, device)
    pages = int(indptr[-1])
    bf16 = torch.bfloat16  # an engine's dtype: the kernels ranked for it are those a real step gets
    kv5 = torch.randn(pages, 2, page, hkv, d, device=device, dtype=bf16)
    k, v = kv5[:, 0], kv5[:, 1]
    q = torch.randn(b, hq, d, device=device, dtype=bf16)
    out = torch.empty(b, hq, d, device=device, dtype=bf16)
    wrapper = compat.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=device), "NHD")
    wrapper.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=bf16)
    # the wrapper's plans, and the native plan with a natural-log LSE to compare with: the wrapper's LSE plan wants
    # base 2, which its kernel writes itself (Triton's) or the plan converts after the run (one launch, counted here)
    plan, plan_lse2 = wrapper._plan_for(None, False), wrapper._plan_for(None, True, True)
    plan_lse = wrapper._plan_for(None, True, False)
    lse = torch.empty(b, hq, device=device)
    for p in (plan, plan_lse, plan_lse2):
        p._runner = lse_base(_NoKernel(torch.empty(b, hq, d, device=device, dtype=bf16), lse), p.kernel, p.params)
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
            "compat_lse_us": with_lse, "overhead_lse_us": with_lse - native_lse,
            "lse_kernel": plan_lse2.kernel.id, "lse_converted_after_run": isinstance(plan_lse2._runner, Base2LSE)}


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
    "flashinfer.rmsnorm": _rmsnorm, "flashinfer.fused_add_rmsnorm": _fused_add_rmsnorm, "flashinfer.rope": _rope,
    "flashinfer.append_kv": _append_kv, "flashinfer.fp8_block_gemm": _fp8_block_gemm,
    "flashinfer.sampling_defaults": _sampling_defaults}
