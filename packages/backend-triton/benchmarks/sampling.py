"""Benchmark: Triton sorting-free sampling at batch 128, vocabulary 128256, from probabilities.

    python packages/backend-triton/benchmarks/sampling.py          # on a GPU

``bench_sampling(device) -> list[dict]``: top-p (0.9) and top-k (50) + top-p (0.9) sampling timed for
the Triton kernels (launcher called directly: seed draw + kernels; the default launch and the ``SWEEP``
variants of the walk that workload is most sensitive to: the candidate passes' for top-p, the top-k
threshold search's for top-k + top-p), the switchboard call with
``check_nan=False``, the reference (torch sort + inverse CDF) and FlashInfer when it is installed.
A last Triton row times the top-k threshold kernel alone (the first of its two launches). Before timing,
every implementation's tokens are checked to lie in the filtered support; ``first_call_s``
is the first call's wall time (the compile of a JIT kernel).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard.bench import median_ms

BATCH, VOCAB = 128, 128256
WORKLOADS = (("top-p 0.9", None, 0.9), ("top-k 50 + top-p 0.9", 50, 0.9))
#: walks (chunk width, load pipeline stages, most warps) besides the default launch. Left out after timing on the
#: H200, all slower: top-p 8192 with 3 stages and 16 warps (also minutes to compile), search walks on 1024- or
#: 2048-wide chunks with 2 to 4 stages, and 4096 with 2 stages and 16 warps; sampling.SEARCH_WALK says why its
#: default wins.
SWEEP = {"top_p": ((8192, 4, 8),), "search": ((4096, 1, 8), (4096, 2, 8))}


def _row(workload: str, impl: str, fn: Callable[[], Any], check: Callable[[torch.Tensor], None]) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": f"{workload}, {BATCH}x{VOCAB} probs fp32", "impl": impl}
    try:
        t0 = time.perf_counter()
        first = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - t0, 2)  # compile + first run (JIT kernels)
        check(first)
        row["ms"] = round(median_ms(fn, rep_ms=200, warmup=25), 4)
    except Exception as exc:  # a benchmark row reports, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(row, flush=True)
    return row


def _flashinfer(top_k: int | None, top_p: float) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """FlashInfer's call for the workload, or None when it is missing or ``KSB_BENCH_FLASHINFER=0`` (its
    sampling modules compile on first use: 80-320 s on the H200)."""
    if os.environ.get("KSB_BENCH_FLASHINFER", "1") == "0":
        return None
    try:
        import flashinfer.sampling as fs
    except Exception:  # optional baseline
        return None
    if top_k is None:
        return lambda p: fs.top_p_sampling_from_probs(p, top_p)
    return lambda p: fs.top_k_top_p_sampling_from_probs(p, top_k, top_p)


def bench_sampling(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    import kernel_switchboard as ksb
    from kernel_switchboard.reference import sampling as reference
    from kernel_switchboard_triton import sampling

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    probs = torch.softmax(3 * torch.randn(BATCH, VOCAB, device=dev, generator=g), -1)
    out: list[dict[str, Any]] = []
    for name, top_k, top_p in WORKLOADS:
        keep = reference.keep_mask(probs, top_k, top_p, None)

        def check(tok: torch.Tensor, keep: torch.Tensor = keep) -> None:
            tok = tok.view(-1).long()
            assert tok.shape == (BATCH,) and bool(((tok >= 0) & (tok < VOCAB)).all()), "token out of range"
            assert bool(keep.gather(1, tok[:, None]).all()), "a filtered-out token was sampled"

        def kernel(top_k: int | None = top_k, top_p: float = top_p) -> torch.Tensor:
            return sampling.top_k_top_p(probs, top_k, top_p, None, False, None, None, False)

        def api(top_k: int | None = top_k, top_p: float = top_p) -> torch.Tensor:
            return ksb.sampling.top_k_top_p(probs, top_k, top_p, check_nan=False, backend="triton")

        def ref(top_k: int | None = top_k, top_p: float = top_p) -> torch.Tensor:
            return reference.top_k_top_p(probs, top_k, top_p, None, False, None, None, False)

        saved = (sampling.MAX_BLOCK, sampling.SEARCH_WALK, sampling.TOP_P_WALK)
        swept = "search" if top_k else "top_p"
        for i, walk in enumerate((saved[1] if top_k else saved[2], *SWEEP[swept])):
            sampling.MAX_BLOCK = max(saved[0], walk[0])
            if top_k:
                sampling.SEARCH_WALK = walk
            else:
                sampling.TOP_P_WALK = walk
            sampling._config.cache_clear()
            label = f"{swept} walk: chunk {walk[0]}, stages {walk[1]}, <= {walk[2]} warps" + (", sweep" if i else "")
            out.append(_row(name, f"triton kernel ({label})", kernel, check))
        sampling.MAX_BLOCK, sampling.SEARCH_WALK, sampling.TOP_P_WALK = saved
        sampling._config.cache_clear()
        if top_k:  # the first of the two launches alone: how the call's time divides
            def exact_threshold(stats: torch.Tensor, k: int = top_k) -> None:
                tau = stats[1][:, None]  # k-th largest weight: >= tau keeps k or more, > tau fewer than k
                assert bool(((probs >= tau).sum(1) >= k).all() and ((probs > tau).sum(1) < k).all()), "wrong threshold"

            out.append(_row(name, "triton top-k threshold kernel alone",
                            lambda top_k=top_k: sampling.top_k_threshold(probs, top_k, False, None), exact_threshold))
        out.append(_row(name, "triton via ksb.sampling (check_nan=False)", api, check))
        out.append(_row(name, "reference (torch sort)", ref, check))
        fi = _flashinfer(top_k, top_p)
        if fi is not None:
            out.append(_row(name, "flashinfer", lambda fi=fi: fi(probs), check))
    return out


if __name__ == "__main__":
    bench_sampling("cuda")
