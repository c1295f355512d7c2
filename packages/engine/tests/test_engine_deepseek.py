"""The engine's DeepSeek-V3-family model (MLA absorbed decode, grouped top-k MoE) against transformers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine_hf_check import TOL, decode_steps_match, hf_logits, prefill_matches  # noqa: E402
from engine_hf_check import prompts as _prompts  # noqa: E402

from kernel_switchboard_engine.cache import BlockTables, build_batch  # noqa: E402
from kernel_switchboard_engine.deepseek import DeepseekModel  # noqa: E402
from kernel_switchboard_engine.tiny import tiny_model  # noqa: E402
from kernel_switchboard_engine.weights import deepseek_from_hf  # noqa: E402

VARIANTS = {
    "q_lora+interleaved": {},
    "no_q_lora+neox_rope": dict(q_lora_rank=None, rope_interleave=False),
    "all_moe+2_shared+unnormalised": dict(first_k_dense_replace=0, n_shared_experts=2, norm_topk_prob=False,
                                          routed_scaling_factor=1.5, n_routed_experts=16, n_group=8, topk_group=3,
                                          num_experts_per_tok=3),
    # YaRN whose attention factor scales cos/sin (0.1 ln 40 + 1 over 0.05 ln 40 + 1), and plain rope
    "yarn_cos_sin_factor": dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5}),
    "plain_rope": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=512),
}


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def hf(request: pytest.FixtureRequest) -> torch.nn.Module:
    return tiny_model("deepseek", seed=1, **VARIANTS[request.param])




@torch.no_grad()
def test_grouped_routing_and_bias_matter(hf: torch.nn.Module) -> None:
    """The test model's routing depends on the groups and the correction bias (so matching it means something)."""
    gate = hf.model.layers[-1].mlp.gate
    x = torch.randn(64, hf.config.hidden_size)
    _, _, grouped = gate(x)
    scores = torch.sigmoid(x @ gate.weight.t())
    plain = torch.topk(scores, gate.top_k, dim=-1)[1]
    biased = torch.topk(scores + gate.e_score_correction_bias, gate.top_k, dim=-1)[1]
    sets = [set(r) for r in grouped.tolist()]
    assert any(s != set(r) for s, r in zip(sets, biased.tolist())), "group restriction never changes the choice"
    assert any(set(a) != set(b) for a, b in zip(plain.tolist(), biased.tolist())), "bias never changes the choice"


@torch.no_grad()
def test_prefill_and_absorbed_decode_logits_match(hf: torch.nn.Module) -> None:
    model = DeepseekModel(deepseek_from_hf(hf))
    seqs = _prompts((6, 10, 1), seed=2)
    tables, cache = prefill_matches(hf, model, seqs)
    decode_steps_match(hf, model, tables, cache, seqs, steps=5)


@torch.no_grad()
def test_mixed_step_and_shared_prefix(hf: torch.nn.Module) -> None:
    """Absorbed decode rows and non-absorbed prefill rows in one step; a prefix shared through pages."""
    model = DeepseekModel(deepseek_from_hf(hf))
    prefix, tail_a, tail_b = _prompts((9, 3, 4), seed=4)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    seq_a = prefix + tail_a
    tables.extend("a", len(seq_a))
    model.forward(build_batch(tables, ["a"], [seq_a], ["last"]), cache)
    shared = tables.fork("a", "b", len(prefix))
    assert shared == 8
    seq_b = prefix + tail_b
    tables.extend("b", len(seq_b) - shared)
    tables.extend("a", 1)
    batch = build_batch(tables, ["a", "b"], [[5], seq_b[shared:]], ["last", "all"])
    out = model.forward(batch, cache)
    torch.testing.assert_close(out[0], hf_logits(hf, [*seq_a, 5])[-1], **TOL)
    torch.testing.assert_close(out[1:], hf_logits(hf, seq_b)[shared:], **TOL)


@torch.no_grad()
def test_few_new_tokens_after_a_history_take_the_absorbed_path(hf: torch.nn.Module) -> None:
    """Speculative verification rows (three new tokens after a history) run absorbed, as (B, T, H, R) MLA decode,
    beside a one-token decode row and a fresh prefill in the same step; every logit as transformers'."""
    from kernel_switchboard_engine.deepseek import _plan_rows

    model = DeepseekModel(deepseek_from_hf(hf))
    hist_a, hist_b, fresh = _prompts((7, 5, 6), seed=8)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    for rid, seq in (("a", hist_a), ("b", hist_b)):
        tables.extend(rid, len(seq))
        model.forward(build_batch(tables, [rid], [seq], ["last"]), cache)
    new_a, new_b = [3, 9, 27], [4]
    tables.extend("a", 3)
    tables.extend("b", 1)
    tables.extend("c", len(fresh))
    batch = build_batch(tables, ["a", "b", "c"], [new_a, new_b, fresh], ["all", "last", "all"])
    groups, prefill = _plan_rows(batch, 4)
    assert sorted(g.tokens for g in groups) == [1, 3] and prefill is not None
    out = model.forward(batch, cache)
    torch.testing.assert_close(out[:3], hf_logits(hf, hist_a + new_a)[-3:], **TOL)
    torch.testing.assert_close(out[3], hf_logits(hf, hist_b + new_b)[-1], **TOL)
    torch.testing.assert_close(out[4:], hf_logits(hf, fresh), **TOL)


def test_presets_are_the_specs_of_their_transformers_configs() -> None:
    from kernel_switchboard_engine.families import deepseek_spec
    from kernel_switchboard_engine.families import dense_spec as llama_spec
    from kernel_switchboard_engine.synthetic import DEEPSEEK_PRESETS, LLAMA_PRESETS
    from kernel_switchboard_engine.tiny import hf_overrides

    for family, presets, to_spec in (("llama", LLAMA_PRESETS, llama_spec), ("deepseek", DEEPSEEK_PRESETS, deepseek_spec)):
        for spec in presets.values():
            assert to_spec(tiny_model(family, **hf_overrides(spec)).config) == spec


@torch.no_grad()
def test_synthetic_weights_absorbed_decode_equals_expanded_prefill() -> None:
    """Random weights without transformers: the absorbed decode path and the non-absorbed prefill path agree."""
    from kernel_switchboard_engine.synthetic import DEEPSEEK_PRESETS, random_deepseek

    model = DeepseekModel(random_deepseek(DEEPSEEK_PRESETS["tiny"], seed=3))
    (seq,) = _prompts((12,), seed=7)
    tables = BlockTables(num_pages=16, page_size=4)
    cache = model.new_cache(16, 4)
    tables.extend("full", len(seq))
    full = model.forward(build_batch(tables, ["full"], [seq], ["all"]), cache)
    tables.extend("step", 6)
    model.forward(build_batch(tables, ["step"], [seq[:6]], ["last"]), cache)
    for i in range(6, len(seq)):
        tables.extend("step", 1)
        batch = build_batch(tables, ["step"], [[seq[i]]], ["last"])
        assert batch.is_decode
        torch.testing.assert_close(model.forward(batch, cache)[0], full[i], **TOL)
