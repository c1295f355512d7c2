"""Cost estimates (seconds) of the cuDNN kernels, from bytes moved (decode) or flops done (prefill).

Fitted on the H200 (``../shared/DEVICE.md``, Llama-3-8B heads, bf16) as ``fixed + work / rate``:
paged decode 2.71 TB/s at B=16 L=2048 and 4.50 TB/s at B=128 L=8192 give a 4.6 TB/s rate and a
20 us fixed cost; causal prefill 550 TFLOP/s (1x8192) and 500 (8x2048) give 569 TFLOP/s and 34 us.
Estimates only rank kernels against each other's estimates made the same way.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: paged decode GPU time (CUDA-graph replays of our plan) fitted on the H200 issue 7 grid (HND, pages 16 and 128,
#: B 1-256, L 1024-8192; notes/gpu-runs.md run 6): 19.5 us + bytes / 4.25 TB/s, within 14% of every point
DECODE_BANDWIDTH = 4.25e12
DECODE_FIXED = 19.5e-6
PREFILL_RATE = 569e12
PREFILL_FIXED = 34e-6


def _bytes_per(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes(pr: Any) -> float:
    """K and V bytes one decode reads: batch * kv_len * Hkv * (D + Dv) * element size."""
    return float(pr.batch * pr.max_kv_len * pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * _bytes_per(pr.kv_dtype))


def attention_flops(pr: Any, causal: bool, window_left: int = -1) -> float:
    """QK^T and PV flops of a prefill: 2 * rows * attended keys * (D + Dv), rows = batch * q_len * Hq.

    Causal rows attend ``kv_len - q_len / 2`` keys on average.
    """
    q_len, kv_len = max(pr.max_q_len, 1), pr.max_kv_len
    keys = kv_len - q_len / 2 if causal else float(kv_len)
    if window_left >= 0:
        keys = min(keys, float(window_left + 1))
    return 2.0 * pr.batch * q_len * pr.num_q_heads * max(keys, 1.0) * (pr.head_dim + pr.head_dim_v)


def decode_cost(pr: Any) -> float:
    if pr.device != "cuda":
        return math.inf
    return DECODE_FIXED + kv_bytes(pr) / DECODE_BANDWIDTH


def prefill_cost(pr: Any) -> float:
    if pr.device != "cuda":
        return math.inf
    return PREFILL_FIXED + attention_flops(pr, "causal" in pr.features) / PREFILL_RATE
