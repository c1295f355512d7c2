"""cuDNN attention kernels: paged decode, paged prefill (packed queries) and ragged prefill.

Each call is one cuDNN SDPA graph (``graphs.py``) built from the call's :class:`~.convert.SdpaSpec`
and cached; ``run`` builds through that cache, and the plans below build at their first run and
keep their graph, workspace and side tensors, so a planned run is one ``execute`` (capturable).
Capabilities come from :class:`~.support.Support` (the installed cuDNN version and the GPU).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel, empty_rows
from kernel_switchboard.ops.attention_runner import buffers
from kernel_switchboard.paged import PagedKVCache, PageTable

from . import graphs
from .convert import (
    check_offsets,
    decode_spec,
    indptr_lengths,
    lengths_4d,
    lse_gather_index,
    pages_hnd,
    prefill_spec,
    q_bucket,
    ragged_offsets,
    ragged_spec,
    table_4d,
    uniform_spec,
)
from .cost import decode_cost, prefill_cost
from .support import Support

BACKEND = "cudnn"
UPGRADE = "pip install -U nvidia-cudnn-cu12 (CUDA 12 torch) or nvidia-cudnn-cu13 (CUDA 13 torch)"
HALF = frozenset({torch.float16, torch.bfloat16})
#: cuDNN's paged containers take power-of-two block sizes
PAGE_SIZES = frozenset(1 << i for i in range(11))
_COMMON = frozenset({"return_lse", "cuda_graph", "deterministic", "qk_v_dims_differ"})


# -- capabilities ----------------------------------------------------------------------------------------
def _checker(version: int, decode: bool, needs_causal_window: bool) -> Any:
    """The check for what the fields cannot say: head-dim pairs for the problem's GPU, window needs causal."""

    def check(pr: Any) -> list[str]:
        s = Support(version, pr.cc or (9, 0))
        reasons = []
        dims = (pr.head_dim, pr.head_dim_v)
        if pr.head_dim != pr.head_dim_v:
            if dims not in s.split_head_dims:
                reasons.append(f"(head_dim, head_dim_v)={dims} not supported (supported: equal dims, or "
                               f"{sorted(s.split_head_dims) or 'none'} on this cuDNN/GPU)")
        elif pr.head_dim not in s.head_dims(decode):
            reasons.append(f"head_dim={pr.head_dim} not supported on compute capability {s.cc[0]}.{s.cc[1]} "
                           f"(supported: multiples of 8 up to {max(s.head_dims(decode))})")
        if needs_causal_window and "sliding_window" in pr.features and "causal" not in pr.features:
            reasons.append("sliding_window without causal not supported (cuDNN's left diagonal bound needs the "
                           "causal right bound)")
        return reasons

    return check


def capabilities(s: Support) -> dict[str, Capability]:
    """The declared capability of each op for cuDNN version/GPU ``s``."""
    window = frozenset({"sliding_window"}) if s.sliding_window else frozenset()
    dims = s.head_dims(decode=False) | {d for pair in s.split_head_dims for d in pair}
    common = dict(devices=frozenset({"cuda"}), min_cc=(8, 0), dtypes=HALF, kv_dtypes=HALF, head_dims=dims,
                  head_dims_v=dims)
    return {
        "attention.decode": Capability(**common, page_sizes=PAGE_SIZES, layouts=s.layouts,  # type: ignore[arg-type]
                                       features=_COMMON | window | {"paged"},
                                       check=_checker(s.version, True, False)),
        "attention.prefill": Capability(**common, page_sizes=PAGE_SIZES, layouts=s.layouts,  # type: ignore[arg-type]
                                        features=_COMMON | window | {"paged", "causal", "mixed_batch"},
                                        check=_checker(s.version, False, True)),
        "attention.prefill_ragged": Capability(**common,  # type: ignore[arg-type]
                                               features=_COMMON | window | {"ragged", "causal", "mixed_batch"},
                                               check=_checker(s.version, False, True)),
    }


def _no_pages(cache: PagedKVCache, table: PageTable, out: torch.Tensor, lse: torch.Tensor | None) -> bool:
    """No page to read at all (a zero-size graph would be refused): write the op's empty result."""
    if table.max_pages and cache.num_pages:
        return False
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))
    return True


# -- decode ------------------------------------------------------------------------------------------------
def _empty_tokens(kv_lens: torch.Tensor, qo_indptr: torch.Tensor, total: int) -> torch.Tensor:
    """(total,) bool: the query tokens of requests with no keys. Device ops, no host sync (``output_size``
    is the known token count), capturable."""
    return torch.repeat_interleave(kv_lens == 0, qo_indptr[1:] - qo_indptr[:-1], output_size=total)


def _zero_rows(empty: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """out 0, lse -inf on the ``empty`` query tokens (cuDNN leaves them undefined)."""
    out.masked_fill_(empty[:, None, None], 0.0)
    if lse is not None:
        lse.masked_fill_(empty[:, None], float("-inf"))


def _zero_empty_rows(kv_lens: torch.Tensor, qo_indptr: torch.Tensor, total: int, out: torch.Tensor,
                     lse: torch.Tensor | None) -> None:
    """Query tokens of requests with no keys: out 0, lse -inf."""
    _zero_rows(_empty_tokens(kv_lens, qo_indptr, total), out, lse)


def _decode_feeds(built: graphs.Built, q: torch.Tensor, cache: PagedKVCache, table: PageTable, out: torch.Tensor,
                  lse: torch.Tensor | None) -> dict[str, torch.Tensor]:
    k, v = pages_hnd(cache)
    bt = table_4d(table.block_table)
    feeds = {"q": q[:, :, None, :], "k": k, "v": v, "o": out[:, :, None, :], "seq_q": built.seq_ones(q.device),
             "seq_kv": lengths_4d(table.seq_lens), "k_table": bt, "v_table": bt}
    if lse is not None:
        feeds["stats"] = lse[:, :, None, None]
    return feeds


def decode(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (B, Hq, D) -> out (B, Hq, Dv), lse (B, Hq) float32 natural log or None: a :class:`DecodePlan` run once."""
    return DecodePlan(None, table, p).run(q, cache, None, None)


class DecodePlan:
    """A planned paged decode: the graph (built at the first run, for that cache's shape), its
    workspace and side tensors are kept; ``run`` is one cuDNN execute."""

    def __init__(self, problem: Any, table: PageTable, p: Any, **_: Any) -> None:
        self.table, self.p = table, p
        self._entries: dict[tuple[Any, ...], tuple[graphs.Built, torch.Tensor]] = {}
        if problem is not None:
            empty_rows.prepare(table.block_table.device, problem.dtype, (problem.num_q_heads, problem.head_dim_v),
                               problem.num_q_heads if p.return_lse else None)

    def _entry(self, q: torch.Tensor, cache: PagedKVCache) -> tuple[graphs.Built, torch.Tensor]:
        key = (q.stride(), cache.k_pages.shape, cache.k_pages.stride(), cache.v_pages.stride(), cache.layout)
        entry = self._entries.get(key)
        if entry is None:
            built = graphs.get(decode_spec(q, cache, self.table, self.p), q.device)
            entry = self._entries[key] = (built, graphs.workspace(built, q.device))
        return entry

    def run(self, q: torch.Tensor, cache: PagedKVCache, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, lse = buffers(out, lse, q, q.shape[:2], cache.head_dim_v, self.p.return_lse)
        if q.shape[0] == 0 or _no_pages(cache, self.table, out, lse):
            return out, lse
        built, ws = self._entry(q, cache)
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        s = lse if lse is None or lse.is_contiguous() else torch.empty_like(lse, memory_format=torch.contiguous_format)
        graphs.execute(built, _decode_feeds(built, q, cache, self.table, o, s), ws, q.device)
        empty_rows.zero_empty_requests(self.table.seq_lens, o, s)  # cuDNN leaves them undefined
        if o is not out:
            out.copy_(o)
        if lse is not None and s is not None and s is not lse:
            lse.copy_(s)
        return out, lse


# -- paged prefill -------------------------------------------------------------------------------------------
class _PackedQueries:
    """Device-side views of one qo_indptr: query lengths, ragged offsets, the LSE gather index (made
    when first needed)."""

    def __init__(self, qo_indptr: torch.Tensor, total: int, s_q: int, q_token_stride: int, o_token_stride: int) -> None:
        self.qo_indptr, self.total, self.s_q = qo_indptr, total, s_q
        self.seq_q = indptr_lengths(qo_indptr)
        self.q_off = ragged_offsets(qo_indptr, q_token_stride)
        self.o_off = ragged_offsets(qo_indptr, o_token_stride)
        self.q_token_stride = q_token_stride
        self._gather: torch.Tensor | None = None

    @property
    def gather(self) -> torch.Tensor:
        if self._gather is None:
            self._gather = lse_gather_index(self.qo_indptr, self.total, self.s_q)
        return self._gather


def _gather_lse(stats: torch.Tensor, gather: torch.Tensor, lse: torch.Tensor) -> None:
    """Dense stats (B, s_q, Hq) -> packed lse (T, Hq) in place."""
    torch.index_select(stats.view(-1, stats.shape[-1]), 0, gather, out=lse)


def _prefill_execute(built: graphs.Built, ws: torch.Tensor, q: torch.Tensor, cache: PagedKVCache, table: PageTable,
                     packed: _PackedQueries, out: torch.Tensor, lse: torch.Tensor | None, stats: torch.Tensor | None
                     ) -> None:
    """Execute the graph; ``stats`` (B, s_q, Hq) float32 is the LSE scratch, gathered into ``lse``."""
    k, v = pages_hnd(cache)
    bt = table_4d(table.block_table)
    feeds = {"q": q, "k": k, "v": v, "o": out, "seq_q": packed.seq_q, "seq_kv": lengths_4d(table.seq_lens),
             "k_table": bt, "v_table": bt, "q_off": packed.q_off, "o_off": packed.o_off}
    if lse is not None and stats is not None:
        feeds["stats"] = stats
    graphs.execute(built, feeds, ws, q.device)
    if lse is not None and stats is not None:
        _gather_lse(stats, packed.gather, lse)


def prefill(q: torch.Tensor, qo_indptr: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D) packed by qo_indptr -> out (Tq, Hq, Dv), lse (Tq, Hq) or None: a :class:`PrefillPlan` run
    once."""
    return PrefillPlan(None, table, p, qo_indptr=qo_indptr).run(q, cache, None, None)


class PrefillPlan:
    """A planned paged prefill: query lengths, offsets and the LSE gather index are made at plan
    time from ``qo_indptr`` (at the first run where its host values are not given); the graph is built at the
    first run and kept with its workspace."""

    def __init__(self, problem: Any, table: PageTable, p: Any, *, qo_indptr: torch.Tensor,
                 host_qo_indptr: list[int] | None = None, **_: Any) -> None:
        self.table, self.p, self.qo_indptr = table, p, qo_indptr
        self.s_q = q_bucket(p.max_q_len)
        self._packed: _PackedQueries | None = None
        total = None if host_qo_indptr is None else host_qo_indptr[-1]
        if problem is not None and total:  # side tensors made now, outside any capture
            self._packed = _PackedQueries(qo_indptr, total, self.s_q, problem.num_q_heads * problem.head_dim,
                                          problem.num_q_heads * problem.head_dim_v)
            if p.return_lse:
                self._packed.gather.numel()  # the LSE gather index, made now too
        self._entries: dict[tuple[Any, ...], tuple[graphs.Built, torch.Tensor]] = {}
        self._stats: torch.Tensor | None = None  # LSE scratch, made once (at the first run with LSE)

    def run(self, q: torch.Tensor, cache: PagedKVCache, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        total, hq, dv = q.shape[0], q.shape[1], cache.head_dim_v
        out, lse = buffers(out, lse, q, (total, hq), dv, self.p.return_lse)
        if total == 0 or self.table.batch_size == 0 or _no_pages(cache, self.table, out, lse):
            return out, lse
        packed = self._packed
        if packed is None or packed.q_token_stride != q.stride(0):
            check_offsets(q, "q")
            packed = self._packed = _PackedQueries(self.qo_indptr, total, self.s_q, q.stride(0), hq * dv)
        key = (q.stride(), cache.k_pages.shape, cache.k_pages.stride(), cache.v_pages.stride(), cache.layout)
        entry = self._entries.get(key)
        if entry is None:
            built = graphs.get(prefill_spec(q, cache, self.table, self.p, self.s_q), q.device)
            entry = self._entries[key] = (built, graphs.workspace(built, q.device))
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        if lse is not None and self._stats is None:
            self._stats = torch.empty((self.table.batch_size, self.s_q, hq), dtype=torch.float32, device=q.device)
        _prefill_execute(entry[0], entry[1], q, cache, self.table, packed, o, lse, self._stats)
        if o is not out:
            out.copy_(o)
        _zero_empty_rows(self.table.seq_lens, self.qo_indptr, total, out, lse)
        return out, lse


# -- ragged prefill --------------------------------------------------------------------------------------------
def _ragged_offset_feeds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor,
                         kv_indptr: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ragged offsets of packed q, k, v and of the (Tq, Hq, Dv) output, by graph role (int32: checked)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_offsets(t, name)
    return {"q_off": ragged_offsets(qo_indptr, q.stride(0)), "o_off": ragged_offsets(qo_indptr, q.shape[1] * v.shape[2]),
            "k_off": ragged_offsets(kv_indptr, k.stride(0)), "v_off": ragged_offsets(kv_indptr, v.stride(0))}


def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) packed by the indptrs -> out (Tq, Hq, Dv), lse or None: a
    :class:`RaggedPrefillPlan` (without the indptrs' host values: the ragged graph) run once."""
    plan = RaggedPrefillPlan(None, None, p, qo_indptr=qo_indptr, kv_indptr=kv_indptr, host_indptrs=None)
    return plan.run(q, k, v, None, None)


class RaggedPrefillPlan:
    """A planned ragged prefill. From the indptrs' values (read by the core at plan time): a batch whose
    requests all have the same query and key counts, packed from offset 0, runs as a dense graph (no
    ragged offsets, no padding mask: cuDNN's faster path); others get their lengths, offsets and LSE
    gather index made here. The zeroing of requests with queries but no keys (a full pass over ``out``)
    runs only when the plan has one. The graph is built at the first run (warm a plan before capturing it).
    Without the host values (an eager call in a CUDA-graph capture) the plan takes the ragged path and makes
    what depends on the query count at its first run, from q's rows."""

    def __init__(self, problem: Any, table: None, p: Any, *, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                 host_indptrs: tuple[list[int], list[int]] | None = None, **_: Any) -> None:
        self.p, self.qo_indptr, self.kv_indptr = p, qo_indptr, kv_indptr
        self.batch = qo_indptr.shape[0] - 1
        self.total: int | None = None  # query rows, where known before the first run
        self.uniform, self.empty, self.gather = False, None, None
        self.empty_unknown = host_indptrs is None  # whether requests with queries but no keys may exist
        if host_indptrs is not None:
            qo, kv = host_indptrs
            self.total = qo[-1]
            q_lens = [b - a for a, b in itertools.pairwise(qo)]
            kv_lens = [b - a for a, b in itertools.pairwise(kv)]
            #: query tokens of requests with no keys (zeroed after each run), when there are any
            self.empty = (_empty_tokens(kv_indptr[1:] - kv_indptr[:-1], qo_indptr, self.total)
                          if any(n > 0 and m == 0 for n, m in zip(q_lens, kv_lens)) else None)
            self.uniform = (self.batch > 0 and qo[0] == 0 and kv[0] == 0 and len(set(q_lens)) == 1
                            and len(set(kv_lens)) == 1 and q_lens[0] > 0 and kv_lens[0] > 0 and p.window_left < 0
                            and (not p.causal or q_lens[0] == kv_lens[0]))
        if self.uniform:
            self.s_q, self.s_kv = q_lens[0], kv_lens[0]
        else:
            self.s_q, self.s_kv = q_bucket(p.max_q_len), q_bucket(p.max_kv_len)
            self.seq = {"seq_q": indptr_lengths(qo_indptr), "seq_kv": indptr_lengths(kv_indptr)}
            if p.return_lse and self.total is not None:
                self.gather = lse_gather_index(qo_indptr, self.total, self.s_q)
        self._entries: dict[tuple[Any, ...], tuple[graphs.Built, torch.Tensor, dict[str, torch.Tensor]]] = {}
        self._stats: torch.Tensor | None = None

    def _entry(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[graphs.Built, torch.Tensor, dict[str, torch.Tensor]]:
        key = (q.stride(), k.stride(), v.stride())
        entry = self._entries.get(key)
        if entry is None:
            if self.uniform:
                spec, side = uniform_spec(q, k, v, self.batch, self.p, self.s_q, self.s_kv), {}
            else:
                side = {**self.seq, **_ragged_offset_feeds(q, k, v, self.qo_indptr, self.kv_indptr)}
                spec = ragged_spec(q, k, v, self.batch, self.p, self.s_q, self.s_kv)
            built = graphs.get(spec, q.device)
            entry = self._entries[key] = (built, graphs.workspace(built, q.device), side)
        return entry

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
            lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) -> out (Tq, Hq, Dv), lse (Tq, Hq) float32 or None."""
        total, hq = q.shape[0], q.shape[1]
        out, lse = buffers(out, lse, q, (total, hq), v.shape[2], self.p.return_lse)
        if total == 0 or self.batch == 0:
            return out, lse
        if k.shape[0] == 0:  # no keys anywhere: out 0, lse -inf, the op's convention, without a zero-size graph
            out.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return out, lse
        built, ws, side = self._entry(q, k, v)
        feeds = {"q": q, "k": k, "v": v, "o": out, **side}
        stats = None  # padded (B, S, Hq) stats to gather into lse
        if lse is not None:
            if self.uniform:  # (B, Hq, S, 1) stats with token-major strides are the packed (T, Hq) lse itself
                feeds["stats"] = lse
            else:
                if self._stats is None:
                    self._stats = torch.empty((self.batch, self.s_q, hq), dtype=torch.float32, device=q.device)
                stats = feeds["stats"] = self._stats
        graphs.execute(built, feeds, ws, q.device)
        if stats is not None and lse is not None:
            if self.gather is None:
                self.gather = lse_gather_index(self.qo_indptr, total, self.s_q)
            _gather_lse(stats, self.gather, lse)
        if self.empty_unknown:
            self.empty, self.empty_unknown = _empty_tokens(self.kv_indptr[1:] - self.kv_indptr[:-1], self.qo_indptr,
                                                           total), False
        if self.empty is not None:
            _zero_rows(self.empty, out, lse)
        return out, lse


# -- records ---------------------------------------------------------------------------------------------------
def kernels(s: Support, version: str) -> list[Kernel]:
    """The cuDNN attention kernels for support row ``s``; ``version`` names cuDNN and the frontend."""
    caps = capabilities(s)
    prefill_reason = s.prefill_unavailable()
    ragged_reason = s.ragged_unavailable()
    return [
        Kernel("attention.decode", "sdpa_paged_decode", BACKEND, caps["attention.decode"], decode, version=version,
               plan=DecodePlan, cost=decode_cost, doc="cuDNN SDPA over paged HND K/V, padding mask, cached graphs"),
        Kernel("attention.prefill", "sdpa_paged_prefill", BACKEND, caps["attention.prefill"], prefill, version=version,
               plan=PrefillPlan, cost=prefill_cost, unavailable=prefill_reason, install=UPGRADE if prefill_reason else None,
               reads_stale_slots=True, doc="cuDNN SDPA, packed (ragged) queries over paged K/V, bottom-right causal"),
        Kernel("attention.prefill_ragged", "sdpa_ragged_prefill", BACKEND, caps["attention.prefill_ragged"],
               prefill_ragged, version=version, plan=RaggedPrefillPlan, cost=prefill_cost, unavailable=ragged_reason,
               install=UPGRADE if ragged_reason else None,
               doc="cuDNN SDPA over packed (THD) Q/K/V with ragged offsets; plans of uniform batches: dense, no padding mask"),
    ]
