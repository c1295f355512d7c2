"""Benchmark: the Triton attention kernels on Llama-3-8B / DeepSeek shapes.

    python packages/backend-triton/benchmarks/attention.py            # default configs
    python packages/backend-triton/benchmarks/attention.py --sweep    # also try other tiles / splits
    python packages/backend-triton/benchmarks/attention.py --compile-report   # regs/spills/smem, no GPU

``bench_attention(device, sweep=False) -> list[dict]``: one dict per (workload, implementation,
config) with ``ms`` (median, triton.testing.do_bench, L2 flushed between reps), ``tb_s`` (decode:
K and V bytes read / time) or ``tflop_s`` (prefill: causal flops / time), ``max_err`` against an
independent result on the same inputs, and ``first_call_s`` (compile + first run). Every row is
checked before it is timed; a failure becomes a row with ``error``, never an exception, so one
broken configuration never hides the others.

Workloads: decode B in {16, 128, 256} x L in {1024, 2048, 8192} (32 q heads, 8 kv heads, d 128,
bf16, page 16, HND pages: cuDNN's layout; NHD at B=128 L=8192 too); causal prefill 1x8192 and
8x2048 (paged, page 16, and ragged) with torch SDPA as an anchor; MLA decode B=128 L=8192 page 64
(128 heads, 512 + 64).

Tuning notes (sm_90 compiler output from ``--compile-report``, before any GPU run):

- decode d128, BLOCK_N 64, 4 warps: 113 registers, 39 KB shared memory, mma.sync (16-row GQA tile),
  no spills; Triton's pipeliner keeps one K/V tile in flight (page ids two iterations ahead), so
  latency is hidden by ~4 resident programs per SM. The split count comes from a waves x tokens
  model (``_attn_common.choose_splits``): B=16 gets 4 splits (512 programs, about one wave),
  B >= 128 none. If B=16 misses 2.5 TB/s, compare ``--sweep`` rows with splits 2/8/16 and BLOCK_N 128.
- prefill d128, BLOCK_M 128 (32 tokens x 4 GQA heads), BLOCK_N 64, 8 warps, 3 stages: wgmma,
  190 registers, 98 KB (paged) / 131 KB (ragged) shared memory, one program per SM. BLOCK_N 128
  reaches 255 registers. FA3/FA4 reach ~600 TFLOP/s with warp specialisation and TMA, which this
  FA2-style kernel does not use: expect the gap there.
- MLA (128 heads): arithmetic intensity ~240 flop/byte, so at 4.8 TB/s it would need ~1.1 PFLOP/s:
  the kernel is compute-bound on an H200. 64-head tiles run on wgmma (255 registers, 147 KB, no
  spills); 32- or 16-head tiles fall back to mma.sync and re-read each latent tile 4-8 times.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

HQ, HKV, D, PAGE = 32, 8, 128, 16
#: the H200 sizes; ``bench_attention(..., sizes=SMOKE)`` runs the same code on tiny shapes (CPU smoke test)
FULL = {"heads": (HQ, HKV, D), "decode_b": (16, 128, 256), "decode_l": (1024, 2048, 8192), "nhd": (128, 8192),
        "prefill": ((1, 8192), (8, 2048)), "mla": (128, 8192, 64, 128)}
SMOKE = {"heads": (4, 2, 64), "decode_b": (2,), "decode_l": (40,), "nhd": (1, 20), "prefill": ((1, 32),),
         "mla": (1, 20, 16, 16)}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _row(workload: str, impl: str, config: str, run: Callable[[], Any], check: Callable[[], float],
         amount: float, unit: str) -> dict[str, Any]:
    """Check, then time ``run``; ``amount`` bytes (unit tb_s) or flops (unit tflop_s) per call."""
    row: dict[str, Any] = {"workload": workload, "impl": impl, "config": config}
    try:
        t0 = time.perf_counter()
        run()
        _sync()
        row["first_call_s"] = round(time.perf_counter() - t0, 2)
        row["max_err"] = float(check())
        if not math.isfinite(row["max_err"]) or row["max_err"] > 0.1:
            raise AssertionError(f"max abs error {row['max_err']:.3g} against the check")
        ms = median_ms(run, rep_ms=100, warmup=25)
        row.update(ms=round(ms, 4), **{unit: round(amount / (ms * 1e-3) / 1e12, 3)})
    except Exception as exc:  # a benchmark row reports, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(row, flush=True)
    return row


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max())


def _paged(batch: int, length: int, page: int, kv_heads: int | None, dims: tuple[int, ...], layout: str,
           dev: torch.device, g: torch.Generator) -> tuple[list[torch.Tensor], Any]:
    """Pages for ``batch`` sequences of ``length`` (shuffled page order) and their PageTable;
    ``kv_heads=None``: MLA pages (P, S, d)."""
    from kernel_switchboard.paged import PageTable

    per = math.ceil(length / page)
    num = batch * per
    ids = torch.randperm(num, device=dev, generator=g).view(batch, per).to(torch.int32)
    pages = []
    for d in dims:
        if kv_heads is None:
            shape: tuple[int, ...] = (num, page, d)
        else:
            shape = (num, page, kv_heads, d) if layout == "NHD" else (num, kv_heads, page, d)
        pages.append(torch.randn(shape, device=dev, generator=g, dtype=torch.bfloat16))
    return pages, PageTable(ids, torch.full((batch,), length, dtype=torch.int32, device=dev), max_seq_len=length)


# -- decode ---------------------------------------------------------------------------------------
#: decode tiles the sweep tries: (BLOCK_N, warps, stages)
DECODE_TILES = ((64, 4, 3), (128, 4, 3), (64, 4, 4), (32, 4, 4), (128, 8, 3), (64, 8, 2))


def _decode_point(batch: int, length: int, layout: str, dev: torch.device, g: torch.Generator, sweep: bool,
                  heads: tuple[int, int, int] = (HQ, HKV, D), graph: bool = False,
                  tiles: tuple[tuple[int, int, int], ...] = DECODE_TILES,
                  splits: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[dict[str, Any]]:
    """Rows of the default plan and, with ``sweep``, of each (BLOCK_N, warps, stages) in ``tiles`` x split count in
    ``splits``; ``graph``: time each plan's run replayed in a CUDA graph (the GPU time, for small batches whose
    eager runs are host-bound)."""
    from kernel_switchboard.paged import PagedKVCache
    from kernel_switchboard.reference import attention as ref
    from kernel_switchboard_triton._decode import DecodeConfig, DecodePlan

    hq, hkv, d = heads
    (k, v), table = _paged(batch, length, PAGE, hkv, (d, d), layout, dev, g)
    cache = PagedKVCache(k, v, layout)
    q = torch.randn(batch, hq, d, device=dev, generator=g, dtype=torch.bfloat16)
    p = SimpleNamespace(sm_scale=d ** -0.5, logits_soft_cap=None, window_left=-1, causal=True, return_lse=False,
                        max_q_len=1, max_kv_len=length, variant=None)
    want = ref.decode(q, cache, table, p)[0]
    nbytes = 2.0 * batch * length * hkv * d * 2
    workload = f"decode B={batch} L={length} {layout} p{PAGE}"
    out = torch.empty(batch, hq, d, device=dev, dtype=torch.bfloat16)
    plans = [DecodePlan(table, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=d, sm_scale=p.sm_scale,
                        logits_soft_cap=None, window_left=-1, max_kv_len=length)]
    if sweep:
        base = plans[0].cfg
        seen = {base}
        for n_splits in sorted({*splits, base.num_splits}):
            for block_n, warps, stages in tiles:
                cfg = DecodeConfig(base.block_h, block_n, n_splits, warps, stages, False)
                if cfg not in seen and n_splits * 2 * block_n <= length:
                    seen.add(cfg)
                    plans.append(DecodePlan(table, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=d,
                                            sm_scale=p.sm_scale, logits_soft_cap=None, window_left=-1,
                                            max_kv_len=length, cfg=cfg))
    rows = []
    for i, plan in enumerate(plans):
        c = plan.cfg
        run = (lambda plan=plan: plan.run(q, cache, out))
        if graph and dev.type == "cuda":
            run()  # compile outside the capture
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                run()
            run = cuda_graph.replay
        rows.append(_row(workload + (" graph" if graph else ""), "triton" if i == 0 else "triton (sweep)",
                         f"splits={c.num_splits} BLOCK_N={c.block_n} warps={c.num_warps} stages={c.num_stages}",
                         run, lambda run=run: (run(), _err(out, want))[1], nbytes, "tb_s"))
    return rows


# -- prefill --------------------------------------------------------------------------------------
def _prefill_point(batch: int, length: int, dev: torch.device, g: torch.Generator, sweep: bool,
                   heads: tuple[int, int, int] = (HQ, HKV, D)) -> list[dict[str, Any]]:
    from kernel_switchboard.paged import PagedKVCache
    from kernel_switchboard_triton._prefill import PrefillConfig, launch_prefill

    hq, hkv, d = heads
    total = batch * length
    q = torch.randn(total, hq, d, device=dev, generator=g, dtype=torch.bfloat16)
    k = torch.randn(total, hkv, d, device=dev, generator=g, dtype=torch.bfloat16)
    v = torch.randn(total, hkv, d, device=dev, generator=g, dtype=torch.bfloat16)
    indptr = torch.arange(0, total + 1, length, device=dev, dtype=torch.int32)
    p = SimpleNamespace(sm_scale=d ** -0.5, logits_soft_cap=None, window_left=-1, causal=True, return_lse=False,
                        max_q_len=length, max_kv_len=length, variant=None)
    flops = 4.0 * batch * hq * d * length * length / 2  # causal: half of QK^T and PV

    def sdpa() -> torch.Tensor:
        qs = q.view(batch, length, hq, d).transpose(1, 2)
        ks = k.view(batch, length, hkv, d).transpose(1, 2)
        vs = v.view(batch, length, hkv, d).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(total, hq, d)

    want = sdpa()
    workload = f"prefill causal {batch}x{length}"
    rows = [_row(workload, "torch sdpa", "", sdpa, lambda: 0.0, flops, "tflop_s")]
    out = torch.empty(total, hq, d, device=dev, dtype=torch.bfloat16)
    # paged views of the same K/V (pages in sequence order, NHD): page 16, and page 128 for TMA page tiles
    lens = torch.full((batch,), length, device=dev, dtype=torch.int32)

    def paged_views(page: int) -> tuple[PagedKVCache, torch.Tensor]:
        bt = torch.arange(total // page, device=dev, dtype=torch.int32).view(batch, length // page)
        return PagedKVCache(k.view(total // page, page, hkv, d), v.view(total // page, page, hkv, d), "NHD"), bt

    pages = {page: paged_views(page) for page in (PAGE, 128) if length % page == 0}
    cfgs: list[PrefillConfig | None] = [None]
    if sweep:
        # pointer-load tiles lose to TMA tiles (default 128x128, 8 warps, 3 stages, TMA; ptxas sm_90: 212 registers,
        # no stack; pointer loads 255 registers and 632 B (ragged) / 1224 B (paged) of stack). Swept: narrower tiles at
        # the causal diagonal (diag_n, 64 by default), which skip keys past it; paged only where pages hold whole tiles
        for bm, bn, warps, stages, diag, tma in ((128, 128, 8, 3, 0, True), (128, 128, 8, 3, 32, True),
                                                 (128, 128, 8, 3, 0, False), (128, 128, 8, 3, 64, False)):
            cfgs.append(PrefillConfig(bm, bn, warps, stages, False, tma=tma, diag_n=diag))
    for cfg in cfgs:
        name = "default" if cfg is None else f"BLOCK_M={cfg.block_m} BLOCK_N={cfg.block_n} warps={cfg.num_warps} " \
                                              f"stages={cfg.num_stages}" + (" tma" if cfg.tma else "") \
                                              + (f" diag_n={cfg.diag_n}" if cfg.diag_n else "")
        ragged = (lambda cfg=cfg: launch_prefill(q, k, v, indptr, indptr, None, None, None, 1, out, None, p, cfg))
        rows.append(_row(workload, "triton ragged", name, ragged, lambda r=ragged: (r(), _err(out, want))[1],
                         flops, "tflop_s"))
        for page in (128,) if cfg is not None and cfg.tma else (PAGE, 128) if cfg is None else (PAGE,):
            if page not in pages:
                continue
            cache, bt = pages[page]
            paged = (lambda cfg=cfg, cache=cache, bt=bt, page=page: launch_prefill(
                q, cache.k_pages, cache.v_pages, indptr, None, bt, lens, "NHD", page, out, None, p, cfg))
            rows.append(_row(workload, f"triton paged p{page}", name, paged,
                             lambda r=paged: (r(), _err(out, want))[1], flops, "tflop_s"))
    return rows


# -- MLA ------------------------------------------------------------------------------------------
def _mla_point(dev: torch.device, g: torch.Generator, sweep: bool, batch: int = 128, length: int = 8192,
               page: int = 64, heads: int = 128, graph: bool = False, splits: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Rows of the default configuration and, with ``sweep``, of the other kernels and of the default with one
    split and each count in ``splits``; ``graph``: each replayed in a CUDA graph (the GPU time alone)."""
    from kernel_switchboard.reference import attention as ref
    from kernel_switchboard_triton._common import gluon_clusters, gluon_hopper
    from kernel_switchboard_triton._decode import round_len
    from kernel_switchboard_triton._mla import MLAConfig, mla_config, mla_decode

    (ckv, kpe), table = _paged(batch, length, page, None, (512, 64), "NHD", dev, g)
    ckv.mul_(0.3)
    qn = torch.randn(batch, heads, 512, device=dev, generator=g, dtype=torch.bfloat16)
    qp = torch.randn(batch, heads, 64, device=dev, generator=g, dtype=torch.bfloat16)
    p = SimpleNamespace(sm_scale=(512 + 64) ** -0.5, logits_soft_cap=None, window_left=-1, causal=True,
                        return_lse=False, max_q_len=1, max_kv_len=length, variant=None)
    want = ref.mla_decode(qn, qp, ckv, kpe, table, p)[0]
    nbytes = float(batch * length * (512 + 64) * 2)
    workload = f"mla decode B={batch} L={length} H={heads} p{page}"
    base = mla_config(dev, batch, heads, round_len(length), page)
    cfgs = [base]
    if sweep:
        # the Triton kernels (the warp-specialised Gluon one is the Hopper default), the Gluon kernel without warp
        # specialisation, the default with one split (BLOCK_N 32, one stage and 32-head tiles are all slower and
        # are not swept)
        for stages, tma in ((2, False), (2, True)):
            for n_splits in sorted({1, base.num_splits}):
                cfgs.append(MLAConfig(64, 64, n_splits, 8, stages, False, tma))
        cfgs += [base._replace(num_splits=s) for s in sorted({1, *splits} - {base.num_splits})]
        if base.gluon:
            cfgs += [base._replace(gluon_ws=False, num_splits=s) for s in sorted({1, base.num_splits})]
        # 2-CTA clusters sharing each tile (Triton >= 3.9); KSB_SWEEP_CLUSTER=0 leaves them out (their tests failed)
        if base.gluon_ws and heads > 64 and gluon_clusters() and os.environ.get("KSB_SWEEP_CLUSTER", "1") != "0":
            cfgs += [base._replace(cluster=True, num_splits=s) for s in sorted({1, base.num_splits, *splits})]
        if heads < 64 and gluon_hopper(dev):  # the warp-specialised kernel's 64-row tiles, the heads' rows valid
            padded = base._replace(block_h=64, block_n=64, num_warps=8, num_stages=2, tma=True, gluon=True,
                                   gluon_ws=True)
            cfgs += [padded._replace(num_splits=s) for s in sorted({1, base.num_splits, *splits})]
    rows = []
    for i, cfg in enumerate(cfgs):
        run = (lambda cfg=cfg: mla_decode(qn, qp, ckv, kpe, table, p, cfg)[0])
        if graph and dev.type == "cuda":
            out = run()  # compile outside the capture
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                out = run()
            run = (lambda cuda_graph=cuda_graph, out=out: (cuda_graph.replay(), out)[1])
        rows.append(_row(workload + (" graph" if graph else ""), "triton" if i == 0 else "triton (sweep)",
                         f"BLOCK_H={cfg.block_h} BLOCK_N={cfg.block_n} splits={cfg.num_splits} warps={cfg.num_warps} "
                         f"stages={cfg.num_stages} tma={cfg.tma} gluon={cfg.gluon} gluon_ws={cfg.gluon_ws}"
                         f"{' cluster=2' if cfg.cluster else ''}", run,
                         lambda run=run: _err(run(), want), nbytes, "tb_s"))
    return rows


def bench_attention(device: str | torch.device = "cuda", sweep: bool = False,
                    sizes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every workload of the module docstring; returns the rows (also printed as they finish)."""
    dev = torch.device(device)
    sz = FULL if sizes is None else sizes
    g = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for batch in sz["decode_b"]:
        for length in sz["decode_l"]:
            rows += _decode_point(batch, length, "HND", dev, g, sweep, sz["heads"])
            _free(dev)
    rows += _decode_point(*sz["nhd"], "NHD", dev, g, sweep, sz["heads"])
    _free(dev)
    for batch, length in sz["prefill"]:
        rows += _prefill_point(batch, length, dev, g, sweep, sz["heads"])
        _free(dev)
    batch, length, page, heads = sz["mla"]
    rows += _mla_point(dev, g, sweep, batch, length, page, heads)
    return rows


def _free(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# -- compiler report (no GPU needed) ----------------------------------------------------------------------
def _compile(fn: Any, ptrs: dict[str, str], constexprs: dict[str, Any], warps: int, stages: int, arch: int) -> dict[str, Any]:
    """Compile one jit kernel for ``sm_<arch>`` on the host; registers and stack (spill) bytes from cuobjdump."""
    import inspect
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in constexprs else ptrs.get(n, "i32" if n.startswith("stride") or n in
                                                            ("window_left", "batch", "heads", "kv_heads") else "fp32")
           for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n.startswith("stride")}
    k = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
    row: dict[str, Any] = {"smem_bytes": k.metadata.shared, "wgmma": "wgmma" in k.asm.get("ptx", "")}
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    for key, field in (("REG:", "regs"), ("STACK:", "stack_bytes"), ("LOCAL:", "local_bytes")):
        if key in usage:
            row[field] = int(usage.split(key)[1].split()[0])
    return row


def compile_report(arch: int = 90) -> list[dict[str, Any]]:
    """Registers, spills, shared memory and wgmma use of the default configs, compiled here for ``sm_<arch>``."""
    from kernel_switchboard_triton import _decode, _mla, _prefill

    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    decode_ptrs = {"q_ptr": bf, "k_ptr": bf, "v_ptr": bf, "block_table_ptr": i32, "seq_lens_ptr": i32, "o_ptr": f32,
                   "lse_ptr": f32}
    prefill_ptrs = {"q_ptr": bf, "k_ptr": bf, "v_ptr": bf, "qo_indptr_ptr": i32, "kv_indptr_ptr": i32,
                    "block_table_ptr": i32, "seq_lens_ptr": i32, "o_ptr": bf, "lse_ptr": f32}
    mla_ptrs = {"qn_ptr": bf, "qp_ptr": bf, "ckv_ptr": bf, "kpe_ptr": bf, "block_table_ptr": i32, "seq_lens_ptr": i32,
                "o_ptr": f32, "lse_ptr": f32}
    jobs: list[tuple[str, Any, dict[str, str], dict[str, Any], int, int]] = []
    for d, bn, warps, stages in ((128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 4, 3), (256, 32, 4, 3), (64, 64, 4, 3)):
        jobs.append((f"decode d{d} BLOCK_N={bn} warps={warps} stages={stages}", _decode._decode_split_kernel, decode_ptrs,
                     dict(GROUP=4, BLOCK_H=16, HEAD_DIM=d, HEAD_DIM_V=d, BLOCK_D=d, BLOCK_DV=d, PAGE_SIZE=16,
                          BLOCK_N=bn, NUM_SPLITS=2, SOFT_CAP=False, DOT_FP32=False), warps, stages))
    hooks = dict(SCORE_MOD=None, MASK_MOD=None, OUTPUT_MOD=None, HAS_SCORE_MOD=False, HAS_MASK_MOD=False,
                 HAS_OUTPUT_MOD=False, SOFTMAX=True)
    for main, tail, bm, bn, diag, warps, stages, paged, tma in (
            (128, 0, 128, 128, 128, 8, 3, False, True), (128, 0, 128, 128, 64, 8, 3, False, True),
            (128, 0, 128, 128, 32, 8, 3, False, True), (128, 0, 128, 64, 64, 8, 3, True, False),
            (128, 0, 64, 64, 64, 4, 3, True, False), (256, 0, 64, 32, 32, 8, 2, True, False),
            (128, 64, 64, 32, 32, 8, 2, True, False)):
        dv = 128 if tail else main
        descs = {f"{x}_desc": f"tensordesc<bf16[{n}, {main}]>" if tma else bf
                 for x, n in (("k", bn), ("v", bn), ("kd", diag), ("vd", diag))}
        jobs.append((f"prefill d{main + tail}/{dv} BLOCK_M={bm} BLOCK_N={bn} DIAG_N={diag} warps={warps} stages={stages} "
                     f"{'paged' if paged else 'ragged'}{' tma' if tma else ''}", _prefill._prefill_kernel,
                     {**prefill_ptrs, **descs},
                     dict(GROUP=4, NUM_KV_HEADS=8, BLOCK_M=bm, BLOCK_N=bn, DIAG_N=diag, HEAD_MAIN=main, HEAD_TAIL=tail,
                          HEAD_DIM_V=dv, BLOCK_DV=dv, PAGE_SIZE=16, PAGED=paged, TMA=tma, HND=False, CAUSAL=True,
                          WINDOW=False, SOFT_CAP=0, RETURN_LSE=False, LOG_B=4, DOT_FP32=False, **hooks), warps, stages))
    for bh, bn, warps, stages in ((64, 32, 8, 2), (32, 32, 8, 2), (16, 32, 4, 2), (64, 16, 4, 2)):
        jobs.append((f"mla BLOCK_H={bh} BLOCK_N={bn} warps={warps} stages={stages}", _mla._mla_split_kernel, mla_ptrs,
                     dict(HEAD_DIM=512, HEAD_DIM_PE=64, BLOCK_H=bh, PAGE_SIZE=64, BLOCK_N=bn, NUM_SPLITS=2,
                          DOT_FP32=False), warps, stages))
    rows = []
    for name, fn, ptrs, consts, warps, stages in jobs:
        row: dict[str, Any] = {"kernel": name, "arch": f"sm_{arch}"}
        try:
            row.update(_compile(fn, ptrs, consts, warps, stages, arch))
        except Exception as exc:  # report, never abort
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(row, flush=True)
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """The best row per (workload, impl) as a text table."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["workload"], r["impl"].replace(" (sweep)", ""))
        score = r.get("tb_s", r.get("tflop_s", -1.0))
        if key not in best or score > best[key].get("tb_s", best[key].get("tflop_s", -1.0)):
            best[key] = r
    lines = [f"{'workload':42} {'impl':18} {'TB/s':>6} {'TFLOP/s':>8} {'ms':>8}  config / error"]
    for (w, i), r in best.items():
        lines.append(f"{w:42} {i:18} {r.get('tb_s', ''):>6} {r.get('tflop_s', ''):>8} {r.get('ms', ''):>8}  "
                     f"{r.get('error', r.get('config', ''))}")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--compile-report" in sys.argv:  # no GPU needed
        compile_report(90)
    else:
        result = bench_attention("cuda", sweep="--sweep" in sys.argv)
        print(summary(result))
