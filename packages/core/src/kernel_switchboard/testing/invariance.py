"""Batch-invariance checks: one request's outputs, bit for bit, across batches of other sizes and compositions.

An :class:`InvarianceCase` holds several batches of one op that all contain the same request (its inputs identical;
its position, its neighbours and the batch's size and longest lengths different). :meth:`InvarianceCase.check`
runs the op's public function on each batch inside ``ksb.batch_invariant()`` with ``backend=`` and asserts that the
request's outputs have the same bits in every batch. :func:`invariance_cases` builds them for the ops the scope
serves, ``size="small"`` for the CPU and the Triton interpreter, ``"large"`` for a GPU (where the kernels' batch
dependent choices, such as split counts and tile shapes, would otherwise differ between the batches).
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..invariance import batch_invariant
from ..paged import PagedKVCache, PageTable
from .case import clone_args

_Tensor = torch.Tensor
#: (args, result) -> the request's outputs
Pick = Callable[[tuple[Any, ...], Any], list[_Tensor]]

#: the ops :func:`invariance_cases` builds cases for
OPS = ("attention.decode", "attention.prefill", "attention.prefill_ragged", "attention.mla_decode",
       "attention.mla_prefill", "attention.pod", "attention.dense", "attention.merge_states", "norm.rms_norm",
       "norm.fused_add_rms_norm", "norm.layer_norm", "gemm.mm", "gemm.mm_fp8", "moe.route", "moe.fused_moe",
       "sampling.renorm", "rope.apply", "activation.silu_and_mul", "activation.swiglu_oai_and_mul",
       "kv_cache.append", "kv_cache.append_slots", "kv_cache.append_csr")


@dataclass
class Batch:
    """One call: the public function's arguments and how to find the request's outputs in its result."""

    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    pick: Pick


@dataclass
class InvarianceCase:
    """Batches of ``op`` that all hold the same request; see the module docstring."""

    op: str
    id: str
    batches: list[Batch] = field(default_factory=list)

    @property
    def function(self) -> Callable[..., Any]:
        family, _, name = self.op.partition(".")
        return getattr(importlib.import_module(f"kernel_switchboard.ops.{family}"), name)  # type: ignore[no-any-return]

    def outputs(self, backend: str, invariant: bool = True) -> list[list[_Tensor]]:
        """The request's outputs in every batch (on cloned inputs), inside the batch-invariant scope."""
        found = []
        with batch_invariant(invariant):
            for batch in self.batches:
                args = clone_args(batch.args)
                result = self.function(*args, backend=backend, **batch.kwargs)
                found.append([t.detach().clone() for t in batch.pick(args, result)])
        return found

    def check(self, backend: str) -> list[list[_Tensor]]:
        """Assert that the request's outputs have the same bits in every batch; returns them."""
        found = self.outputs(backend)
        first = found[0]
        for batch, outs in zip(self.batches[1:], found[1:]):
            assert len(outs) == len(first)
            for i, (a, b) in enumerate(zip(first, outs)):
                assert_same_bits(b, a, f"{self.op}[{self.id}] output {i} of {backend}: batch "
                                       f"{batch.label!r} against {self.batches[0].label!r}")
        return found


def bits(t: _Tensor) -> _Tensor:
    """The bit patterns of ``t`` (floats viewed as integers of their width), on the CPU."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def assert_same_bits(got: _Tensor, want: _Tensor, what: str) -> None:
    """``got`` and ``want`` have the same shape, dtype and bits (NaN payloads and the sign of zero included)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {tuple(got.shape)} {got.dtype} against {tuple(want.shape)} {want.dtype}")
    diff = bits(got) != bits(want)
    if bool(diff.any()):
        idx = tuple(int(i) for i in diff.nonzero()[0])
        err = (got.double() - want.double()).abs().nan_to_num(float("inf")).max().item() if got.is_floating_point() else 0
        raise AssertionError(f"{what}: {int(diff.sum())} of {got.numel()} entries differ in their bits; first at {idx}: "
                             f"{got[idx].item()!r} against {want[idx].item()!r}; max abs difference {err:.3g}")


# -- data ---------------------------------------------------------------------------------------------------
class _Data:
    """Random tensors from one seeded CPU generator, moved to ``device`` in ``dtype``."""

    def __init__(self, seed: int, device: torch.device | str) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.device = device

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> _Tensor:
        return (torch.randn(*shape, generator=self.g) * scale).to(self.device, dtype)

    def randint(self, high: int, *shape: int) -> _Tensor:
        return torch.randint(0, high, shape, generator=self.g)


def _paged(data: _Data, kv: list[tuple[_Tensor, _Tensor]], page_size: int, layout: str) -> tuple[PagedKVCache, PageTable]:
    """A cache holding each request's K (L, Hkv, D) and V (L, Hkv, Dv) in shuffled pages (unused slots NaN)."""
    k0, v0 = kv[0]
    hkv, d, dv, dtype, device = k0.shape[1], k0.shape[2], v0.shape[2], k0.dtype, k0.device
    need = [math.ceil(k.shape[0] / page_size) for k, _ in kv]
    num_pages = sum(need) + 2
    perm = torch.randperm(num_pages, generator=data.g).tolist()
    table = torch.zeros(len(kv), max(max(need), 1) + 1, dtype=torch.int32)
    k_pages = torch.full((num_pages, page_size, hkv, d), float("nan"), dtype=dtype, device=device)
    v_pages = torch.full((num_pages, page_size, hkv, dv), float("nan"), dtype=dtype, device=device)
    start = 0
    for b, (k, v) in enumerate(kv):
        for i in range(need[b]):
            page = perm[start + i]
            table[b, i] = page
            rows = slice(i * page_size, min((i + 1) * page_size, k.shape[0]))
            k_pages[page, : rows.stop - rows.start] = k[rows]
            v_pages[page, : rows.stop - rows.start] = v[rows]
        table[b, need[b]:] = perm[start]  # past the request's pages: a valid page that kernels must ignore
        start += need[b]
    if layout == "HND":
        k_pages, v_pages = k_pages.transpose(1, 2).contiguous(), v_pages.transpose(1, 2).contiguous()
    lens = torch.tensor([k.shape[0] for k, _ in kv], dtype=torch.int32)
    return PagedKVCache(k_pages, v_pages, layout), PageTable(table.to(device), lens.to(device))


def _latent(data: _Data, kv: list[tuple[_Tensor, _Tensor]], page_size: int) -> tuple[_Tensor, _Tensor, PageTable]:
    """Latent pages ckv (P, S, Dc), kpe (P, S, Dr) holding each request's (ckv (L, Dc), kpe (L, Dr))."""
    cache, table = _paged(data, [(c[:, None], p[:, None]) for c, p in kv], page_size, "NHD")
    return cache.k_pages[:, :, 0], cache.v_pages[:, :, 0], table


def _indptr(lens: list[int], device: torch.device | str) -> _Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)


def _pick_rows(lo: int, hi: int) -> Pick:
    """The :data:`Pick` of rows lo:hi of every tensor of a result."""
    return lambda args, result: _rows(result, lo, hi)


def _pick_decode(row: int) -> Pick:
    """The :data:`Pick` of an ``attention.pod`` decode row: (out_decode, lse_decode) row ``row``."""
    return lambda args, result: [result[1][row:row + 1], result[3][row:row + 1]]


def _rows(result: Any, lo: int, hi: int) -> list[_Tensor]:
    """Rows lo:hi of a result (a tensor or a tuple of tensors)."""
    parts = result if isinstance(result, tuple) else (result,)
    return [t[lo:hi] for t in parts if isinstance(t, torch.Tensor)]


# -- the compositions -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sizes:
    """Shapes of one size class."""

    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    mla_heads: int
    #: the request's KV length and queries, and the other requests' (kv, q) of the two bigger batches
    kv_len: int
    q_len: int
    around: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]
    #: rows of the three batches of the row-wise ops, the request's row index in each
    rows: tuple[int, int, int]
    hidden: int
    gemm_nk: tuple[int, int]
    moe: tuple[int, int, int, int]  # experts, hidden, intermediate, top_k
    vocab: int


SMALL = _Sizes(4, 2, 64, 16, 4, 37, 5, (((5, 1), (90, 30)), ((120, 40), (1, 1), (0, 0), (64, 1))), (1, 7, 33), 300,
               (64, 48), (4, 64, 32, 2), 100)
LARGE = _Sizes(32, 8, 128, 16, 128, 5000, 700, (((300, 1), (9000, 512)), ((12000, 2048), (1, 1), (0, 0), (2048, 1))),
               (1, 64, 1000), 8192, (4096, 4096), (64, 2048, 768, 6), 128256)


def _compositions(s: _Sizes, decode: bool) -> list[tuple[str, list[tuple[int, int]], int]]:
    """(label, [(kv_len, q_len)] per request, the request's index): alone, between two others, last of five."""
    me = (s.kv_len, 1 if decode else s.q_len)
    (a, b), rest = s.around
    fix = (lambda kq: (kq[0], 1)) if decode else (lambda kq: kq)  # decode: one query per request
    return [("alone", [me], 0), ("middle of 3", [fix(a), me, fix(b)], 1),
            ("last of 5", [*(fix(x) for x in rest), me], len(rest))]


def _paged_case(op: str, s: _Sizes, dtype: torch.dtype, device: torch.device | str, layout: str,
                kwargs: dict[str, Any]) -> InvarianceCase:
    """attention.decode / prefill / prefill_ragged: the request's queries and K/V fixed, the others drawn anew."""
    decode = op == "attention.decode"
    mine = _Data(1, device)
    q_me = mine.randn(1 if decode else s.q_len, s.q_heads, s.head_dim, dtype=dtype)
    kv_me = (mine.randn(s.kv_len, s.kv_heads, s.head_dim, dtype=dtype), mine.randn(s.kv_len, s.kv_heads, s.head_dim,
                                                                                  dtype=dtype))
    case = InvarianceCase(op, f"{op.split('.')[1]}-{str(dtype)[6:]}-{layout}-L{s.kv_len}")
    for n, (label, reqs, pos) in enumerate(_compositions(s, decode)):
        data = _Data(100 + n, device)
        qs, kvs = [], []
        for b, (kv_len, q_len) in enumerate(reqs):
            if b == pos:
                qs.append(q_me)
                kvs.append(kv_me)
                continue
            qs.append(data.randn(q_len, s.q_heads, s.head_dim, dtype=dtype))
            kvs.append((data.randn(kv_len, s.kv_heads, s.head_dim, dtype=dtype),
                        data.randn(kv_len, s.kv_heads, s.head_dim, dtype=dtype)))
        q = torch.cat(qs)
        q_lens = [t.shape[0] for t in qs]
        lo = sum(q_lens[:pos])
        pick = _pick_rows(lo, lo + q_lens[pos])
        if op == "attention.prefill_ragged":
            k, v = torch.cat([k for k, _ in kvs]), torch.cat([v for _, v in kvs])
            args: tuple[Any, ...] = (q, k, v, _indptr(q_lens, device), _indptr([k.shape[0] for k, _ in kvs], device))
        else:
            cache, table = _paged(data, kvs, s.page_size, layout)
            args = (q, cache, table) if decode else (q, _indptr(q_lens, device), cache, table)
        case.batches.append(Batch(label, args, {**kwargs, "return_lse": True}, pick))
    return case


def _pod_case(s: _Sizes, dtype: torch.dtype, device: torch.device | str) -> InvarianceCase:
    """attention.pod: a decode request beside prefill parts and decode parts of other sizes (and a prefill request,
    checked as well, beside other decode parts)."""
    mine = _Data(9, device)
    q_me = mine.randn(1, s.q_heads, s.head_dim, dtype=dtype)
    kv_me = (mine.randn(s.kv_len, s.kv_heads, s.head_dim, dtype=dtype), mine.randn(s.kv_len, s.kv_heads, s.head_dim,
                                                                                  dtype=dtype))
    case = InvarianceCase("attention.pod", f"pod-{str(dtype)[6:]}-L{s.kv_len}")
    for n, (label, reqs, pos) in enumerate(_compositions(s, True)):
        data = _Data(400 + n, device)
        prefills = [kq for kq in s.around[min(n, 1)] if kq[1] > 1][: n + 1] or [(s.q_len, s.q_len)]
        kvs = [(data.randn(kv, s.kv_heads, s.head_dim, dtype=dtype), data.randn(kv, s.kv_heads, s.head_dim, dtype=dtype))
               for kv, _ in prefills]
        q = torch.cat([data.randn(q_len, s.q_heads, s.head_dim, dtype=dtype) for _, q_len in prefills])
        q_decode = []
        for b, (kv_len, _) in enumerate(reqs):
            if b == pos:
                q_decode.append(q_me)
                kvs.append(kv_me)
            else:
                q_decode.append(data.randn(1, s.q_heads, s.head_dim, dtype=dtype))
                kvs.append((data.randn(kv_len, s.kv_heads, s.head_dim, dtype=dtype),
                            data.randn(kv_len, s.kv_heads, s.head_dim, dtype=dtype)))
        cache, table = _paged(data, kvs, s.page_size, "NHD")
        bp = len(prefills)
        tables = (PageTable(table.block_table[:bp], table.seq_lens[:bp]),
                  PageTable(table.block_table[bp:], table.seq_lens[bp:]))
        args = (q, _indptr([q_len for _, q_len in prefills], device), torch.cat(q_decode), cache, *tables)
        case.batches.append(Batch(f"{len(prefills)} prefills, decode {label}", args, {"return_lse": True},
                                  _pick_decode(pos)))
    return case


def _mla_case(op: str, s: _Sizes, dtype: torch.dtype, device: torch.device | str) -> InvarianceCase:
    decode = op == "attention.mla_decode"
    dc, dr, h = 512, 64, s.mla_heads
    mine = _Data(2, device)
    q_len = 1 if decode else s.q_len
    q_me = (mine.randn(q_len, h, dc, dtype=dtype), mine.randn(q_len, h, dr, dtype=dtype))
    kv_me = (mine.randn(s.kv_len, dc, dtype=dtype, scale=0.3), mine.randn(s.kv_len, dr, dtype=dtype))
    case = InvarianceCase(op, f"{op.split('.')[1]}-{str(dtype)[6:]}-h{h}-L{s.kv_len}")
    for n, (label, reqs, pos) in enumerate(_compositions(s, decode)):
        data = _Data(200 + n, device)
        qn, qp, kvs = [], [], []
        for b, (kv_len, ql) in enumerate(reqs):
            if b == pos:
                qn.append(q_me[0])
                qp.append(q_me[1])
                kvs.append(kv_me)
                continue
            qn.append(data.randn(ql, h, dc, dtype=dtype))
            qp.append(data.randn(ql, h, dr, dtype=dtype))
            kvs.append((data.randn(kv_len, dc, dtype=dtype, scale=0.3), data.randn(kv_len, dr, dtype=dtype)))
        ckv, kpe, table = _latent(data, kvs, s.page_size)
        q_lens = [t.shape[0] for t in qn]
        lo = sum(q_lens[:pos])
        pick = _pick_rows(lo, lo + q_lens[pos])
        if decode:
            args: tuple[Any, ...] = (torch.cat(qn), torch.cat(qp), ckv, kpe, table)
        else:
            args = (torch.cat(qn), torch.cat(qp), _indptr(q_lens, device), ckv, kpe, table)
        case.batches.append(Batch(label, args, {"sm_scale": 1 / math.sqrt(192), "return_lse": True}, pick))
    return case


def _row_batches(s: _Sizes, make_row: Callable[[_Data], tuple[_Tensor, ...]], device: torch.device | str,
                 sizes: tuple[int, int, int] | None = None) -> list[tuple[str, tuple[_Tensor, ...], int]]:
    """(label, row tensors stacked over the batch, the request's row): the row-wise ops' three batches of
    ``sizes`` rows (default ``s.rows``), each row made by ``make_row`` (the request's from one seed, the others
    from another); the request first, in the middle, then last."""
    mine = make_row(_Data(3, device))
    out = []
    for n, rows in enumerate(sizes or s.rows):
        pos = (rows - 1) * n // 2  # first, middle, last
        data = _Data(300 + n, device)
        parts = [mine if r == pos else make_row(data) for r in range(rows)]
        out.append((f"row {pos} of {rows}", tuple(torch.cat(ts) for ts in zip(*parts)), pos))
    return out


def _rowwise_case(op: str, ident: str, s: _Sizes, device: torch.device | str,
                  make_row: Callable[[_Data], tuple[_Tensor, ...]],
                  call: Callable[[tuple[_Tensor, ...]], tuple[tuple[Any, ...], dict[str, Any]]],
                  pick: Callable[[int], Pick] | None = None, sizes: tuple[int, int, int] | None = None
                  ) -> InvarianceCase:
    """An op whose every output row belongs to one input row: ``call(rows)`` gives the public arguments."""
    case = InvarianceCase(op, ident)
    for label, rows, pos in _row_batches(s, make_row, device, sizes):
        args, kwargs = call(rows)
        case.batches.append(Batch(label, args, kwargs, pick(pos) if pick else
                                  _pick_rows(pos, pos + 1)))
    return case


def _shared(seed: int, device: torch.device | str) -> _Data:
    return _Data(seed, device)


def invariance_cases(op: str, device: torch.device | str, size: str = "small",
                     dtype: torch.dtype = torch.float16) -> list[InvarianceCase]:
    """The cases of ``op`` (one of :data:`OPS`) at ``size`` in ``dtype`` (its float inputs)."""
    s = SMALL if size == "small" else LARGE
    if op in ("attention.decode", "attention.prefill", "attention.prefill_ragged"):
        cases = [_paged_case(op, s, dtype, device, "NHD", {})]
        if op != "attention.prefill_ragged":
            cases.append(_paged_case(op, s, dtype, device, "HND", {"logits_soft_cap": 30.0}))
        return cases
    if op in ("attention.mla_decode", "attention.mla_prefill"):
        return [_mla_case(op, s, dtype, device)]
    if op == "attention.pod":
        return [_pod_case(s, dtype, device)]
    if op == "attention.dense":
        lq, d, h = (20, 64, 4) if size == "small" else (1024, 128, 32)

        def dense_row(data: _Data) -> tuple[_Tensor, ...]:
            return (data.randn(1, h, lq, d, dtype=dtype), data.randn(1, h, lq, d, dtype=dtype),
                    data.randn(1, h, lq, d, dtype=dtype), data.randn(1, h, lq, lq, dtype=dtype))

        mask = _shared(4, device).randn(lq, lq).gt(0.0)
        return [_rowwise_case(op, f"dense-{str(dtype)[6:]}-L{lq}", s, device, dense_row,
                              lambda r: ((r[0], r[1], r[2], r[3]), {"causal": True}), sizes=(1, 3, 5)),
                _rowwise_case(op, f"dense-shared-mask-{str(dtype)[6:]}-L{lq}", s, device, dense_row,
                              lambda r: ((r[0], r[1], r[2], mask), {}), sizes=(1, 3, 5))]
    if op == "attention.merge_states":
        h, d = (4, 64) if size == "small" else (32, 128)
        return [_rowwise_case(op, f"merge-{str(dtype)[6:]}", s, device,
                              lambda data: (data.randn(1, h, d, dtype=dtype), data.randn(1, h, scale=3.0),
                                            data.randn(1, h, d, dtype=dtype), data.randn(1, h, scale=3.0)),
                              lambda r: (r, {}))]
    if op.startswith("norm."):
        weights = _shared(5, device)
        w, bias = weights.randn(s.hidden, dtype=dtype), weights.randn(s.hidden, dtype=dtype)

        def norm_row(data: _Data) -> tuple[_Tensor, ...]:
            return data.randn(1, s.hidden, dtype=dtype), data.randn(1, s.hidden, dtype=dtype)

        if op == "norm.rms_norm":
            return [_rowwise_case(op, f"rms-{str(dtype)[6:]}-H{s.hidden}", s, device, norm_row,
                                  lambda r: ((r[0], w), {}))]
        if op == "norm.layer_norm":
            return [_rowwise_case(op, f"layer-{str(dtype)[6:]}-H{s.hidden}", s, device, norm_row,
                                  lambda r: ((r[0], w, bias), {}))]
        return [_rowwise_case(op, f"fused-add-{str(dtype)[6:]}-H{s.hidden}", s, device, norm_row,
                              lambda r: ((r[0], r[1], w), {}),
                              lambda p: lambda a, r: [a[0][p:p + 1], a[1][p:p + 1]])]  # written in place
    if op == "gemm.mm":
        n, k = s.gemm_nk
        b = _shared(6, device).randn(k, n, dtype=dtype, scale=k ** -0.5)
        return [_rowwise_case(op, f"mm-{str(dtype)[6:]}-N{n}-K{k}", s, device,
                              lambda data: (data.randn(1, k, dtype=dtype),), lambda r: ((r[0], b), {}))]
    if op == "gemm.mm_fp8":
        return _fp8_gemm_cases(s, device)
    if op in ("moe.route", "moe.fused_moe"):
        return [_moe_case(op, s, dtype, device)]
    if op == "sampling.renorm":
        v = s.vocab

        def probs_row(data: _Data) -> tuple[_Tensor, ...]:
            p = torch.softmax(data.randn(1, v, scale=3.0), dim=-1)
            return p, torch.tensor([int(data.randint(v // 2, 1)) + 1], dtype=torch.int32, device=device)

        return [_rowwise_case(op, f"renorm-V{v}", s, device, probs_row, lambda r: ((r[0], r[1], 0.9), {}),
                              sizes=(1, 4, 9) if size == "small" else None)]
    if op == "rope.apply":
        hq, hk, d = (4, 2, 64) if size == "small" else (32, 8, 128)
        return [_rowwise_case(op, f"rope-{str(dtype)[6:]}-d{d}", s, device,
                              lambda data: (data.randn(1, hq, d, dtype=dtype), data.randn(1, hk, d, dtype=dtype),
                                            data.randint(4096, 1).to(device)),
                              lambda r: ((r[0], r[1], r[2]), {"theta": 5e5}))]
    if op == "activation.silu_and_mul":
        return [_rowwise_case(op, f"silu-{str(dtype)[6:]}-H{s.hidden}", s, device,
                              lambda data: (data.randn(1, 2 * s.hidden, dtype=dtype, scale=3.0),),
                              lambda r: ((r[0],), {}))]
    if op == "activation.swiglu_oai_and_mul":
        return [_rowwise_case(op, f"swiglu-oai-{str(dtype)[6:]}-H{s.hidden}", s, device,
                              lambda data: (data.randn(1, 2 * s.hidden, dtype=dtype, scale=3.0),),
                              lambda r: ((r[0],), {"alpha": 1.702, "limit": 7.0}))]
    if op in ("kv_cache.append", "kv_cache.append_slots", "kv_cache.append_csr"):
        return [_append_case(op, s, dtype, device)]
    raise ValueError(f"no invariance cases for {op!r}; known: {', '.join(OPS)}")


def _fp8_gemm_cases(s: _Sizes, device: torch.device | str) -> list[InvarianceCase]:
    n, k = s.gemm_nk
    e4m3 = torch.float8_e4m3fn
    shared = _shared(7, device)
    b = shared.randn(n, k).to(e4m3).t()  # (K, N), K-major
    cases = []
    for mode in ("tensor", "row_col", "block"):
        sb = {"tensor": shared.randn(1).abs() + 0.5, "row_col": shared.randn(1, n).abs() + 0.5,
              "block": shared.randn(-(-k // 128), -(-n // 128)).abs() + 0.5}[mode]
        sa_shared = shared.randn(1).abs() + 0.5

        def row(data: _Data, mode: str = mode) -> tuple[_Tensor, ...]:
            a = data.randn(1, k).to(e4m3)
            sa = {"tensor": torch.ones(1, 1, device=device), "row_col": data.randn(1, 1).abs() + 0.5,
                  "block": data.randn(1, -(-k // 128)).abs() + 0.5}[mode]
            return a, sa

        def call(r: tuple[_Tensor, ...], mode: str = mode, sb: _Tensor = sb, sa_shared: _Tensor = sa_shared
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            sa = sa_shared if mode == "tensor" else r[1]
            return (r[0], b, sa, sb), {"out_dtype": torch.bfloat16}

        cases.append(_rowwise_case("gemm.mm_fp8", f"mm-fp8-{mode}-N{n}-K{k}", s, device, row, call))
    return cases


def _moe_case(op: str, s: _Sizes, dtype: torch.dtype, device: torch.device | str) -> InvarianceCase:
    experts, hidden, inter, top_k = s.moe
    shared = _shared(8, device)
    w13 = shared.randn(experts, 2 * inter, hidden, dtype=dtype, scale=hidden ** -0.5)
    w2 = shared.randn(experts, hidden, inter, dtype=dtype, scale=inter ** -0.5)

    def row(data: _Data) -> tuple[_Tensor, ...]:
        return data.randn(1, hidden, dtype=dtype), data.randn(1, experts, scale=2.0)

    if op == "moe.route":
        return _rowwise_case(op, f"route-E{experts}-k{top_k}", s, device, row, lambda r: ((r[1], top_k), {}))
    return _rowwise_case(op, f"moe-{str(dtype)[6:]}-E{experts}-H{hidden}-I{inter}-k{top_k}", s, device, row,
                         lambda r: ((r[0], r[1], w13, w2, top_k), {}))


def _append_case(op: str, s: _Sizes, dtype: torch.dtype, device: torch.device | str) -> InvarianceCase:
    """kv_cache.append (through the table), append_csr (through its CSR form) or append_slots (to slot
    ``page * S + 2``) of one new token per request into an fp8 cache: the request's stored bits (a divide by the scale
    and a rounding) in every batch."""
    e4m3 = torch.float8_e4m3fn
    hkv, d, ps = s.kv_heads, s.head_dim, s.page_size
    case = InvarianceCase(op, f"{op.partition('.')[2].replace('_', '-')}-fp8-{str(dtype)[6:]}")
    for label, rows, pos in _row_batches(s, lambda data: (data.randn(1, hkv, d, dtype=dtype, scale=20.0),
                                                          data.randn(1, hkv, d, dtype=dtype, scale=20.0)), device):
        b = rows[0].shape[0]
        table = PageTable(torch.arange(b, dtype=torch.int32, device=device)[:, None],
                          torch.full((b,), 3, dtype=torch.int32, device=device))
        cache = PagedKVCache(torch.zeros(b, ps, hkv, d, dtype=e4m3, device=device),
                             torch.zeros(b, ps, hkv, d, dtype=e4m3, device=device), "NHD", k_scale=0.37, v_scale=1.9)
        positions = torch.full((b,), 2, dtype=torch.int32, device=device)
        pick = (lambda p: lambda a, r: [a[2].k_pages[p, 2], a[2].v_pages[p, 2]])(pos)
        if op == "kv_cache.append":
            case.batches.append(Batch(label, (rows[0], rows[1], cache, table, positions), {}, pick))
        elif op == "kv_cache.append_csr":
            pages = torch.arange(b + 1, dtype=torch.int32, device=device)  # one page per request: indptr, indices
            case.batches.append(Batch(label, (rows[0], rows[1], cache, pages, pages[:b], positions, pages[:b]), {},
                                      pick))
        else:
            slots = torch.arange(b, dtype=torch.int64, device=device) * ps + 2
            case.batches.append(Batch(label, (rows[0], rows[1], cache, slots), {}, pick))
    return case
