"""Continuous batching (``generate_batch``) of a "ksb" model.

transformers 5.16-5.17 switch the model to "paged|ksb": its greedy tokens must equal those of transformers' own
"paged|eager" and of plain ``generate`` with "eager", one prompt at a time, with chunked prefill (a prompt longer
than the batch's token budget), mixed prefill/decode steps and, for Gemma 2, a sliding-window layer group. Later
releases refuse custom implementations for continuous batching themselves; the test checks that they still do,
so that this package's README stays true.
"""

from __future__ import annotations

import kernel_switchboard_transformers as kst
import pytest
import torch
import transformers
from models import VOCAB, WINDOW, build
from packaging.version import Version
from transformers import AttentionInterface, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

TAKES_CUSTOM = Version(transformers.__version__) < Version("5.18")
NEW_TOKENS = 12


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 2 * WINDOW + 3, 9, 3 * WINDOW)]


def _batch(model, impl: str) -> list[list[int]]:
    model.set_attn_implementation(impl)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # page size 8; 20 tokens per step, so the longest prompts are prefilled in chunks beside other requests' decodes
    cb = ContinuousBatchingConfig(block_size=8, num_blocks=64, max_batch_tokens=20, max_memory_percent=0.9,
                                  use_cuda_graph=False)
    with torch.no_grad():
        out = model.generate_batch(_prompts(), generation_config=config, continuous_batching_config=cb,
                                   progress_bar=False)
    return [out[f"req_{i}"].generated_tokens for i in range(len(out))]


def _one_by_one(model) -> list[list[int]]:
    model.set_attn_implementation("eager")
    tokens = []
    with torch.no_grad():
        for p in _prompts():
            ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                                 eos_token_id=None)
            tokens.append(ids[0, len(p):].tolist())
    return tokens


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls that reach "paged|ksb" (so a test cannot pass on another implementation)."""
    seen = {"n": 0}

    def counted(*args, **kwargs):
        seen["n"] += 1
        return kst.paged_attention_forward(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, kst.PAGED_NAME, counted)
    return seen


@pytest.mark.skipif(not TAKES_CUSTOM, reason=f"transformers {transformers.__version__} refuses custom "
                    "implementations for continuous batching (test_later_releases_refuse covers it)")
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_generate_batch_matches_eager(family, calls):
    model = build(family, seed=4)
    want = _one_by_one(model)
    assert _batch(model, "paged|eager") == want
    assert _batch(model, kst.NAME) == want
    assert calls["n"] > 0
    assert model.config._attn_implementation == kst.NAME  # restored after the batch


@pytest.mark.skipif(TAKES_CUSTOM, reason=f"transformers {transformers.__version__} takes 'paged|ksb'")
def test_later_releases_refuse():
    model = build("llama")
    with pytest.raises(ValueError, match=kst.NAME):
        _batch(model, kst.NAME)


def test_paged_entry_needs_the_paged_cache():
    module = build("llama").model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 16)
    kv = torch.zeros(1, 2, 3, 16)
    with pytest.raises(ValueError, match="PagedAttentionCache"):
        kst.paged_attention_forward(module, q, kv, kv, None)
