"""Which switchboard op serves which mask, masks outside the length-based pattern, and what "ksb" refuses."""

from __future__ import annotations

import pytest
import torch
from kernel_switchboard_transformers._layout import layout_of
from models import WINDOW, build, left_padded, prompts

import kernel_switchboard as ksb
from kernel_switchboard.errors import InvalidArgumentError

RTOL = 1e-4


@pytest.fixture
def ops(monkeypatch):
    """Counts calls of the attention ops the adapter uses (they still run)."""
    counts = dict.fromkeys(("decode", "prefill", "prefill_ragged", "dense"), 0)
    for name in counts:
        real = getattr(ksb.attention, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(ksb.attention, name, counted)
    return counts


def _run(model, impl, ids, mask=None, **kwargs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kwargs).logits


def _close(got, want):
    assert (got - want).abs().max().item() <= RTOL * want.abs().max().item()


def test_ops_by_batch_shape(ops):
    """No padding: the keys are read in place (prefill, then decode); left padding: gathered into prefill_ragged."""
    model = build("llama")
    model.set_attn_implementation("ksb")
    with torch.no_grad():
        model.generate(prompts(2, 10), max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert ops["prefill"] == 2 and ops["decode"] == 2 * 2 and ops["prefill_ragged"] == ops["dense"] == 0
    ids, mask = left_padded(prompts(2, 10), [0, 3])
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert ops["prefill_ragged"] == 2 * 3 and ops["dense"] == 0


def test_static_cache_matches_eager(ops):
    """A static cache hands every layer its whole buffer; the unwritten slots are masked, the keys still read in place."""
    model = build("mistral")
    ids = prompts(2, 2 * WINDOW)
    out = {}
    for impl in ("eager", "ksb"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            out[impl] = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static",
                                       pad_token_id=0, eos_token_id=None)
    assert torch.equal(out["ksb"], out["eager"])
    assert ops["prefill_ragged"] == ops["dense"] == 0 and ops["decode"] > 0


def _prefix_lm_mask(batch: int, length: int, prefix: int) -> torch.Tensor:
    """Float (B, 1, L, L): the first ``prefix`` tokens see each other both ways, the rest are causal."""
    keep = torch.ones(length, length).tril().bool()
    keep[:prefix, :prefix] = True
    bias = torch.zeros(length, length).masked_fill(~keep, torch.finfo(torch.float32).min)
    return bias.expand(batch, 1, length, length)


def test_other_masks_run_dense_and_match_eager(ops):
    model = build("llama")
    ids = prompts(2, 12)
    mask = _prefix_lm_mask(2, 12, 5)
    _close(_run(model, "ksb", ids, mask), _run(model, "eager", ids, mask))
    assert ops["dense"] == 2
    bias = torch.randn(2, 1, 12, 12, generator=torch.Generator().manual_seed(0))  # an additive bias, not a mask
    _close(_run(model, "ksb", ids, bias), _run(model, "eager", ids, bias))
    assert ops["dense"] == 4


def test_soft_cap_with_other_mask_is_refused():
    model = build("gemma2")
    with pytest.raises(InvalidArgumentError, match=r"attention_mask.*softcap"):
        _run(model, "ksb", prompts(1, 12), _prefix_lm_mask(1, 12, 5))


def test_output_attentions_is_refused():
    with pytest.raises(InvalidArgumentError, match="output_attentions"):
        _run(build("llama"), "ksb", prompts(1, 6), output_attentions=True)


def test_dropout_is_refused():
    model = build("llama", attention_dropout=0.1).train()
    with pytest.raises(InvalidArgumentError, match="dropout"):
        _run(model, "ksb", prompts(1, 6))


def test_missing_mask_with_ambiguous_alignment_is_refused():
    from kernel_switchboard_transformers import attention_forward

    module = build("llama").model.layers[0].self_attn
    q, kv = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 5, 16)
    with pytest.raises(InvalidArgumentError, match="attention_mask"):
        attention_forward(module, q, kv, kv, None)


def test_layout_of_padding():
    causal = torch.ones(6, 6).tril().bool()
    right = causal.clone().expand(2, 1, 6, 6).clone()
    right[1, :, :, 4:] = False  # request 1: 4 tokens, then 2 pad slots
    right[1, :, 4:, :] = False
    got = layout_of(right, 2, True, None)
    assert got is not None and got.kv_prefix and got.q_lens == (6, 4) and got.kv_lens == (6, 4)
    left = causal.clone().expand(2, 1, 6, 6).clone()
    left[1, :, :, :2] = False
    left[1, :, :2, :] = False
    got = layout_of(left, 2, True, None)
    assert got is not None and not got.kv_prefix and got.q_lens == (6, 4)
    window = causal & ~torch.ones(6, 6).tril(-3).bool()  # 3 tokens: itself and 2 before
    assert layout_of(window.expand(1, 1, 6, 6), 1, True, 2) is not None
    assert layout_of(window.expand(1, 1, 6, 6), 1, True, None) is None


def test_right_padded_logits_match_eager(ops):
    """Right padding: the padding queries still see the real tokens before them (sdpa's mask says so), which the
    length-based kernels cannot express; attention.dense applies the mask as it is."""
    model = build("qwen2")
    ids = prompts(2, 2 * WINDOW)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    keep = mask.bool()
    _close(_run(model, "ksb", ids, mask)[keep], _run(model, "eager", ids, mask)[keep])
    assert ops["dense"] == 2 and ops["prefill"] == ops["prefill_ragged"] == 0


@pytest.mark.parametrize("kv_len", [37, 38, 300])
def test_keys_read_in_place_as_one_slot_pages(kv_len):
    """A dense (B, Hkv, Lk, D) cache is read as pages of one token, so the page size (a compile-time constant of
    the Triton kernels) stays 1 while Lk grows every decode step; the result equals attention over the dense keys."""
    from kernel_switchboard_transformers._layout import uniform_layout
    from kernel_switchboard_transformers.attention import _in_place_cache, run_layout

    g = torch.Generator().manual_seed(kv_len)
    b, hq, hkv, d = 3, 4, 2, 16
    key, value = torch.randn(b, hkv, kv_len, d, generator=g), torch.randn(b, hkv, kv_len, d, generator=g)
    query = torch.randn(b, hq, 1, d, generator=g)
    layout = uniform_layout(b, 1, kv_len, query.device)
    cache, table = _in_place_cache(key, value, layout)
    assert cache.page_size == 1 and table.block_table.shape[1] % 256 == 0
    got = run_layout(query, key, value, layout, causal=True, scaling=None, softcap=None, window_left=None)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
