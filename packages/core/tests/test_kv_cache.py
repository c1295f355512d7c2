"""kv_cache.append / append_mla against a Python loop, bad inputs, torch.compile, opcheck, conformance."""

from __future__ import annotations

from typing import cast

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.capability import bucket
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.kv_cache import append_case, append_mla_case

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("kv_cache.append", "kv_cache.append_mla"))

F16, BF16, F32, E4M3 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn


def _loop_append(k: torch.Tensor, v: torch.Tensor, cache: ksb.PagedKVCache, table: ksb.PageTable,
                 positions: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The expected pages after the append, written one token at a time."""
    k_pages, v_pages = cache.k_pages.clone(), cache.v_pages.clone()
    ps = cache.page_size
    for t in range(k.shape[0]):
        b = t if rows is None else int(rows[t])
        pos = int(positions[t])
        page, slot = int(table.block_table[b, pos // ps]), pos % ps
        for src, dst, scale in ((k, k_pages, cache.k_scale), (v, v_pages, cache.v_scale)):
            val = src[t].float() / scale if scale is not None else src[t]
            if cache.layout == "NHD":
                dst[page, slot] = val.to(dst.dtype)
            else:
                dst[page, :, slot] = val.to(dst.dtype)
    return k_pages, v_pages


@pytest.mark.parametrize(("dtype", "layout", "ps", "lens", "new", "kv_dtype"), [
    (F32, "NHD", 4, (1, 9, 13), None, None),
    (F16, "HND", 4, (5, 9), (5, 2), None),
    (BF16, "NHD", 1, (3, 7, 2), (1, 7, 2), None),
    (F32, "HND", 16, (12, 30), (3, 1), E4M3),
    (F16, "NHD", 4, (6, 2), None, E4M3),
])
def test_append_matches_a_python_loop(dtype: torch.dtype, layout: str, ps: int, lens: tuple[int, ...],
                                      new: tuple[int, ...] | None, kv_dtype: torch.dtype | None) -> None:
    case = append_case(dtype, layout, ps, 2, 16, lens, new, "cpu", kv_dtype, seed=3)
    k, v, cache, table, positions, *rest = case.args
    rows = rest[0] if rest else None
    want_k, want_v = _loop_append(k, v, cache, table, positions, rows)
    ksb.kv_cache.append(k, v, cache, table, positions, rows)
    assert torch.equal(cache.k_pages.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(cache.v_pages.view(torch.uint8), want_v.view(torch.uint8))


def test_fp8_append_saturates_instead_of_overflowing() -> None:
    case = append_case(F32, "NHD", 4, 2, 16, (3, 5), None, "cpu", E4M3)
    k, v, cache, table, positions = case.args
    k.fill_(1e6)
    v.fill_(-1e6)
    ksb.kv_cache.append(k, v, cache, table, positions)
    written = cache.k_pages[int(table.block_table[0, 0]), 2].float()
    assert torch.all(written == 448.0)
    assert torch.all(cache.v_pages[int(table.block_table[0, 0]), 2].float() == -448.0)


def test_append_then_decode_sees_the_new_token() -> None:
    case = append_case(F32, "HND", 4, 2, 16, (6, 11), None, "cpu")
    k, v, cache, table, positions = case.args
    ksb.kv_cache.append(k, v, cache, table, positions)
    q = torch.randn(2, 4, 16)
    out = ksb.attention.decode(q, cache, table, window_left=0)  # attends only the last (appended) token
    torch.testing.assert_close(out, v.repeat_interleave(2, dim=1), atol=1e-6, rtol=1e-6)


def test_batch_indices_positions() -> None:
    qo = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32)
    seq_lens = torch.tensor([3, 7, 10, 5], dtype=torch.int32)
    rows, positions = ksb.kv_cache.batch_indices_positions(qo, seq_lens, 9)
    assert rows.tolist() == [0, 0, 0, 2, 3, 3, 3, 3, 3]
    assert positions.tolist() == [0, 1, 2, 9, 0, 1, 2, 3, 4]
    assert rows.dtype == positions.dtype == torch.int32


def test_append_mla_matches_a_python_loop() -> None:
    case = append_mla_case(BF16, 4, (5, 9), (5, 2), "cpu", dc=32, dr=8, seed=1)
    ckv, kpe, ckv_pages, kpe_pages, table, positions, rows = case.args
    want_c, want_k = ckv_pages.clone(), kpe_pages.clone()
    for t in range(ckv.shape[0]):
        pos = int(positions[t])
        page = int(table.block_table[int(rows[t]), pos // 4])
        want_c[page, pos % 4] = ckv[t]
        want_k[page, pos % 4] = kpe[t]
    ksb.kv_cache.append_mla(ckv, kpe, ckv_pages, kpe_pages, table, positions, rows)
    assert torch.equal(ckv_pages, want_c) and torch.equal(kpe_pages, want_k)


def test_append_bad_inputs_name_the_argument() -> None:
    k, v, cache, table, positions, rows = append_case(F32, "NHD", 4, 2, 16, (5, 9), (5, 2), "cpu").args
    out_of_range = positions.clone()
    out_of_range[3] = table.max_pages * cache.page_size
    bad_row = rows.clone()
    bad_row[0] = 2
    bad_table = ksb.PageTable(torch.full_like(table.block_table, cache.num_pages), table.seq_lens)
    bad = {
        r"k\.shape": lambda: ksb.kv_cache.append(k[:, :1], v, cache, table, positions, rows),
        r"k\.dtype": lambda: ksb.kv_cache.append(k.half(), v.half(), cache, table, positions, rows),
        r"v=": lambda: ksb.kv_cache.append(k, v[:3], cache, table, positions, rows),
        r"positions\.dtype": lambda: ksb.kv_cache.append(k, v, cache, table, positions.long(), rows),
        r"positions\.shape": lambda: ksb.kv_cache.append(k, v, cache, table, positions[:2], rows),
        r"positions=.*at token 3": lambda: ksb.kv_cache.append(k, v, cache, table, out_of_range, rows),
        r"batch_indices=None": lambda: ksb.kv_cache.append(k, v, cache, table, positions),
        r"batch_indices=.*at token 0": lambda: ksb.kv_cache.append(k, v, cache, table, positions, bad_row),
        r"table\.block_table=.*page index": lambda: ksb.kv_cache.append(k, v, cache, bad_table, positions, rows),
        r"cache=": lambda: ksb.kv_cache.append(k, v, table, table, positions, rows),
        r"k\.stride": lambda: ksb.kv_cache.append(torch.randn(7, 16, 2).transpose(1, 2), v, cache, table, positions,
                                                  rows),
    }
    before = cache.k_pages.clone()
    for pattern, call in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()
    assert torch.equal(cache.k_pages, before), "a rejected append must not write"


def test_append_mla_bad_inputs_name_the_argument() -> None:
    ckv, kpe, ckv_pages, kpe_pages, table, positions = append_mla_case(F16, 4, (3, 9), None, "cpu", dc=32, dr=8).args
    with pytest.raises(ksb.InvalidArgumentError, match=r"ckv\.dtype"):
        ksb.kv_cache.append_mla(ckv.float(), kpe, ckv_pages, kpe_pages, table, positions)
    with pytest.raises(ksb.InvalidArgumentError, match=r"kpe\.shape"):
        ksb.kv_cache.append_mla(ckv, kpe[:, :4], ckv_pages, kpe_pages, table, positions)
    with pytest.raises(ksb.InvalidArgumentError, match=r"kpe_pages="):
        ksb.kv_cache.append_mla(ckv, kpe, ckv_pages, kpe_pages[:2], table, positions)
    with pytest.raises(ksb.InvalidArgumentError, match=r"positions="):
        ksb.kv_cache.append_mla(ckv, kpe, ckv_pages, kpe_pages, table, positions + 100)


def test_torch_compile_fullgraph_appends_then_decodes() -> None:
    k, v, cache, table, positions = append_case(F32, "HND", 4, 2, 16, (6, 11), None, "cpu").args
    eager_cache = ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "HND")
    q = torch.randn(2, 4, 16)

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: ksb.PagedKVCache) -> torch.Tensor:
        ksb.kv_cache.append(k, v, c, table, positions)
        return cast(torch.Tensor, ksb.attention.decode(q, c, table))

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, cache)
    want = step(q, k, v, eager_cache)
    torch.testing.assert_close(got, want)
    assert torch.equal(cache.k_pages, eager_cache.k_pages) and torch.equal(cache.v_pages, eager_cache.v_pages)


def test_opcheck_kv_cache_ops() -> None:
    k, v, cache, table, positions, rows = append_case(F32, "NHD", 4, 2, 16, (5, 9), (5, 2), "cpu").args
    torch.library.opcheck(torch.ops.ksb.kv_cache_append.default,
                          (k, v, cache.k_pages, cache.v_pages, "NHD", None, None, None, None, table.block_table,
                           table.seq_lens, None, positions, rows, True, None))
    ckv, kpe, ckv_pages, kpe_pages, mtable, mpos = append_mla_case(F16, 4, (3, 9), None, "cpu", dc=32, dr=8).args
    torch.library.opcheck(torch.ops.ksb.kv_cache_append_mla.default,
                          (ckv, kpe, ckv_pages, kpe_pages, mtable.block_table, mtable.seq_lens, None, mpos, None, True,
                           None))


@pytest.mark.gpu
def test_reference_append_on_gpu_matches_cpu() -> None:
    cpu = append_case(BF16, "HND", 16, 8, 128, (100, 1, 37), (30, 1, 5), "cpu", E4M3, seed=2)
    gpu = append_case(BF16, "HND", 16, 8, 128, (100, 1, 37), (30, 1, 5), "cuda", E4M3, seed=2)
    a = cpu.outputs(*cpu.run("reference"))  # type: ignore[misc]
    b = gpu.outputs(*gpu.run("reference"))  # type: ignore[misc]
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.uint8), y.cpu().view(torch.uint8))


@pytest.mark.parametrize(("op", "shape"), [
    ("kv_cache.append", dict(batch=3, kv_len=20, kv_heads=2, head_dim=32, page_size=4, dtype="fp16", layout="HND")),
    ("kv_cache.append", dict(batch=2, kv_len=9, q_len=4, num_kv_heads=1, head_dim=16, kv_dtype="fp8", dtype="bf16")),
    ("kv_cache.append_mla", dict(batch=2, kv_len=9, q_len=3, head_dim=32, head_dim_pe=8, page_size=4)),
])
def test_example_builds_a_runnable_case(op: str, shape: dict[str, object]) -> None:
    from kernel_switchboard.testing.cases.kv_cache import example

    case = example(op, "cpu", **shape)
    assert ksb.explain(op, *case.args, **case.kwargs).problem.tokens == bucket(
        int(shape["batch"]) * int(shape.get("q_len", 1)))  # type: ignore[call-overload]
    case.compare("reference")
