"""POD (prefill-on-decode): a batch's prefill requests and decode requests over one paged cache in one launch.

Every program of ``_pod_kernel`` runs one work unit of the prefill kernel (``_prefill.py``'s ``_prefill_program``: a
tile of packed (token, head) rows of one request against its KV), either of the prefill part, with the prefill
kernel's tile (128 rows on Hopper, K/V by TMA where the pages allow), or of the decode part, whose requests are rows of
one token (``qo_indptr`` = 0..Bd) with a tile of their own size (16 rows: one token's query heads, pointer loads, no
split of the KV). Both kinds share the kernel's code, so a decode row is computed as the mixed-batch prefill kernel
would, without a 128-row tile spent on each decode request.

Scheduling: the grid is ``D + P`` programs, D decode units ((request, KV head)) and P prefill units ((tile slot,
KV head), the heavy causal tiles first). The hardware starts programs in id order as SMs free up, so the order of
the units is the work split:

- ``decode_first`` (the default): units 0..D-1 are the decode part. No decode row waits behind a prefill tile: the
  decode units start in the first waves, and the prefill tiles take over the SMs as the decode units finish, the
  last decode units running beside the first prefill tiles;
- ``interleave``: decode and prefill units alternate while both last, so from the first wave on memory-bound decode
  units and compute-bound prefill tiles run side by side (on one SM when the tile shapes leave room for two programs:
  ``PODConfig`` with a 64-row prefill tile, ~100 KB of shared memory, instead of the 128-row tile's ~220 KB).

``switchboard bench --preset beyond`` measures both against FlashInfer's POD and prefill-then-decode.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from ._attn_common import FP8_KV, fixed_max, interpreting, scale_args, soft_cap_args, soft_cap_mode, split_dim
from ._prefill import PrefillConfig, _prefill_program, prefill_config, rows_bucket, tma_descriptors, variant_launch

SCHEDULES = {"decode_first": 0, "interleave": 1}


@triton.jit
def _pod_kernel(
    q_ptr,  # (Tq, Hq, D) prefill queries packed by qo_indptr
    qd_ptr,  # (Bd, Hq, D) decode queries
    k_ptr,  # K pages (any layout through strides)
    v_ptr,  # V pages
    k_desc,  # TMA descriptor of K as token rows for the prefill tiles (TMA; else k_ptr): _prefill.tma_descriptors
    v_desc,  # TMA descriptor of V (TMA; else v_ptr)
    kd_desc,  # K descriptor of the prefill's diagonal tiles (TMA; else k_desc)
    vd_desc,  # V descriptor of the prefill's diagonal tiles (TMA; else v_desc)
    qo_indptr_ptr,  # (Bp+1,) int32 prefill query offsets
    dqo_indptr_ptr,  # (Bd+1,) int32 0..Bd: the decode rows as one-token requests
    bt_ptr,  # (Bp, max_pages) int32 prefill block table
    dbt_ptr,  # (Bd, max_pages) int32 decode block table
    seq_lens_ptr,  # (Bp,) int32 prefill KV lengths
    dseq_lens_ptr,  # (Bd,) int32 decode KV lengths
    o_ptr,  # (Tq, Hq, Dv) prefill output
    od_ptr,  # (Bd, Hq, Dv) decode output
    lse_ptr,  # (Tq, Hq) float32 prefill LSE (RETURN_LSE)
    dlse_ptr,  # (Bd, Hq) float32 decode LSE (RETURN_LSE)
    stride_qt, stride_qh,  # prefill q strides (token, head)
    stride_dqt, stride_dqh,  # decode q strides (request, head)
    stride_kp, stride_ks, stride_kh,  # K strides (page, slot, head)
    stride_vp, stride_vs, stride_vh,  # V strides (page, slot, head)
    stride_bt, stride_dbt,  # block-table row strides (prefill, decode)
    stride_ot, stride_oh, stride_dot, stride_doh,  # output strides (prefill, decode)
    stride_lt, stride_lh, stride_dlt, stride_dlh,  # LSE strides (prefill, decode)
    qk_scale,  # log2-unit score scale, or sm_scale / cap with SOFT_CAP
    cap_log2,  # soft cap * log2 e (SOFT_CAP only)
    v_scale,  # output multiplier (fp8 V scale, else 1.0)
    k_scale_ptr,  # fp8 K scale tensor, () or (Hkv,) float32 (K_SCALE_STRIDE >= 0)
    v_scale_ptr,  # fp8 V scale tensor (V_SCALE_STRIDE >= 0)
    window_left,  # window size (WINDOW only)
    batch,  # prefill requests Bp
    dbatch,  # decode requests Bd
    prefill_units,  # P: prefill tile slots x KV heads
    decode_units,  # D: decode slots x KV heads
    vargs,  # (0,): no custom variant
    GROUP: tl.constexpr,  # query heads per KV head
    NUM_KV_HEADS: tl.constexpr,  # KV heads
    BLOCK_M: tl.constexpr,  # prefill tile rows
    BLOCK_N: tl.constexpr,  # prefill KV tokens per tile
    DIAG_N: tl.constexpr,  # prefill KV tokens per diagonal tile
    D_BLOCK_M: tl.constexpr,  # decode tile rows (>= GROUP)
    D_BLOCK_N: tl.constexpr,  # decode KV tokens per tile
    HEAD_MAIN: tl.constexpr,  # power-of-two part of the qk head dim
    HEAD_TAIL: tl.constexpr,  # rest of the qk head dim
    HEAD_DIM_V: tl.constexpr,  # v head dim
    BLOCK_DV: tl.constexpr,  # next power of two of HEAD_DIM_V
    PAGE_SIZE: tl.constexpr,  # tokens per page
    TMA: tl.constexpr,  # prefill K/V tiles by TMA
    HND: tl.constexpr,  # HND pages (TMA rows)
    CAUSAL: tl.constexpr,  # the prefill part's causal mask
    WINDOW: tl.constexpr,  # sliding-window mask
    SOFT_CAP: tl.constexpr,  # logits soft cap mode (_attn_common.soft_cap_mode)
    FIXED_MAX: tl.constexpr,  # 0 running maximum, 1 softmax against the soft cap, 2 and exp2 on FMAs (fixed_max)
    RETURN_LSE: tl.constexpr,  # write the LSEs
    LOG_B: tl.constexpr,  # binary-search steps over the prefill requests
    D_LOG_B: tl.constexpr,  # binary-search steps over the decode requests
    DOT_FP32: tl.constexpr,  # float32 dot operands (interpreter)
    F16_MATH: tl.constexpr,  # fp8 K/V with bf16 queries: dot operands in fp16 (see _decode's module docstring)
    SCHEDULE: tl.constexpr,  # 0: decode units first, 1: decode and prefill units alternate (module docstring)
    K_SCALE_STRIDE: tl.constexpr,  # K scale tensor stride over KV heads (0: one scale), -1: folded into qk_scale
    V_SCALE_STRIDE: tl.constexpr,  # V scale tensor stride over KV heads, -1: folded into v_scale
):
    pid = tl.program_id(0)
    if SCHEDULE == 1:
        pairs = tl.minimum(prefill_units, decode_units)
        paired = pid < 2 * pairs
        decode = tl.where(paired, pid % 2 == 0, decode_units > prefill_units)
        unit = tl.where(paired, pid // 2, pid - pairs)
    else:
        decode = pid < decode_units
        unit = tl.where(decode, pid, pid - decode_units)
    if decode:
        _prefill_program(unit // NUM_KV_HEADS, unit % NUM_KV_HEADS, qd_ptr, k_ptr, v_ptr, k_ptr, v_ptr, k_ptr, v_ptr,
                         dqo_indptr_ptr, dqo_indptr_ptr, dbt_ptr, dseq_lens_ptr, od_ptr, dlse_ptr, stride_dqt, stride_dqh,
                         stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_dbt, stride_dot,
                         stride_doh, stride_dlt, stride_dlh, qk_scale, cap_log2, v_scale, k_scale_ptr, v_scale_ptr,
                         window_left, dbatch, vargs,
                         GROUP, NUM_KV_HEADS, D_BLOCK_M, D_BLOCK_N, D_BLOCK_N, HEAD_MAIN, HEAD_TAIL, HEAD_DIM_V,
                         BLOCK_DV, PAGE_SIZE, True, False, HND, CAUSAL, WINDOW, SOFT_CAP, FIXED_MAX, RETURN_LSE, False, D_LOG_B,
                         DOT_FP32, False, F16_MATH, None, None, None, False, False, False, True, K_SCALE_STRIDE,
                         V_SCALE_STRIDE)
    else:
        _prefill_program(unit // NUM_KV_HEADS, unit % NUM_KV_HEADS, q_ptr, k_ptr, v_ptr, k_desc, v_desc, kd_desc,
                         vd_desc, qo_indptr_ptr, qo_indptr_ptr, bt_ptr, seq_lens_ptr, o_ptr, lse_ptr, stride_qt,
                         stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt, stride_ot,
                         stride_oh, stride_lt, stride_lh, qk_scale, cap_log2, v_scale, k_scale_ptr, v_scale_ptr,
                         window_left, batch, vargs, GROUP,
                         NUM_KV_HEADS, BLOCK_M, BLOCK_N, DIAG_N, HEAD_MAIN, HEAD_TAIL, HEAD_DIM_V, BLOCK_DV, PAGE_SIZE,
                         True, TMA, HND, CAUSAL, WINDOW, SOFT_CAP, FIXED_MAX, RETURN_LSE, False, LOG_B, DOT_FP32, False, F16_MATH,
                         None, None, None, False, False, False, True, K_SCALE_STRIDE, V_SCALE_STRIDE)


class PODConfig(NamedTuple):
    """Launch choices of the POD kernel: the prefill part's tile (a :class:`PrefillConfig`), the decode part's tile,
    the order of the units (``SCHEDULES``), and the kernel's warps and pipeline stages."""

    prefill: PrefillConfig
    decode_block_m: int
    decode_block_n: int
    schedule: str
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=256)
def pod_config(device: torch.device, head_dim: int, head_dim_v: int, group: int, rows: int,
               schedule: str = "decode_first", co_resident: bool = False) -> PODConfig:
    """The POD configuration for these head dims: the prefill kernel's tile for the prefill part's longest query
    (``rows``: its packed rows, bucketed), or with ``co_resident`` a 64-row, 64-key prefill tile in two stages so a
    decode program fits beside it on an SM; decode tiles of one token's query heads (at least 16 rows)."""
    cfg = prefill_config(device, head_dim, head_dim_v, rows)
    if co_resident and not interpreting():
        cfg = cfg._replace(block_m=64, block_n=64, diag_n=0, num_warps=4, num_stages=2)
    d_block_m = max(16, triton.next_power_of_2(group))
    d_block_n = 16 if interpreting() else (64 if max(head_dim, head_dim_v) <= 128 else 32)
    return PODConfig(cfg, d_block_m, d_block_n, schedule, cfg.num_warps, cfg.num_stages)


def launch_pod(q: torch.Tensor, qo_indptr: torch.Tensor, q_decode: torch.Tensor, decode_indptr: torch.Tensor,
               cache: Any, table: Any, decode_table: Any, out: torch.Tensor, out_decode: torch.Tensor,
               lse: torch.Tensor | None, lse_decode: torch.Tensor | None, p: Any, cfg: PODConfig) -> None:
    """One launch of the POD kernel (``lse`` and ``lse_decode`` both given or both None)."""
    k, v = cache.k_pages, cache.v_pages
    nhd = cache.layout == "NHD"
    ks, kh = (k.stride(1), k.stride(2)) if nhd else (k.stride(2), k.stride(1))
    vs, vh = (v.stride(1), v.stride(2)) if nhd else (v.stride(2), v.stride(1))
    kv_heads, page_size = cache.num_kv_heads, cache.page_size
    tq, hq, d = q.shape
    group = hq // kv_heads
    batch, dbatch = qo_indptr.shape[0] - 1, decode_indptr.shape[0] - 1
    pre = cfg.prefill
    prefill_units = (tq * group // pre.block_m + batch) * kv_heads if tq else 0
    decode_units = (dbatch * group // cfg.decode_block_m + dbatch) * kv_heads if dbatch else 0
    if prefill_units + decode_units == 0:
        return
    main, tail = split_dim(d)
    k_scale, k_scale_t, k_stride = scale_args(cache.k_scale, q)
    v_scale, v_scale_t, v_stride = scale_args(cache.v_scale, q)
    qk_scale, cap_log2 = soft_cap_args(p.sm_scale, p.logits_soft_cap, k_scale)
    descriptors = None if tail else tma_descriptors(k, v, cache.layout, page_size, pre)
    lse_t, dlse_t = (lse, lse_decode) if lse is not None and lse_decode is not None else (out, out_decode)
    bt, dbt = table.block_table, decode_table.block_table
    dv = v.shape[-1]
    vargs, hooks = variant_launch(None)
    f16_math = k.dtype in FP8_KV and q.dtype == torch.bfloat16
    _pod_kernel[(prefill_units + decode_units,)](
        q, q_decode, k, v, *(descriptors or (k, v, k, v)), qo_indptr, decode_indptr, bt, dbt, table.seq_lens,
        decode_table.seq_lens, out, out_decode, lse_t, dlse_t,
        q.stride(0), q.stride(1), q_decode.stride(0), q_decode.stride(1), k.stride(0), ks, kh, v.stride(0), vs, vh,
        bt.stride(0), dbt.stride(0), out.stride(0), out.stride(1), out_decode.stride(0), out_decode.stride(1),
        lse_t.stride(0), lse_t.stride(1), dlse_t.stride(0), dlse_t.stride(1),
        qk_scale, cap_log2, v_scale, k_scale_t, v_scale_t, p.window_left, batch, dbatch, prefill_units, decode_units,
        vargs,
        GROUP=group, NUM_KV_HEADS=kv_heads, BLOCK_M=pre.block_m, BLOCK_N=pre.block_n, DIAG_N=pre.diag_n or pre.block_n,
        D_BLOCK_M=cfg.decode_block_m, D_BLOCK_N=cfg.decode_block_n, HEAD_MAIN=main, HEAD_TAIL=tail, HEAD_DIM_V=dv,
        BLOCK_DV=triton.next_power_of_2(dv), PAGE_SIZE=page_size, TMA=descriptors is not None,
        HND=cache.layout == "HND", CAUSAL=bool(p.causal), WINDOW=p.window_left >= 0,
        SOFT_CAP=soft_cap_mode(p.logits_soft_cap, q.dtype),
        FIXED_MAX=fixed_max(p.logits_soft_cap, q.dtype, f16_math, hooks, pre.exp2_fma), RETURN_LSE=lse is not None,
        LOG_B=max(1, batch.bit_length()), D_LOG_B=max(1, dbatch.bit_length()),
        DOT_FP32=pre.dot_fp32 and q.dtype == torch.bfloat16 and not f16_math, F16_MATH=f16_math, SCHEDULE=SCHEDULES[cfg.schedule],
        K_SCALE_STRIDE=k_stride, V_SCALE_STRIDE=v_stride,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


class PODRunner:
    """``Kernel.plan`` of the POD kernel: the launch configuration and the decode part's ``qo_indptr`` (0..Bd) for
    these tables; ``run`` only launches (no host synchronisation; it allocates only the outputs it is not given)."""

    def __init__(self, problem: Any, table: Any, p: Any, *, qo_indptr: torch.Tensor, decode_table: Any,
                 config: PODConfig | None = None, **_: Any) -> None:
        self.table, self.decode_table, self.p, self.qo_indptr = table, decode_table, p, qo_indptr
        device = table.block_table.device
        self.decode_indptr = torch.arange(decode_table.batch_size + 1, dtype=torch.int32, device=device)
        self.cfg = config or pod_config(device, problem.head_dim, problem.head_dim_v, problem.group_size,
                                        rows_bucket(p, problem.group_size))
        self.head_dim_v = problem.head_dim_v

    def run(self, q: torch.Tensor, q_decode: torch.Tensor, cache: Any, out: torch.Tensor | None,
            out_decode: torch.Tensor | None, lse: torch.Tensor | None, lse_decode: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        want = self.p.return_lse
        out = q.new_empty(*q.shape[:2], self.head_dim_v) if out is None else out
        out_decode = q_decode.new_empty(*q_decode.shape[:2], self.head_dim_v) if out_decode is None else out_decode
        if want:
            lse = q.new_empty(q.shape[:2], dtype=torch.float32) if lse is None else lse
            lse_decode = q.new_empty(q_decode.shape[:2], dtype=torch.float32) if lse_decode is None else lse_decode
        else:
            lse = lse_decode = None
        launch_pod(q, self.qo_indptr, q_decode, self.decode_indptr, cache, self.table, self.decode_table, out,
                   out_decode, lse, lse_decode, self.p, self.cfg)
        return out, out_decode, lse, lse_decode


def pod(q: torch.Tensor, qo_indptr: torch.Tensor, q_decode: torch.Tensor, cache: Any, table: Any, decode_table: Any,
        p: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The ``attention.pod`` kernel (run-only form): the runner for these tables, run once."""
    problem = _Dims(cache.head_dim, cache.head_dim_v, q.shape[1] // cache.num_kv_heads)
    return PODRunner(problem, table, p, qo_indptr=qo_indptr, decode_table=decode_table).run(q, q_decode, cache, None,
                                                                                             None, None, None)


class _Dims(NamedTuple):
    head_dim: int
    head_dim_v: int
    group_size: int
