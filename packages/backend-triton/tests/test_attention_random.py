"""Seeded random attention problems across the Triton kernels' declared space, against the reference: head dims
(also q/k and v differing), GQA groups, page sizes, layouts, lengths including 0 and 1, soft cap, window, LSE,
fp8 KV (e4m3, e5m2), and decode, paged prefill (full, append, mixed with decode rows) and ragged prefill."""

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
    prefill_case,
    ragged_case,
)

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
    spec = AttnSpec(dtype, rng.choice(["NHD", "HND"]), rng.choice([1, 8, 16, 32, 64, 128]), kv_heads * group,
                    kv_heads, head_dim, head_dim_v, kv_lens=lens, soft_cap=rng.choice([None, None, 7.0]),
                    window=rng.choice([None, None, rng.randint(0, 60)]), lse=rng.random() < 0.5,
                    kv_dtype=rng.choice([None, None, torch.float8_e4m3fn, torch.float8_e5m2]))
    kind = rng.choice(["decode", "prefill", "ragged"])
    if kind == "decode":
        return decode_case(spec, DEVICE, seed)
    spec = _with_queries(spec, rng, 48, mixed=rng.random() < 0.5, causal=rng.random() < 0.7)
    if kind == "ragged":
        return ragged_case(replace(spec, kv_dtype=None), DEVICE, seed)
    return prefill_case(spec, DEVICE, seed)


@pytest.mark.parametrize("seed", range(96))
def test_random_problem_matches_reference(seed: int) -> None:
    from kernel_switchboard import registry

    case = _random_case(seed)
    kernels = [k for k in registry.kernels(case.op) if k.backend == "triton" and declares(k, case)]
    assert kernels, f"{case.id}: no Triton kernel declares it (the sampled space drifted from the capability)"
    for kernel in kernels:
        case.compare(kernel.id)

