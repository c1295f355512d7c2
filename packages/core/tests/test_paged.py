"""The paged KV types: CSR <-> block-table converters, layout conversion, and their use by attention."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, page_table


@pytest.mark.parametrize(("lens", "page_size"), [((0, 1, 37, 16), 16), ((5, 0, 3), 1), ((9,), 4), ((), 8)])
def test_csr_round_trip(lens: tuple[int, ...], page_size: int) -> None:
    block_table, seq_lens, _ = page_table(torch.Generator().manual_seed(0), lens, page_size)
    table = ksb.PageTable(block_table, seq_lens)
    indptr, indices, last = table.to_csr(page_size)
    counts = [(n + page_size - 1) // page_size for n in lens]
    assert indptr.tolist() == [sum(counts[:i]) for i in range(len(lens) + 1)]
    assert indices.tolist() == [int(block_table[b, j]) for b, n in enumerate(counts) for j in range(n)]
    assert last.tolist() == [0 if n == 0 else n - (c - 1) * page_size for n, c in zip(lens, counts)]
    back = ksb.PageTable.from_csr(indptr, indices, last, page_size)
    assert back.seq_lens.tolist() == list(lens)
    for b, n in enumerate(counts):
        assert back.block_table[b, :n].tolist() == block_table[b, :n].tolist()


def test_from_csr_of_flashinfer_style_inputs() -> None:
    indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    indices = torch.tensor([7, 3, 1, 0, 4], dtype=torch.int32)
    last = torch.tensor([3, 0, 16], dtype=torch.int32)
    table = ksb.PageTable.from_csr(indptr, indices, last, 16)
    assert table.seq_lens.tolist() == [19, 0, 48]
    assert table.block_table[0, :2].tolist() == [7, 3] and table.block_table[2].tolist() == [1, 0, 4]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn])
def test_layout_round_trip_and_attention_is_layout_independent(dtype: torch.dtype) -> None:
    kv_dtype = dtype if dtype == torch.float8_e4m3fn else None
    q, cache, table = decode_case(AttnSpec(torch.float16, "NHD", 4, 4, 2, kv_lens=(9, 0, 14), kv_dtype=kv_dtype),
                                  "cpu").args
    hnd = cache.to_layout("HND")
    assert hnd.layout == "HND" and hnd.k_pages.shape == (cache.num_pages, 2, 4, 64)
    assert (hnd.k_scale, hnd.v_scale) == (cache.k_scale, cache.v_scale)
    back = hnd.to_layout("NHD")
    assert torch.equal(back.k_pages.view(torch.uint8), cache.k_pages.view(torch.uint8))
    assert torch.equal(back.v_pages.view(torch.uint8), cache.v_pages.view(torch.uint8))
    a = ksb.attention.decode(q, cache, table, return_lse=True)
    b = ksb.attention.decode(q, hnd, table, return_lse=True)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_attention_through_a_csr_table_equals_the_block_table() -> None:
    q, cache, table = decode_case(AttnSpec(torch.float32, "HND", 4, 4, 1, kv_lens=(9, 1, 14)), "cpu").args
    indptr, indices, last = table.to_csr(cache.page_size)
    csr_table = ksb.PageTable.from_csr(indptr, indices, last, cache.page_size)
    torch.testing.assert_close(ksb.attention.decode(q, cache, csr_table), ksb.attention.decode(q, cache, table),
                               atol=0, rtol=0)


def test_table_written_in_place_is_read_again() -> None:
    """An engine that grows seq_lens in place between eager calls gets the new lengths, not stale ones."""
    import kernel_switchboard as ksb

    torch.manual_seed(0)
    k = torch.randn(4, 4, 2, 16)
    v = torch.randn(4, 4, 2, 16)
    cache = ksb.PagedKVCache(k, v)
    seq_lens = torch.tensor([3], dtype=torch.int32)
    table = ksb.PageTable(torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), seq_lens)
    q = torch.randn(1, 4, 16)
    ksb.attention.decode(q, cache, table)
    seq_lens.fill_(10)
    fresh = ksb.PageTable(table.block_table.clone(), seq_lens.clone())
    assert table.max_seq_len == 10
    torch.testing.assert_close(ksb.attention.decode(q, cache, table), ksb.attention.decode(q, cache, fresh))
    seq_lens.fill_(17)  # more than 4 pages of 4 tokens: the check runs again and names the argument
    with pytest.raises(ksb.InvalidArgumentError, match="seq_lens"):
        ksb.attention.decode(q, cache, table)
