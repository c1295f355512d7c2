"""Host time of one planned decode run per backend, and where the Triton plan's host time goes (GPU).

Small decode problems (B=1, L=1024) are bound by the host: the time per ``plan.run`` with no sync in
the loop is the host's. Prints microseconds per run for each eligible backend and FlashInfer's wrapper,
then each eager ``ksb.attention.decode`` call (automatic choice and explicit backends) with a cProfile of
the automatic one, then a cProfile of the Triton plan's runs, then each GEMM backend's eager call on a small
problem (16x1024x1024: bf16 mm, fp8 block-scaled mm) beside torch's, then a decode step's KV append (B=128, one
token each, through FlashInfer's CSR pages) per backend, through the compat function and through FlashInfer's.

    python3 tools/host_overhead.py
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

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


def main() -> int:
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
    for choice in (None, "trtllm", "triton"):  # None: the automatic choice
        try:
            us = host_us(lambda b=choice: ksb.attention.decode(q, cache, table, backend=b))
        except Exception as exc:  # noqa: BLE001
            print(f"eager {choice}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"eager {choice!s:8s} decode {us:7.1f} us/call", flush=True)
    print(ksb.explain("attention.decode", q, cache, table))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        ksb.attention.decode(q, cache, table)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    if "triton" in plans:
        plan = plans["triton"]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            plan.run(q, cache)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    gemm_host_times()
    append_host_times()
    return 0


def append_host_times() -> None:
    """Eager host time of a decode step's KV append (B=128, 8 heads, d128, pages of 16) per backend, through
    ``kernel_switchboard.flashinfer.append_paged_kv_cache`` and through FlashInfer's (when installed)."""
    import kernel_switchboard.flashinfer as compat
    from kernel_switchboard.bench.flashinfer import _pages
    from kernel_switchboard.paged import PagedKVCache

    b, kv_len, page, hkv, d = 128, 64, 16, 8, 128
    indptr, indices, last = _pages(b, kv_len, page, torch.device("cuda"))
    seq_lens = torch.full((b,), kv_len, dtype=torch.int32, device="cuda")
    batch_indices, positions = compat.get_batch_indices_positions(
        torch.arange(b + 1, dtype=torch.int32, device="cuda"), seq_lens, b)
    k, v = (torch.randn(b, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k_pages, v_pages = (torch.zeros(int(indptr[-1]), page, hkv, d, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    pages = (k_pages, v_pages)
    cache = PagedKVCache(k_pages, v_pages, "NHD")
    calls: dict[str, Callable[[], Any]] = {f"{backend} append_csr": lambda bk=backend: ksb.kv_cache.append_csr(
        k, v, cache, indptr, indices, positions, batch_indices, check_indices=False, backend=bk)
        for backend in ("triton", "reference")}
    calls["compat append_paged_kv_cache"] = lambda: compat.append_paged_kv_cache(
        k, v, batch_indices, positions, pages, indices, indptr, last, "NHD")
    try:
        import flashinfer

        calls["flashinfer append_paged_kv_cache"] = lambda: flashinfer.append_paged_kv_cache(
            k, v, batch_indices, positions, pages, indices, indptr, last, "NHD")
    except ImportError:
        pass
    for name, call in calls.items():
        try:
            print(f"eager {name:34s} {host_us(call):7.1f} us/call", flush=True)
        except Exception as exc:  # noqa: BLE001 - a backend not installed here is reported
            print(f"eager {name}: {type(exc).__name__}: {str(exc)[:120]}")


def gemm_host_times() -> None:
    """Eager host time of ``ksb.gemm.mm`` / ``mm_fp8`` per backend on a problem the GPU finishes in microseconds."""
    from kernel_switchboard.bench.flashinfer import _block_scaled

    a16 = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    a8, w8, sa, sw, _ = _block_scaled(16, 1024, 1024, torch.device("cuda"))
    # the scales in the layout the kernels read, so no call pays a transpose: 1x128 scales M-major (cuBLAS: outer
    # dimension major), 128x128 scales as the transposed view of the weight's (N/128, K/128)
    b8, sa_col, sb = w8.t(), sa.t().contiguous().t(), sw.t()
    calls = {"torch.mm": lambda: torch.mm(a16, b16),
             "torch._scaled_mm block": lambda: torch._scaled_mm(a8, b8, scale_a=sa_col, scale_b=sb,
                                                                 out_dtype=torch.bfloat16)}
    for backend in ("cutlass", "triton"):
        calls[f"{backend} mm"] = lambda b=backend: ksb.gemm.mm(a16, b16, backend=b)
        calls[f"{backend} mm_fp8 block"] = lambda b=backend: ksb.gemm.mm_fp8(a8, b8, sa_col, sb, backend=b)
    for name, call in calls.items():
        try:
            print(f"eager {name:24s} {host_us(call):7.1f} us/call", flush=True)
        except Exception as exc:  # noqa: BLE001 - a backend not installed here is reported
            print(f"eager {name}: {type(exc).__name__}: {str(exc)[:120]}")


if __name__ == "__main__":
    raise SystemExit(main())
