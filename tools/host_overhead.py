"""Host time of one planned decode run per backend, and where the Triton plan's host time goes (GPU).

Small decode problems (B=1, L=1024) are bound by the host: the time per ``plan.run`` with no sync in
the loop is the host's. Prints microseconds per run for each eligible backend and FlashInfer's wrapper,
then each eager ``ksb.attention.decode`` call (automatic choice and explicit backends) with a cProfile of
the automatic one, then a cProfile of the Triton plan's runs. ``--mla``: the same for ``plan_mla_decode``'s run
(B=16 L=4096 and B=128 L=8192, 128 heads, page 64) and FlashInfer's MLA wrapper, the bench's inputs.

    python3 tools/host_overhead.py [--mla]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case

RUNS = 2000


def host_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(RUNS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / RUNS * 1e6


def profile(fn, runs: int = 500, lines: int = 22) -> None:
    """cProfile of ``runs`` calls of ``fn``, by own time and by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(lines)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(lines)


def mla() -> int:
    from kernel_switchboard import bench as kb

    for batch, kv_len in ((16, 4096), (128, 8192)):
        params = {"batch": batch, "kv_len": kv_len, "num_heads": 128, "page_size": 64, "dtype": "bfloat16"}
        case = kb._example("attention.mla_decode", torch.device("cuda"), params)
        _, run = kb._mla_plan(None, case.args, case.kwargs)
        print(f"B={batch} L={kv_len} plan.run {host_us(run):7.1f} us/run", flush=True)
        for name, fn in kb._flashinfer_externals("attention.mla_decode", case.args, case.kwargs).items():
            print(f"B={batch} L={kv_len} {name} {host_us(fn):7.1f} us/run", flush=True)
        profile(run)
    return 0


def main() -> int:
    if "--mla" in sys.argv:
        return mla()
    spec = AttnSpec(torch.bfloat16, "NHD", 16, 32, 8, 128, kv_lens=(1024,))
    q, cache, table = decode_case(spec, "cuda").args
    plans = {}
    for backend in ("triton", "trtllm", "fa", "cudnn"):
        try:
            plans[backend] = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                                       dtype=torch.bfloat16, layout="NHD", page_size=16, backend=backend)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot plan this is reported
            print(f"{backend}: no plan ({type(exc).__name__}: {str(exc)[:120]})")
    for backend, plan in plans.items():
        print(f"{backend:8s} plan.run  {host_us(lambda plan=plan: plan.run(q, cache)):7.1f} us/run", flush=True)
    print(f"{'torch':8s} empty+add {host_us(lambda: torch.empty_like(q).add_(1)):7.1f} us/run")
    try:
        import flashinfer

        indptr, indices, last = table.to_csr(cache.page_size)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=q.dtype, kv_data_type=q.dtype)
        kv = (cache.k_pages, cache.v_pages)
        print(f"{'flashinfer':8s} run {host_us(lambda: w.run(q, kv)):7.1f} us/run")
    except Exception as exc:  # noqa: BLE001
        print(f"flashinfer: {type(exc).__name__}: {str(exc)[:120]}")
    for backend in (None, "trtllm", "triton"):  # None: the automatic choice
        try:
            us = host_us(lambda b=backend: ksb.attention.decode(q, cache, table, backend=b))
        except Exception as exc:  # noqa: BLE001
            print(f"eager {backend}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"eager {backend!s:8s} decode {us:7.1f} us/call", flush=True)
    print(ksb.explain("attention.decode", q, cache, table))
    profile(lambda: ksb.attention.decode(q, cache, table))
    if "triton" in plans:
        profile(lambda: plans["triton"].run(q, cache))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
