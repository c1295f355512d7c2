"""``switchboard bench --preset beyond``: POD, batch invariance, fp8 prefill and MLA prefill against their baselines.

Each point runs its own comparison (a :class:`~kernel_switchboard.bench.points.RunPoint` carries its runner) and reports
rows like every other preset (ms, TFLOP/s or TB/s, and in ``extra`` the ratios and checks):

- **POD**, 1 prefill of 4096 tokens + 64 decodes at L=4096 (Llama-3-8B heads, bf16, pages of 16): ``plan_pod`` (the
  automatic choice, eager and in a CUDA graph), the Triton POD kernel's schedules, the switchboard's prefill then
  decode (two plans), FlashInfer's POD and FlashInfer's prefill then decode; ``extra``: the speedup over the
  switchboard's prefill-then-decode and the max difference of each output from it;
- **batch invariance**, decode B=64 L=4096 and causal prefill 1x8192: the automatic plan outside and inside
  ``ksb.batch_invariant()`` (eager and in a CUDA graph), ``extra``: the cost ratio and whether a request's bits are
  the same alone and in the batch (inside the scope; outside it, for comparison);
- **fp8 prefill**, causal 1x8192 and 4x4096 over pages of 128: ``triton:prefill_fp8`` (e4m3 queries and pages, scaled
  by their amax / 448) and the bf16 kernels, TFLOP/s and the max error of each against the float32 attention of the
  bf16 inputs the fp8 ones were quantised from;
- **MLA prefill**, DeepSeek-V3 latents (128 heads, 512 + 64, pages of 64): a 4096-token prompt and a 1024-token chunk
  after 7168 cached tokens, ``plan_mla_prefill`` against FlashInfer's ``BatchMLAPagedAttentionWrapper``.

FlashInfer rows appear when ``flashinfer`` imports (``KSB_BENCH_FLASHINFER=0`` leaves them out: its JIT takes
minutes on first use).
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from typing import Any

import torch

from ..invariance import batch_invariant
from ..paged import PagedKVCache, PageTable
from ..testing.cases.attention import AttnSpec, decode_case, indptr, mla_prefill_case, pod_case, prefill_case
from .points import Point, Row, RunPoint
from .timing import captured_graph, time_ms

_Call = Callable[[], Any]
BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


def points() -> list[Point]:
    """The preset's points; POD last, since FlashInfer's POD module takes minutes to compile on first use."""
    return [
        RunPoint("attention.decode", {"batch": 64, "kv_len": 4096}, "batch-invariant decode B=64 L=4096",
                    _invariant_decode),
        RunPoint("attention.prefill", {"batch": 1, "q_len": 8192}, "batch-invariant prefill 1x8192",
                    _invariant_prefill),
        RunPoint("attention.prefill", {"batch": 1, "q_len": 8192}, "fp8 prefill 1x8192 p128", _fp8_prefill),
        RunPoint("attention.prefill", {"batch": 4, "q_len": 4096}, "fp8 prefill 4x4096 p128", _fp8_prefill),
        RunPoint("attention.mla_prefill", {"batch": 1, "q_len": 4096, "kv_len": 4096}, "MLA prefill 1x4096 H=128",
                    _mla_prefill),
        RunPoint("attention.mla_prefill", {"batch": 1, "q_len": 1024, "kv_len": 8192},
                    "MLA chunk 1024 after 7168 H=128", _mla_prefill),
        RunPoint("attention.pod", {"prefill": 4096, "decodes": 64, "kv_len": 4096}, "1x4096 prefill + 64 decodes L=4096",
                    _pod),
    ]


# -- helpers ----------------------------------------------------------------------------------------------
def _flashinfer() -> Any:
    if os.environ.get("KSB_BENCH_FLASHINFER", "1") == "0":
        return None
    try:
        return importlib.import_module("flashinfer")
    except Exception:  # noqa: BLE001 - not installed or broken: its rows are left out
        return None


def _out(result: Any) -> torch.Tensor:
    """The out tensor of an attention result (out, or a tuple that starts with it)."""
    return result[0] if isinstance(result, tuple) else result  # type: ignore[no-any-return]


def _max_diff(a: Any, b: Any) -> float:
    """Max |a - b| of two attention outputs (tensors or results whose first item is out), NaN counted as inf."""
    return (_out(a).float() - _out(b).float()).abs().nan_to_num(float("inf")).max().item()


class _Rows:
    """Rows of one point: ``add(name, call)`` times a call (or records its error)."""

    def __init__(self, preset: str, point: Point, device: torch.device, reps_ms: float, units: float, unit: str) -> None:
        self.preset, self.point, self.device, self.reps_ms = preset, point, device, reps_ms
        self.units, self.unit = units, unit
        self.rows: list[Row] = []

    def add(self, name: str, call: _Call, **extra: Any) -> Row:
        try:
            call()  # warm-up: compiles and plans outside the timing
            ms = time_ms(call, self.device, self.reps_ms)
            metric = self.units / (ms * 1e-3) / 1e12 if self.units else None
            row = Row(self.preset, self.point.op, self.point.label, name, ms, metric, self.unit, extra=dict(extra))
        except Exception as exc:  # noqa: BLE001 - one failing row does not stop the point
            row = Row(self.preset, self.point.op, self.point.label, name, None, error=f"{type(exc).__name__}: {exc}"[:300])
        self.rows.append(row)
        return row

    def graph(self, name: str, call: _Call, **extra: Any) -> Row | None:
        """The row of ``call`` replayed from a CUDA graph (the GPU time alone)."""
        if self.device.type != "cuda":
            return None
        try:
            call()
            replay = captured_graph(call).replay
        except Exception as exc:  # noqa: BLE001
            row = Row(self.preset, self.point.op, self.point.label, f"{name} [graph]", None,
                      error=f"{type(exc).__name__}: {exc}"[:300])
            self.rows.append(row)
            return row
        return self.add(f"{name} [graph]", replay, **extra)


def _ratio(rows: list[Row], num: str, den: str, key: str) -> None:
    """``extra[key]`` of row ``num``: its time over row ``den``'s."""
    by = {r.kernel: r for r in rows}
    a, b = by.get(num), by.get(den)
    if a is not None and b is not None and a.ms and b.ms:
        a.extra[key] = a.ms / b.ms


# -- POD --------------------------------------------------------------------------------------------------
def _pod(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from ..ops.attention import plan_decode, plan_pod, plan_prefill

    n, decodes, kv_len = point.params["prefill"], point.params["decodes"], point.params["kv_len"]
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(n,), q_lens=(n,))
    case = pod_case(spec, (kv_len,) * decodes, device, seed=1)
    q, qo, q_d, cache, table_p, table_d = case.args
    flops = 2.0 * (n * (n + 1) / 2) * 32 * 256 + 2.0 * decodes * kv_len * 32 * 256
    rows = _Rows(preset, point, device, reps_ms, flops, "TFLOP/s")
    dims: dict[str, Any] = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, page_size=16)
    prefill = plan_prefill(table_p, qo, **dims)
    decode = plan_decode(table_d, **dims)
    want_p, want_d = _out(prefill.run(q, cache)).clone(), _out(decode.run(q_d, cache)).clone()

    def sequential() -> Any:
        return prefill.run(q, cache), decode.run(q_d, cache)

    seq = f"ksb prefill then decode ({prefill.kernel.id} + {decode.kernel.id}) [plan]"
    rows.add(seq, sequential)
    rows.graph(seq[:-7], sequential)
    pod = plan_pod(table_p, qo, table_d, **dims)
    got = pod.run(q, q_d, cache)
    checks = {"max_diff_prefill": _max_diff(got[0], want_p), "max_diff_decode": _max_diff(got[1], want_d)}
    name = f"plan_pod -> {pod.kernel.id}"
    rows.add(f"{name} [plan]", lambda: pod.run(q, q_d, cache), **checks)
    rows.graph(name, lambda: pod.run(q, q_d, cache))
    triton_pod: Any
    try:
        from kernel_switchboard_triton import _pod as triton_pod  # the schedules of the Triton kernel
    except ImportError:
        triton_pod = None
    if triton_pod is not None and device.type == "cuda":
        for schedule, co_resident in (("decode_first", False), ("interleave", False), ("decode_first", True),
                                      ("interleave", True)):
            cfg = triton_pod.pod_config(device, 128, 128, 4, 2 ** math.ceil(math.log2(4 * n)), schedule, co_resident)
            runner = triton_pod.PODRunner(pod.problem, table_p, pod.params, qo_indptr=qo, decode_table=table_d,
                                          config=cfg)
            out = runner.run(q, q_d, cache, None, None, None, None)
            rows.add(f"triton:pod {schedule}{' co-resident' if co_resident else ''}",
                     lambda r=runner: r.run(q, q_d, cache, None, None, None, None),
                     max_diff_prefill=_max_diff(out[0], want_p), max_diff_decode=_max_diff(out[1], want_d))
    _flashinfer_pod(rows, q, qo, q_d, cache, table_p, table_d, want_p, want_d)
    for r in rows.rows:
        _ratio(rows.rows, r.kernel, seq if not r.kernel.endswith("[graph]") else seq[:-7] + " [graph]",
               "time_over_ksb_prefill_then_decode")
    return rows.rows


def _flashinfer_pod(rows: _Rows, q: torch.Tensor, qo: torch.Tensor, q_d: torch.Tensor, cache: PagedKVCache,
                    table_p: PageTable, table_d: PageTable, want_p: torch.Tensor, want_d: torch.Tensor) -> None:
    """FlashInfer's POD (the batch wrapper over paged KV for both parts where it has one, else the single-prefill
    wrapper on the prefill's contiguous K/V) and its prefill then decode, planned once."""
    fi = _flashinfer()
    if fi is None:
        return
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    kv = (cache.k_pages, cache.v_pages)
    ps = cache.page_size
    csr_p, csr_d = table_p.to_csr(ps), table_d.to_csr(ps)
    heads = dict(num_qo_heads=q.shape[1], num_kv_heads=cache.num_kv_heads)
    try:
        if hasattr(fi, "BatchPODWithPagedKVCacheWrapper"):
            w = fi.BatchPODWithPagedKVCacheWrapper(ws, "NHD")
            qo_d = torch.arange(q_d.shape[0] + 1, dtype=torch.int32, device=q.device)
            w.plan(qo, csr_p[0], csr_p[1], csr_p[2], qo_d, csr_d[0], csr_d[1], csr_d[2], **heads, head_dim=q.shape[2],
                   page_size=ps, q_data_type=q.dtype, kv_data_type=cache.dtype)

            def pod() -> Any:
                return w.run(q, kv, q_d, kv, causal_p=True)

            name = "[ext] flashinfer BatchPOD"
        else:
            n = int(table_p.seq_lens[0])
            pages = table_p.block_table[0, :(n + ps - 1) // ps].long()
            k_p = cache.k_pages[pages].flatten(0, 1)[:n].contiguous()
            v_p = cache.v_pages[pages].flatten(0, 1)[:n].contiguous()
            w = fi.PODWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(csr_d[0], csr_d[1], csr_d[2], **heads, head_dim=q.shape[2], page_size=ps, q_data_type=q.dtype,
                   kv_data_type=cache.dtype)

            def pod() -> Any:
                return w.run(q, k_p, v_p, q_d, kv, causal_p=True)

            name = "[ext] flashinfer POD"
        out_p, out_d = pod()
        rows.add(name, pod, max_diff_prefill=_max_diff(out_p, want_p), max_diff_decode=_max_diff(out_d, want_d))
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is a row with its error
        rows.rows.append(Row(rows.preset, rows.point.op, rows.point.label, "[ext] flashinfer POD", None,
                             error=f"{type(exc).__name__}: {exc}"[:300]))
    try:
        wp = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        wp.plan(qo, *csr_p, q.shape[1], cache.num_kv_heads, q.shape[2], ps, causal=True, q_data_type=q.dtype,
                kv_data_type=cache.dtype)
        ws_d = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
        wd = fi.BatchDecodeWithPagedKVCacheWrapper(ws_d, "NHD", use_tensor_cores=True)
        wd.plan(*csr_d, q.shape[1], cache.num_kv_heads, q.shape[2], ps, q_data_type=q.dtype, kv_data_type=cache.dtype)
        rows.add("[ext] flashinfer prefill then decode (tensor cores)", lambda: (wp.run(q, kv), wd.run(q_d, kv)))
    except Exception as exc:  # noqa: BLE001
        rows.rows.append(Row(rows.preset, rows.point.op, rows.point.label, "[ext] flashinfer prefill then decode",
                             None, error=f"{type(exc).__name__}: {exc}"[:300]))


# -- batch invariance -------------------------------------------------------------------------------------
def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16)))


def _invariant_decode(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from ..ops.attention import decode, plan_decode

    b, n = point.params["batch"], point.params["kv_len"]
    q, cache, table = decode_case(AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(n,) * b), device, seed=2).args
    rows = _Rows(preset, point, device, reps_ms, 2.0 * b * n * 8 * 256, "TB/s")
    dims: dict[str, Any] = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, page_size=16)
    alone = PageTable(table.block_table[:1].clone(), table.seq_lens[:1].clone())
    for scope, backend in _scopes(device):
        with batch_invariant(scope):
            plan = plan_decode(table, backend=backend, **dims)
            same = _same_bits(_out(decode(q, cache, table, backend=backend))[:1],
                              _out(decode(q[:1].clone(), cache, alone, backend=backend)))
        name = f"{'batch-invariant' if scope else 'default'} plan_decode -> {plan.kernel.id}"
        rows.add(f"{name} [plan]", lambda p=plan: p.run(q, cache), request_bits_same_alone_and_in_batch=same)
        rows.graph(name, lambda p=plan: p.run(q, cache))
    _invariance_ratios(rows.rows)
    return rows.rows


def _invariant_prefill(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from ..ops.attention import plan_prefill, prefill

    n = point.params["q_len"]
    spec = AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(n, 4096), q_lens=(n, 1))
    q, qo, cache, table = prefill_case(spec, device, seed=3).args
    one = PageTable(table.block_table[:1].clone(), table.seq_lens[:1].clone())
    q1, qo1 = q[:n].clone(), indptr([n], device)
    rows = _Rows(preset, point, device, reps_ms, 2.0 * (n * (n + 1) / 2) * 32 * 256, "TFLOP/s")
    dims: dict[str, Any] = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, page_size=16)
    for scope, backend in _scopes(device):
        with batch_invariant(scope):
            plan = plan_prefill(one, qo1, backend=backend, **dims)
            same = _same_bits(_out(prefill(q, qo, cache, table, backend=backend))[:n],
                              _out(prefill(q1, qo1, cache, one, backend=backend)))
        name = f"{'batch-invariant' if scope else 'default'} plan_prefill -> {plan.kernel.id}"
        rows.add(f"{name} [plan]", lambda p=plan: p.run(q1, cache), request_bits_same_alone_and_beside_a_decode=same)
        rows.graph(name, lambda p=plan: p.run(q1, cache))
    _invariance_ratios(rows.rows)
    return rows.rows


def _scopes(device: torch.device) -> list[tuple[bool, str | None]]:
    """(inside the scope, backend) of the rows: the automatic choice outside and inside, and on a GPU the Triton
    kernel outside (the scope's choice where FA4 is not installed, so the ratio to it is the cost of its fixed
    choices alone)."""
    return [(False, None), *([(False, "triton")] if device.type == "cuda" else []), (True, None)]


def _invariance_ratios(rows: list[Row]) -> None:
    """``extra['cost_over_default']`` of each batch-invariant row: its time over the default rows of its call kind
    (the automatic choice, and the same backend's kernel outside the scope)."""
    for r in rows:
        if r.kernel.startswith("batch-invariant") and r.ms:
            kind = "[graph]" if r.kernel.endswith("[graph]") else "[plan]"
            for d in rows:
                if d.kernel.startswith("default") and d.kernel.endswith(kind) and d.ms:
                    r.extra[f"cost_over {d.kernel}"] = r.ms / d.ms


# -- fp8 prefill --------------------------------------------------------------------------------------------
def _fp8_prefill(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from ..ops.attention import plan_prefill, prefill

    b, n = point.params["batch"], point.params["q_len"]
    spec = AttnSpec(BF16, "NHD", 128, 32, 8, 128, kv_lens=(n,) * b, q_lens=(n,) * b)
    q, qo, cache, table = prefill_case(spec, device, seed=4).args
    k_scale = cache.k_pages.float().nan_to_num(0.0).abs().amax().item() / 448
    v_scale = cache.v_pages.float().nan_to_num(0.0).abs().amax().item() / 448
    q_scale = q.float().abs().amax().item() / 448
    cache8 = PagedKVCache((cache.k_pages.float() / k_scale).to(E4M3), (cache.v_pages.float() / v_scale).to(E4M3),
                          "NHD", k_scale, v_scale)
    q8 = (q.float() / q_scale).to(E4M3)
    exact = prefill(q, qo, cache, table, backend="reference")  # float32 attention of the bf16 inputs
    rows = _Rows(preset, point, device, reps_ms, b * 2.0 * (n * (n + 1) / 2) * 32 * 256, "TFLOP/s")
    dims: dict[str, Any] = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=128)
    fp8 = plan_prefill(table, qo, dtype=E4M3, kv_dtype=E4M3, q_scale=q_scale, **dims)
    fp8_row = rows.add(f"fp8 plan_prefill -> {fp8.kernel.id}", lambda: fp8.run(q8, cache8),
                       max_err=_max_diff(fp8.run(q8, cache8), exact))
    for backend in (None, "triton:prefill_paged") if device.type == "cuda" else (None,):
        bf16 = plan_prefill(table, qo, dtype=BF16, backend=backend, **dims)
        row = rows.add(f"bf16 plan_prefill -> {bf16.kernel.id}", lambda p=bf16: p.run(q, cache),
                       max_err=_max_diff(bf16.run(q, cache), exact))
        if row.metric and fp8_row.metric:
            fp8_row.extra[f"tflops_over {row.kernel}"] = fp8_row.metric / row.metric
    return rows.rows


# -- MLA prefill ----------------------------------------------------------------------------------------------
def _mla_prefill(point: Point, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
    from ..ops.attention import plan_mla_prefill

    b, n, kv = point.params["batch"], point.params["q_len"], point.params["kv_len"]
    case = mla_prefill_case(BF16, (kv,) * b, (n,) * b, 128, 64, device, seed=5)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    scale = case.kwargs["sm_scale"]
    pairs = b * (n * kv - n * (n - 1) / 2)
    rows = _Rows(preset, point, device, reps_ms, 2.0 * pairs * 128 * (512 + 64 + 512), "TFLOP/s")
    plan = plan_mla_prefill(table, qo, num_heads=128, head_dim_ckv=512, head_dim_kpe=64, dtype=BF16, page_size=64,
                            sm_scale=scale)
    mine = _out(plan.run(q_nope, q_pe, ckv, kpe)).clone()
    name = f"plan_mla_prefill -> {plan.kernel.id}"
    rows.add(f"{name} [plan]", lambda: plan.run(q_nope, q_pe, ckv, kpe))
    rows.graph(name, lambda: plan.run(q_nope, q_pe, ckv, kpe))
    fi = _flashinfer()
    if fi is not None:
        try:
            kv_indptr, kv_indices, _ = table.to_csr(64)
            w = fi.mla.BatchMLAPagedAttentionWrapper(torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device))
            w.plan(qo, kv_indptr, kv_indices, table.seq_lens, 128, 512, 64, 64, True, scale, BF16, BF16)
            theirs = w.run(q_nope, q_pe, ckv, kpe)
            row = rows.add("[ext] flashinfer BatchMLAPagedAttentionWrapper", lambda: w.run(q_nope, q_pe, ckv, kpe),
                           max_diff_from_ksb=_max_diff(theirs, mine))
            _ratio(rows.rows, f"{name} [graph]", row.kernel, "time_over_flashinfer")
            _ratio(rows.rows, f"{name} [plan]", row.kernel, "time_over_flashinfer")
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is a row with its error
            rows.rows.append(Row(preset, point.op, point.label, "[ext] flashinfer mla", None,
                                 error=f"{type(exc).__name__}: {exc}"[:300]))
    return rows.rows
