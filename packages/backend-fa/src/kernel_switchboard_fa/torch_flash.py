"""torch's built-in FlashAttention (SDPA flash backend, FA2 inside torch): dense, unpaged prefill.

Declared for ``attention.prefill_ragged`` with **one request** (batch 1): SDPA takes dense
(B, H, S, D) tensors without per-request lengths or masks, so a packed batch of several requests
cannot be expressed without a mask its flash backend lacks. For one request the lengths are the
tensor shapes (no device read). torch's ``is_causal`` aligns the mask top-left, the op bottom-right:
a causal call with fewer queries than keys is split into the keys before the queries (every query
sees them: non-causal) and the last ``Tq`` keys (square, where both alignments agree), merged by LSE.
LSE comes from ``aten._scaled_dot_product_flash_attention`` (natural log, (1, Hq, Tq)); GQA passes
``enable_gqa`` to SDPA, or repeats K/V heads for the aten call. No window, no soft cap, equal head dims.
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel

from .convert import merge_two
from .cost import prefill_cost
from .providers import TORCH_FLASH

HALF = frozenset({torch.float16, torch.bfloat16})
DIMS = frozenset(range(8, 257, 8))

CAPABILITY = Capability(
    devices=frozenset({"cuda"}), min_cc=(8, 0), dtypes=HALF, kv_dtypes=HALF, head_dims=DIMS, head_dims_v=DIMS,
    features=frozenset({"ragged", "causal", "return_lse", "cuda_graph"}), limits={"batch": 1},
)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """(T, H, D) -> (1, H, T, D) view."""
    return t.transpose(0, 1)[None]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """torch SDPA on its flash backend only: (1, Hq, Sq, D), (1, Hkv, Sk, D) -> (1, Hq, Sq, D)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                                enable_gqa=k.shape[1] != q.shape[1])


def _flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's flash kernel (equal head counts): out (1, H, Sq, D), lse (1, H, Sq) float32 natural log."""
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return res[0], res[1]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Dense (1, H, S, D) flash attention -> out (Tq, Hq, Dv)."""
    return _sdpa(q, k, v, causal, scale)[0].transpose(0, 1)


def _attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (1, H, S, D) flash attention with its LSE -> out (Tq, Hq, Dv), lse (Tq, Hq) float32."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, lse = _flash_lse(q, k, v, causal, scale)
    return out[0].transpose(0, 1), lse[0, :, : q.shape[2]].transpose(0, 1)


def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One request: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, D) -> out (Tq, Hq, D), lse (Tq, Hq) or None."""
    tq, tk = q.shape[0], k.shape[0]
    if tq == 0 or tk == 0:
        out = q.new_zeros((tq, q.shape[1], v.shape[-1]))
        return out, (q.new_full((tq, q.shape[1]), float("-inf"), dtype=torch.float32) if p.return_lse else None)
    qd, kd, vd = _dense(q), _dense(k), _dense(v)
    prefix = tk - tq if p.causal else 0
    if prefix <= 0 and not p.return_lse:
        return _attend(qd, kd, vd, p.causal, p.sm_scale).contiguous(), None
    if prefix <= 0:
        out, lse = _attend_lse(qd, kd, vd, p.causal, p.sm_scale)
        return out.contiguous(), lse.contiguous()
    out_a, lse_a = _attend_lse(qd, kd[:, :, :prefix], vd[:, :, :prefix], False, p.sm_scale)
    out_b, lse_b = _attend_lse(qd, kd[:, :, prefix:], vd[:, :, prefix:], True, p.sm_scale)
    out, lse = merge_two(out_a, lse_a, out_b, lse_b)
    return out, (lse if p.return_lse else None)


def kernels(version: str | None, unavailable: str | None) -> list[Kernel]:
    return [Kernel("attention.prefill_ragged", f"torch-flash@{version or 'none'}:prefill_ragged", "fa", CAPABILITY,
                   prefill_ragged, version=version or "", cost=prefill_cost("torch-flash"), unavailable=unavailable,
                   install=TORCH_FLASH.install if unavailable else None,
                   doc="torch SDPA flash backend, one dense request (batch 1)")]
