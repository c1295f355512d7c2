"""Cost estimates (seconds) of the cuDNN kernels, from bytes moved (decode) or flops done (prefill).

Each estimate is ``fixed + work / rate``, fitted on the H200 (Llama-3-8B heads, bf16): paged decode is
19.5 us + K/V bytes / 4.25 TB/s, fitted to the GPU time of the planned decode (CUDA-graph replays) over
B 1-256, L 1024-8192 with HND pages of 16 and 128, within 14% of every point; causal prefill is
34 us + flops / 569 TFLOP/s, which gives the 550 TFLOP/s measured at 1x8192 (torch SDPA's cuDNN backend) and
532 at 8x2048, where 500 was measured.
Estimates only rank kernels against each other's estimates made the same way.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: paged decode: fixed + K/V bytes / bandwidth; causal prefill: fixed + flops / rate (see the module docstring)
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
