"""Triton attention kernels: their records, capabilities and cost estimates.

The kernels and their launchers live in ``_decode.py`` (paged decode, split-KV + merge),
``_prefill.py`` (paged / ragged prefill, append, mixed batches), ``_mla.py`` (absorbed MLA decode),
``_mla_prefill.py`` (absorbed MLA prefill / append over latent pages), ``_pod.py`` (prefill and decode requests in
one launch) and ``_merge.py`` (merge_states).
Capabilities state exactly what the kernels do:

- q/out dtypes fp16 and bf16 (dots on tensor cores, float32 accumulation and softmax);
- KV dtypes: q's dtype, or fp8 (e4m3, e5m2) with scales, floats or device tensors per KV head (dequantised in
  registers);
- head dims 64, 80, 96, 128, 192, 256 (prefill splits the qk dot into power-of-two parts, 192 = 128 + 64,
  96 = 64 + 32, 80 = 64 + 16, and takes no custom variant at 80; decode and the v dims pad to a power of two in
  registers); any page size; NHD and HND;
- soft cap, sliding window, LSE, and CUDA-graph capturable runs; deterministic (no atomics); batch invariant in
  ``ksb.batch_invariant()`` (decode: splits of a fixed token count merged in order; prefill: one tile shape; MLA
  decode: one split; MLA prefill, dense and merge as they are);
- custom variants (``kernel_switchboard.Variant``) in decode / prefill / ragged prefill: the hooks
  are ``tl.constexpr`` kernel arguments, so Triton compiles and caches one kernel per variant;
- ``attention.dense`` (``dense.py``): the ragged prefill kernel with the bias or mask read by a variant hook.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel, eager_host_floor

from .. import __version__
from .._common import BACKEND, DEVICES, PRIORITY
from . import launcher

#: H200-class rough rates for cost estimates (bytes/s, flop/s); only the ranking uses them
HBM_BYTES_PER_S = 4.0e12
TENSOR_FLOPS = 4.5e14
#: fixed cost of one launch, seconds
LAUNCH_S = 6e-6
#: paged decode, GPU time (CUDA-graph replays of plan.run), fitted on the H200 over the decode grid (B 1-256,
#: L 1024-8192, pages 16 and 128, NHD and HND, Llama-3-8B heads): fixed + bytes / rate,
#: 13 us + 4.3 TB/s, within 14% of every point. Every backend's decode cost is fitted on the same grid.
DECODE_FIXED_S = 13e-6
DECODE_BYTES_PER_S = 4.3e12
#: fp8 e4m3 pages (fp16 math, 128-key tiles): H100, B=128 L=8192 page 16, 2.69 TB/s of fp8 pages against 3.03 TB/s
#: of bf16 pages in the same process
DECODE_FP8_BYTES_PER_S = 0.89 * DECODE_BYTES_PER_S


def is_inf_cost(problem: Any) -> bool:
    """The CPU (interpreter) never wins on cost: it ranks by priority below the reference."""
    return getattr(problem, "device", "cuda") != "cuda"


def nbytes(dtype: torch.dtype) -> int:
    return dtype.itemsize


def cost_seconds(bytes_moved: float, flops: float, problem: Any) -> float:
    """Roofline estimate: the larger of memory and tensor-core time, plus a launch."""
    if is_inf_cost(problem):
        return math.inf
    return LAUNCH_S + max(bytes_moved / HBM_BYTES_PER_S, flops / TENSOR_FLOPS)


def fp8_needs_sm89(problem: Any) -> list[str]:
    """``Capability.check``: Triton converts fp8 (e4m3 ``float8e4nv``) only from compute capability 8.9."""
    cc = getattr(problem, "cc", None)
    if "fp8_kv" in getattr(problem, "features", ()) and cc is not None and cc < (8, 9):
        return [f"fp8 KV needs compute capability >= 8.9 for Triton's fp8 conversions (have {cc[0]}.{cc[1]})"]
    return []


_HALF = frozenset({torch.float16, torch.bfloat16})
_FP8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
_DIMS = frozenset({64, 80, 96, 128, 192, 256})
_COMMON = frozenset({"sliding_window", "soft_cap", "return_lse", "qk_v_dims_differ", "cuda_graph", "deterministic",
                     "custom_variant", "batch_invariant"})

DECODE = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF | _FP8, head_dims=_DIMS,
    head_dims_v=_DIMS, page_sizes=None, layouts=frozenset({"NHD", "HND"}),
    features=_COMMON | {"paged", "fp8_kv", "kv_scale_tensor"}, limits={"group_size": 64}, check=fp8_needs_sm89,
)
def _no_variant_at_d80(problem: Any) -> list[str]:
    """Prefill splits head dim 80 into 64 + 16; with a custom variant's hooks, ptxas (Triton 3.6's, for sm_90)
    crashes compiling some such kernels. Without a variant every d80 kernel compiles and passes."""
    if getattr(problem, "head_dim", None) == 80 and "custom_variant" in getattr(problem, "features", ()):
        return ["head_dim=80 with a custom variant: ptxas crashed compiling such prefill kernels (use 64, 96 or 128)"]
    return []


def _prefill_checks(problem: Any) -> list[str]:
    return fp8_needs_sm89(problem) + _no_variant_at_d80(problem)


PREFILL = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF | _FP8, head_dims=_DIMS,
    head_dims_v=_DIMS, page_sizes=None, layouts=frozenset({"NHD", "HND"}),
    features=_COMMON | {"paged", "causal", "fp8_kv", "kv_scale_tensor", "mixed_batch"}, limits={"group_size": 64},
    check=_prefill_checks,
)
POD = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF | _FP8, head_dims=_DIMS,
    head_dims_v=_DIMS, page_sizes=None, layouts=frozenset({"NHD", "HND"}),
    features=(_COMMON - {"custom_variant"}) | {"paged", "causal", "fp8_kv", "kv_scale_tensor"}, limits={"group_size": 64},
    check=fp8_needs_sm89,
)
#: fp8 attention (FlashAttention-3's): queries and the cache in float8_e4m3fn, both dots on fp8 tensor cores (P rounded
#: to e4m3 for the PV dot), out in bfloat16; Hopper's fp8 wgmma, head dims that fill its 32-deep K steps
PREFILL_FP8 = Capability(
    devices=DEVICES, min_cc=(9, 0), dtypes=frozenset({torch.float8_e4m3fn}), kv_dtypes=frozenset({torch.float8_e4m3fn}),
    head_dims=frozenset({64, 128, 256}), head_dims_v=frozenset({64, 128, 256}), page_sizes=None,
    layouts=frozenset({"NHD", "HND"}),
    features=(_COMMON - {"custom_variant"}) | {"paged", "causal", "fp8_kv", "fp8_q", "kv_scale_tensor", "mixed_batch"},
    limits={"group_size": 64},
)
RAGGED = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF, head_dims=_DIMS, head_dims_v=_DIMS,
    features=_COMMON | {"ragged", "causal", "mixed_batch"}, limits={"group_size": 64}, check=_no_variant_at_d80,
)
MLA = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF, head_dims=frozenset({512}),
    head_dims_v=frozenset({512}), page_sizes=None,
    features=frozenset({"paged", "return_lse", "cuda_graph", "deterministic", "batch_invariant"}),
    allowed={"head_dim_pe": frozenset({64})},
)
MLA_PREFILL = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, kv_dtypes=_HALF, head_dims=frozenset({512}),
    head_dims_v=frozenset({512}), page_sizes=None,
    features=frozenset({"paged", "causal", "mixed_batch", "return_lse", "cuda_graph", "deterministic",
                        "batch_invariant"}),
    allowed={"head_dim_pe": frozenset({64})},
)
DENSE = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF, head_dims=_DIMS, head_dims_v=_DIMS,
    features=frozenset({"causal", "attn_bias", "qk_v_dims_differ", "cuda_graph", "deterministic", "batch_invariant"}),
    limits={"group_size": 64},
)
MERGE = Capability(
    devices=DEVICES, min_cc=(8, 0), dtypes=_HALF | {torch.float32},
    features=frozenset({"cuda_graph", "deterministic", "batch_invariant"}),
)


def _decode_cost(pr: Any) -> float:
    kv = pr.batch * pr.max_kv_len * pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * nbytes(pr.kv_dtype)
    rate = DECODE_FP8_BYTES_PER_S if nbytes(pr.kv_dtype) == 1 else DECODE_BYTES_PER_S
    return math.inf if is_inf_cost(pr) else DECODE_FIXED_S + kv / rate


def _prefill_cost(pr: Any) -> float:
    rows = pr.batch * pr.max_q_len * pr.num_q_heads
    flops = 2.0 * rows * pr.max_kv_len * (pr.head_dim + pr.head_dim_v)
    if "causal" in pr.features and pr.max_q_len >= pr.max_kv_len:
        flops *= 0.5
    kv = pr.batch * pr.max_kv_len * pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * nbytes(pr.kv_dtype)
    return cost_seconds(kv, flops, pr)


def _mla_cost(pr: Any) -> float:
    kv = pr.batch * pr.max_kv_len * (pr.head_dim + pr.head_dim_pe) * nbytes(pr.kv_dtype)
    flops = 2.0 * pr.batch * pr.num_q_heads * pr.max_kv_len * (pr.head_dim + pr.head_dim_pe + pr.head_dim_v)
    return cost_seconds(kv, flops, pr)  # 128 heads: compute-bound (~240 flop/byte)


def _prefill_fp8_cost(pr: Any) -> float:
    """:func:`_prefill_cost` at twice the tensor-core rate (fp8 MMAs)."""
    return LAUNCH_S + (_prefill_cost(pr) - LAUNCH_S) / 2 if not is_inf_cost(pr) else math.inf


#: the one-launch POD kernel's prefill part, flop/s: fitted on one H100 point (4096 prefill tokens beside 64 decodes
#: at L=4096: 0.867 ms), well below the separate prefill kernel's rate
POD_PREFILL_FLOPS = 2.25e14


def _pod_cost(pr: Any) -> float:
    """The prefill part at the POD kernel's measured rate, then the decode part's KV reads at the decode rate: the
    decode units run first and the prefill units after them, so the two add up rather than overlap."""
    if is_inf_cost(pr):
        return math.inf
    rows = pr.batch * pr.max_q_len * pr.num_q_heads
    flops = 2.0 * rows * pr.max_kv_len * (pr.head_dim + pr.head_dim_v)
    if "causal" in pr.features and pr.max_q_len >= pr.max_kv_len:
        flops *= 0.5
    per_request = pr.max_kv_len * pr.num_kv_heads * (pr.head_dim + pr.head_dim_v) * nbytes(pr.kv_dtype)
    prefill = max(pr.batch * per_request / HBM_BYTES_PER_S, flops / POD_PREFILL_FLOPS)
    rate = DECODE_FP8_BYTES_PER_S if nbytes(pr.kv_dtype) == 1 else DECODE_BYTES_PER_S
    return LAUNCH_S + prefill + pr.decode_batch * per_request / rate


def _mla_prefill_cost(pr: Any) -> float:
    rows = pr.batch * pr.max_q_len * pr.num_q_heads
    flops = 2.0 * rows * pr.max_kv_len * (pr.head_dim + pr.head_dim_pe + pr.head_dim_v)
    if "causal" in pr.features and pr.max_q_len >= pr.max_kv_len:
        flops *= 0.5
    kv = pr.batch * pr.max_kv_len * (pr.head_dim + pr.head_dim_pe) * nbytes(pr.kv_dtype)
    return cost_seconds(kv, flops, pr)


#: ``attention.dense`` on the H200 (``switchboard bench --preset dense``, head dim 64): the kernel reads
#: a mask or bias tile per score tile at ~0.25e12 (bool) / 0.3e12 (float) elements per second, which bounds it
#: well below the tensor cores; an eager call costs ~0.19 ms of host time at least (no plan: it packs the
#: inputs and launches every call; cross-attention 16x77x1024 measured 0.196 ms)
DENSE_MASK_ELEMS_PER_S = {"bool": 2.5e11, "float": 3.0e11}
DENSE_HOST_S = 1.9e-4


def _dense_cost(pr: Any) -> float:
    """Seconds: the larger of the eager host floor (not paid by a call captured in a CUDA graph) and the
    tensor-core or mask-read time."""
    if is_inf_cost(pr):
        return math.inf
    flops = 2.0 * pr.batch * pr.num_q_heads * pr.q_len * pr.kv_len * (pr.head_dim + pr.head_dim_v)
    causal_half = "causal" in pr.features and pr.q_len >= pr.kv_len
    elems = pr.batch * pr.num_q_heads * pr.q_len * pr.kv_len * (0.5 if causal_half else 1.0)
    mask_s = elems / DENSE_MASK_ELEMS_PER_S[pr.bias] if pr.bias != "none" else 0.0
    return max(eager_host_floor(pr, DENSE_HOST_S), LAUNCH_S + max(flops * (0.5 if causal_half else 1.0) / TENSOR_FLOPS, mask_s))


def _merge_cost(pr: Any) -> float:
    return cost_seconds(3.0 * pr.tokens * pr.num_heads * pr.head_dim * nbytes(pr.dtype), 0.0, pr)


def kernels() -> list[Kernel]:
    """The attention kernels of the Triton backend."""
    return [
        Kernel("attention.decode", "decode_splitkv", BACKEND, DECODE, launcher("_decode:decode"), version=__version__,
               plan=launcher("_decode:plan_decode"),
               cost=_decode_cost, priority=PRIORITY, writes_lse_base2=True,
               doc="split-KV paged decode, GQA heads packed per KV head, second-pass merge"),
        Kernel("attention.prefill", "prefill_paged", BACKEND, PREFILL, launcher("_prefill:prefill"), version=__version__,
               plan=launcher("_prefill:PrefillPlan"),
               cost=_prefill_cost, priority=PRIORITY, writes_lse_base2=True,
               doc="FlashAttention-2 style over paged KV; GQA-packed (token, head) rows; mixed batches in one launch"),
        Kernel("attention.prefill", "prefill_fp8", BACKEND, PREFILL_FP8, launcher("_prefill:prefill"),
               version=__version__, plan=launcher("_prefill:PrefillPlan"),
               cost=_prefill_fp8_cost, priority=PRIORITY, math_dtype=lambda pr: torch.float8_e4m3fn,
               writes_lse_base2=True,
               doc="the paged prefill kernel on float8_e4m3fn queries and pages: QK and PV on fp8 tensor cores "
                   "(sm_90), out bfloat16"),
        Kernel("attention.prefill_ragged", "prefill_ragged", BACKEND, RAGGED, launcher("_prefill:prefill_ragged"),
               version=__version__, cost=_prefill_cost, priority=PRIORITY, writes_lse_base2=True,
               doc="FlashAttention-2 style over ragged KV"),
        Kernel("attention.mla_decode", "mla_decode_splitkv", BACKEND, MLA, launcher("_mla:mla_decode"),
               version=__version__, plan=launcher("_mla:plan_mla"), cost=_mla_cost, priority=PRIORITY,
               doc="absorbed MLA decode (512 + 64), split-KV, head tiles share each latent KV tile (sm_90: the "
                   "warp-specialised Gluon kernel)"),
        Kernel("attention.mla_prefill", "mla_prefill", BACKEND, MLA_PREFILL, launcher("_mla_prefill:mla_prefill"),
               version=__version__, plan=launcher("_mla_prefill:MLAPrefillRunner"), cost=_mla_prefill_cost,
               priority=PRIORITY,
               doc="absorbed MLA over latent pages, several query tokens per request: (token, head) rows share "
                   "each latent tile, one launch per batch"),
        Kernel("attention.pod", "pod", BACKEND, POD, launcher("_pod:pod"), version=__version__,
               plan=launcher("_pod:PODRunner"), cost=_pod_cost, priority=PRIORITY,
               doc="prefill tiles and one-token decode tiles of the prefill kernel in one launch, decode units "
                   "scheduled first"),
        Kernel("attention.merge_states", "merge_states", BACKEND, MERGE, launcher("_merge:merge_states"),
               version=__version__,
               cost=_merge_cost, priority=PRIORITY, doc="elementwise LSE merge"),
        Kernel("attention.dense", "dense", BACKEND, DENSE, launcher("dense:dense"), version=__version__, cost=_dense_cost,
               priority=PRIORITY, doc="the ragged prefill kernel on (B, H, L, D) tensors; bias / mask read by a "
                                      "variant hook through its strides (broadcast biases in place)"),
    ]
