"""Triton kv_cache.append_slots and kv_cache.append_csr against the reference: conformance cases (padding, tokens
outside their pages, layouts, page sizes, fp8, int32/int64 slots) and the K|V halves of one engine-shaped cache tensor."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import conformance_test

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_triton_conformance = conformance_test("triton", ops=("kv_cache.append_slots", "kv_cache.append_csr"))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a cache tensor. Triton 3.7's interpreter casts -0.0 to fp8 as +0.0 (the GPU and Triton 3.9's
    interpreter keep the sign), so under the interpreter an fp8 zero's sign is not compared."""
    b = t.view(torch.uint8)
    if triton_interpreting() and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        b = torch.where(b == 0x80, torch.zeros_like(b), b)
    return b


@pytest.mark.parametrize(("page_dtype", "layout"), [(torch.bfloat16, "HND"), (torch.float8_e4m3fn, "HND"),
                                                    (torch.float16, "NHD")])
def test_halves_of_one_cache_tensor(page_dtype: torch.dtype, layout: str) -> None:
    """vLLM's cache: K and V are the two halves of the last dim of one (pages, heads, slots, 2 * D) tensor."""
    heads, d, ps, pages = 4, 64, 16, 7
    g = torch.Generator().manual_seed(1)
    shape = (pages, heads, ps, 2 * d) if layout == "HND" else (pages, ps, heads, 2 * d)
    kv = torch.randn(shape, generator=g).to(DEVICE, page_dtype)
    scales = (0.5, 0.125) if page_dtype == torch.float8_e4m3fn else (None, None)
    dtype = torch.bfloat16 if scales[0] else page_dtype
    k = (torch.randn(9, heads, d, generator=g) * 3).to(DEVICE, dtype)
    v = (torch.randn(9, heads, d, generator=g) * 3).to(DEVICE, dtype)
    slots = torch.tensor([5, -1, 40, 111, 0, -1, 17, 64, 80], device=DEVICE)
    got, want = kv.clone(), kv.clone()
    ksb.kv_cache.append_slots(k, v, ksb.PagedKVCache(got[..., :d], got[..., d:], layout, *scales), slots,
                              backend="triton")
    ksb.kv_cache.append_slots(k, v, ksb.PagedKVCache(want[..., :d], want[..., d:], layout, *scales), slots,
                              backend="reference")
    assert torch.equal(_bits(got), _bits(want))
    assert not torch.equal(_bits(got), _bits(kv))


@pytest.mark.gpu
def test_triton_append_slots_is_captured_in_a_cuda_graph() -> None:
    from kernel_switchboard.testing.cases.kv_cache import append_slots_case

    k, v, cache, slots = append_slots_case(torch.bfloat16, "HND", 16, 8, 128, (300, 7), (30, 1), "cuda",
                                           torch.float8_e4m3fn, padding=5).args
    want = ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "HND", cache.k_scale, cache.v_scale)
    ksb.kv_cache.append_slots(k, v, want, slots, backend="reference")
    ksb.kv_cache.append_slots(k, v, ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "HND",
                                                     cache.k_scale, cache.v_scale), slots, backend="triton")  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ksb.kv_cache.append_slots(k, v, cache, slots, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache.k_pages.view(torch.uint8), want.k_pages.view(torch.uint8))
    assert torch.equal(cache.v_pages.view(torch.uint8), want.v_pages.view(torch.uint8))
