"""Pure-decode steps with static shapes: eager, ``torch.compile(fullgraph=True)``, or CUDA graphs.

Every mode feeds ``model.decode_step`` from static buffers of a padded batch size (1, 2, 4, ...,
``max_batch``): token ids, positions, and a :class:`PageTable` whose ``block_table`` (B, width) and
``seq_lens`` are updated in place each step, with ``max_seq_len`` fixed to ``width * page_size`` so
nothing depends on host values that change. Padding rows decode a dummy token into a reserved
scratch page. In ``"cuda_graph"`` mode the attention goes through ``attention.plan_decode`` (dense models: one
plan per distinct window) or ``attention.plan_mla_decode`` (DeepSeek), planned once per batch size (``plan.run``
is capturable), and the whole step is captured once per batch size, then replayed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.paged import PageTable

from . import calls
from .cache import BlockTables

MODES = ("eager", "compile", "cuda_graph")


def missing_capturable(model: Any) -> list[str]:
    """Ops of ``model``'s decode step with no available CUDA-graph-capturable kernel for CUDA (empty = capturable)."""
    from kernel_switchboard.registry import registry

    s = model.spec
    ops = ["gemm.mm", "norm.rms_norm", "norm.fused_add_rms_norm"]
    ropes = [s.layer_rope(i) for i in range(s.num_layers)] if model.family == "llama" else [s.rope]
    ops += sorted({"rope.apply_cos_sin_cache" if r.needs_table else "rope.apply" for r in ropes})
    if model.family == "llama":
        ops += ["kv_cache.append", "attention.decode"]
        if s.num_experts:
            ops += ["moe.route", "moe.experts"]
        else:
            ops += ["activation.gelu_tanh_and_mul"] if s.activation == "gelu_tanh" else ["activation.silu_and_mul"]
    else:
        ops += ["activation.silu_and_mul", "kv_cache.append_mla", "attention.mla_decode", "gemm.grouped_mm",
                "moe.route", "moe.experts"]

    def ok(kernel: Any) -> bool:
        cap = kernel.capability
        return (kernel.unavailable is None and "cuda_graph" in cap.features
                and (cap.devices is None or "cuda" in cap.devices))

    return [op for op in ops if not any(ok(k) for k in registry.kernels(op))]


class _Slot:
    """Static buffers (and, for CUDA graphs, the captured graph) of one padded batch size."""

    def __init__(self, batch: int, width: int, page_size: int, device: torch.device) -> None:
        self.ids = torch.zeros(batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(batch, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(batch, width, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(batch, dtype=torch.int32, device=device)
        self.table = PageTable(self.block_table, self.seq_lens, max_seq_len=width * page_size)
        self.plan: Any = None  # dense models: {window_left: plan}; DeepSeek: one plan
        self.graph: Any = None
        self.logits: torch.Tensor | None = None


class DecodeRunner:
    """Runs decode steps of ``model`` over ``cache`` for requests kept in ``tables``.

    ``tables`` must hold one reserved page (``BlockTables(..., reserved_pages=1)``): padding rows
    write there. ``width``: the most pages any request may use.
    """

    def __init__(self, model: Any, cache: Any, tables: BlockTables, *, mode: str = "eager", max_batch: int = 32,
                 width: int) -> None:
        if mode not in MODES:
            raise fail("mode", mode, f"one of {MODES}")
        if mode == "cuda_graph" and model.device.type != "cuda":
            raise fail("mode", mode, "'eager' or 'compile' on a CPU model (CUDA graphs need a GPU)")
        if not tables.reserved:
            raise fail("tables.reserved", tables.reserved, "one reserved scratch page (reserved_pages=1)")
        self.model, self.cache, self.tables, self.mode = model, cache, tables, mode
        self.max_batch, self.width = max_batch, width
        self._slots: dict[int, _Slot] = {}
        self._step = torch.compile(model.decode_step, fullgraph=True) if mode == "compile" else model.decode_step

    def bucket(self, n: int) -> int:
        """The padded batch size that serves ``n`` requests."""
        b = 1
        while b < n:
            b *= 2
        return min(b, self.max_batch) if n <= self.max_batch else n

    def __call__(self, rids: Sequence[Hashable], token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (len(rids), vocab) of one new token per request; extend ``tables`` for each request first."""
        n = len(rids)
        if n > self.max_batch:
            raise fail("rids", f"{n} requests", f"at most max_batch = {self.max_batch}")
        slot = self._slot(self.bucket(n))
        self._fill(slot, rids, token_ids)
        if self.mode == "cuda_graph":
            if slot.graph is None:
                with calls.untraced():
                    self._capture(slot)
            slot.graph.replay()
            logits = slot.logits if slot.logits is not None else torch.empty(0)
        else:
            logits = self._step(slot.ids, slot.positions, slot.table, self.cache)
        return logits[:n]

    def plans(self) -> list[Any]:
        """The attention plans made so far (CUDA-graph mode: ``plan_decode`` or ``plan_mla_decode``), one per batch
        size."""
        plans: list[Any] = []
        for slot in self._slots.values():
            if isinstance(slot.plan, dict):
                plans.extend(slot.plan.values())
            elif slot.plan is not None:
                plans.append(slot.plan)
        return plans

    def warmup(self) -> None:
        """Compile / capture every padded batch size now (padding rows only: nothing real is written)."""
        b = 1
        while True:
            slot = self._slot(b)
            self._fill(slot, [], [])
            if self.mode == "cuda_graph":
                if slot.graph is None:
                    with calls.untraced():
                        self._capture(slot)
            else:
                self._step(slot.ids, slot.positions, slot.table, self.cache)
            if b >= self.max_batch:
                break
            b = min(2 * b, self.max_batch)

    # -- internals ---------------------------------------------------------------------------------
    def _slot(self, b: int) -> _Slot:
        slot = self._slots.get(b)
        if slot is None:
            slot = self._slots[b] = _Slot(b, self.width, self.tables.page_size, self.model.device)
        return slot

    def _fill(self, slot: _Slot, rids: Sequence[Hashable], token_ids: Sequence[int]) -> None:
        b, n = slot.ids.shape[0], len(rids)
        scratch = self.tables.reserved[0]
        table = torch.full((b, self.width), scratch, dtype=torch.int32)
        lens = torch.ones(b, dtype=torch.int32)
        for i, r in enumerate(rids):
            pages = self.tables.pages(r)
            if len(pages) > self.width:
                raise fail("width", self.width, f"at least {len(pages)} pages (request {r!r})")
            table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            lens[i] = self.tables.length(r)
        ids = torch.zeros(b, dtype=torch.int64)
        ids[:n] = torch.tensor(list(token_ids), dtype=torch.int64)
        positions = lens - 1
        slot.ids.copy_(ids, non_blocking=True)
        slot.positions.copy_(positions, non_blocking=True)
        slot.block_table.copy_(table, non_blocking=True)
        slot.seq_lens.copy_(lens, non_blocking=True)

    def _capture(self, slot: _Slot) -> None:
        model, s = self.model, self.model.spec
        max_kv = self.width * self.tables.page_size
        if model.family == "llama":
            slot.plan = {w: calls.plan_decode(self.cache.layers[0], slot.table, s.num_heads, model.dtype, s.sm_scale,
                                              s.attn_soft_cap, w, max_kv_len=max_kv, capturable=True)
                         for w in s.distinct_windows}
        else:
            slot.plan = calls.plan_mla_decode(slot.table, s.num_heads, s.kv_lora_rank, s.qk_rope_head_dim, model.dtype,
                                              self.tables.page_size, s.sm_scale, max_kv_len=max_kv, capturable=True)
        # warm up on a side stream (first-call table builds, lazy inits), then capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(slot.ids, slot.positions, slot.table, self.cache, slot.plan)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            slot.logits = self._step(slot.ids, slot.positions, slot.table, self.cache, slot.plan)
        slot.graph = graph
