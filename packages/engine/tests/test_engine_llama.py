"""The engine's Llama-family model against Hugging Face transformers (float32, CPU, reference kernels)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kernel_switchboard_engine.cache import BlockTables, build_batch  # noqa: E402
from kernel_switchboard_engine.llama import LlamaModel  # noqa: E402
from kernel_switchboard_engine.tiny import tiny_model  # noqa: E402
from kernel_switchboard_engine.weights import llama_from_hf  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="module")
def model(hf: torch.nn.Module) -> LlamaModel:
    return LlamaModel(llama_from_hf(hf))


@torch.no_grad()
def hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), vocab) logits of transformers' eager forward over the whole sequence."""
    return hf(torch.tensor([tokens])).logits[0]


def _prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]


def test_llama3_rope_scaling_is_exercised(hf: torch.nn.Module) -> None:
    inv = hf.model.rotary_emb.inv_freq
    plain = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    assert not torch.allclose(inv, plain), "the test config must make Llama-3.1 scaling change some frequencies"


@torch.no_grad()
def test_prefill_then_decode_logits_match(hf: torch.nn.Module, model: LlamaModel) -> None:
    prompts = _prompts((5, 11, 1, 8), seed=2)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    rids = list(range(len(prompts)))
    for r, p in zip(rids, prompts):
        tables.extend(r, len(p))
    logits = model.forward(build_batch(tables, rids, prompts, ["all"] * len(rids)), cache)
    off = 0
    for p in prompts:
        torch.testing.assert_close(logits[off: off + len(p)], hf_logits(hf, p), **TOL)
        off += len(p)
    seqs = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        new = torch.randint(0, 128, (len(rids),), generator=g).tolist()
        for r in rids:
            tables.extend(r, 1)
        batch = build_batch(tables, rids, [[t] for t in new], ["last"] * len(rids))
        assert batch.is_decode
        step = model.forward(batch, cache)
        for r in rids:
            seqs[r].append(new[r])
            torch.testing.assert_close(step[r], hf_logits(hf, seqs[r])[-1], **TOL)


@torch.no_grad()
def test_mixed_prefill_and_decode_step(hf: torch.nn.Module, model: LlamaModel) -> None:
    """One step holding a decode token, a whole prompt and a prompt chunk: one qo_indptr, attention.prefill."""
    a, b, c = _prompts((6, 7, 9), seed=4)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    tables.extend("a", 6)
    tables.extend("c", 5)
    model.forward(build_batch(tables, ["a", "c"], [a, c[:5]], ["last", "none"]), cache)
    tables.extend("a", 1)
    tables.extend("b", 7)
    tables.extend("c", 4)
    batch = build_batch(tables, ["a", "b", "c"], [[3], b, c[5:]], ["last", "all", "all"])
    assert not batch.is_decode and batch.qo_lens == [1, 7, 4]
    out = model.forward(batch, cache)
    torch.testing.assert_close(out[0], hf_logits(hf, [*a, 3])[-1], **TOL)
    torch.testing.assert_close(out[1:8], hf_logits(hf, b), **TOL)
    torch.testing.assert_close(out[8:], hf_logits(hf, c)[5:], **TOL)


@torch.no_grad()
def test_shared_prefix_pages(hf: torch.nn.Module, model: LlamaModel) -> None:
    """Two requests share the full pages of a common prefix; the second prefills only its own suffix."""
    prefix, tail_a, tail_b = _prompts((10, 3, 5), seed=5)
    tables = BlockTables(num_pages=16, page_size=4)
    cache = model.new_cache(16, 4)
    tables.extend("a", 13)
    model.forward(build_batch(tables, ["a"], [prefix + tail_a], ["last"]), cache)
    shared = tables.fork("a", "b", len(prefix))
    assert shared == 8 and tables.pages("b") == tables.pages("a")[:2]
    assert all(tables.allocator.refcount(p) == 2 for p in tables.pages("b"))
    seq_b = prefix + tail_b
    tables.extend("b", len(seq_b) - shared)
    tables.extend("a", 1)
    batch = build_batch(tables, ["a", "b"], [[7], seq_b[shared:]], ["last", "all"])
    out = model.forward(batch, cache)
    torch.testing.assert_close(out[0], hf_logits(hf, [*prefix, *tail_a, 7])[-1], **TOL)
    torch.testing.assert_close(out[1:], hf_logits(hf, seq_b)[shared:], **TOL)
    free_before, own_pages = tables.allocator.num_free, len(tables.pages("a")) - 2
    tables.free("a")
    assert tables.allocator.num_free == free_before + own_pages  # the shared pages stay with b
    tables.free("b")
    assert tables.allocator.num_free == 16
