"""fp8 attention in the Triton kernels: KV scales as device tensors (one or one per KV head) in decode, prefill, POD and
the append, against the reference (interpreter on the CPU; real sizes on a GPU, ``gpu``)."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, pod_case, prefill_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
E4M3, F16, BF16 = torch.float8_e4m3fn, torch.float16, torch.bfloat16


def _scaled(cache: ksb.PagedKVCache, k_scale: torch.Tensor, v_scale: torch.Tensor) -> ksb.PagedKVCache:
    return ksb.PagedKVCache(cache.k_pages, cache.v_pages, cache.layout, k_scale.to(cache.device),
                            v_scale.to(cache.device))


@pytest.mark.parametrize("op", ["decode", "prefill", "pod"])
def test_per_head_scale_tensors_match_reference(op: str) -> None:
    small = DEVICE == "cpu"
    spec = AttnSpec(F16 if small else BF16, "HND", 16, 4 if small else 32, 2 if small else 8, 64 if small else 128,
                    kv_lens=(21, 40, 1) if small else (3000, 700, 1), q_lens=(7, 40, 1) if small else (512, 700, 1),
                    kv_dtype=E4M3, lse=True)
    heads = spec.kv_heads
    k_scale = torch.tensor([0.5 * 2.0 ** -(h % 3) for h in range(heads)])
    v_scale = torch.tensor([1.0 + h / heads for h in range(heads)])
    if op == "pod":
        case = pod_case(spec, (33, 5) if small else (4096, 77), DEVICE)
        i = 3
    else:
        case = (decode_case if op == "decode" else prefill_case)(spec, DEVICE)
        i = 1 if op == "decode" else 2
    args = list(case.args)
    args[i] = _scaled(args[i], k_scale, v_scale)
    fn = getattr(ksb.attention, op)
    assert "kv_scale_tensor" in ksb.explain(case.op, *args, **case.kwargs, backend="triton").problem.features
    got = fn(*args, **case.kwargs, backend="triton")
    want = fn(*args, **case.kwargs, backend="reference")
    for g, w in zip(got, want):
        assert_close(g, w, atol=3e-2, rtol=3e-2, what=f"{op} with per-head scale tensors")


def test_append_quantises_each_head_by_its_scale_tensor() -> None:
    pages = torch.zeros(3, 4, 2, 64, dtype=E4M3, device=DEVICE)
    table = ksb.PageTable(torch.arange(3, dtype=torch.int32, device=DEVICE)[:, None],
                          torch.full((3,), 4, dtype=torch.int32, device=DEVICE))
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(3, 2, 64, generator=g) * 30).to(DEVICE, F16)
    v = torch.randn(3, 2, 64, generator=g).to(DEVICE, F16)
    positions = torch.full((3,), 1, dtype=torch.int32, device=DEVICE)
    stored = []
    for backend in ("triton", "reference"):
        cache = ksb.PagedKVCache(pages.clone(), pages.clone(), "NHD", torch.tensor([0.25, 3.0], device=DEVICE),
                                 torch.tensor(0.5, device=DEVICE))
        ksb.kv_cache.append(k, v, cache, table, positions, backend=backend)
        stored.append((cache.k_pages[:, 1].view(torch.uint8).cpu(), cache.v_pages[:, 1].view(torch.uint8).cpu()))
    assert torch.equal(stored[0][0], stored[1][0]) and torch.equal(stored[0][1], stored[1][1])
