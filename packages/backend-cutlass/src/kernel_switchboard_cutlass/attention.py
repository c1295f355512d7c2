"""``attention.dense`` through CUTLASS's memory-efficient attention as shipped in torch (SDPA's efficient backend).

The flash kernels take no additive bias and no arbitrary mask; this kernel takes both. The op's
conventions differ from SDPA's in three places, handled here: causal is bottom-right aligned (SDPA's
``is_causal`` is top-left, and SDPA refuses a mask with it), so the causal mask is folded into the mask;
GQA repeats K/V heads (``enable_gqa`` is not on every torch the efficient backend serves); a query with
nothing to attend gets out 0 (SDPA may give NaN), so rows whose mask keeps nothing are zeroed.
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel, KernelUnavailableError
from kernel_switchboard.availability import missing_cuda

#: the efficient kernel wants head dims in multiples of 8 (16-byte rows in half precision)
HEAD_DIMS = frozenset(range(8, 513, 8))
CAPABILITY = Capability(devices=frozenset({"cuda"}), min_cc=(5, 0), head_dims=HEAD_DIMS, head_dims_v=HEAD_DIMS,
                        features=frozenset({"causal", "attn_bias", "qk_v_dims_differ", "cuda_graph"}))
INSTALL = "pip install torch  (a CUDA build, on a machine with an NVIDIA GPU)"
#: the efficient kernel's rate by head dim on the H200: head dim 64 from ``switchboard bench --preset dense`` (about
#: the same with or without a mask), head dim 128 from causal prefill at 1x8192
EFFICIENT_FLOPS = {64: 7.0e13, 128: 1.65e14}
#: causal with a bias: folding the causal mask into a copy of the bias, then finding the dead rows, moves ~16
#: bytes per (query, key) pair (1x4096 causal + bias, 16 heads: 2.2 ms against 1.0 ms of attention)
MERGE_BYTES_PER_PAIR = 16.0


def dense_cost(pr: Any) -> float:
    """Seconds: every score tile at the measured rate (the causal mask is a mask here: no tiles skipped), plus
    the causal-mask merge when there is a bias, plus a launch."""
    pairs = pr.batch * pr.num_q_heads * pr.q_len * pr.kv_len
    flops = 2.0 * pairs * (pr.head_dim + pr.head_dim_v)
    rate = EFFICIENT_FLOPS[64] if max(pr.head_dim, pr.head_dim_v) <= 64 else EFFICIENT_FLOPS[128]
    merge = pairs * MERGE_BYTES_PER_PAIR / 4e12 if "causal" in pr.features and pr.bias != "none" else 0.0
    return 1e-5 + flops / rate + merge


def causal_keep(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """(Lq, Lk) bool: query i (at KV position Lk - Lq + i) keeps KV positions up to its own."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)


def merged_mask(attn_bias: torch.Tensor | None, causal: bool, q_len: int, kv_len: int,
                device: torch.device) -> torch.Tensor | None:
    """The one mask SDPA gets: the bias (bool: True = keep; float: added) with the causal mask folded in."""
    if not causal:
        return attn_bias
    keep = causal_keep(q_len, kv_len, device)
    if attn_bias is None:
        return keep
    if attn_bias.dtype == torch.bool:
        return attn_bias & keep
    return attn_bias.masked_fill(~keep, float("-inf"))


def sdpa_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None, p: Any,
               backends: list[Any] | None = None) -> torch.Tensor:
    """The kernel: q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, Hq, Lq, Dv).

    ``backends``: the SDPA backends allowed (default: the efficient one only; tests on a CPU pass None
    for torch's choice, which checks this wrapper's conventions)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = merged_mask(attn_bias, p.causal, q.shape[2], k.shape[2], q.device)
    if mask is not None and mask.dim() < 4:  # SDPA wants at least (Lq, Lk): give it a 4-d view
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    allowed = [SDPBackend.EFFICIENT_ATTENTION] if backends is None and q.is_cuda else backends
    if allowed is None:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.sm_scale)
    else:
        try:
            with sdpa_kernel(allowed):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.sm_scale)
        except RuntimeError as exc:  # torch found no kernel of the allowed backends for these inputs
            raise KernelUnavailableError(
                f"cutlass:sdpa_efficient: torch's memory-efficient attention refused q {tuple(q.shape)} {q.dtype}, "
                f"v {tuple(v.shape)}, mask {None if mask is None else (tuple(mask.shape), mask.dtype)}: "
                f"{str(exc).splitlines()[0][:300]}; pass backend='reference' (or another kernel) for this call"
            ) from exc
    if mask is not None:
        dead = ~mask.any(-1) if mask.dtype == torch.bool else torch.isneginf(mask).all(-1)
        out = out.masked_fill(dead[..., None], 0.0)
    return out


def kernels(version: str) -> list[Kernel]:
    """The dense attention kernel, unavailable with a reason where torch has no CUDA GPU."""
    reason = missing_cuda()
    return [Kernel("attention.dense", f"sdpa_efficient@torch-{torch.__version__.split('+')[0]}", "cutlass", CAPABILITY,
                   sdpa_dense, version=version, cost=dense_cost, unavailable=reason,
                   install=INSTALL if reason else None,
                   doc="CUTLASS memory-efficient attention in torch (SDPA efficient backend): additive bias or "
                       "bool mask, bottom-right causal, GQA by repeated K/V heads")]
