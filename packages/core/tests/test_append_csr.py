"""kv_cache.append_csr (FlashInfer's CSR page table, no block table built) against kv_cache.append through the same
table; tokens outside their pages write nothing; check_indices names each kind of bad target; bad tensors refused."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import InvalidArgumentError
from kernel_switchboard.testing.cases.kv_cache import append_case, append_csr_case

F16, BF16, E4M3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn

SPECS = [  # dtype, layout, page size, kv heads, head dim, lens, new, kv dtype
    (F16, "NHD", 16, 2, 64, (1, 17, 40), None, None),
    (BF16, "HND", 1, 2, 64, (5, 9), (5, 2), None),
    (BF16, "NHD", 4, 4, 64, (7, 3, 20), (7, 1, 4), E4M3),
]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("outside", [0, 4])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_append_csr_writes_what_append_writes_through_the_table(spec: tuple, outside: int) -> None:
    dtype, layout, page, heads, dim, lens, new, kvd = spec
    want = append_case(dtype, layout, page, heads, dim, lens, new, "cpu", kvd, seed=3)
    got = append_csr_case(dtype, layout, page, heads, dim, lens, new, "cpu", kvd, outside=outside, seed=3)
    k, v, cache, indptr, indices, positions, rows = got.args
    ksb.kv_cache.append_csr(k, v, cache, indptr, indices, positions, rows, check_indices=not outside)
    wk, wv, wcache, table, wpos = want.args[:5]
    ksb.kv_cache.append(wk, wv, wcache, table, wpos, *want.args[5:])
    assert torch.equal(_bytes(cache.k_pages), _bytes(wcache.k_pages))  # the tokens outside wrote nothing
    assert torch.equal(_bytes(cache.v_pages), _bytes(wcache.v_pages))


def _small() -> tuple:
    case = append_csr_case(F16, "NHD", 4, 2, 16, (6, 9), (2, 3), "cpu", seed=5)
    return case.args


@pytest.mark.parametrize(("change", "named"), [
    (lambda a: {"rows": torch.tensor([0, 0, 2, 1, 1], dtype=torch.int32)}, "batch_indices"),
    (lambda a: {"positions": torch.tensor([4, 5, 6, 7, 12], dtype=torch.int32)}, "positions"),
    (lambda a: {"positions": torch.tensor([-1, 5, 6, 7, 8], dtype=torch.int32)}, "positions"),
    (lambda a: {"indices": torch.full_like(a[4], 99)}, "indices"),
    (lambda a: {"indptr": torch.tensor([0, 9, 2], dtype=torch.int32)}, "indptr"),
    (lambda a: {"indptr": a[3].long()}, "indptr"),
    (lambda a: {"indices": a[4].float()}, "indices"),
    (lambda a: {"rows": a[6][:-1]}, "batch_indices"),
    (lambda a: {"indptr": torch.zeros(0, dtype=torch.int32)}, "indptr"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_targets_and_tensors_are_refused_by_name(change, named: str) -> None:  # type: ignore[no-untyped-def]
    k, v, cache, indptr, indices, positions, rows = _small()
    args = {"indptr": indptr, "indices": indices, "positions": positions, "rows": rows}
    args.update(change((k, v, cache, indptr, indices, positions, rows)))
    before = _bytes(cache.k_pages).clone()
    with pytest.raises(InvalidArgumentError, match=named):
        ksb.kv_cache.append_csr(k, v, cache, args["indptr"], args["indices"], args["positions"], args["rows"])
    assert torch.equal(_bytes(cache.k_pages), before)  # refused before anything is written


def test_flashinfer_compat_append_runs_the_csr_op_without_a_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernel_switchboard.flashinfer.append_paged_kv_cache`` calls kv_cache.append_csr with check_indices=False (as
    FlashInfer, no read back per call: engines call it once per layer), and builds no PageTable."""
    import kernel_switchboard.flashinfer as fi
    from kernel_switchboard.paged import PageTable

    k, v, cache, indptr, indices, positions, rows = _small()
    calls = []
    real = ksb.kv_cache.append_csr
    monkeypatch.setattr(ksb.kv_cache, "append_csr", lambda *a, **kw: (calls.append(kw), real(*a, **kw)))
    monkeypatch.setattr(PageTable, "from_csr", lambda *a, **kw: pytest.fail("a PageTable was built"))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda *a: pytest.fail("a host read"))
    last = torch.tensor([2, 1], dtype=torch.int32)
    fi.append_paged_kv_cache(k, v, rows, positions, (cache.k_pages, cache.v_pages), indices, indptr, last, "NHD")
    assert calls == [{"check_indices": False}]


def test_flashinfer_compat_mla_append_runs_the_csr_op_on_the_latent_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """``append_paged_mla_kv_cache`` writes ckv / kpe through kv_cache.append_csr (the pages seen as a one-head
    cache): no PageTable, no host read, and a padding entry (batch index -1) writes nothing."""
    import kernel_switchboard.flashinfer as fi
    from kernel_switchboard.paged import PageTable

    ckv, kpe = torch.zeros(6, 16, 32), torch.zeros(6, 16, 8)
    indptr, indices = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([4, 1, 5], dtype=torch.int32)
    last = torch.tensor([3, 16], dtype=torch.int32)
    new_ckv, new_kpe = torch.randn(3, 32), torch.randn(3, 8)
    rows = torch.tensor([0, 1, -1], dtype=torch.int32)
    positions = torch.tensor([18, 15, 0], dtype=torch.int32)
    calls = []
    real = ksb.kv_cache.append_csr
    monkeypatch.setattr(ksb.kv_cache, "append_csr", lambda *a, **kw: (calls.append(kw), real(*a, **kw)))
    monkeypatch.setattr(PageTable, "from_csr", lambda *a, **kw: pytest.fail("a PageTable was built"))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda *a: pytest.fail("a host read"))
    fi.append_paged_mla_kv_cache(new_ckv, new_kpe, rows, positions, ckv, kpe, indices, indptr, last)
    assert calls == [{"check_indices": False}]
    assert torch.equal(ckv[1, 2], new_ckv[0]) and torch.equal(kpe[1, 2], new_kpe[0])
    assert torch.equal(ckv[5, 15], new_ckv[1]) and torch.equal(kpe[5, 15], new_kpe[1])
    assert int((ckv != 0).any(-1).sum()) == 2 and int((kpe != 0).any(-1).sum()) == 2  # the padding wrote nothing


def test_flashinfer_compat_mla_append_names_mismatched_latent_pages() -> None:
    import kernel_switchboard.flashinfer as fi

    ckv = torch.zeros(6, 16, 32)
    indptr, indices = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([4, 1], dtype=torch.int32)
    last, rows, positions = (torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                             torch.tensor([18], dtype=torch.int32))
    for kpe in (torch.zeros(6, 16, 8, dtype=torch.float16), torch.zeros(5, 16, 8)):
        with pytest.raises(InvalidArgumentError, match="kpe_cache"):
            fi.append_paged_mla_kv_cache(torch.randn(1, 32), torch.randn(1, 8), rows, positions, ckv, kpe, indices,
                                         indptr, last)
