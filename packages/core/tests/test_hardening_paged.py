"""Bad inputs of the paged KV types are refused by name where they enter, never turned into a wrong table."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import InvalidArgumentError

I32, I64 = torch.int32, torch.int64


def _csr(indptr: list[int], indices: list[int], last: list[int], dtype: torch.dtype = I32
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(indptr, dtype=dtype), torch.tensor(indices, dtype=dtype), torch.tensor(last, dtype=dtype))


@pytest.mark.parametrize(("args", "page_size", "name"), [
    (_csr([0, 2], [2**32 + 3, 1], [3], I64), 16, "indices"),  # would wrap to page 3 in int32
    (_csr([0, 1], [-1], [3]), 16, "indices"),
    (_csr([0, 3, 1], [1, 2, 3], [1, 1]), 16, "indptr"),  # decreasing
    (_csr([1, 2], [5, 6], [1]), 4, None),  # a non-zero start is FlashInfer-legal (accepted below)
    (_csr([0, 5], [1], [1]), 4, "indptr"),  # past the end of indices
    (_csr([-1, 1], [1, 2], [1]), 4, "indptr"),
    (_csr([0, 1], [1], [17]), 16, "last_page_len"),  # above page_size: would read padding
    (_csr([0, 1], [1], [0]), 16, "last_page_len"),  # a request with a page holds >= 1 token in it
    (_csr([0, 1], [1], [-2]), 16, "last_page_len"),
    (_csr([0, 1], [1], [1]), 2**32, "page_size"),  # would wrap the lengths
    (_csr([0, 1], [1], [1]), 0, "page_size"),
    (_csr([0, 1], [1], [1]), True, "page_size"),
    (_csr([0, 1], [1], [1]), 2.0, "page_size"),
    ((torch.tensor([0, 1]), torch.tensor([1.0]), torch.tensor([1])), 4, "indices.dtype"),
    ((torch.tensor([[0, 1]]), torch.tensor([1]), torch.tensor([1])), 4, "indptr"),
    ((torch.tensor([0, 1]), torch.tensor([1]), torch.tensor([1, 1])), 4, "last_page_len.shape"),
])
def test_from_csr_validates_every_input(args: tuple[torch.Tensor, ...], page_size: int, name: str | None) -> None:
    if name is None:
        table = ksb.PageTable.from_csr(*args, page_size)
        assert table.block_table.tolist() == [[6]] and table.seq_lens.tolist() == [1]
        return
    with pytest.raises(InvalidArgumentError, match=rf"^{name}="):
        ksb.PageTable.from_csr(*args, page_size)


def test_from_csr_refuses_lengths_past_int32() -> None:
    indptr, indices, last = torch.tensor([0, 2**20]), torch.zeros(2**20, dtype=I32), torch.tensor([1])
    with pytest.raises(InvalidArgumentError, match=r"^page_size=4096 .*below 2\*\*31"):
        ksb.PageTable.from_csr(indptr, indices, last, 4096)


def test_from_csr_int64_inputs_in_range_give_the_same_table_as_int32() -> None:
    a = ksb.PageTable.from_csr(*_csr([0, 2, 2, 5], [7, 3, 1, 0, 4], [3, 0, 16], I64), 16)
    b = ksb.PageTable.from_csr(*_csr([0, 2, 2, 5], [7, 3, 1, 0, 4], [3, 0, 16], I32), 16)
    assert torch.equal(a.block_table, b.block_table) and torch.equal(a.seq_lens, b.seq_lens)
    assert a.block_table.dtype == a.seq_lens.dtype == I32 and a.max_seq_len == 48


def test_from_csr_table_notices_in_place_writes_like_any_table() -> None:
    table = ksb.PageTable.from_csr(*_csr([0, 1], [0], [3]), 4)
    assert table.max_seq_len == 3
    table.seq_lens.fill_(4)
    assert table.max_seq_len == 4  # measured by from_csr, not a caller's trusted bound


@pytest.mark.parametrize("value", [-3, 2**31, 3.5, True, "8"])
def test_page_table_max_seq_len_must_be_a_non_negative_int(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^max_seq_len="):
        ksb.PageTable(torch.zeros(1, 1, dtype=I32), torch.ones(1, dtype=I32), max_seq_len=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value"), [("k_scale", float("inf")), ("k_scale", float("nan")), ("v_scale", 0.0),
                                             ("v_scale", -1.0), ("k_scale", float("-inf")), ("k_scale", True)])
def test_fp8_cache_scales_must_be_finite_and_positive(name: str, value: float) -> None:
    pages = torch.zeros(2, 4, 1, 8).to(torch.float8_e4m3fn)
    with pytest.raises(InvalidArgumentError, match=rf"^{name}="):
        ksb.PagedKVCache(pages, pages, **{name: value})
    assert ksb.PagedKVCache(pages, pages, k_scale=0.5, v_scale=2).v_scale == 2.0
