"""Continuous batching and speculative decoding against transformers' generate (greedy) and statistics."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from kernel_switchboard_engine import tiny  # noqa: E402
from kernel_switchboard_engine.families import from_hf  # noqa: E402
from kernel_switchboard_engine.sampling import SamplingParams  # noqa: E402
from kernel_switchboard_engine.scheduler import Engine  # noqa: E402
from kernel_switchboard_engine.speculative import SpeculativeDecoder  # noqa: E402
from kernel_switchboard_engine.tiny import tiny_model  # noqa: E402
from kernel_switchboard_engine.weights import truncate_layers  # noqa: E402

STEPS = 32


def _build(family: str, **overrides: object) -> tuple[torch.nn.Module, object]:
    hf = tiny_model(family, seed=1, **overrides)
    return hf, from_hf(hf)


def hf_greedy(hf: torch.nn.Module, prompt: list[int], steps: int = STEPS) -> list[int]:
    return tiny.hf_greedy(hf, prompt, steps)


def _prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("family", ["llama", "deepseek", "gemma2", "mixtral"])
def test_continuous_batching_greedy_equals_generate(family: str) -> None:
    hf, model = _build(family)
    base = _prompts((5, 21, 3, 9, 12))
    prompts = [*base, [*base[1][:14], 7, 8]]  # the last one shares a 12-token (3-page) prefix with the second
    # 30 usable pages of 4 tokens and a 16-token step budget: chunked prefill, mixed steps and preemption
    eng = Engine(model, num_pages=31, page_size=4, max_step_tokens=16, max_running=4)
    params = SamplingParams(max_new_tokens=STEPS)
    rids = [eng.add(p, params) for p in prompts[:2]]
    eng.step()
    eng.step()
    rids += [eng.add(p, params) for p in prompts[2:]]
    while eng.has_work():
        eng.step()
    for rid, prompt in zip(rids, prompts):
        assert eng.finished[rid].output == hf_greedy(hf, prompt), f"request {rid}"
    hist = eng.history
    assert any(r.mixed for r in hist), "no step mixed prefill and decode requests"
    assert any(r.prefill_tokens == 16 for r in hist), "no prefill was chunked at the step budget"
    assert sum(r.preempted for r in hist) > 0, "the page budget never forced a preemption"
    assert eng.tables.allocator.num_free == 30  # every page back except the reserved scratch page


def test_prefix_pages_are_shared_between_live_requests() -> None:
    hf, model = _build("llama")
    (prefix,) = _prompts((13,), seed=5)
    eng = Engine(model, num_pages=64, page_size=4, max_step_tokens=64)
    params = SamplingParams(max_new_tokens=6)
    a = eng.add([*prefix, 1], params)
    eng.step()
    b = eng.add([*prefix, 2, 3], params)
    report = eng.step()
    assert report.shared_tokens == 12 and report.mixed
    pa, pb = eng.tables.pages(a), eng.tables.pages(b)
    assert pa[:3] == pb[:3] and all(eng.tables.allocator.refcount(p) == 2 for p in pa[:3])
    while eng.has_work():
        eng.step()
    assert eng.finished[a].output == hf_greedy(hf, [*prefix, 1], 6)
    assert eng.finished[b].output == hf_greedy(hf, [*prefix, 2, 3], 6)
    assert eng.tables.allocator.num_free == 63


def test_sampled_generation_is_seeded_and_in_range() -> None:
    _, model = _build("llama")
    prompts = _prompts((4, 7))
    params = [SamplingParams(max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9),
              SamplingParams(max_new_tokens=8)]
    outs = [Engine(model, num_pages=32, page_size=4, generator=torch.Generator().manual_seed(7)).generate(prompts, params)
            for _ in range(2)]
    assert outs[0] == outs[1]
    assert all(0 <= t < 128 for row in outs[0] for t in row) and all(len(row) == 8 for row in outs[0])


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_speculative_greedy_equals_target_greedy(family: str) -> None:
    hf, target = _build(family, num_hidden_layers=3) if family == "llama" else _build(family)
    draft = type(target)(truncate_layers(target.w, 1))
    prompts = _prompts((5, 11, 2), seed=6)
    dec = SpeculativeDecoder(target, draft, num_draft=3, num_pages=64, page_size=4)
    outs = dec.generate(prompts, STEPS)
    for prompt, out in zip(prompts, outs):
        assert out == hf_greedy(hf, prompt)
    assert dec.stats.emitted > 0, "no draft was ever accepted: the greedy acceptance path is untested"
    assert dec.t_tables.allocator.num_free == 64 and dec.d_tables.allocator.num_free == 64


def test_speculative_self_draft_accepts_everything() -> None:
    hf, target = _build("llama")
    dec = SpeculativeDecoder(target, target, num_draft=4, num_pages=32, page_size=4)
    (prompt,) = _prompts((6,), seed=8)
    assert dec.generate([prompt], 10) == [hf_greedy(hf, prompt, 10)]
    assert dec.stats.emitted == dec.stats.proposed


@torch.no_grad()
def test_speculative_sampling_statistics() -> None:
    """With temperature 1, one round of N identical requests: the first token follows the target's
    distribution and the first draft is accepted with probability sum_x min(p(x), q(x))."""
    hf, target = _build("llama")
    hf_draft, draft = _build("llama", num_hidden_layers=1)
    prompt = _prompts((4,), seed=9)[0]
    p = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
    q = torch.softmax(hf_draft(torch.tensor([prompt])).logits[0, -1], -1)
    n = 3000
    dec = SpeculativeDecoder(target, draft, num_draft=1, num_pages=2 * n + 8, page_size=4, temperature=1.0,
                             generator=torch.Generator().manual_seed(11))
    outs = dec.generate([prompt] * n, 1)
    first = torch.tensor([o[0] for o in outs])
    freq = torch.bincount(first, minlength=128).double() / n
    alpha = float(torch.minimum(p, q).sum())
    rate = dec.stats.emitted / n
    assert abs(rate - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n), (rate, alpha)

    def max_z(expected: torch.Tensor) -> float:
        e = expected.double()
        keep = e * n >= 20
        return float(((freq[keep] - e[keep]).abs() / (e[keep] * (1 - e[keep]) / n).sqrt()).max())

    assert max_z(p) < 4.5, "the first token does not follow the target distribution"
    assert max_z(q) > 4.5, "the draft distribution is too close to the target's for this test to have power"
