"""The engine's Llama-family model against Hugging Face transformers (float32, CPU, reference kernels)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine_hf_check import TOL, decode_steps_match, hf_logits, prefill_matches  # noqa: E402
from engine_hf_check import prompts as _prompts  # noqa: E402

from kernel_switchboard_engine.cache import BlockTables, build_batch  # noqa: E402
from kernel_switchboard_engine.llama import LlamaModel  # noqa: E402
from kernel_switchboard_engine.tiny import tiny_model  # noqa: E402
from kernel_switchboard_engine.weights import llama_from_hf  # noqa: E402


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return tiny_model("llama", seed=1)


@pytest.fixture(scope="module")
def model(hf: torch.nn.Module) -> LlamaModel:
    return LlamaModel(llama_from_hf(hf))




def test_llama3_rope_scaling_is_exercised(hf: torch.nn.Module) -> None:
    inv = hf.model.rotary_emb.inv_freq
    plain = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    assert not torch.allclose(inv, plain), "the test config must make Llama-3.1 scaling change some frequencies"


@torch.no_grad()
def test_prefill_then_decode_logits_match(hf: torch.nn.Module, model: LlamaModel) -> None:
    seqs = _prompts((5, 11, 1, 8), seed=2)
    tables, cache = prefill_matches(hf, model, seqs)
    decode_steps_match(hf, model, tables, cache, seqs, steps=6)


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
