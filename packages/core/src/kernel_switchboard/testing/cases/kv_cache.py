"""Conformance cases for the kv_cache family: the compared outputs are the written page tensors."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from ...paged import PagedKVCache, PageTable
from ..case import Case
from .attention import _SHORT, generator, page_table, random_pages

OPS = ("kv_cache.append", "kv_cache.append_slots", "kv_cache.append_csr", "kv_cache.append_mla")


def _pages_of(args: tuple[Any, ...], _: Any) -> list[torch.Tensor]:
    cache = args[2]
    return [cache.k_pages, cache.v_pages]


def _mla_pages_of(args: tuple[Any, ...], _: Any) -> list[torch.Tensor]:
    return [args[2], args[3]]


def _targets(rng: random.Random, kv_lens: tuple[int, ...], new: tuple[int, ...] | None
             ) -> tuple[list[int], list[int] | None]:
    """Positions (and batch indices) of appended tokens: ``new`` tokens at the end of each request
    (None: one decode token per request, no batch_indices)."""
    if new is None:
        return [n - 1 for n in kv_lens], None
    positions: list[int] = []
    rows: list[int] = []
    for b, (n, m) in enumerate(zip(kv_lens, new)):
        positions.extend(range(n - m, n))
        rows.extend([b] * m)
    order = list(range(len(rows)))
    rng.shuffle(order)  # tokens need not be grouped by request
    return [positions[i] for i in order], [rows[i] for i in order]


def append_case(dtype: torch.dtype, layout: str, page_size: int, kv_heads: int, head_dim: int,
                kv_lens: tuple[int, ...], new: tuple[int, ...] | None, device: torch.device | str,
                kv_dtype: torch.dtype | None = None, head_dim_v: int | None = None, seed: int | torch.Generator = 0) -> Case:
    """Append ``new[b]`` tokens ending at ``kv_lens[b]`` (lengths after the append) to a random cache."""
    g = generator(seed)
    rng = random.Random(g.initial_seed())
    dv = head_dim if head_dim_v is None else head_dim_v
    block_table, seq_lens, num_pages = page_table(g, kv_lens, page_size)
    scales = (0.5, 2.0) if kv_dtype is not None else (None, None)
    page_dtype = kv_dtype or dtype
    k_pages = random_pages(g, num_pages, page_size, kv_heads, head_dim, page_dtype, scales[0])
    v_pages = random_pages(g, num_pages, page_size, kv_heads, dv, page_dtype, scales[1])
    if layout == "HND":
        k_pages, v_pages = k_pages.transpose(1, 2).contiguous(), v_pages.transpose(1, 2).contiguous()
    cache = PagedKVCache(k_pages.to(device), v_pages.to(device), layout, *scales)
    table = PageTable(block_table.to(device), seq_lens.to(device))
    positions, rows = _targets(rng, kv_lens, new)
    t = len(positions)
    k = (torch.randn(t, kv_heads, head_dim, generator=g, device=g.device) * 4).to(device, dtype)
    v = (torch.randn(t, kv_heads, dv, generator=g, device=g.device) * 4).to(device, dtype)
    pos = torch.tensor(positions, dtype=torch.int32, device=device)
    args: tuple[Any, ...] = (k, v, cache, table, pos)
    if rows is not None:
        args += (torch.tensor(rows, dtype=torch.int32, device=device),)
    tag = "-".join([_SHORT[dtype], layout, f"p{page_size}", f"h{kv_heads}", f"d{head_dim}" + (f":{dv}" if dv != head_dim
                    else ""), f"t{t}", "decode" if new is None else "prefill"] + ([_SHORT[kv_dtype]] if kv_dtype else []))
    return Case("kv_cache.append", tag, args, {}, page_dtype, outputs=_pages_of)


def slots_of(block_table: torch.Tensor, rows: list[int], positions: list[int], page_size: int) -> list[int]:
    """The slot (page * page_size + offset) of each (request, position) through ``block_table``."""
    return [int(block_table[b, p // page_size]) * page_size + p % page_size for b, p in zip(rows, positions)]


def append_slots_case(dtype: torch.dtype, layout: str, page_size: int, kv_heads: int, head_dim: int,
                      kv_lens: tuple[int, ...], new: tuple[int, ...] | None, device: torch.device | str,
                      kv_dtype: torch.dtype | None = None, head_dim_v: int | None = None, padding: int = 0,
                      slot_dtype: torch.dtype = torch.int64, seed: int | torch.Generator = 0) -> Case:
    """As :func:`append_case`, addressed by slot mapping, with ``padding`` tokens (slot -1) mixed in."""
    base = append_case(dtype, layout, page_size, kv_heads, head_dim, kv_lens, new, device, kv_dtype, head_dim_v, seed)
    k, v, cache, table, positions = base.args[:5]
    rows = base.args[5].tolist() if len(base.args) > 5 else list(range(len(kv_lens)))
    slots = slots_of(table.block_table.cpu(), rows, positions.tolist(), page_size)
    g = generator(10_000 + padding)
    pad_k = torch.randn(padding, kv_heads, k.shape[2], generator=g) * 4  # would be seen if written
    pad_v = torch.randn(padding, kv_heads, v.shape[2], generator=g) * 4
    order = torch.randperm(len(slots) + padding, generator=g)  # padding tokens at random places
    k = torch.cat((k, pad_k.to(k.device, k.dtype)))[order.to(k.device)]
    v = torch.cat((v, pad_v.to(v.device, v.dtype)))[order.to(v.device)]
    slot_list = [(slots + [-1] * padding)[i] for i in order.tolist()]
    slot_mapping = torch.tensor(slot_list, dtype=slot_dtype, device=device)
    tag = base.id.replace("decode", "slots-decode").replace("prefill", "slots-prefill") + (
        f"-pad{padding}" if padding else "") + ("-i32" if slot_dtype == torch.int32 else "")
    return Case("kv_cache.append_slots", tag, (k, v, cache, slot_mapping), {},
                base.dtype, outputs=_pages_of)


def append_csr_case(dtype: torch.dtype, layout: str, page_size: int, kv_heads: int, head_dim: int,
                    kv_lens: tuple[int, ...], new: tuple[int, ...] | None, device: torch.device | str,
                    kv_dtype: torch.dtype | None = None, head_dim_v: int | None = None, outside: int = 0,
                    seed: int | torch.Generator = 0) -> Case:
    """As :func:`append_case`, addressed through the CSR form of its table (``PageTable.to_csr``), with ``outside``
    extra tokens whose request, position or page lies outside (they write nothing; the case then passes
    ``check_indices=False``, which would refuse them)."""
    base = append_case(dtype, layout, page_size, kv_heads, head_dim, kv_lens, new, device, kv_dtype, head_dim_v, seed)
    k, v, cache, table, positions = base.args[:5]
    rows = base.args[5] if len(base.args) > 5 else torch.arange(len(kv_lens), dtype=torch.int32, device=device)
    indptr, indices, _ = table.to_csr(page_size)
    if outside:
        g = generator(20_000 + outside)
        batch = len(kv_lens)
        # a request past the batch, a position past the request's pages, a negative position, by turns
        bad = [(batch, 0), (0, (int(indptr[1]) + 1) * page_size), (batch - 1, -1)]
        extra = [bad[i % 3] for i in range(outside)]
        k = torch.cat((k, (torch.randn(outside, kv_heads, k.shape[2], generator=g) * 4).to(k.device, k.dtype)))
        v = torch.cat((v, (torch.randn(outside, kv_heads, v.shape[2], generator=g) * 4).to(v.device, v.dtype)))
        rows = torch.cat((rows, torch.tensor([b for b, _ in extra], dtype=torch.int32, device=device)))
        positions = torch.cat((positions, torch.tensor([q for _, q in extra], dtype=torch.int32, device=device)))
    tag = base.id.replace("decode", "csr-decode").replace("prefill", "csr-prefill") + (
        f"-out{outside}" if outside else "")
    return Case("kv_cache.append_csr", tag, (k, v, cache, indptr, indices, positions, rows),
                {"check_indices": False} if outside else {}, base.dtype, outputs=_pages_of)


def append_mla_case(dtype: torch.dtype, page_size: int, kv_lens: tuple[int, ...], new: tuple[int, ...] | None,
                    device: torch.device | str, dc: int = 512, dr: int = 64, seed: int | torch.Generator = 0) -> Case:
    g = generator(seed)
    rng = random.Random(g.initial_seed())
    block_table, seq_lens, num_pages = page_table(g, kv_lens, page_size)
    ckv_pages = torch.randn(num_pages, page_size, dc, generator=g, device=g.device).to(device, dtype)
    kpe_pages = torch.randn(num_pages, page_size, dr, generator=g, device=g.device).to(device, dtype)
    table = PageTable(block_table.to(device), seq_lens.to(device))
    positions, rows = _targets(rng, kv_lens, new)
    t = len(positions)
    ckv = torch.randn(t, dc, generator=g, device=g.device).to(device, dtype)
    kpe = torch.randn(t, dr, generator=g, device=g.device).to(device, dtype)
    args: tuple[Any, ...] = (ckv, kpe, ckv_pages, kpe_pages, table, torch.tensor(positions, dtype=torch.int32,
                                                                                 device=device))
    if rows is not None:
        args += (torch.tensor(rows, dtype=torch.int32, device=device),)
    tag = f"mla-{_SHORT[dtype]}-p{page_size}-t{t}-{'decode' if new is None else 'prefill'}"
    return Case("kv_cache.append_mla", tag, args, {}, dtype, outputs=_mla_pages_of)


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    rng = random.Random(0)
    f16, bf16, f32, e4m3 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
    if op == "kv_cache.append":
        if size == "small":
            specs: list[tuple[Any, ...]] = [  # dtype, layout, page size, kv heads, head dim, lens, new, kv dtype
                (f16, "NHD", 16, 2, 64, (1, 17, 40), None, None),
                (bf16, "HND", 1, 2, 64, (5, 9), (5, 2), None),
                (f32, "NHD", 16, 1, 64, (33, 16, 1), (3, 16, 1), None),
                (f16, "HND", 16, 2, 64, (12, 30), None, e4m3),
                (bf16, "NHD", 1, 4, 64, (7, 3, 20), (7, 1, 4), e4m3),
            ]
            out = [append_case(dt, layout, ps, heads, dim, lens, new, device, kvd, seed=i)
                   for i, (dt, layout, ps, heads, dim, lens, new, kvd) in enumerate(specs)]
            out.append(append_case(f16, "NHD", 16, 1, 192, (9, 20), (9, 1), device, head_dim_v=128, seed=9))
            return out
        out = []
        for i, (dt, layout, ps, kvd) in enumerate([(bf16, "NHD", 16, None), (f16, "HND", 64, None),
                                                  (bf16, "HND", 128, e4m3), (bf16, "NHD", 16, e4m3)]):
            batch = rng.choice((16, 32, 64))
            lens = tuple(rng.randint(1, 4096) for _ in range(batch))
            new = None if i % 2 == 0 else tuple(min(n, rng.randint(1, 256)) for n in lens)
            out.append(append_case(dt, layout, ps, 8, 128, lens, new, device, kvd, seed=i))
        return out
    if op == "kv_cache.append_slots":
        if size == "small":
            slot_specs: list[tuple[Any, ...]] = [  # dtype, layout, page size, heads, dim, lens, new, kv dtype, pad, slots
                (f16, "NHD", 16, 2, 64, (1, 17, 40), None, None, 2, torch.int64),
                (bf16, "HND", 1, 2, 64, (5, 9), (5, 2), None, 3, torch.int32),
                (f32, "NHD", 16, 1, 64, (33, 16, 1), (3, 16, 1), None, 0, torch.int64),
                (f16, "HND", 16, 2, 64, (12, 30), None, e4m3, 1, torch.int64),
                (bf16, "NHD", 1, 4, 64, (7, 3, 20), (7, 1, 4), e4m3, 4, torch.int32),
            ]
            out = [append_slots_case(dt, layout, ps, heads, dim, lens, new, device, kvd, padding=pad, slot_dtype=sd,
                                     seed=i) for i, (dt, layout, ps, heads, dim, lens, new, kvd, pad, sd)
                   in enumerate(slot_specs)]
            out.append(append_slots_case(f16, "NHD", 16, 1, 192, (9, 20), (9, 1), device, head_dim_v=128, padding=1,
                                         seed=9))
            out.append(append_slots_case(f32, "NHD", 4, 2, 16, (3, 5), None, device, padding=0, seed=10))
            return out
        out = []
        for i, (dt, layout, ps, kvd) in enumerate([(bf16, "NHD", 16, None), (f16, "HND", 64, None),
                                                  (bf16, "HND", 1, e4m3), (bf16, "NHD", 16, e4m3)]):
            batch = rng.choice((16, 32, 64))
            lens = tuple(rng.randint(1, 4096) for _ in range(batch))
            new = None if i % 2 == 0 else tuple(min(n, rng.randint(1, 256)) for n in lens)
            out.append(append_slots_case(dt, layout, ps, 8, 128, lens, new, device, kvd, padding=rng.randint(0, 64),
                                         seed=i))
        return out
    if op == "kv_cache.append_csr":
        if size == "small":
            csr_specs: list[tuple[Any, ...]] = [  # dtype, layout, page size, heads, dim, lens, new, kv dtype, outside
                (f16, "NHD", 16, 2, 64, (1, 17, 40), None, None, 0),
                (bf16, "HND", 1, 2, 64, (5, 9), (5, 2), None, 3),
                (f32, "NHD", 16, 1, 64, (33, 16, 1), (3, 16, 1), None, 0),
                (bf16, "NHD", 4, 4, 64, (7, 3, 20), (7, 1, 4), e4m3, 2),
            ]
            return [append_csr_case(dt, layout, ps, heads, dim, lens, new, device, kvd, outside=o, seed=i)
                    for i, (dt, layout, ps, heads, dim, lens, new, kvd, o) in enumerate(csr_specs)]
        out = []
        for i, (dt, layout, ps, kvd) in enumerate([(bf16, "NHD", 16, None), (f16, "HND", 64, None),
                                                  (bf16, "NHD", 16, e4m3)]):
            batch = rng.choice((16, 32, 64))
            lens = tuple(rng.randint(1, 4096) for _ in range(batch))
            new = None if i % 2 == 0 else tuple(min(n, rng.randint(1, 256)) for n in lens)
            out.append(append_csr_case(dt, layout, ps, 8, 128, lens, new, device, kvd, outside=i, seed=i))
        return out
    if op == "kv_cache.append_mla":
        if size == "small":
            return [append_mla_case(f16, 16, (1, 17, 40), None, device),
                    append_mla_case(bf16, 1, (5, 9), (5, 2), device, seed=1)]
        lens = tuple(rng.randint(1, 4096) for _ in range(64))
        return [append_mla_case(bf16, 64, lens, None, device),
                append_mla_case(bf16, 64, lens[:16], tuple(min(n, 512) for n in lens[:16]), device, seed=1)]
    return []


#: the parameters :func:`example` reads, with their types (``switchboard explain`` / ``bench`` / ``tune`` check them)
EXAMPLE_PARAMS: dict[str, type] = {
    "batch": int, "kv_len": int, "q_len": int, "kv_heads": int, "num_kv_heads": int, "head_dim": int,
    "head_dim_v": int, "head_dim_pe": int, "page_size": int, "dtype": str, "kv_dtype": str, "layout": str, "seed": int,
}


def example(op: str, device: torch.device | str = "cpu", **shape: Any) -> Case:
    """One case from CLI-style parameters: batch, kv_len, q_len (tokens appended per request;
    default 1 = decode), kv_heads, head_dim, page_size, dtype, kv_dtype, layout, seed."""
    from .attention import _dtype

    batch = int(shape.get("batch", 4))
    kv_len = int(shape.get("kv_len", 1024))
    q_len = min(int(shape.get("q_len", 1)), kv_len)
    new = None if q_len == 1 else (q_len,) * batch
    dtype = _dtype(shape.get("dtype", "bf16"))
    seed = torch.Generator(device=device).manual_seed(int(shape.get("seed", 0)))
    if op == "kv_cache.append_mla":
        return append_mla_case(dtype, int(shape.get("page_size", 64)), (kv_len,) * batch, new, device,
                               int(shape.get("head_dim", 512)), int(shape.get("head_dim_pe", 64)), seed)
    if op in ("kv_cache.append", "kv_cache.append_slots", "kv_cache.append_csr"):
        kv_dtype = shape.get("kv_dtype")
        kvd = _dtype(kv_dtype) if kv_dtype is not None else None
        builders: dict[str, Callable[..., Case]] = {
            "kv_cache.append": append_case, "kv_cache.append_slots": append_slots_case,
            "kv_cache.append_csr": append_csr_case}
        build = builders[op]
        return build(dtype, str(shape.get("layout", "NHD")), int(shape.get("page_size", 16)),
                     int(shape.get("kv_heads", shape.get("num_kv_heads", 8))),
                     int(shape.get("head_dim", 128)), (kv_len,) * batch, new,
                     device, kvd if kvd != dtype else None, shape.get("head_dim_v"), seed=seed)
    raise ValueError(f"no example builder for op {op!r}; known: {', '.join(OPS)}")
