"""Triton KV-cache append kernels against the reference: layouts, page sizes, fp8, MLA pages."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.paged import PagedKVCache, PageTable
from kernel_switchboard.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _table(batch: int, max_pages: int, num_pages: int, seed: int = 0) -> PageTable:
    bt = torch.randperm(num_pages, generator=_gen(seed))[: batch * max_pages].view(batch, max_pages)
    lens = torch.full((batch,), max_pages, dtype=torch.int32)
    return PageTable(bt.to(DEVICE, torch.int32), lens.to(DEVICE))


def _targets(tokens: int, batch: int, capacity: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct (request, position) pairs so that no two tokens write the same slot."""
    flat = torch.randperm(batch * capacity, generator=_gen(seed))[:tokens]
    return (flat // capacity).to(DEVICE, torch.int32), (flat % capacity).to(DEVICE, torch.int32)


CASES = [
    # page dtype, input dtype, layout, page_size, kv_heads, (D, Dv)
    (torch.float16, torch.float16, "NHD", 16, 2, (64, 64)),
    (torch.bfloat16, torch.bfloat16, "HND", 1, 3, (64, 64)),
    (torch.float32, torch.float32, "NHD", 5, 2, (96, 40)),
    (torch.bfloat16, torch.bfloat16, "HND", 4, 1, (192, 128)),
    (torch.float8_e4m3fn, torch.bfloat16, "NHD", 16, 2, (64, 64)),
    (torch.float8_e4m3fn, torch.float32, "HND", 8, 2, (128, 128)),
    (torch.float8_e5m2, torch.float16, "NHD", 16, 2, (64, 64)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-{str(c[1])[6:]}-{c[2]}-p{c[3]}-{c[5]}")
def test_append_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    page_dtype, dtype, layout, ps, hkv, (d, dv) = case
    batch, max_pages, num_pages, tokens = 3, 4, 15, 9
    fp8 = page_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    g = _gen(2)

    def pages(dim: int) -> torch.Tensor:
        shape = (num_pages, ps, hkv, dim) if layout == "NHD" else (num_pages, hkv, ps, dim)
        return torch.randn(shape, generator=g).to(DEVICE, page_dtype)

    scales = {"k_scale": 0.5, "v_scale": 0.02} if fp8 else {}
    cache = PagedKVCache(pages(d), pages(dv), layout, **scales)
    table = _table(batch, max_pages, num_pages)
    bi, pos = _targets(tokens, batch, max_pages * ps)
    k = (torch.randn(tokens, hkv, d, generator=g) * 3).to(DEVICE, dtype)
    v = (torch.randn(tokens, hkv, dv, generator=g) * 3).to(DEVICE, dtype)
    if fp8:
        k[0, 0, 0] = 1e6  # saturates
    got = PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), layout, **scales)
    want = PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), layout, **scales)
    ksb.kv_cache.append(k, v, got, table, pos, bi, backend="triton")
    ksb.kv_cache.append(k, v, want, table, pos, bi, backend="reference")
    for g_pages, w_pages in ((got.k_pages, want.k_pages), (got.v_pages, want.v_pages)):
        if fp8:  # bit-exact: the same rounding and saturation
            assert torch.equal(g_pages.view(torch.uint8), w_pages.view(torch.uint8))
        else:
            assert_close(g_pages, w_pages, atol=0, rtol=0)
    assert not torch.equal(got.k_pages.float(), cache.k_pages.float())  # something was written


def test_append_decode_step_without_batch_indices() -> None:
    table = _table(4, 2, 10)
    cache = PagedKVCache(torch.zeros(10, 16, 2, 64, device=DEVICE, dtype=torch.float16),
                         torch.zeros(10, 16, 2, 64, device=DEVICE, dtype=torch.float16))
    k = torch.randn(4, 2, 64, generator=_gen(3)).to(DEVICE, torch.float16)
    pos = torch.tensor([0, 17, 31, 5], dtype=torch.int32, device=DEVICE)
    ksb.kv_cache.append(k, k, cache, table, pos, backend="triton")
    for b in range(4):
        page = int(table.block_table[b, int(pos[b]) // 16])
        assert torch.equal(cache.k_pages[page, int(pos[b]) % 16], k[b])


@pytest.mark.parametrize(("dtype", "page_size"), [(torch.bfloat16, 16), (torch.float16, 1)])
def test_append_mla_matches_reference(dtype: torch.dtype, page_size: int) -> None:
    batch, max_pages, num_pages, tokens = 2, 3, 9, 5
    g = _gen(4)
    ckv_pages = torch.randn(num_pages, page_size, 512, generator=g).to(DEVICE, dtype)
    kpe_pages = torch.randn(num_pages, page_size, 64, generator=g).to(DEVICE, dtype)
    table = _table(batch, max_pages, num_pages)
    bi, pos = _targets(tokens, batch, max_pages * page_size)
    ckv = torch.randn(tokens, 512, generator=g).to(DEVICE, dtype)
    kpe = torch.randn(tokens, 64, generator=g).to(DEVICE, dtype)
    got = (ckv_pages.clone(), kpe_pages.clone())
    want = (ckv_pages.clone(), kpe_pages.clone())
    ksb.kv_cache.append_mla(ckv, kpe, *got, table, pos, bi, backend="triton")
    ksb.kv_cache.append_mla(ckv, kpe, *want, table, pos, bi, backend="reference")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(got[0], ckv_pages)


def _store_args(op: str, table: PageTable, bi: torch.Tensor, pos: torch.Tensor, ps: int) -> tuple[torch.Tensor, ...]:
    """The index arguments of ``op`` for tokens going to (request ``bi``, position ``pos``) of ``table``."""
    bt = table.block_table
    if op == "append":
        return table, pos, bi
    if op == "append_slots":
        return ((bt[bi.long(), (pos // ps).long()] * ps + pos % ps).to(torch.int64),)
    indptr = torch.arange(0, (bt.shape[0] + 1) * bt.shape[1], bt.shape[1], dtype=torch.int32, device=DEVICE)
    return indptr, bt.flatten().contiguous(), pos, bi


@pytest.mark.parametrize("op", ["append", "append_slots", "append_csr"])
def test_store_launches_are_kept_across_a_steps_layers(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine appends at every layer of a step, each layer's own pages, the same geometry: the launch is kept
    and repeated with each layer's tensors (each layer's pages get their own tokens, exactly); another token count
    or other float fp8 scales make their own launch; a kept launch holds no call's tensors."""
    import gc
    import weakref

    from kernel_switchboard_triton import _append

    monkeypatch.setattr(_append, "_KEPT", {})
    batch, max_pages, num_pages, ps, hkv, d = 3, 4, 15, 8, 2, 64
    table = _table(batch, max_pages, num_pages)
    fn = getattr(ksb.kv_cache, op)
    for tokens, fp8_scales in ((5, None), (5, None), (7, None), (5, (0.5, 0.25)), (5, (2.0, 0.125))):
        bi, pos = _targets(tokens, batch, max_pages * ps, seed=tokens)
        args = _store_args(op, table, bi, pos, ps)
        for layer in range(3):
            g = _gen(10 + layer)
            dtype = torch.float8_e4m3fn if fp8_scales else torch.bfloat16
            pages = [torch.randn(num_pages, ps, hkv, d, generator=g).to(DEVICE, dtype) for _ in range(2)]
            scales = dict(zip(("k_scale", "v_scale"), fp8_scales)) if fp8_scales else {}
            k, v = (torch.randn(tokens, hkv, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
            got = PagedKVCache(pages[0].clone(), pages[1].clone(), "NHD", **scales)
            want = PagedKVCache(pages[0].clone(), pages[1].clone(), "NHD", **scales)
            fn(k, v, got, *args, backend="triton")
            fn(k, v, want, *args, backend="reference")
            for g_pages, w_pages in ((got.k_pages, want.k_pages), (got.v_pages, want.v_pages)):
                # exact values (Triton 3.7's interpreter stores a negative value that rounds to zero as +0)
                assert torch.equal(g_pages.float(), w_pages.float())
            if layer == 0:
                kept = dict(_append._KEPT)
            else:  # the first layer's launch repeated, none rebuilt or added
                assert _append._KEPT.keys() == kept.keys() and all(_append._KEPT[k] is kept[k] for k in kept)
        refs = [weakref.ref(t) for t in (k, v, got.k_pages, got.v_pages)]
        del k, v, got, want, pages, g_pages, w_pages
        gc.collect()
        assert all(r() is None for r in refs)
    assert len(_append._KEPT) == 4  # one launch for each geometry: 5 and 7 tokens, and each pair of fp8 scales
