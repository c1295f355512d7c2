"""FlashAttention-4 (``flash_attn.cute.flash_attn_varlen_func``, CuTe DSL, JIT-compiled per shape).

- decode: a batch of one-token sequences over the paged NHD pool (``page_table`` + ``seqused_k``);
  page size 128 (= its KV tile) loads pages by TMA, other sizes by its cp.async loader.
  Split-KV: FA4 splits natively on sm_100 (``num_splits=0``: its heuristic); on sm_90 it has no
  split-KV, so small batches (B * Hkv at most half the SMs, no window) are split here by slicing
  the page table (:func:`~.convert.split_table`) and merged (:func:`~.convert.merge_splits`).
- prefill: packed queries (``cu_seqlens_q``) over the paged pool; prefill_ragged: ``cu_seqlens_q/k``; a
  ragged plan whose requests all have the same query and key counts calls FA4's dense entry on
  (B, S, H, D) views instead (its causal LPT tile scheduler; the varlen one schedules tiles in order).
- causal (bottom-right), sliding window, soft cap (a score_mod: about half the prefill rate), LSE, GQA
  packing; head dims 8..256 on sm_90; up to 128, 192/128 or 256/256 on sm_100.
- Rows of a partly used last page must hold finite values when the page size is 128 (the TMA
  path loads whole pages and multiplies masked rows by zero).
- Batch invariance (``ksb.batch_invariant()``), prefill and ragged prefill on sm_90: FA4 computes each (request,
  query tile, head) tile alone, with tile shapes fixed by the head dims and the mask kind and no split-KV there; in
  the scope a ragged plan always takes the varlen entry (the dense one would pack GQA heads by the batch's lengths).
  On sm_100 its query stages and split counts follow the batch, so the capability refuses the scope there.
  The prefill kernels rank above the Triton ones by priority, the scope's only ranking key.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.ops.attention_runner import buffers, into
from kernel_switchboard.paged import PagedKVCache, PageTable

from .convert import decode_queries, lse_batched, lse_batched_tokens, lse_varlen, merge_splits, softcap, split_table, window_fa4
from .cost import decode_cost, prefill_cost
from .providers import FA4, load


def quiet_aux_data_warning() -> None:
    """Silence CuTe DSL 4.8's warning, at each FA4 kernel's compile, that it cannot pass FA4 4.0.0b36's ``aux_data``
    argument (an ``AuxData`` of the score / mask modifiers FA4 builds itself) as a JIT argument: FA4 handles it, and
    the switchboard's FA4 results are checked against the reference kernels with and without modifiers. Only that
    message is silenced; installed when this module is imported."""
    warnings.filterwarnings("ignore", message=r"Argument aux_data \(position \d+\) cannot be converted to a JitArgument",
                            category=UserWarning)


quiet_aux_data_warning()

HALF = frozenset({torch.float16, torch.bfloat16})
DIMS = frozenset(range(8, 257, 8))
_COMMON = frozenset({"return_lse", "soft_cap", "sliding_window", "cuda_graph", "qk_v_dims_differ"})
#: prefill kernels whose per-request results do not depend on the batch (sm_90 only: :func:`check_arch`)
_PREFILL = _COMMON | {"causal", "mixed_batch", "batch_invariant"}
#: above the Triton kernels' priority (10): inside the batch-invariant scope kernels rank by priority alone
PREFILL_PRIORITY = 20
#: fewest tokens per chunk worth a split of its own
MIN_SPLIT_TOKENS = 512
MAX_SPLITS = 16


def _fn() -> Any:
    return load(FA4).flash_attn_varlen_func


def _dense_fn() -> Any:
    return load(FA4).flash_attn_func


def check_arch(pr: Any) -> list[str]:
    """FA4's head-dim rules by architecture (interface.py ``_validate_head_dims``), and batch invariance on sm_90
    only."""
    d, dv = pr.head_dim, pr.head_dim_v
    major = (pr.cc or (9, 0))[0]
    reasons = []
    if not (major == 9 or (d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))):
        reasons.append(f"(head_dim, head_dim_v)=({d}, {dv}) not supported on compute capability {major}.x "
                       "(supported: both <= 128, (192, 128) or (256, 256))")
    if "batch_invariant" in pr.features and major != 9:
        reasons.append(f"batch invariance is served on compute capability 9.x only, not {major}.x (FA4's query "
                       "stages and split counts follow the batch there)")
    return reasons


def capabilities() -> dict[str, Capability]:
    common = dict(devices=frozenset({"cuda"}), min_cc=(9, 0), max_cc=(11, 9), dtypes=HALF, kv_dtypes=HALF,
                  head_dims=DIMS, head_dims_v=DIMS, check=check_arch)
    nhd = frozenset({"NHD"})
    return {
        "attention.decode": Capability(**common, layouts=nhd, features=_COMMON | {"paged"}),  # type: ignore[arg-type]
        "attention.prefill": Capability(**common, layouts=nhd, features=_PREFILL | {"paged"}),  # type: ignore[arg-type]
        "attention.prefill_ragged": Capability(**common, features=_PREFILL | {"ragged"}),  # type: ignore[arg-type]
    }


# -- split-KV ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.major


def native_splits(device: torch.device) -> int:
    """``num_splits`` to pass FA4: 0 (its own heuristic) on sm_100+, 1 on sm_90 (no split-KV there)."""
    return 0 if _sm_count(device.index or 0)[1] >= 10 else 1


def manual_splits(batch: int, kv_heads: int, kv_capacity: int, num_sms: int, window_left: int) -> int:
    """Chunks per request for the page-table split (sm_90): enough to fill the SMs when
    ``batch * kv_heads`` work units fill at most half of them, each chunk >= MIN_SPLIT_TOKENS."""
    units = batch * kv_heads
    if window_left >= 0 or units == 0 or 2 * units > num_sms:
        return 1
    return max(1, min(num_sms // units, kv_capacity // MIN_SPLIT_TOKENS, MAX_SPLITS))


# -- kernels --------------------------------------------------------------------------------------------------
def _empty(cache: PagedKVCache, table: PageTable, out: torch.Tensor, lse: torch.Tensor | None) -> bool:
    """No page to read at all: the op's empty result (0, -inf) instead of a zero-size launch."""
    if table.max_pages and cache.num_pages:
        return False
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))
    return True


def _decode_into(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any, splits: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    fn = _fn()
    kw = dict(softmax_scale=p.sm_scale, causal=True, window_size=window_fa4(p.window_left),
              softcap=softcap(p.logits_soft_cap))
    if splits > 1:
        tbl, lens = split_table(table.block_table, table.seq_lens, cache.page_size, splits)
        qs = decode_queries(q.repeat_interleave(splits, 0))
        out, lse = fn(qs, cache.k_pages, cache.v_pages, seqused_k=lens, page_table=tbl, return_lse=True, **kw)
        merged, merged_lse = merge_splits(out[:, 0], lse_batched(lse), splits)
        return merged, (merged_lse if p.return_lse else None)
    out, lse = fn(decode_queries(q), cache.k_pages, cache.v_pages, seqused_k=table.seq_lens,
                  page_table=table.block_table, num_splits=native_splits(q.device), return_lse=p.return_lse, **kw)
    return out[:, 0], (lse_batched(lse) if p.return_lse else None)


def _auto_splits(device: torch.device, batch: int, kv_heads: int, kv_capacity: int, window_left: int) -> int:
    num_sms, major = _sm_count(device.index or 0)
    if major != 9:
        return 1
    return manual_splits(batch, kv_heads, kv_capacity, num_sms, window_left)


def decode(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (B, Hq, D) -> out (B, Hq, Dv), lse (B, Hq) or None: a :class:`DecodePlan` run once."""
    return DecodePlan(None, table, p).run(q, cache, None, None)


class DecodePlan:
    """A planned FA4 decode: the split count is fixed at plan time; ``run`` slices the table on the
    device (so in-place table updates are seen), calls FA4 and merges. FA4 returns new tensors: a run given
    buffers copies into them, one given none returns FA4's."""

    def __init__(self, problem: Any, table: PageTable, p: Any, *, splits: int | None = None, **_: Any) -> None:
        self.table, self.p, self.splits = table, p, splits
        if splits is None and problem is not None:  # settled here, so a first run inside a capture does no host work
            self.splits = _auto_splits(table.block_table.device, table.batch_size, problem.num_kv_heads,
                                       table.max_pages * problem.page_size, p.window_left)

    def run(self, q: torch.Tensor, cache: PagedKVCache, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if q.shape[0] == 0 or not (self.table.max_pages and cache.num_pages):
            out, lse = buffers(out, lse, q, q.shape[:2], cache.head_dim_v, self.p.return_lse)
            _empty(cache, self.table, out, lse)
            return out, lse
        if self.splits is None:  # planned without a problem (an eager call): settle at the first run
            self.splits = _auto_splits(q.device, q.shape[0], cache.num_kv_heads,
                                       self.table.max_pages * cache.page_size, self.p.window_left)
        return into(_decode_into(q, cache, self.table, self.p, self.splits), out, lse)


def prefill(q: torch.Tensor, qo_indptr: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D) packed by qo_indptr over the paged pool -> out (Tq, Hq, Dv), lse (Tq, Hq) or None."""
    if q.shape[0] == 0 or not (table.max_pages and cache.num_pages):
        out = q.new_empty((q.shape[0], q.shape[1], cache.head_dim_v))
        lse = q.new_empty(q.shape[:2], dtype=torch.float32) if p.return_lse else None
        _empty(cache, table, out, lse)
        return out, lse
    out, lse = _fn()(q, cache.k_pages, cache.v_pages, cu_seqlens_q=qo_indptr, seqused_k=table.seq_lens,
                     page_table=table.block_table, max_seqlen_q=max(p.max_q_len, 1), softmax_scale=p.sm_scale,
                     causal=p.causal, window_size=window_fa4(p.window_left), softcap=softcap(p.logits_soft_cap),
                     return_lse=p.return_lse)
    return out, (lse_varlen(lse) if p.return_lse else None)


def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) packed by the indptrs -> out (Tq, Hq, Dv), lse or None."""
    out, lse = _fn()(q, k, v, cu_seqlens_q=qo_indptr, cu_seqlens_k=kv_indptr, max_seqlen_q=max(p.max_q_len, 1),
                     max_seqlen_k=max(p.max_kv_len, 1), softmax_scale=p.sm_scale, causal=p.causal,
                     window_size=window_fa4(p.window_left), softcap=softcap(p.logits_soft_cap), return_lse=p.return_lse)
    return out, (lse_varlen(lse) if p.return_lse else None)


#: causal dense prefill packs GQA query heads only for requests longer than this (see RaggedPrefillPlan)
PACK_GQA_ABOVE = 4096


class RaggedPrefillPlan:
    """A planned ragged prefill. From the indptrs' values (read by the core at plan time): a batch whose
    requests all have the same query and key counts, packed from offset 0, runs through FA4's dense
    entry on (B, S, H, D) views; others through the varlen one, as an unplanned call does, and so does every batch
    of a plan made in the batch-invariant scope."""

    def __init__(self, problem: Any, table: None, p: Any, *, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                 host_indptrs: tuple[list[int], list[int]] | None = None, **_: Any) -> None:
        self.p, self.indptrs, self.batch = p, (qo_indptr, kv_indptr), qo_indptr.shape[0] - 1
        self.dense, self.pack_gqa = False, None
        if host_indptrs is None or getattr(p, "batch_invariant", False):  # the varlen entry
            return
        qo, kv = host_indptrs
        q_lens = {b - a for a, b in itertools.pairwise(qo)}
        kv_lens = {b - a for a, b in itertools.pairwise(kv)}
        self.dense = (self.batch > 0 and qo[0] == 0 and kv[0] == 0 and len(q_lens) == 1 and len(kv_lens) == 1
                      and min(q_lens) > 0 and min(kv_lens) > 0)
        # FA4 packs the query heads of a KV head into one tile by default; unpacked tiles run causal prefill faster
        # up to 4096 queries per request on the H200, packed ones beyond
        self.pack_gqa = False if p.causal and self.dense and max(q_lens) <= PACK_GQA_ABOVE else None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
            lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) -> out (Tq, Hq, Dv), lse (Tq, Hq) float32 or None (FA4's
        own tensors, copied into the buffers given)."""
        if not self.dense:
            return into(prefill_ragged(q, k, v, *self.indptrs, self.p), out, lse)
        b, p = self.batch, self.p
        res, res_lse = _dense_fn()(q.unflatten(0, (b, -1)), k.unflatten(0, (b, -1)), v.unflatten(0, (b, -1)),
                                   softmax_scale=p.sm_scale, causal=p.causal, window_size=window_fa4(p.window_left),
                                   softcap=softcap(p.logits_soft_cap), return_lse=p.return_lse, pack_gqa=self.pack_gqa)
        return into((res.flatten(0, 1), lse_batched_tokens(res_lse) if p.return_lse else None), out, lse)


def kernels(version: str | None, unavailable: str | None) -> list[Kernel]:
    """FA4's kernel records; ``unavailable`` (reason) marks them all when FA4 cannot run here."""
    caps = capabilities()
    tag = f"fa4@{version or 'none'}"
    extra = dict(backend="fa", version=version or "", unavailable=unavailable,
                 install=FA4.install if unavailable else None)
    return [
        Kernel("attention.decode", f"{tag}:decode", capability=caps["attention.decode"], run=decode, plan=DecodePlan,
               cost=decode_cost("fa4"), doc="FA4 paged decode (page 128 = TMA fast path; split-KV on small batches)",
               reads_stale_slots=True, **extra),  # type: ignore[arg-type]
        Kernel("attention.prefill", f"{tag}:prefill", capability=caps["attention.prefill"], run=prefill,
               cost=prefill_cost("fa4"), doc="FA4 varlen queries over the paged pool", reads_stale_slots=True,
               priority=PREFILL_PRIORITY, **extra),  # type: ignore[arg-type]
        Kernel("attention.prefill_ragged", f"{tag}:prefill_ragged", capability=caps["attention.prefill_ragged"],
               run=prefill_ragged, plan=RaggedPrefillPlan, cost=prefill_cost("fa4"), priority=PREFILL_PRIORITY,
               doc="FA4 varlen Q/K/V; plans of uniform batches: FA4's dense entry", **extra),  # type: ignore[arg-type]
    ]
