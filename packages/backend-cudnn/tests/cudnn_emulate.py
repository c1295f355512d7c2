"""A CPU model of what one cuDNN SDPA graph computes, driven only by its :class:`SdpaSpec` and the
bound buffers (dims, element strides, ragged offsets, page tables, lengths, masks), as
``docs/operations/Attention.md`` of cudnn-frontend defines them. Tests swap it in for the real
graph to check every conversion of the backend against the reference kernels on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_switchboard_cudnn.convert import SdpaSpec, TensorSpec, int_specs


@dataclass
class FakeBuilt:
    """Stands in for ``graphs.Built``: the spec, and every role name as its own 'tensor'."""

    spec: SdpaSpec
    tensors: dict[str, Any] = field(default_factory=dict)
    workspace_size: int = 0

    def __post_init__(self) -> None:
        roles = ["q", "k", "v", "o", "stats", "k_table", "v_table", *int_specs(self.spec)]
        self.tensors = {r: r for r in roles}

    def seq_ones(self, device: torch.device) -> torch.Tensor:
        return torch.ones((self.spec.batch, 1, 1, 1), dtype=torch.int32, device=device)


def _rows(ts: TensorSpec, feeds: dict[str, torch.Tensor], role: str, b: int, n: int) -> torch.Tensor:
    """(H, n, D) view of request b's first n rows of a dense or ragged tensor."""
    t = feeds[role]
    off = int(feeds[ts.ragged].reshape(-1)[b]) if ts.ragged is not None else b * ts.strides[0]
    return torch.as_strided(t, (ts.dims[1], n, ts.dims[3]), (ts.strides[1], ts.strides[2], ts.strides[3]),
                            t.storage_offset() + off)


def _paged(ts: TensorSpec, table_spec: TensorSpec, pool: torch.Tensor, table: torch.Tensor, b: int, n: int
           ) -> torch.Tensor:
    """(H, n, D) of request b gathered from a paged container through its page table."""
    pages = torch.as_strided(table, (table_spec.dims[2],), (table_spec.strides[2],),
                             table.storage_offset() + b * table_spec.strides[0]).long()
    container = torch.as_strided(pool, ts.dims, ts.strides, pool.storage_offset())
    bs = ts.dims[2]
    pos = torch.arange(n)
    return container[pages[pos // bs], :, pos % bs, :].permute(1, 0, 2)  # (n, H, D) -> (H, n, D)


def emulate(spec: SdpaSpec, feeds: dict[str, torch.Tensor]) -> None:
    """Compute the graph into the fed output buffers (float64 math)."""
    if spec.padding:
        seq_q = feeds["seq_q"].reshape(-1).tolist()
        seq_kv = feeds["seq_kv"].reshape(-1).tolist()
    else:  # no padding mask: every request has the full S of its tensors
        seq_q, seq_kv = [spec.q.dims[2]] * spec.batch, [spec.k.dims[2]] * spec.batch
    hq = spec.q.dims[1]
    for b in range(spec.batch):
        nq, nk = int(seq_q[b]), int(seq_kv[b])
        if nq == 0:
            continue
        if nk == 0:  # cuDNN leaves rows without keys undefined: write NaN so a backend that trusts them fails
            _rows(spec.o, feeds, "o", b, nq).fill_(float("nan"))
            if spec.stats is not None:
                st = spec.stats
                t = feeds["stats"]
                torch.as_strided(t, (st.dims[1], nq), (st.strides[1], st.strides[2]),
                                 t.storage_offset() + b * st.strides[0]).fill_(float("nan"))
            continue
        q = _rows(spec.q, feeds, "q", b, nq).double()
        if spec.table is not None:
            k = _paged(spec.k, spec.table, feeds["k"], feeds["k_table"], b, nk).double()
            v = _paged(spec.v, spec.table, feeds["v"], feeds["v_table"], b, nk).double()
        else:
            k = _rows(spec.k, feeds, "k", b, nk).double()
            v = _rows(spec.v, feeds, "v", b, nk).double()
        group = hq // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        s = torch.einsum("hqd,hkd->hqk", q, k) * spec.scale
        row = torch.arange(nq)[:, None] + (nk - nq)  # bottom-right: row i sits on column i + nk - nq
        col = torch.arange(nk)[None, :]
        keep = torch.ones(nq, nk, dtype=torch.bool)
        if spec.causal:
            keep &= col <= row
        if spec.left_bound is not None:
            keep &= col > row - spec.left_bound
        s = s.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # (H, nq); -inf for empty rows
        p = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), torch.zeros_like(s))
        _rows(spec.o, feeds, "o", b, nq).copy_(p @ v)
        if spec.stats is not None:
            st = spec.stats
            t = feeds["stats"]
            dst = torch.as_strided(t, (st.dims[1], nq), (st.strides[1], st.strides[2]),
                                   t.storage_offset() + b * st.strides[0])
            dst.copy_(lse)


def install(monkeypatch: Any) -> dict[str, int]:
    """Replace ``graphs.get/execute/workspace`` by the emulator; returns build/execute counters."""
    from kernel_switchboard_cudnn import graphs

    counts = {"get": 0, "execute": 0}

    def get(spec: SdpaSpec, device: torch.device) -> FakeBuilt:
        hash(spec)  # the real cache keys on it
        counts["get"] += 1
        return FakeBuilt(spec)

    def execute(built: FakeBuilt, feeds: dict[str, torch.Tensor], workspace: torch.Tensor, device: torch.device) -> None:
        counts["execute"] += 1
        emulate(built.spec, {r: t for r, t in feeds.items() if r in built.tensors})

    monkeypatch.setattr(graphs, "get", get)
    monkeypatch.setattr(graphs, "execute", execute)
    monkeypatch.setattr(graphs, "workspace", lambda built, device: torch.empty(1, dtype=torch.uint8))
    return counts
