"""Cost estimates (seconds) of the FlashAttention kernels, per provider.

``max(host, fixed + work / rate)``: ``work`` is the K/V bytes a decode reads or the flops a
prefill does; ``host`` is the Python time one eager call spends before the GPU is the bottleneck, which a
captured call (feature ``cuda_graph``: a capturable plan, or a call inside capture) does not pay at replay.
Fitted on the H200 (Llama-3-8B heads, bf16):

- FA4 paged decode, GPU time over B 1-256, L 1024-8192, pages 16 and 128 (CUDA-graph replays): 34 us
  plus 3.65 TB/s at page 16, 4.3 TB/s at page 128; an eager call has a ~130 us floor (its interface is
  Python-heavy; sm_90 has no split-KV), which ranks it below the others for small batches;
- FA4 causal prefill 614 TFLOP/s (1x8192) and 529 (8x2048): 649 TFLOP/s plus 48 us;
- torch's flash SDPA (FA2) 311 / 300 TFLOP/s: 315 TFLOP/s plus 23 us; FA2 likewise;
- FA3 (FlashInfer's FA3 path measured 615 / 524 TFLOP/s): 640 TFLOP/s plus 45 us;
- a logits soft cap (30) cost FA4 55% of its prefill rate (293 vs 658 TFLOP/s) and FA3 16%.

Other GPUs get the same numbers: estimates only rank kernels against each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard import eager_host_floor


@dataclass(frozen=True)
class Rates:
    """One provider's fitted costs."""

    decode_bw: float  # bytes/s at page sizes other than the fast one
    decode_bw_fast: float  # bytes/s at ``fast_page``
    fast_page: int | None
    decode_fixed: float  # s
    prefill_rate: float  # flop/s
    prefill_fixed: float  # s
    host: float  # s, per-call floor of an eager call
    soft_cap: float = 1.0  # prefill rate factor with a logits soft cap


RATES = {
    "fa4": Rates(3.65e12, 4.3e12, 128, 34e-6, 649e12, 48e-6, 130e-6, soft_cap=0.45),
    "fa3": Rates(3.9e12, 3.9e12, None, 15e-6, 640e12, 45e-6, 40e-6, soft_cap=0.84),
    "fa2": Rates(3.0e12, 3.0e12, None, 15e-6, 315e12, 25e-6, 30e-6, soft_cap=0.8),
    "torch-flash": Rates(0.0, 0.0, None, 0.0, 315e12, 23e-6, 25e-6),
}


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes(pr: Any) -> float:
    """K and V bytes a decode reads: batch * kv_len * Hkv * (D + Dv) * element size."""
    return float(pr.batch * pr.max_kv_len * pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * _elem(pr.kv_dtype))


def attention_flops(pr: Any) -> float:
    """2 * rows * attended keys * (D + Dv); causal rows attend ``kv_len - q_len / 2`` keys on average."""
    q_len, kv_len = max(pr.max_q_len, 1), pr.max_kv_len
    keys = kv_len - q_len / 2 if "causal" in pr.features else float(kv_len)
    return 2.0 * pr.batch * q_len * pr.num_q_heads * max(keys, 1.0) * (pr.head_dim + pr.head_dim_v)


def decode_cost(provider: str) -> Any:
    r = RATES[provider]

    def cost(pr: Any) -> float:
        if pr.device != "cuda":
            return math.inf
        bw = r.decode_bw_fast if pr.page_size == r.fast_page else r.decode_bw
        return max(eager_host_floor(pr, r.host), r.decode_fixed + kv_bytes(pr) / bw)

    return cost


def prefill_cost(provider: str) -> Any:
    r = RATES[provider]

    def cost(pr: Any) -> float:
        if pr.device != "cuda":
            return math.inf
        rate = r.prefill_rate * (r.soft_cap if "soft_cap" in pr.features else 1.0)
        return max(eager_host_floor(pr, r.host), r.prefill_fixed + attention_flops(pr) / rate)

    return cost
