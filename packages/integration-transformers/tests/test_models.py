"""attn_implementation="ksb" against "eager" on six model families: logits within float32 tolerance and identical
greedy generations, for plain and left-padded batches, with sliding windows and soft-caps in force."""

from __future__ import annotations

import pytest
import torch
from models import FAMILIES, WINDOW, build, left_padded, prompts

RTOL = 1e-4  # of the largest logit: float32 attention in another order of summation


def _logits(model, impl: str, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= RTOL * scale, f"max |ksb - eager| = {err:.3e} > {RTOL:.0e} * {scale:.3e}"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    return build(request.param)


def test_logits_match_eager(model):
    ids = prompts(2, 3 * WINDOW)
    _assert_close(_logits(model, "ksb", ids, None), _logits(model, "eager", ids, None))


def test_left_padded_logits_match_eager(model):
    ids, mask = left_padded(prompts(3, 3 * WINDOW), [0, 5, 11])
    got, want = _logits(model, "ksb", ids, mask), _logits(model, "eager", ids, mask)
    keep = mask.bool()  # padding positions' logits are meaningless under either implementation
    _assert_close(got[keep], want[keep])


def test_greedy_generation_matches_eager(model):
    ids, mask = left_padded(prompts(3, 2 * WINDOW + 3, seed=2), [0, 4, 9])
    out = {}
    for impl in ("eager", "ksb"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            out[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False,
                                       pad_token_id=0, eos_token_id=None)
    assert torch.equal(out["ksb"], out["eager"])


def test_features_are_in_force():
    """The tests above would prove little if the window or the soft-cap changed nothing: both move eager's logits."""
    ids = prompts(1, 3 * WINDOW)
    mistral = build("mistral")
    wide = build("mistral", sliding_window=None)
    assert (_logits(mistral, "eager", ids, None) - _logits(wide, "eager", ids, None)).abs().max() > 1e-2
    gemma = build("gemma2")
    uncapped = build("gemma2", attn_logit_softcapping=None)
    assert (_logits(gemma, "eager", ids, None) - _logits(uncapped, "eager", ids, None)).abs().max() > 1e-2
