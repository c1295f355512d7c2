"""Conformance cases of ``attention.dense``: random q/k/v with a bool mask, a float bias or none, causal or not,
GQA, Lq < / = / > Lk, and rows that keep nothing (their output must be 0)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from ..case import Case

_SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


class DenseSpec(NamedTuple):
    dtype: torch.dtype
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    head_dim_v: int
    bias: str  # "none", "bool" (B, 1, Lq, Lk) or "float" (Hq, Lq, Lk) with -inf entries
    causal: bool

    def tag(self) -> str:
        dims = f"d{self.head_dim}" + (f":{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        return (f"dense-{_SHORT[self.dtype]}-b{self.batch}-h{self.q_heads}:{self.kv_heads}-q{self.q_len}-k{self.kv_len}"
                f"-{dims}-{self.bias}" + ("-causal" if self.causal else ""))


def dense_case(spec: DenseSpec, device: torch.device | str, seed: int | torch.Generator = 0) -> Case:
    """One ``attention.dense`` call; data drawn on the CPU (or on ``seed``'s device when it is a generator)."""
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    s = spec

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=g.device).to(device, s.dtype)

    q = randn(s.batch, s.q_heads, s.q_len, s.head_dim)
    k = randn(s.batch, s.kv_heads, s.kv_len, s.head_dim)
    v = randn(s.batch, s.kv_heads, s.kv_len, s.head_dim_v)
    bias = None
    if s.bias == "bool":
        bias = torch.rand(s.batch, 1, s.q_len, s.kv_len, generator=g, device=g.device) < 0.7
        bias[0, 0, 0] = False  # a query that keeps nothing: out 0
        bias = bias.to(device)
    elif s.bias == "float":
        bias = torch.randn(s.q_heads, s.q_len, s.kv_len, generator=g, device=g.device) * 2
        bias.masked_fill_(torch.rand(bias.shape, generator=g, device=g.device) < 0.1, float("-inf"))
        bias[-1, -1] = float("-inf")  # every score of one query masked by the bias
        bias = bias.to(device, s.dtype)
    return Case("attention.dense", s.tag(), (q, k, v, bias), {"causal": s.causal}, s.dtype)


def dense_specs(size: str) -> list[DenseSpec]:
    """The sampled space: small shapes for the CPU, real ones (encoder / cross-attention sizes) on a GPU."""
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    if size == "small":
        return [DenseSpec(f16, 2, 4, 2, 5, 9, 16, 16, "bool", True),
                DenseSpec(bf16, 1, 4, 4, 7, 7, 32, 32, "float", False),
                DenseSpec(f32, 2, 2, 1, 9, 4, 16, 8, "none", True),  # Lq > Lk: the first rows keep nothing
                DenseSpec(f16, 1, 8, 2, 3, 12, 64, 64, "float", True),
                DenseSpec(bf16, 2, 4, 2, 20, 33, 64, 64, "bool", True)]
    return [DenseSpec(bf16, 4, 16, 16, 512, 512, 64, 64, "bool", False),
            DenseSpec(f16, 2, 32, 8, 1024, 1024, 128, 128, "float", True),
            DenseSpec(bf16, 8, 12, 12, 77, 1024, 64, 64, "none", False),  # cross-attention
            DenseSpec(f32, 2, 8, 2, 300, 200, 128, 64, "bool", True)]


def dense_random_cases(count: int, seed: int, dtypes: tuple[torch.dtype, ...], head_dim: int
                       ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool]]:
    """Random dense-attention calls: GQA, Lq vs Lk both ways, causal or not, bool / float / no bias in every
    broadcastable shape (full, per request, per head, 1-d over keys, 2-d), -inf entries included."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        b, hkv = rng.randint(1, 3), rng.choice([1, 2])
        hq, lq, lk = hkv * rng.choice([1, 2, 4]), rng.choice([1, 2, 7, 17]), rng.choice([1, 5, 16, 31])
        dt = rng.choice(dtypes)
        q, k = torch.randn(b, hq, lq, head_dim, generator=g), torch.randn(b, hkv, lk, head_dim, generator=g)
        v = torch.randn(b, hkv, lk, rng.choice([head_dim, 2 * head_dim]), generator=g)
        shape = rng.choice([(b, hq, lq, lk), (1, 1, lq, lk), (lk,), (hq, 1, lk), (b, 1, 1, lk), (lq, lk)])
        kind, bias = rng.choice(["none", "bool", "float"]), None
        if kind == "bool":
            bias = torch.rand(shape, generator=g) < 0.6
        elif kind == "float":
            bias = (torch.randn(shape, generator=g) * 2).masked_fill(torch.rand(shape, generator=g) < 0.1, float("-inf"))
            bias = bias.to(dt)
        yield q.to(dt), k.to(dt), v.to(dt), bias, rng.random() < 0.5


def bench_problems(cc: tuple[int, int] = (9, 0)) -> dict[str, object]:
    """The ``switchboard bench --preset dense`` points as eager GPU problems with exact lengths (no tensors): what the
    backends' cost-model tests compare with the times measured on the H200 (``switchboard bench --preset dense``)."""
    from ...bench import PRESETS
    from ...ops.attention_dense import DenseProblem

    problems: dict[str, object] = {}
    for point in PRESETS["dense"]():
        x = point.params
        features = ({"causal"} if x["causal"] else set()) | ({"attn_bias"} if x["bias"] != "none" else set())
        problems[point.label] = DenseProblem("cuda", cc, torch.bfloat16, x["head_dim"], x["head_dim"], x["num_q_heads"],
                                             x["num_kv_heads"], x["num_q_heads"] // x["num_kv_heads"], x["batch"],
                                             x["q_len"], x["kv_len"], x["bias"], frozenset(features))
    return problems


def cost_ratios(cost: Any, measured_ms: dict[str, float]) -> dict[str, float]:
    """``cost(problem)`` over the measured time of each :func:`bench_problems` point in ``measured_ms`` (ms)."""
    return {label: cost(problem) * 1e3 / measured_ms[label] for label, problem in bench_problems().items()}
