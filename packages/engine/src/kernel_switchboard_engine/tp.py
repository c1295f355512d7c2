"""Tensor-parallel Llama on switchboard ops (Megatron-style split, one process per rank).

Per rank ``r`` of ``W``:

- attention: column-parallel q/k/v (heads ``[r Hq/W, (r+1) Hq/W)`` and KV heads ``[r Hkv/W, (r+1) Hkv/W)``),
  a paged KV cache holding only this rank's KV heads, row-parallel ``o_proj`` (its ``Hq D / W`` rows);
- MLP: column-parallel gate/up (``I / W`` columns of each), row-parallel ``down`` (``I / W`` rows);
- between them ``comm.all_reduce_fused_rms_norm`` sums the row-parallel partial outputs over the ranks,
  adds the residual and applies the next RMSNorm (post-attention norm, next layer's input norm, or the
  final norm) in one op;
- embedding, norms and ``lm_head`` replicated: every rank computes the same logits, so every rank can run
  the same :class:`~kernel_switchboard_engine.scheduler.Engine` and greedy sampling in lockstep.

The per-rank shard is an ordinary :class:`LlamaWeights` whose spec has ``Hq/W`` heads, ``Hkv/W`` KV heads
and ``I/W`` intermediate columns, so :class:`TPLlamaModel` reuses :class:`LlamaModel`'s attention and
MLP code unchanged and only replaces the residual/norm plumbing between them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import fail

from . import calls
from .llama import LlamaKVCache, LlamaModel, dense_mlp
from .weights import DenseMLP, LlamaLayer, LlamaSpec, LlamaWeights

#: environment for NCCL runs on shared hosts: NVLink multicast (NVLS / symmetric-memory multicast) off
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


# -- process group ---------------------------------------------------------------------------------------
def set_safe_env() -> None:
    """Turn NVLink multicast off in this process's environment (call before ``init_process_group``)."""
    os.environ.update(SAFE_ENV)


def init_distributed(backend: str | None = None, *, rank: int | None = None, world_size: int | None = None,
                     init_method: str | None = None) -> torch.device:
    """Initialise the default process group and return this rank's device.

    ``backend`` None picks ``nccl`` when CUDA is available and ``gloo`` otherwise. ``rank`` /
    ``world_size`` / ``init_method`` default to torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT``). On CUDA the device is ``cuda:LOCAL_RANK`` (``rank`` when unset).
    Sets :data:`SAFE_ENV` first.
    """
    set_safe_env()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise fail("backend", backend, "'nccl', 'gloo' or None")
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    device = torch.device("cpu")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = dict(backend=backend, rank=rank, world_size=world_size,
                                  init_method=init_method or "env://")
    if backend == "nccl":
        kwargs["device_id"] = device  # eager NCCL communicator: first collective does not pay the init
    torch.distributed.init_process_group(**kwargs)
    return device


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) without an initialised process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    return 0, 1


# -- sharding --------------------------------------------------------------------------------------------
#: the fields of a plain Llama spec (the rest switch on other families' features)
_LLAMA_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                 "rms_eps", "rope_theta", "rope_scaling")

def tp_spec(spec: LlamaSpec, world: int) -> LlamaSpec:
    """The per-rank spec: heads, KV heads and intermediate size divided by ``world`` (all must divide)."""
    if not (isinstance(world, int) and world >= 1):
        raise fail("world", world, "an int >= 1")
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        value = getattr(spec, name)
        if value % world:
            raise fail(f"spec.{name}", value, f"a multiple of the tensor-parallel size {world}")
    return dataclasses.replace(spec, num_heads=spec.num_heads // world, num_kv_heads=spec.num_kv_heads // world,
                               intermediate_size=spec.intermediate_size // world)


def _cols(w: torch.Tensor, start: int, size: int, rank: int) -> torch.Tensor:
    """Columns ``[start + rank size, start + (rank+1) size)`` of a (in, out) matrix."""
    return w[:, start + rank * size: start + (rank + 1) * size]


def shard_llama(weights: LlamaWeights, rank: int, world: int) -> LlamaWeights:
    """Rank ``rank``'s shard of full Llama weights (the engine's (in, out) layout, see :mod:`.weights`).

    w_qkv (hidden, (Hq + 2 Hkv) D) -> (hidden, (Hq + 2 Hkv) D / W) = [q_r | k_r | v_r];
    w_o (Hq D, hidden) -> rows of q_r's heads; w_gate_up (hidden, 2I) -> [gate_r | up_r];
    w_down (I, hidden) -> rows r I/W ... ; embed, norms, lm_head shared (not copied).
    """
    if not (isinstance(rank, int) and 0 <= rank < world):
        raise fail("rank", rank, f"an int in [0, {world})")
    plain = LlamaSpec(*[getattr(weights.spec, f) for f in _LLAMA_FIELDS], max_position=weights.spec.max_position)
    if weights.spec != plain:
        raise fail("weights.spec", weights.spec,
                   "a plain Llama (no biases, q/k norms, Gemma norms, soft-caps, windows or MoE): the tensor-parallel "
                   "split covers Llama only")
    s, local = weights.spec, tp_spec(weights.spec, world)
    d = s.head_dim
    q, kv, inter = local.num_heads * d, local.num_kv_heads * d, local.intermediate_size
    layers = []
    for layer in weights.layers:
        assert isinstance(layer.mlp, DenseMLP)  # a plain Llama, checked above
        w_qkv = torch.cat([_cols(layer.w_qkv, 0, q, rank), _cols(layer.w_qkv, s.num_heads * d, kv, rank),
                           _cols(layer.w_qkv, (s.num_heads + s.num_kv_heads) * d, kv, rank)], dim=1)
        w_gate_up = torch.cat([_cols(layer.mlp.w_gate_up, 0, inter, rank),
                               _cols(layer.mlp.w_gate_up, s.intermediate_size, inter, rank)], dim=1)
        w_o = layer.w_o[rank * q: (rank + 1) * q].contiguous()
        w_down = layer.mlp.w_down[rank * inter: (rank + 1) * inter].contiguous()
        layers.append(LlamaLayer(layer.attn_norm, w_qkv.contiguous(), w_o, layer.mlp_norm,
                                 DenseMLP(w_gate_up.contiguous(), w_down)))
    return LlamaWeights(local, weights.embed, layers, weights.final_norm, weights.lm_head)


# -- the model -------------------------------------------------------------------------------------------
def all_reduce_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                    group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``comm.all_reduce_fused_rms_norm`` through the engine's tracer: (norm(sum(x) + residual), sum + residual)."""
    return calls._call("comm.all_reduce_fused_rms_norm", ksb.comm.all_reduce_fused_rms_norm, x, residual, weight, eps,
                       group=group)


class TPLlamaModel(LlamaModel):
    """One rank of a tensor-parallel Llama: same interface as :class:`LlamaModel` (``forward``,
    ``decode_step``, ``new_cache``), replicated logits (N, vocab) on every rank.

    ``shard``: this rank's :func:`shard_llama` weights; ``full_spec``: the unsharded spec; ``group``: the
    tensor-parallel process group (None: the default group, or one process without a process group).
    Every rank must call ``forward``/``decode_step`` with the same batch. ``new_cache`` holds only this
    rank's KV heads: ``(layers, pages, page_size, Hkv / W, D)``.
    """

    def __init__(self, shard: LlamaWeights, full_spec: LlamaSpec, group: Any = None) -> None:
        super().__init__(shard)
        self.full_spec = full_spec
        self.rank, self.world = rank_and_world(group)
        if shard.spec != tp_spec(full_spec, self.world):
            raise fail("shard.spec", shard.spec, f"tp_spec(full_spec, {self.world})")
        # the default group as None: the only form that crosses torch.compile's custom op
        default = torch.distributed.group.WORLD if torch.distributed.is_available() else None
        self.group = None if group is None or group is default else group

    @classmethod
    def from_full(cls, weights: LlamaWeights, group: Any = None) -> TPLlamaModel:
        """This rank's model from the full weights (every rank holds them first, e.g. from the same seed)."""
        rank, world = rank_and_world(group)
        return cls(shard_llama(weights, rank, world), weights.spec, group)

    def _layers(self, token_ids: torch.Tensor, positions: torch.Tensor, batch_indices: torch.Tensor | None,
                table: Any, cache: LlamaKVCache, qo_indptr: torch.Tensor | None, plan: Any) -> torch.Tensor:
        eps, layers = self.spec.rms_eps, self.w.layers
        residual = self.w.embed[token_ids]
        h = calls.rms_norm(residual, layers[0].attn_norm, eps)
        for i, layer in enumerate(layers):
            partial = self._attention(i, layer, h, positions, batch_indices, table, cache.layers[i], qo_indptr, plan)
            h, residual = all_reduce_norm(partial, residual, layer.mlp_norm, eps, self.group)
            assert isinstance(layer.mlp, DenseMLP)  # shard_llama refuses MoE models
            partial = dense_mlp(layer.mlp, h)
            nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else self.w.final_norm
            h, residual = all_reduce_norm(partial, residual, nxt, eps, self.group)
        return h


# -- greedy generation without the scheduler (tests, tp_main) --------------------------------------------
@torch.no_grad()
def greedy(model: LlamaModel, prompts: list[list[int]], steps: int, page_size: int = 4
           ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill every prompt in one step, then ``steps - 1`` batched decode steps, argmax each time.

    Returns (tokens per prompt (steps each), the logits of every step: (len(prompts), vocab) float32).
    Works for :class:`LlamaModel` and :class:`TPLlamaModel` alike (on every rank).
    """
    from .cache import BlockTables, build_batch

    need = sum(-(-(len(p) + steps) // page_size) for p in prompts) + 1
    tables = BlockTables(need, page_size, model.device)
    cache = model.new_cache(need, page_size)
    rids = list(range(len(prompts)))
    for r, p in zip(rids, prompts):
        tables.extend(r, len(p))
    logits = model.forward(build_batch(tables, rids, prompts, ["last"] * len(rids)), cache)
    out: list[list[int]] = [[] for _ in prompts]
    history = []
    for step in range(steps):
        history.append(logits.float())
        new = logits.argmax(dim=-1).tolist()
        for r in rids:
            out[r].append(int(new[r]))
        if step + 1 == steps:
            break
        for r in rids:
            tables.extend(r, 1)
        logits = model.forward(build_batch(tables, rids, [[t] for t in new], ["last"] * len(rids)), cache)
    return out, history
