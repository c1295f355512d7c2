"""A Llama-family decoder (GQA, RoPE with Llama-3.1 scaling, RMSNorm, SwiGLU) on switchboard ops.

Per layer: ``rms_norm`` (fused with the residual add after the first) -> ``gemm.mm`` to q|k|v ->
``rope.apply`` -> ``kv_cache.append`` into the paged cache -> attention through one plan per step:
``attention.prefill`` (any mix of prefill chunks and decode tokens, one ``qo_indptr``) or ``attention.decode``
(every request one token) -> ``gemm.mm`` -> ``fused_add_rms_norm`` -> ``gemm.mm`` -> ``silu_and_mul`` -> ``gemm.mm``.
Plain torch only gathers embeddings and reshapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.paged import PagedKVCache, PageTable

from . import calls
from .cache import StepBatch
from .model import PagedModel
from .weights import DenseMLP, LlamaLayer, LlamaWeights


@dataclass
class LlamaKVCache:
    """K and V pages of every layer: ``(layers, pages, page_size, kv_heads, head_dim)``, one view per layer."""

    k: torch.Tensor
    v: torch.Tensor
    layers: list[PagedKVCache]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]


def dense_mlp(mlp: DenseMLP, h: torch.Tensor) -> torch.Tensor:
    """SwiGLU: (silu(h Wg) * h Wu) Wd, h (T, hidden)."""
    return calls.mm(calls.silu_and_mul(calls.mm(h, mlp.w_gate_up)), mlp.w_down)


class LlamaModel(PagedModel):
    """Forward passes of a Llama-family model over a paged KV cache. ``weights``: :class:`LlamaWeights`."""

    family = "llama"

    def __init__(self, weights: LlamaWeights) -> None:
        super().__init__(weights)
        self.w: LlamaWeights = weights

    def new_cache(self, num_pages: int, page_size: int) -> LlamaKVCache:
        s = self.spec
        shape = (s.num_layers, num_pages, page_size, s.num_kv_heads, s.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return LlamaKVCache(k, v, [PagedKVCache(k[i], v[i], layout="NHD") for i in range(s.num_layers)])

    # -- steps -------------------------------------------------------------------------------------
    def forward(self, batch: StepBatch, cache: LlamaKVCache) -> torch.Tensor:
        """Logits (N, vocab) of ``batch.logits_indices`` after writing the step's K/V into ``cache``."""
        decode = batch.is_decode
        s, dtype = self.spec, self.w.embed.dtype
        # one plan for every layer: validation, selection and the kernel's schedule once per step (and a prefill
        # step's indptrs read back once, not once per layer)
        if decode:
            plan = calls.plan_decode(cache.layers[0], batch.table, s.num_heads, dtype, s.sm_scale)
        else:
            plan = calls.plan_prefill(batch.qo_indptr, cache.layers[0], batch.table, s.num_heads, dtype, s.sm_scale)
        h = self._layers(batch.token_ids, batch.positions, batch.batch_indices, batch.table, cache,
                         None if decode else batch.qo_indptr, plan)
        return calls.mm(h[batch.logits_indices], self.w.lm_head)

    def decode_step(self, token_ids: torch.Tensor, positions: torch.Tensor, table: PageTable, cache: LlamaKVCache,
                    plan: Any = None) -> torch.Tensor:
        """One token per request: token_ids (B,) int64, positions (B,) int32 -> logits (B, vocab).

        ``table.seq_lens`` already counts the new token. Only tensor ops and switchboard ops, so it
        can be wrapped in ``torch.compile(fullgraph=True)`` or captured in a CUDA graph (pass the
        ``attention.plan_decode`` plan then).
        """
        h = self._layers(token_ids, positions, None, table, cache, None, plan)
        return calls.mm(h, self.w.lm_head)

    # -- layers ------------------------------------------------------------------------------------
    def _layers(self, token_ids: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None, table: PageTable,
                cache: LlamaKVCache, qo_indptr: torch.Tensor | None, plan: Any) -> torch.Tensor:
        eps = self.spec.rms_eps
        x = self.w.embed[token_ids]
        residual = x
        h = x
        for i, layer in enumerate(self.w.layers):
            if i == 0:
                h = calls.rms_norm(x, layer.attn_norm, eps)
            else:
                calls.fused_add_rms_norm(h, residual, layer.attn_norm, eps)
            h = self._attention(layer, h, positions, batch_indices, table, cache.layers[i], qo_indptr, plan)
            calls.fused_add_rms_norm(h, residual, layer.mlp_norm, eps)
            h = dense_mlp(layer.mlp, h)
        calls.fused_add_rms_norm(h, residual, self.w.final_norm, eps)
        return h

    def _attention(self, layer: LlamaLayer, h: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None,
                   table: PageTable, kv: PagedKVCache, qo_indptr: torch.Tensor | None, plan: Any) -> torch.Tensor:
        s = self.spec
        t, d = h.shape[0], s.head_dim
        qkv = calls.mm(h, layer.w_qkv)
        q = qkv[:, : s.num_heads * d].view(t, s.num_heads, d)
        k = qkv[:, s.num_heads * d: (s.num_heads + s.num_kv_heads) * d].view(t, s.num_kv_heads, d)
        v = qkv[:, (s.num_heads + s.num_kv_heads) * d:].view(t, s.num_kv_heads, d)
        q, k = calls.rope(q, k, positions, s.rope_theta, s.rope_scaling, False)
        calls.append_kv(k, v, kv, table, positions, batch_indices, qo_indptr is not None)
        if plan is not None:  # the step's plan (eager steps, CUDA-graph mode)
            o = calls.run_plan(plan, q, kv)
        else:
            o = calls.decode(q, kv, table, s.sm_scale)
        return calls.mm(o.reshape(t, s.num_heads * d), layer.w_o)
