"""Dense decoders of the Llama lineage on switchboard ops: Llama, Qwen2/3, Mistral, Mixtral, Gemma 2/3.

Per layer: ``rms_norm`` (fused with the residual add after the first) -> ``gemm.mm`` to q|k|v (with its bias:
Qwen2) -> per-head q/k ``rms_norm`` (Qwen3, Gemma 3) -> ``rope.apply`` (or ``rope.apply_cos_sin_cache`` for
linear / YaRN scaling) -> ``kv_cache.append`` into the paged cache -> attention through the step's plan for the
layer's window (one plan per distinct window: Gemma alternates sliding and global layers): ``attention.prefill``
(any mix of prefill chunks and decode tokens, one ``qo_indptr``) or ``attention.decode`` (every request one token),
with the model's softmax scale and attention soft-cap -> ``gemm.mm`` -> [``rms_norm``: Gemma's post-attention norm]
-> ``fused_add_rms_norm`` -> the MLP: ``gemm.mm`` -> ``silu_and_mul`` / ``gelu_tanh_and_mul`` -> ``gemm.mm``, or
Mixtral's ``moe.route`` (softmax top-k) + ``moe.experts`` -> [``rms_norm``: Gemma's post-MLP norm].

Plain torch only gathers embeddings, reshapes, and applies the final logit soft-cap (Gemma 2): ``cap * tanh(x /
cap)`` over the step's (N, vocab) logits, two elementwise passes next to the lm_head GEMM that produced them; no op
family holds it, and ``gemm.mm`` has no epilogue to fuse it into.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.ops.rope import cos_sin_cache
from kernel_switchboard.paged import PagedKVCache, PageTable

from . import calls
from .cache import StepBatch
from .model import PagedModel
from .weights import DenseMLP, LlamaLayer, LlamaWeights, MoEWeights, RopeSpec


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


def dense_mlp(mlp: DenseMLP, h: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """Gated MLP: (act(h Wg) * h Wu) Wd, h (T, hidden); ``activation`` "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    gate_up = calls.mm(h, mlp.w_gate_up)
    act = calls.gelu_tanh_and_mul(gate_up) if activation == "gelu_tanh" else calls.silu_and_mul(gate_up)
    return calls.mm(act, mlp.w_down)


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)``, as transformers caps Gemma 2's final logits (see the module docstring)."""
    return torch.tanh(logits / cap) * cap


class LlamaModel(PagedModel):
    """Forward passes of a dense decoder over a paged KV cache. ``weights``: :class:`LlamaWeights`.

    ``plan`` arguments (``decode_step``, ``_layers``) map each window of :attr:`LlamaSpec.distinct_windows` to
    the step's attention plan for it.
    """

    family = "llama"

    def __init__(self, weights: LlamaWeights) -> None:
        super().__init__(weights)
        self.w: LlamaWeights = weights
        s = self.spec
        #: cos/sin tables of the ropes rope.apply cannot take (linear, YaRN), built once
        self.rope_tables = {rope: cos_sin_cache(s.max_position, s.head_dim, rope.theta, rope.scaling, self.device)
                            for rope in {s.layer_rope(i) for i in range(s.num_layers)} if rope.needs_table}

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
        # one plan per window for every layer: validation, selection and the kernel's schedule once per step (and a
        # prefill step's indptrs read back once per window, not once per layer)
        if decode:
            plans = {w: calls.plan_decode(cache.layers[0], batch.table, s.num_heads, dtype, s.sm_scale,
                                          s.attn_soft_cap, w) for w in s.distinct_windows}
        else:
            plans = {w: calls.plan_prefill(batch.qo_indptr, cache.layers[0], batch.table, s.num_heads, dtype,
                                           s.sm_scale, s.attn_soft_cap, w) for w in s.distinct_windows}
        h = self._layers(batch.token_ids, batch.positions, batch.batch_indices, batch.table, cache,
                         None if decode else batch.qo_indptr, plans)
        return self.logits(h[batch.logits_indices])

    def decode_step(self, token_ids: torch.Tensor, positions: torch.Tensor, table: PageTable, cache: LlamaKVCache,
                    plan: dict[int, Any] | None = None) -> torch.Tensor:
        """One token per request: token_ids (B,) int64, positions (B,) int32 -> logits (B, vocab).

        ``table.seq_lens`` already counts the new token. Only tensor ops and switchboard ops, so it
        can be wrapped in ``torch.compile(fullgraph=True)`` or captured in a CUDA graph (pass the
        ``attention.plan_decode`` plans then, one per window).
        """
        h = self._layers(token_ids, positions, None, table, cache, None, plan)
        return self.logits(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head of the final hidden states (N, hidden), soft-capped when the model caps them."""
        out = calls.mm(h, self.w.lm_head)
        cap = self.spec.final_soft_cap
        return out if cap is None else soft_cap(out, cap)

    # -- layers ------------------------------------------------------------------------------------
    def _layers(self, token_ids: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None,
                table: PageTable, cache: LlamaKVCache, qo_indptr: torch.Tensor | None,
                plan: dict[int, Any] | None) -> torch.Tensor:
        s = self.spec
        eps, gemma = s.rms_eps, s.gemma_norms
        x = self.w.embed[token_ids]
        residual = x
        h = x
        for i, layer in enumerate(self.w.layers):
            if i == 0:
                h = calls.rms_norm(x, layer.attn_norm, eps, gemma)
            else:
                calls.fused_add_rms_norm(h, residual, layer.attn_norm, eps, gemma)
            h = self._attention(i, layer, h, positions, batch_indices, table, cache.layers[i], qo_indptr, plan)
            if layer.post_attn_norm is not None:
                h = calls.rms_norm(h, layer.post_attn_norm, eps, gemma)
            calls.fused_add_rms_norm(h, residual, layer.mlp_norm, eps, gemma)
            h = self._mlp(layer.mlp, h)
            if layer.post_mlp_norm is not None:
                h = calls.rms_norm(h, layer.post_mlp_norm, eps, gemma)
        calls.fused_add_rms_norm(h, residual, self.w.final_norm, eps, gemma)
        return h

    def _mlp(self, mlp: DenseMLP | MoEWeights, h: torch.Tensor) -> torch.Tensor:
        if isinstance(mlp, DenseMLP):
            return dense_mlp(mlp, h, self.spec.activation)
        # Mixtral: router logits in the model dtype (as transformers' linear), softmax over them in float32, top-k
        # renormalised; the experts are SwiGLU MLPs
        logits = calls.mm(h, mlp.router).float()
        weights, ids = calls.route(logits, self.spec.experts_per_tok, "softmax", True, None, None, None, 1.0)
        return calls.experts(h, weights, ids, mlp.w13, mlp.w2)

    def _rope(self, rope: RopeSpec, q: torch.Tensor, k: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if rope.needs_table:
            return calls.rope_table(q, k, positions, self.rope_tables[rope], rope.interleaved)
        return calls.rope(q, k, positions, rope.theta, rope.scaling, rope.interleaved)

    def _attention(self, i: int, layer: LlamaLayer, h: torch.Tensor, positions: torch.Tensor,
                   batch_indices: torch.Tensor | None, table: PageTable, kv: PagedKVCache,
                   qo_indptr: torch.Tensor | None, plan: dict[int, Any] | None) -> torch.Tensor:
        s = self.spec
        t, d = h.shape[0], s.head_dim
        qkv = calls.mm(h, layer.w_qkv, layer.b_qkv)
        q = qkv[:, : s.num_heads * d].view(t, s.num_heads, d)
        k = qkv[:, s.num_heads * d: (s.num_heads + s.num_kv_heads) * d].view(t, s.num_kv_heads, d)
        v = qkv[:, (s.num_heads + s.num_kv_heads) * d:].view(t, s.num_kv_heads, d)
        if layer.q_norm is not None and layer.k_norm is not None:  # over each head's dims
            q = calls.rms_norm(q.reshape(-1, d), layer.q_norm, s.rms_eps, s.gemma_norms).view(t, s.num_heads, d)
            k = calls.rms_norm(k.reshape(-1, d), layer.k_norm, s.rms_eps, s.gemma_norms).view(t, s.num_kv_heads, d)
        q, k = self._rope(s.layer_rope(i), q, k, positions)
        calls.append_kv(k, v, kv, table, positions, batch_indices, qo_indptr is not None)
        window = s.window(i)
        if plan is not None:  # the step's plans (eager steps, CUDA-graph mode)
            o = calls.run_plan(plan[window], q, kv)
        else:
            o = calls.decode(q, kv, table, s.sm_scale, s.attn_soft_cap, window)
        return calls.mm(o.reshape(t, s.num_heads * d), layer.w_o, layer.b_o)
