"""A DeepSeek-V3-family decoder on switchboard ops: MLA attention and grouped top-k MoE.

MLA keeps one latent KV "head" per token in the paged cache: ``ckv`` (R = kv_lora_rank, after
``kv_a_layernorm``) and ``kpe`` (the roped key part, Dr), written by ``kv_cache.append_mla``.

- Decode (one new token per request), absorbed: ``q_nope`` is folded through ``W_UK`` into the
  latent space (``gemm.grouped_mm`` per head), ``attention.mla_decode`` attends over the latent
  pages, and ``W_UV`` maps the latent output back to ``v_head_dim`` per head. Requests with a few
  new tokens after a history (speculative verification: up to ``ABSORBED_NEW_TOKENS``, one count
  per step) take the same path, with ``attention.mla_decode`` of (B, T, H, R) queries.
- Prefill chunks, non-absorbed: the request's latent tokens (cached prefix + new) are read from
  the pages, expanded by ``kv_b_proj`` (``gemm.mm``) into per-head K (nope | rope) and V, and
  ``attention.prefill_ragged`` runs causal attention with head_dim nope+rope and head_dim_v v.
  A mixed step runs both on their own rows.

MoE layers: router ``gemm.mm`` in float32 -> ``moe.route`` (sigmoid scores, correction bias,
``n_group``/``topk_group`` grouped top-k, ``norm_topk_prob``, ``routed_scaling_factor``) ->
``moe.experts`` -> plus the shared experts' SwiGLU MLP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.rope import cos_sin_cache
from kernel_switchboard.paged import PageTable

from . import calls
from .cache import StepBatch
from .llama import dense_mlp
from .model import PagedModel
from .weights import DeepseekWeights, DenseMLP, MLALayer, MoEWeights


@dataclass
class MLACache:
    """Latent pages of every layer: ckv (layers, pages, page_size, R), kpe (layers, pages, page_size, Dr)."""

    ckv: torch.Tensor
    kpe: torch.Tensor

    @property
    def page_size(self) -> int:
        return self.ckv.shape[2]

    @property
    def num_pages(self) -> int:
        return self.ckv.shape[1]


#: requests with at most this many new tokens after a history take the absorbed path (speculative verification)
ABSORBED_NEW_TOKENS = 8


@dataclass
class _DecodeRows:
    """Requests of a step on the absorbed decode path, ``tokens`` new tokens each: their token rows and page table."""

    rows: torch.Tensor | None  # (Bd * tokens,) int64 token rows, request by request; None = every row of the step
    table: PageTable
    plan: Any = None  # the step's attention.plan_mla_decode, made once and run by every layer (None: eager calls)
    tokens: int = 1


@dataclass
class _PrefillRows:
    """Requests of a step on the non-absorbed path, with the latent tokens to read back from the pages."""

    rows: torch.Tensor  # (Tp,) int64 token rows
    qo_indptr: torch.Tensor  # (Bp+1,) int32 over rows
    kv_indptr: torch.Tensor  # (Bp+1,) int32 over the gathered latent tokens
    kv_pages: torch.Tensor  # (Tk,) int64 page of each latent token
    kv_slots: torch.Tensor  # (Tk,) int64 slot in that page
    plan: Any = None  # the step's attention.plan_prefill_ragged, made once and run by every layer


def _plan_rows(batch: StepBatch, page_size: int) -> tuple[list[_DecodeRows], _PrefillRows | None]:
    """Split a step's requests into the absorbed groups (one new token; a few after a history, one count per
    step) and the prefill path (host lists only, no device reads)."""
    dev = batch.token_ids.device
    starts = [0]
    for n in batch.qo_lens:
        starts.append(starts[-1] + n)
    dec = [b for b, n in enumerate(batch.qo_lens) if n == 1 and batch.seq_lens[b] > 1]
    few = [b for b, n in enumerate(batch.qo_lens) if 1 < n <= ABSORBED_NEW_TOKENS and batch.seq_lens[b] > n]
    if len({batch.qo_lens[b] for b in few}) > 1:  # several counts in one step: those requests prefill
        few = []
    absorbed = set(dec) | set(few)
    pre = [b for b in range(len(batch.qo_lens)) if b not in absorbed]
    if not pre and not few:
        return [_DecodeRows(None, batch.table)], None
    groups = []
    for members in (dec, few):
        if members:
            tokens = batch.qo_lens[members[0]]
            idx = torch.tensor(members, dtype=torch.int64).to(dev)
            table = PageTable(batch.table.block_table[idx].contiguous(), batch.table.seq_lens[idx].contiguous(),
                              max_seq_len=max(batch.seq_lens[b] for b in members))
            rows = torch.tensor([starts[b] + i for b in members for i in range(tokens)], dtype=torch.int64).to(dev)
            groups.append(_DecodeRows(rows, table, tokens=tokens))
    if not pre:
        return groups, None
    tok_rows: list[int] = []
    qo, kv = [0], [0]
    pages: list[int] = []
    slots: list[int] = []
    for b in pre:
        tok_rows.extend(range(starts[b], starts[b + 1]))
        qo.append(qo[-1] + batch.qo_lens[b])
        n = batch.seq_lens[b]
        kv.append(kv[-1] + n)
        pages.extend(batch.block_rows[b][p // page_size] for p in range(n))
        slots.extend(p % page_size for p in range(n))

    def t(v: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(v, dtype=dtype).to(dev)

    prefill = _PrefillRows(t(tok_rows, torch.int64), t(qo, torch.int32), t(kv, torch.int32), t(pages, torch.int64),
                           t(slots, torch.int64))
    return groups, prefill


class DeepseekModel(PagedModel):
    """Forward passes of a DeepSeek-V3-family model over paged MLA latents. ``weights``: :class:`DeepseekWeights`."""

    family = "deepseek"

    def __init__(self, weights: DeepseekWeights) -> None:
        super().__init__(weights)
        self.w: DeepseekWeights = weights
        s = self.spec
        #: YaRN's cos/sin table (its attention factor folded in), built once; None for plain rope
        self.rope_table = (cos_sin_cache(s.max_position, s.qk_rope_head_dim, s.rope_theta, s.rope_scaling, self.device)
                           if s.rope.needs_table else None)

    def _rope(self, q_pe: torch.Tensor, kpe: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        if self.rope_table is not None:
            return calls.rope_table(q_pe, kpe, positions, self.rope_table, s.rope_interleave)
        return calls.rope(q_pe, kpe, positions, s.rope_theta, None, s.rope_interleave)

    def new_cache(self, num_pages: int, page_size: int) -> MLACache:
        s = self.spec
        ckv = torch.zeros(s.num_layers, num_pages, page_size, s.kv_lora_rank, dtype=self.dtype, device=self.device)
        kpe = torch.zeros(s.num_layers, num_pages, page_size, s.qk_rope_head_dim, dtype=self.dtype, device=self.device)
        return MLACache(ckv, kpe)

    # -- steps -------------------------------------------------------------------------------------
    def forward(self, batch: StepBatch, cache: MLACache) -> torch.Tensor:
        """Logits (N, vocab) of ``batch.logits_indices`` after writing the step's latents into ``cache``."""
        groups, prefill = _plan_rows(batch, cache.page_size)
        s = self.spec
        # one plan per absorbed group for every layer: validation, selection and the split schedule, once
        groups = [replace(g, plan=calls.plan_mla_decode(g.table, s.num_heads, s.kv_lora_rank, s.qk_rope_head_dim,
                                                        self.dtype, cache.page_size, s.sm_scale, q_len=g.tokens))
                  for g in groups]
        if prefill is not None:  # one plan for every layer: the step's indptrs are read back once
            prefill = replace(prefill, plan=calls.plan_prefill_ragged(
                prefill.qo_indptr, prefill.kv_indptr, s.num_heads, s.qk_nope_head_dim + s.qk_rope_head_dim,
                s.v_head_dim, self.dtype, s.sm_scale))
        rows = (groups, prefill)
        bidx = None if batch.is_decode else batch.batch_indices
        h = self._layers(batch.token_ids, batch.positions, bidx, batch.table, cache, rows, not batch.is_decode)
        return calls.mm(h[batch.logits_indices], self.w.lm_head)

    def decode_step(self, token_ids: torch.Tensor, positions: torch.Tensor, table: PageTable, cache: MLACache,
                    plan: Any = None) -> torch.Tensor:
        """One token per request (every request has a cache): logits (B, vocab). Compile/graph friendly.

        ``plan``: an ``attention.plan_mla_decode`` plan of ``table`` (CUDA-graph mode) that every layer runs; without
        one each layer calls ``attention.mla_decode`` (what ``torch.compile`` traces).
        """
        rows = ([_DecodeRows(None, table, plan)], None)
        h = self._layers(token_ids, positions, None, table, cache, rows, False)
        return calls.mm(h, self.w.lm_head)

    # -- layers ------------------------------------------------------------------------------------
    def _layers(self, token_ids: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None,
                table: PageTable, cache: MLACache, rows: tuple[list[_DecodeRows], _PrefillRows | None],
                check: bool) -> torch.Tensor:
        eps = self.spec.rms_eps
        x = self.w.embed[token_ids]
        residual = x
        h = x
        for i, layer in enumerate(self.w.layers):
            if i == 0:
                h = calls.rms_norm(x, layer.attn_norm, eps)
            else:
                calls.fused_add_rms_norm(h, residual, layer.attn_norm, eps)
            h = self._attention(layer, h, positions, batch_indices, table, cache.ckv[i], cache.kpe[i], rows, check)
            calls.fused_add_rms_norm(h, residual, layer.mlp_norm, eps)
            h = self._mlp(layer.mlp, h)
        calls.fused_add_rms_norm(h, residual, self.w.final_norm, eps)
        return h

    def _mlp(self, mlp: DenseMLP | MoEWeights, h: torch.Tensor) -> torch.Tensor:
        if isinstance(mlp, DenseMLP):
            return dense_mlp(mlp, h)
        s = self.spec
        logits = calls.mm(h.float(), mlp.router)
        weights, ids = calls.route(logits, s.num_experts_per_tok, "sigmoid", s.norm_topk_prob, s.n_group, s.topk_group,
                                   mlp.correction_bias, s.routed_scaling_factor)
        y = calls.experts(h, weights, ids, mlp.w13, mlp.w2)
        if mlp.shared is not None:
            y = y + dense_mlp(mlp.shared, h)
        return y

    def _attention(self, layer: MLALayer, h: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None,
                   table: PageTable, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
                   rows: tuple[list[_DecodeRows], _PrefillRows | None], check: bool) -> torch.Tensor:
        s = self.spec
        t, nh, nope, dr, r, dv = h.shape[0], s.num_heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim
        if layer.w_q is not None:
            q = calls.mm(h, layer.w_q)
        elif layer.w_q_a is not None and layer.q_a_norm is not None and layer.w_q_b is not None:
            q = calls.mm(calls.rms_norm(calls.mm(h, layer.w_q_a), layer.q_a_norm, _MLA_EPS), layer.w_q_b)
        else:
            raise fail("layer", "MLALayer without w_q or w_q_a/q_a_norm/w_q_b", "one of the two query projections")
        q = q.view(t, nh, nope + dr)
        latent = calls.mm(h, layer.w_kv_a)  # (T, R + Dr)
        ckv = calls.rms_norm(latent[:, :r], layer.kv_a_norm, _MLA_EPS)
        q_pe, kpe = self._rope(q[:, :, nope:], latent[:, r:].view(t, 1, dr), positions)
        kpe = kpe.view(t, dr)
        calls.append_mla(ckv, kpe, ckv_pages, kpe_pages, table, positions, batch_indices, check)
        q_nope = q[:, :, :nope]
        groups, prefill = rows
        if prefill is None and len(groups) == 1 and groups[0].rows is None:  # every row decodes
            out = self._absorbed(layer, q_nope, q_pe, ckv_pages, kpe_pages, groups[0])
        else:
            out = torch.empty(t, nh, dv, dtype=h.dtype, device=h.device)
            for g in groups:
                assert g.rows is not None  # (None only when one group holds every row, above)
                out[g.rows] = self._absorbed(layer, q_nope[g.rows], q_pe[g.rows], ckv_pages, kpe_pages, g)
            if prefill is not None:
                out[prefill.rows] = self._expanded(layer, q_nope, q_pe, ckv_pages, kpe_pages, prefill)
        return calls.mm(out.reshape(t, nh * dv), layer.w_o)

    def _absorbed(self, layer: MLALayer, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor,
                  kpe_pages: torch.Tensor, rows: _DecodeRows) -> torch.Tensor:
        """Absorbed MLA decode of the group's N = B * tokens rows, request by request: (N, H, v)."""
        q_lat = calls.bmm(q_nope.transpose(0, 1), layer.w_uk).transpose(0, 1).contiguous()  # (N, H, R)
        n, h = q_lat.shape[:2]
        if rows.tokens > 1:  # (B, T, H, .): each request's new tokens, causal among themselves
            q_lat = q_lat.view(-1, rows.tokens, h, q_lat.shape[-1])
            q_pe = q_pe.reshape(-1, rows.tokens, h, q_pe.shape[-1])
        if rows.plan is not None:
            lat = calls.run_plan(rows.plan, q_lat, q_pe.contiguous(), ckv_pages, kpe_pages)
        else:
            lat = calls.mla_decode(q_lat, q_pe.contiguous(), ckv_pages, kpe_pages, rows.table, self.spec.sm_scale)
        return calls.bmm(lat.reshape(n, h, -1).transpose(0, 1), layer.w_uv).transpose(0, 1)  # (N, H, v)

    def _expanded(self, layer: MLALayer, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor,
                  kpe_pages: torch.Tensor, rows: _PrefillRows) -> torch.Tensor:
        """Non-absorbed causal attention of the prefill rows over their whole latent history: (Tp, H, v)."""
        s = self.spec
        nh, nope, dv = s.num_heads, s.qk_nope_head_dim, s.v_head_dim
        ckv = ckv_pages[rows.kv_pages, rows.kv_slots]  # (Tk, R)
        kpe = kpe_pages[rows.kv_pages, rows.kv_slots]  # (Tk, Dr)
        tk = ckv.shape[0]
        kv = calls.mm(ckv, layer.w_kv_b).view(tk, nh, nope + dv)
        k = torch.cat([kv[:, :, :nope], kpe[:, None, :].expand(tk, nh, kpe.shape[-1])], dim=-1)
        v = kv[:, :, nope:].contiguous()
        pr = rows.rows
        q = torch.cat([q_nope[pr], q_pe[pr]], dim=-1)
        return calls.run_plan(rows.plan, q, k, v)


#: eps of the q_a / kv_a latent norms (transformers builds them with the RMSNorm default)
_MLA_EPS = 1e-6
