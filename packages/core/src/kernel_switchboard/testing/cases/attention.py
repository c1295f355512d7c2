"""Conformance cases for the attention family.

Each case calls the public function. The capability space (dtypes, NHD/HND, page sizes, head
dims, GQA groups, causal, soft cap, window, LSE, fp8 KV, mixed batches, lengths 0 and 1) is
covered by a fixed list plus draws from a seeded generator. ``size="small"`` is tiny (CPU and
the Triton interpreter); ``size="large"`` has real GPU sizes. :func:`example` builds one case
from CLI-style parameters (``switchboard explain``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...paged import PagedKVCache, PageTable
from ..case import Case, tolerance
from .attention_dense import DenseSpec, dense_case, dense_specs

OPS = ("attention.decode", "attention.prefill", "attention.prefill_ragged", "attention.mla_decode",
       "attention.mla_prefill", "attention.pod", "attention.merge_states", "attention.dense")

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp8": torch.float8_e4m3fn, "e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2, "float8_e5m2": torch.float8_e5m2,
}
_SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "e4m3",
          torch.float8_e5m2: "e5m2"}


@dataclass(frozen=True)
class AttnSpec:
    """One attention problem to build. ``q_lens`` None means decode (one query per request)."""

    dtype: torch.dtype = torch.float16
    layout: str = "NHD"
    page_size: int = 16
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    head_dim_v: int | None = None
    kv_lens: tuple[int, ...] = (0, 1, 37)
    q_lens: tuple[int, ...] | None = None
    causal: bool = True
    soft_cap: float | None = None
    window: int | None = None
    lse: bool = False
    kv_dtype: torch.dtype | None = None  # fp8 dtype for a quantised cache
    scale_tensor: bool = False  # the fp8 cache's scales as tensors: K per KV head, V one for all
    q_fp8: bool = False  # prefill queries in float8_e4m3fn (with q_scale; ``dtype`` is then the out dtype, bfloat16)
    variant: str | None = None  # a shipped custom variant (kernel_switchboard.variants_lib.VARIANTS)

    @property
    def dv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    def tag(self, kind: str) -> str:
        bits = [kind, _SHORT[self.dtype], self.layout, f"p{self.page_size}", f"h{self.q_heads}:{self.kv_heads}",
                f"d{self.head_dim}" + (f":{self.dv}" if self.dv != self.head_dim else ""), f"b{len(self.kv_lens)}",
                f"L{max(self.kv_lens, default=0)}"]
        if self.q_lens is not None:
            bits.append(f"q{max(self.q_lens, default=0)}" + ("" if self.causal else "-noncausal"))
        if self.soft_cap is not None:
            bits.append(f"cap{self.soft_cap:g}")
        if self.window is not None:
            bits.append(f"win{self.window}")
        if self.lse:
            bits.append("lse")
        if self.kv_dtype is not None:
            bits.append(_SHORT[self.kv_dtype] + ("-scaleT" if self.scale_tensor else ""))
        if self.q_fp8:
            bits.append("q-e4m3")
        if self.variant is not None:
            bits.append(f"var-{self.variant}")
        return "-".join(bits)

    def tol(self) -> tuple[float, float] | None:
        if self.kv_dtype is None and not self.unnormalised():
            return None
        a, r = tolerance(self.dtype)
        if self.kv_dtype is not None:
            a, r = max(a, 2e-2), max(r, 2e-2)  # a kernel may compute with the fp8 values in 16-bit
        if self.unnormalised():
            # no softmax: an output is a sum of up to L weighted values, of typical size ~sqrt(L)/2
            a *= max(1.0, 0.5 * max(self.kv_lens, default=1) ** 0.5)
        return a, r

    def unnormalised(self) -> bool:
        """True for a variant without softmax (sigmoid attention): outputs are sums, not averages."""
        if self.variant is None:
            return False
        from ... import variants_lib

        return not variants_lib.VARIANTS[self.variant].softmax


# -- builders (also used by the tests) --------------------------------------------------------------------
def generator(seed: int | torch.Generator) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (same data on every device), or ``seed`` itself when it is a
    generator (e.g. one on the GPU, for large examples generated where they run)."""
    return seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)


def random_pages(g: torch.Generator, num_pages: int, page_size: int, heads: int, dim: int, dtype: torch.dtype,
                 scale: float | torch.Tensor | None = None, unused: torch.Tensor | None = None) -> torch.Tensor:
    """NHD pages (num_pages, page_size, heads, dim) of N(0, 1) values; fp8 stores value / scale (a tensor scale: ()
    or one per head).
    ``unused`` (num_pages, page_size) bool: slots filled with NaN (no kernel may read them)."""
    x = torch.randn(num_pages, page_size, heads, dim, generator=g, device=g.device)
    if unused is not None:
        x.masked_fill_(unused.to(x.device)[:, :, None, None], float("nan"))
    if isinstance(scale, torch.Tensor):  # () or one per head
        return (x / scale.to(x.device).reshape(-1, 1)).clamp(-448, 448).to(dtype)
    if scale is not None:
        return (x / scale).clamp(-448, 448).to(dtype)
    return x.to(dtype)


def page_table(g: torch.Generator, kv_lens: tuple[int, ...] | list[int], page_size: int, extra_pages: int = 3,
               pad_cols: int = 1) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A shuffled block table for ``kv_lens``: (block_table (B, max_pages) int32, seq_lens (B,) int32,
    num_pages). Entries past a request's last page hold other valid page ids (kernels must ignore them)."""
    need = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(need) + extra_pages
    perm = torch.randperm(num_pages, generator=g, device=g.device)
    width = max(need, default=0) + pad_cols
    table = torch.randint(0, num_pages, (len(kv_lens), width), generator=g, dtype=torch.int64, device=g.device)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[start:start + n]
        start += n
    return table.to(torch.int32), torch.tensor(list(kv_lens), dtype=torch.int32), num_pages


def paged_kv(g: torch.Generator, spec: AttnSpec, device: torch.device | str) -> tuple[PagedKVCache, PageTable]:
    """A random cache and table for ``spec`` on ``device`` (generated on the CPU: same data on every device)."""
    block_table, seq_lens, num_pages = page_table(g, spec.kv_lens, spec.page_size)
    kv_dtype = spec.kv_dtype or spec.dtype
    fp8 = spec.kv_dtype is not None
    k_scale: float | torch.Tensor | None = 0.5 if fp8 else None  # powers of two: exact (de)quantisation
    v_scale: float | torch.Tensor | None = 2.0 if fp8 else None
    if fp8 and spec.scale_tensor:
        k_scale = torch.tensor([0.5 * 2.0 ** -(h % 3) for h in range(spec.kv_heads)])
        v_scale = torch.tensor(2.0)
    unused = unwritten_slots(block_table, seq_lens, num_pages, spec.page_size)
    k = random_pages(g, num_pages, spec.page_size, spec.kv_heads, spec.head_dim, kv_dtype, k_scale, unused)
    v = random_pages(g, num_pages, spec.page_size, spec.kv_heads, spec.dv, kv_dtype, v_scale, unused)
    if spec.layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    if isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor):
        k_scale, v_scale = k_scale.to(device), v_scale.to(device)
    cache = PagedKVCache(k.to(device), v.to(device), spec.layout, k_scale, v_scale)
    return cache, PageTable(block_table.to(device), seq_lens.to(device))


def indptr(lens: tuple[int, ...] | list[int], device: torch.device | str) -> torch.Tensor:
    """(len(lens)+1,) int32 offsets of packed rows."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(list(lens), dtype=torch.int64), 0).to(torch.int32)
    return out.to(device)


def variant_kwargs(name: str, q_heads: int, kv_lens: tuple[int, ...], g: torch.Generator,
                   device: torch.device | str) -> dict[str, Any]:
    """``variant=`` and ``variant_args=`` of a shipped variant, with random parameters (needs triton)."""
    from ... import variants_lib as lib

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=g.device).to(device)

    args: dict[str, tuple[Any, ...]] = {
        "alibi": (lib.alibi_slopes(q_heads, device),),
        "soft_cap": (3.0,),
        "sliding_window": (5,),
        "sinks": (randn(q_heads),),
        "sigmoid": (-0.5,),
        "prefix_lm": (torch.tensor([n // 2 for n in kv_lens], dtype=torch.int32, device=device),),
        "rel_pos_bias": (randn(q_heads, 9), 8),
    }
    return {"variant": lib.VARIANTS[name], "variant_args": args[name]}


def _kwargs(spec: AttnSpec, prefill: bool, g: torch.Generator | None = None,
            device: torch.device | str = "cpu") -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if spec.variant is not None and g is not None:
        kw.update(variant_kwargs(spec.variant, spec.q_heads, spec.kv_lens, g, device))
    if prefill:
        kw["causal"] = spec.causal
    if spec.soft_cap is not None:
        kw["logits_soft_cap"] = spec.soft_cap
    if spec.window is not None:
        kw["window_left"] = spec.window
    if spec.lse:
        kw["return_lse"] = True
    return kw


def decode_case(spec: AttnSpec, device: torch.device | str, seed: int | torch.Generator = 0) -> Case:
    g = generator(seed)
    cache, table = paged_kv(g, spec, device)
    q = torch.randn(len(spec.kv_lens), spec.q_heads, spec.head_dim, generator=g, device=g.device).to(device, spec.dtype)
    return Case("attention.decode", spec.tag("decode"), (q, cache, table), _kwargs(spec, False, g, device), spec.dtype,
                spec.tol())


#: the scale of fp8 queries in the cases (a power of two: exact)
Q_SCALE = 0.25


def prefill_case(spec: AttnSpec, device: torch.device | str, seed: int | torch.Generator = 0) -> Case:
    assert spec.q_lens is not None
    g = generator(seed)
    cache, table = paged_kv(g, spec, device)
    q = torch.randn(sum(spec.q_lens), spec.q_heads, spec.head_dim, generator=g, device=g.device).to(device, spec.dtype)
    kwargs = _kwargs(spec, True, g, device)
    if spec.q_fp8:  # stored = q / q_scale, in e4m3
        q = (q.float() / Q_SCALE).to(torch.float8_e4m3fn)
        kwargs["q_scale"] = Q_SCALE
    return Case("attention.prefill", spec.tag("prefill"), (q, indptr(spec.q_lens, device), cache, table), kwargs,
                spec.dtype, spec.tol())


def pod_case(spec: AttnSpec, decode_lens: tuple[int, ...], device: torch.device | str,
             seed: int | torch.Generator = 0) -> Case:
    """``attention.pod``: the prefill requests of ``spec`` (kv_lens, q_lens) and one-token decode requests of
    ``decode_lens`` in one cache (their pages shuffled together)."""
    assert spec.q_lens is not None
    g = generator(seed)
    cache, table = paged_kv(g, replace(spec, kv_lens=spec.kv_lens + decode_lens), device)
    b = len(spec.kv_lens)
    prefill_table = PageTable(table.block_table[:b], table.seq_lens[:b])
    decode_table = PageTable(table.block_table[b:], table.seq_lens[b:])
    q = torch.randn(sum(spec.q_lens), spec.q_heads, spec.head_dim, generator=g, device=g.device).to(device, spec.dtype)
    q_decode = torch.randn(len(decode_lens), spec.q_heads, spec.head_dim, generator=g, device=g.device).to(device,
                                                                                                           spec.dtype)
    args = (q, indptr(spec.q_lens, device), q_decode, cache, prefill_table, decode_table)
    return Case("attention.pod", f"{spec.tag('pod')}-d{len(decode_lens)}", args, _kwargs(spec, True), spec.dtype,
                spec.tol())


def ragged_case(spec: AttnSpec, device: torch.device | str, seed: int | torch.Generator = 0) -> Case:
    assert spec.q_lens is not None
    g = generator(seed)
    tk = sum(spec.kv_lens)
    k = torch.randn(tk, spec.kv_heads, spec.head_dim, generator=g, device=g.device).to(device, spec.dtype)
    v = torch.randn(tk, spec.kv_heads, spec.dv, generator=g, device=g.device).to(device, spec.dtype)
    q = torch.randn(sum(spec.q_lens), spec.q_heads, spec.head_dim, generator=g, device=g.device).to(device, spec.dtype)
    args = (q, k, v, indptr(spec.q_lens, device), indptr(spec.kv_lens, device))
    tag = spec.tag("ragged").replace(f"-{spec.layout}-p{spec.page_size}", "")
    return Case("attention.prefill_ragged", tag, args, _kwargs(spec, True, g, device), spec.dtype, spec.tol())


def unwritten_slots(block_table: torch.Tensor, seq_lens: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """(num_pages, page_size) bool: the slots no request's first ``seq_len`` tokens occupy."""
    written = torch.zeros(num_pages, page_size, dtype=torch.bool, device=block_table.device)
    for b, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n, device=block_table.device)
        written[block_table[b, pos // page_size].long(), pos % page_size] = True
    return ~written


def write_positions(cache: PagedKVCache, table: PageTable, request: int, start: int, stop: int, seed: int = 0) -> None:
    """Write random K/V (in the cache's dtype) at KV positions [start, stop) of ``request``: what an append
    does before its ``seq_len`` grows past slots that held NaN as unwritten."""
    g = torch.Generator().manual_seed(seed)
    ps = cache.page_size
    for pos in range(start, stop):
        page, slot = int(table.block_table[request, pos // ps]), pos % ps
        for pages in (cache.k_pages, cache.v_pages):
            row = pages[page, :, slot] if cache.layout == "HND" else pages[page, slot]
            row.copy_(torch.randn(row.shape, generator=g).to(row.dtype))


def latent_pages(g: torch.Generator, kv_lens: tuple[int, ...], page_size: int, dtype: torch.dtype,
                 device: torch.device | str, dc: int = 512, dr: int = 64) -> tuple[torch.Tensor, torch.Tensor, PageTable]:
    """Random latent pages ckv (P, S, dc), kpe (P, S, dr) and their shuffled table for ``kv_lens``; the unwritten slots
    hold NaN: a kernel must never let them reach the output."""
    block_table, seq_lens, num_pages = page_table(g, kv_lens, page_size)
    unused = unwritten_slots(block_table, seq_lens, num_pages, page_size)[:, :, None]
    ckv = torch.randn(num_pages, page_size, dc, generator=g, device=g.device).masked_fill_(unused, float("nan"))
    kpe = torch.randn(num_pages, page_size, dr, generator=g, device=g.device).masked_fill_(unused, float("nan"))
    return ckv.to(device, dtype), kpe.to(device, dtype), PageTable(block_table.to(device), seq_lens.to(device))


def mla_case(dtype: torch.dtype, kv_lens: tuple[int, ...], heads: int, page_size: int, device: torch.device | str,
             lse: bool = False, seed: int | torch.Generator = 0, dc: int = 512, dr: int = 64, q_len: int = 1) -> Case:
    """Latent pages whose unwritten slots hold NaN: a kernel must never let them reach the output. ``q_len`` > 1:
    queries (B, q_len, H, D), each request's newest tokens (multi-token prediction)."""
    g = generator(seed)
    ckv, kpe, table = latent_pages(g, kv_lens, page_size, dtype, device, dc, dr)
    b = len(kv_lens)
    lead = (b, heads) if q_len == 1 else (b, q_len, heads)
    q_nope = torch.randn(*lead, dc, generator=g, device=g.device).to(device, dtype)
    q_pe = torch.randn(*lead, dr, generator=g, device=g.device).to(device, dtype)
    kw: dict[str, Any] = {"sm_scale": 1.0 / math.sqrt(192)}
    if lse:
        kw["return_lse"] = True
    tag = (f"mla-{_SHORT[dtype]}-p{page_size}-h{heads}-b{b}-L{max(kv_lens, default=0)}" + ("-lse" if lse else "")
           + (f"-t{q_len}" if q_len > 1 else ""))
    return Case("attention.mla_decode", tag, (q_nope, q_pe, ckv, kpe, table), kw, dtype)


def mla_prefill_case(dtype: torch.dtype, kv_lens: tuple[int, ...], q_lens: tuple[int, ...], heads: int,
                     page_size: int, device: torch.device | str, lse: bool = False, causal: bool = True,
                     seed: int | torch.Generator = 0, dc: int = 512, dr: int = 64) -> Case:
    """``attention.mla_prefill``: request b's ``q_lens[b]`` newest tokens (prefill, append, or a decode row of 1)
    against its ``kv_lens[b]`` latent tokens, the unwritten page slots holding NaN."""
    g = generator(seed)
    ckv, kpe, table = latent_pages(g, kv_lens, page_size, dtype, device, dc, dr)
    tq = sum(q_lens)
    q_nope = torch.randn(tq, heads, dc, generator=g, device=g.device).to(device, dtype)
    q_pe = torch.randn(tq, heads, dr, generator=g, device=g.device).to(device, dtype)
    kw: dict[str, Any] = {"sm_scale": 1.0 / math.sqrt(192), "causal": causal}
    if lse:
        kw["return_lse"] = True
    tag = (f"mla-prefill-{_SHORT[dtype]}-p{page_size}-h{heads}-b{len(kv_lens)}-L{max(kv_lens, default=0)}"
           f"-q{max(q_lens, default=0)}" + ("" if causal else "-noncausal") + ("-lse" if lse else ""))
    return Case("attention.mla_prefill", tag, (q_nope, q_pe, indptr(q_lens, device), ckv, kpe, table), kw, dtype)


def merge_case(dtype: torch.dtype, tokens: int, heads: int, dim: int, device: torch.device | str,
               seed: int | torch.Generator = 0) -> Case:
    g = generator(seed)
    out_a = torch.randn(tokens, heads, dim, generator=g, device=g.device).to(device, dtype)
    out_b = torch.randn(tokens, heads, dim, generator=g, device=g.device).to(device, dtype)
    lse_a = torch.randn(tokens, heads, generator=g, device=g.device) * 3 + 4
    lse_b = torch.randn(tokens, heads, generator=g, device=g.device) * 3 + 4
    if tokens:
        lse_a[0, 0] = float("-inf")  # empty partial states
        lse_b[-1, -1] = float("-inf")
        lse_a[tokens // 2, 0] = lse_b[tokens // 2, 0] = float("-inf")
    args = (out_a, lse_a.to(device), out_b, lse_b.to(device))
    return Case("attention.merge_states", f"merge-{_SHORT[dtype]}-t{tokens}-h{heads}-d{dim}", args, {}, dtype)


# -- the sampled space --------------------------------------------------------------------------------------
def _small_specs() -> list[AttnSpec]:
    f16, bf16, f32, e4m3 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
    return [
        AttnSpec(f16, "NHD", 16, 4, 4, kv_lens=(0, 1, 37)),
        AttnSpec(bf16, "HND", 1, 4, 2, kv_lens=(5, 1, 23), lse=True),
        AttnSpec(f16, "NHD", 16, 4, 1, kv_lens=(17, 40), soft_cap=5.0),
        AttnSpec(f16, "HND", 16, 4, 2, kv_lens=(33, 0, 9), window=6, lse=True),
        AttnSpec(f16, "NHD", 1, 4, 1, kv_lens=(12, 31), kv_dtype=e4m3),
        AttnSpec(bf16, "NHD", 16, 2, 2, kv_lens=(40, 3, 16), kv_dtype=e4m3, lse=True),
        AttnSpec(f32, "HND", 16, 4, 2, kv_lens=(29, 1), soft_cap=3.0, window=10, lse=True),
        AttnSpec(f16, "NHD", 16, 2, 1, head_dim=128, kv_lens=(21, 2)),
        AttnSpec(bf16, "HND", 16, 4, 2, kv_lens=(26, 7), soft_cap=4.0, window=5, lse=True),
        AttnSpec(f16, "NHD", 16, 8, 1, kv_lens=(19, 4)),  # GQA group 8
        AttnSpec(bf16, "HND", 16, 4, 2, head_dim=96, kv_lens=(27, 1), lse=True),  # Phi-3's head dim
        AttnSpec(f16, "NHD", 1, 2, 1, head_dim=80, kv_lens=(9, 30), soft_cap=5.0),  # Phi-2's
        AttnSpec(bf16, "NHD", 16, 4, 2, kv_lens=(25, 6), kv_dtype=torch.float8_e5m2, lse=True),
        AttnSpec(f16, "HND", 16, 4, 2, kv_lens=(21, 9, 1), kv_dtype=e4m3, scale_tensor=True, lse=True),
    ]


def _variant_specs(size: str) -> list[AttnSpec]:
    """One spec per shipped variant (none when triton, which the variant hooks need, is missing)."""
    try:
        from ...variants_lib import VARIANTS
    except ImportError:
        return []
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    out = []
    for i, name in enumerate(VARIANTS):
        if size == "small":
            spec = AttnSpec(f16, ("NHD", "HND")[i % 2], (16, 1)[i % 2], 4, 2, kv_lens=((0, 1, 37), (13, 40))[i % 2],
                            lse=i % 3 == 0, variant=name)
        else:
            spec = AttnSpec(bf16, ("NHD", "HND")[i % 2], 16, 32, 8, 128, kv_lens=(2048, 1, 0, 700, 1500, 33),
                            lse=i % 3 == 0, variant=name)
        out.append(spec)
        if size == "small" and i % 3 == 1:  # float32 / bfloat16 through the same hooks
            out.append(replace(spec, dtype=f32 if i % 2 else bf16, lse=True))
    return out


def _large_specs(rng: random.Random) -> list[AttnSpec]:
    f16, bf16, e4m3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn
    base = [
        AttnSpec(bf16, "NHD", 16, 32, 8, 128),
        AttnSpec(bf16, "HND", 64, 32, 8, 128, lse=True),
        AttnSpec(f16, "NHD", 128, 32, 32, 128),
        AttnSpec(bf16, "HND", 16, 32, 4, 128, soft_cap=30.0),
        AttnSpec(f16, "NHD", 64, 32, 1, 128, window=256, lse=True),
        AttnSpec(bf16, "NHD", 16, 32, 8, 128, kv_dtype=e4m3),
        AttnSpec(bf16, "HND", 128, 32, 8, 128, kv_dtype=e4m3, lse=True),
        AttnSpec(f16, "NHD", 16, 32, 8, 64),
        AttnSpec(torch.float32, "NHD", 16, 32, 8, 128),
        AttnSpec(bf16, "HND", 16, 32, 32, 96, lse=True),
        AttnSpec(f16, "NHD", 16, 32, 8, 128, kv_dtype=torch.float8_e5m2),
        AttnSpec(bf16, "NHD", 16, 32, 8, 128, kv_dtype=e4m3, scale_tensor=True, lse=True),
    ]
    out = []
    for spec in base:
        batch = rng.choice((16, 32, 64))
        max_len = rng.choice((512, 1024, 2048, 4096))
        lens = [rng.randint(1, max_len) for _ in range(batch)]
        lens[0], lens[1], lens[2] = max_len, 1, 0
        out.append(replace(spec, kv_lens=tuple(lens)))
    return out


def _with_queries(spec: AttnSpec, rng: random.Random, max_q: int, mixed: bool, causal: bool = True) -> AttnSpec:
    """Query counts for a prefill spec: full prefill, append (qo < kv), and (mixed) decode rows of 1."""
    q_lens = []
    for i, n in enumerate(spec.kv_lens):
        choice = i % 3 if mixed else (i % 2) * 2
        if n == 0:
            q_lens.append(0)
        elif choice == 0:
            q_lens.append(min(n, max_q))  # prefill (the whole sequence when it fits)
        elif choice == 1:
            q_lens.append(1)  # a decode row
        else:
            q_lens.append(rng.randint(1, min(n, max_q)))  # append / chunked prefill
    return replace(spec, q_lens=tuple(q_lens), causal=causal)


def _prefill_specs(size: str, rng: random.Random) -> list[AttnSpec]:
    return _plain_prefill_specs(size, rng) + [
        _with_queries(s, rng, 40 if size == "small" else 512, mixed=i % 2 == 0, causal=s.variant != "prefix_lm")
        for i, s in enumerate(_variant_specs(size))]


def _plain_prefill_specs(size: str, rng: random.Random) -> list[AttnSpec]:
    if size == "small":
        specs = _small_specs()
        out = [_with_queries(s, rng, 40, mixed=i % 2 == 0, causal=i != 3) for i, s in enumerate(specs)]
        out.append(AttnSpec(torch.float16, "NHD", 16, 2, 1, head_dim=192, head_dim_v=128, kv_lens=(9, 14),
                            q_lens=(9, 4), lse=True))
        out.append(AttnSpec(torch.float32, "HND", 16, 4, 2, kv_lens=(11, 7, 1), q_lens=(11, 3, 1), causal=False))
        out.append(AttnSpec(torch.bfloat16, "NHD", 16, 4, 2, kv_lens=(21, 40, 1), q_lens=(7, 40, 1), lse=True,
                            kv_dtype=torch.float8_e4m3fn, q_fp8=True))
        return out
    out = []
    for i, s in enumerate(_large_specs(rng)):
        lens = tuple(min(n, 2048) for n in s.kv_lens[:16])
        out.append(_with_queries(replace(s, kv_lens=lens), rng, 512, mixed=i % 2 == 0, causal=i != 3))
    out.append(AttnSpec(torch.bfloat16, "NHD", 64, 16, 16, head_dim=192, head_dim_v=128,
                        kv_lens=(1024, 700, 1, 333), q_lens=(1024, 100, 1, 333), lse=True))
    out.append(AttnSpec(torch.bfloat16, "NHD", 128, 32, 8, 128, kv_lens=(2048, 700, 1), q_lens=(2048, 100, 1),
                        lse=True, kv_dtype=torch.float8_e4m3fn, q_fp8=True))
    return out


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    rng = random.Random(0)
    if op == "attention.decode":
        specs = (_small_specs() if size == "small" else _large_specs(rng)) + _variant_specs(size)
        return [decode_case(s, device, seed=i) for i, s in enumerate(specs)]
    if op == "attention.prefill":
        return [prefill_case(s, device, seed=i) for i, s in enumerate(_prefill_specs(size, rng))]
    if op == "attention.pod":
        specs = _plain_prefill_specs(size, rng)[:6 if size == "small" else 4]
        decodes = [(1, 40, 0, 17), (23,), (5, 9)] if size == "small" else [tuple(rng.randint(1, 4096) for _ in range(64)),
                                                                         (4096,) * 16 + (1, 0)]
        return [pod_case(s, decodes[i % len(decodes)], device, seed=i) for i, s in enumerate(specs)]
    if op == "attention.prefill_ragged":
        specs = [replace(s, layout="NHD", page_size=16) for s in _prefill_specs(size, rng) if s.kv_dtype is None]
        return [ragged_case(s, device, seed=i) for i, s in enumerate(specs)]
    if op == "attention.mla_decode":
        if size == "small":
            return [mla_case(torch.float16, (0, 1, 37), 4, 16, device),
                    mla_case(torch.bfloat16, (23, 40), 2, 1, device, lse=True, seed=1),
                    mla_case(torch.float32, (9, 17), 4, 16, device, lse=True, seed=2)]
        return [mla_case(torch.bfloat16, tuple(rng.randint(1, 4096) for _ in range(64)), 128, 64, device),
                mla_case(torch.bfloat16, tuple([0, 1] + [rng.randint(1, 2048) for _ in range(30)]), 16, 64, device,
                         lse=True, seed=1),
                mla_case(torch.float16, tuple(rng.randint(1, 1024) for _ in range(16)), 128, 16, device, seed=2)]
    if op == "attention.mla_prefill":
        if size == "small":
            return [mla_prefill_case(torch.float16, (0, 1, 37), (0, 1, 20), 4, 16, device),
                    mla_prefill_case(torch.bfloat16, (23, 40, 5), (23, 1, 5), 2, 1, device, lse=True, seed=1),
                    mla_prefill_case(torch.float32, (9, 17), (4, 17), 4, 16, device, lse=True, seed=2),
                    mla_prefill_case(torch.float16, (12, 30), (12, 7), 2, 16, device, lse=True, causal=False, seed=3)]
        lens = [rng.randint(1, 4096) for _ in range(8)]
        return [mla_prefill_case(torch.bfloat16, (2048, 1500, 1, 600), (256, 300, 1, 600), 128, 64, device),
                mla_prefill_case(torch.bfloat16, tuple(lens), tuple(rng.randint(1, min(n, 1024)) for n in lens), 16,
                                 64, device, lse=True, seed=1),
                mla_prefill_case(torch.float16, (1024, 200, 50), (1, 200, 17), 128, 16, device, lse=True, seed=2)]
    if op == "attention.dense":
        return [dense_case(s, device, seed=i) for i, s in enumerate(dense_specs(size))]
    if op == "attention.merge_states":
        shapes = [(5, 4, 64), (1, 2, 128)] if size == "small" else [(4096, 32, 128), (77, 128, 512)]
        return [merge_case(dt, *shape, device, seed=i) for i, shape in enumerate(shapes)
                for dt in (torch.float16, torch.bfloat16, torch.float32)]
    return []


# -- one case from CLI-style parameters --------------------------------------------------------------------
def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    key = str(value).replace("torch.", "").lower()
    if key not in DTYPES:
        raise ValueError(f"dtype {value!r}: expected one of {sorted(DTYPES)}")
    return DTYPES[key]


#: the parameters :func:`example` reads, with their types (``switchboard explain`` / ``bench`` / ``tune`` check them)
EXAMPLE_PARAMS: dict[str, type] = {
    "batch": int, "kv_len": int, "q_len": int, "tokens": int, "q_heads": int, "num_q_heads": int, "num_heads": int,
    "kv_heads": int, "num_kv_heads": int, "head_dim": int, "head_dim_v": int, "head_dim_pe": int, "page_size": int,
    "dtype": str, "kv_dtype": str, "layout": str, "causal": bool, "soft_cap": float, "window": int, "lse": bool,
    "seed": int, "variant": str, "bias": str,
}


def example(op: str, device: torch.device | str = "cpu", **shape: Any) -> Case:
    """One case of ``op`` from CLI-style parameters, every request of equal length:

    batch, kv_len, q_len (prefill), q_heads (or num_q_heads / num_heads), kv_heads (or
    num_kv_heads), head_dim, head_dim_v, page_size, dtype ("bf16"...), kv_dtype ("fp8"/"e4m3" for
    a quantised cache), layout, causal, soft_cap, window, lse, seed, variant (a name in
    ``variants_lib.VARIANTS``, with random parameters). MLA uses head_dim (latent, 512)
    and head_dim_pe (64) (MLA prefill also q_len and causal); POD also decode_batch (decode requests beside the
    batch's prefill requests); merge_states uses tokens; dense uses q_len, kv_len and bias (none | bool | float).
    Data is generated on ``device``.
    """
    batch = int(shape.get("batch", 4))
    kv_len = int(shape.get("kv_len", 1024))
    dtype = _dtype(shape.get("dtype", "bf16"))
    g = torch.Generator(device=device).manual_seed(int(shape.get("seed", 0)))
    lse = bool(shape.get("lse", False))
    q_heads = int(shape.get("q_heads", shape.get("num_q_heads", shape.get("num_heads", 0)))) or None
    if op == "attention.mla_decode":
        return mla_case(dtype, (kv_len,) * batch, q_heads or 128, int(shape.get("page_size", 64)), device, lse, g,
                        int(shape.get("head_dim", 512)), int(shape.get("head_dim_pe", 64)), int(shape.get("q_len", 1)))
    if op == "attention.mla_prefill":
        q_len = min(int(shape.get("q_len", kv_len)), kv_len)
        return mla_prefill_case(dtype, (kv_len,) * batch, (q_len,) * batch, q_heads or 128,
                                int(shape.get("page_size", 64)), device, lse, bool(shape.get("causal", True)), g,
                                int(shape.get("head_dim", 512)), int(shape.get("head_dim_pe", 64)))
    if op == "attention.merge_states":
        return merge_case(dtype, int(shape.get("tokens", batch)), q_heads or 32, int(shape.get("head_dim", 128)), device,
                          g)
    if op == "attention.dense":
        head_dim = int(shape.get("head_dim", 128))
        dense_spec = DenseSpec(dtype, batch, q_heads or 32, int(shape.get("kv_heads", shape.get("num_kv_heads", 8))),
                               int(shape.get("q_len", kv_len)), kv_len, head_dim,
                               int(shape.get("head_dim_v") or head_dim), str(shape.get("bias", "bool")),
                               bool(shape.get("causal", False)))
        return dense_case(dense_spec, device, g)
    kv_dtype = shape.get("kv_dtype")
    spec = AttnSpec(
        dtype=dtype, layout=str(shape.get("layout", "NHD")), page_size=int(shape.get("page_size", 16)),
        q_heads=q_heads or 32, kv_heads=int(shape.get("kv_heads", shape.get("num_kv_heads", 8))),
        head_dim=int(shape.get("head_dim", 128)),
        head_dim_v=int(shape["head_dim_v"]) if shape.get("head_dim_v") is not None else None,
        kv_lens=(kv_len,) * batch, causal=bool(shape.get("causal", True)),
        soft_cap=float(shape["soft_cap"]) if shape.get("soft_cap") is not None else None,
        window=int(shape["window"]) if shape.get("window") is not None else None, lse=lse,
        kv_dtype=_dtype(kv_dtype) if kv_dtype is not None and _dtype(kv_dtype) != dtype else None,
        variant=str(shape["variant"]) if shape.get("variant") is not None else None,
    )
    if op == "attention.decode":
        return decode_case(spec, device, g)
    q_len = min(int(shape.get("q_len", kv_len)), kv_len)
    spec = replace(spec, q_lens=(q_len,) * batch)
    if op == "attention.prefill":
        return prefill_case(spec, device, g)
    if op == "attention.prefill_ragged":
        return ragged_case(replace(spec, kv_dtype=None), device, g)
    if op == "attention.pod":  # ``batch`` prefill requests and ``decode_batch`` decode requests, all of kv_len
        return pod_case(spec, (kv_len,) * int(shape.get("decode_batch", batch)), device, g)
    raise ValueError(f"no example builder for op {op!r}; known: {', '.join(OPS)}")
