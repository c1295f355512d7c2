"""Seeded random problems across the Triton attention and KV-cache kernels' declared space, against the reference.

Attention: head dims (also q/k and v differing), GQA groups, page sizes, layouts, lengths including 0 and 1, soft
cap, window, LSE, fp8 KV (e4m3, e5m2), the shipped custom variants, and decode, paged prefill (full, append, mixed
with decode rows) and ragged prefill. MLA decode: heads, page sizes, lengths, new tokens per request, LSE. KV append:
layouts, page sizes, head dims, fp8 pages, decode steps and prefill chunks, standard and MLA pages."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import declares
from kernel_switchboard.testing.case import Case
from kernel_switchboard.testing.cases.attention import (
    AttnSpec,
    _with_queries,
    decode_case,
    mla_case,
    prefill_case,
    ragged_case,
)
from kernel_switchboard.testing.cases.kv_cache import append_case, append_mla_case
from kernel_switchboard.variants_lib import VARIANTS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
DIMS = (64, 80, 96, 128, 192, 256)


def _random_case(seed: int) -> Case:
    rng = random.Random(seed)
    dtype = rng.choice([torch.float16, torch.bfloat16])
    kv_heads, group = rng.choice([1, 2]), rng.choice([1, 2, 3, 4, 8])
    head_dim = rng.choice(DIMS)
    head_dim_v = rng.choice([head_dim, head_dim, 64, 128]) if head_dim != 192 else 128
    max_len = 200 if DEVICE == "cpu" else 3000
    lens = tuple(rng.choice([0, 1, rng.randint(2, max_len)]) for _ in range(rng.randint(1, 4)))
    # a variant brings its own cap or window; prefill declines one at head dim 80 (attention.py)
    variant = rng.choice(sorted(VARIANTS)) if rng.random() < 0.25 and head_dim != 80 else None
    spec = AttnSpec(dtype, rng.choice(["NHD", "HND"]), rng.choice([1, 8, 16, 32, 64, 128]), kv_heads * group,
                    kv_heads, head_dim, head_dim_v, kv_lens=lens,
                    soft_cap=None if variant else rng.choice([None, None, 7.0]),
                    window=None if variant else rng.choice([None, None, rng.randint(0, 60)]), lse=rng.random() < 0.5,
                    kv_dtype=rng.choice([None, None, torch.float8_e4m3fn, torch.float8_e5m2]), variant=variant)
    kind = rng.choice(["decode", "prefill", "ragged"])
    if kind == "decode":
        return decode_case(spec, DEVICE, seed)
    causal = variant != "prefix_lm" and rng.random() < 0.7  # prefix-LM is its own mask
    spec = _with_queries(spec, rng, 48, mixed=rng.random() < 0.5, causal=causal)
    if kind == "ragged":
        return ragged_case(replace(spec, kv_dtype=None), DEVICE, seed)
    return prefill_case(spec, DEVICE, seed)


def _random_mla_or_append(seed: int) -> Case:
    rng = random.Random(seed)
    dtype = rng.choice([torch.float16, torch.bfloat16])
    lens = tuple(rng.choice([1, 2, rng.randint(3, 150)]) for _ in range(rng.randint(1, 3)))
    kind = rng.choice(["mla", "append", "append_mla"])
    if kind == "mla":
        return mla_case(dtype, tuple(rng.choice([0, n]) for n in lens), rng.choice([1, 16, 20, 64, 128]),
                        rng.choice([1, 16, 32, 64]), DEVICE, lse=rng.random() < 0.5, seed=seed,
                        q_len=rng.choice([1, 1, 2, 3]))
    new = None if rng.random() < 0.5 else tuple(rng.randint(0, n) for n in lens)  # None: one token each
    if kind == "append_mla":
        return append_mla_case(dtype, rng.choice([1, 16, 64]), lens, new, DEVICE, seed=seed)
    head_dim = rng.choice(DIMS)
    return append_case(dtype, rng.choice(["NHD", "HND"]), rng.choice([1, 16, 32, 64, 128]), rng.choice([1, 2, 8]),
                       head_dim, lens, new, DEVICE, kv_dtype=rng.choice([None, torch.float8_e4m3fn, torch.float8_e5m2]),
                       head_dim_v=rng.choice([head_dim, 64]), seed=seed)


@pytest.mark.parametrize("seed", range(96))
def test_random_problem_matches_reference(seed: int) -> None:
    _compare_with_every_triton_kernel(_random_case(seed))


@pytest.mark.parametrize("seed", range(1000, 1032))
def test_random_mla_or_append_matches_reference(seed: int) -> None:
    _compare_with_every_triton_kernel(_random_mla_or_append(seed))


def _compare_with_every_triton_kernel(case: Case) -> None:
    from kernel_switchboard import registry

    kernels = [k for k in registry.kernels(case.op) if k.backend == "triton" and declares(k, case)]
    assert kernels, f"{case.id}: no Triton kernel declares it (the sampled space drifted from the capability)"
    for kernel in kernels:
        case.compare(kernel.id)

