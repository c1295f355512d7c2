"""Every supported family against transformers' eager forward (float32, CPU, reference kernels).

Each family's tiny config switches its features on at strengths that matter (tiny.py): prompts run past the
8-token windows, q/k and lm_head weights are large enough that the soft-caps bite, Gemma's softmax scale is not
head_dim ** -0.5, DeepSeek-V3 uses its checkpoints' YaRN. ``test_features_bite`` proves it: turning a feature
off in transformers (same weights) moves the logits. Then, per family: prefill logits of a batch of prompts,
chunked-prefill logits (chunks sharing steps with a decoding request), 16 greedy decode steps (logits and
tokens against ``generate``), the plan-less decode step the compiled and CUDA-graph modes run, and one refused
config value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from engine_hf_check import TOL, hf_logits, prefill_matches  # noqa: E402
from engine_hf_check import prompts as _prompts  # noqa: E402

import kernel_switchboard as ksb  # noqa: E402
from kernel_switchboard_engine.cache import BlockTables, build_batch  # noqa: E402
from kernel_switchboard_engine.families import SUPPORTED, from_hf, spec_from_config  # noqa: E402
from kernel_switchboard_engine.graphs import DecodeRunner  # noqa: E402
from kernel_switchboard_engine.tiny import FAMILIES, config, hf_greedy, tiny_model  # noqa: E402

STEPS = 16


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def hf(family: str) -> torch.nn.Module:
    return tiny_model(family, seed=1)


@pytest.fixture(scope="module")
def model(hf: torch.nn.Module) -> Any:
    return from_hf(hf)




# -- the features are on, and they matter -------------------------------------------------------------------
def _variant(family: str, hf: torch.nn.Module, edit: Callable[[torch.nn.Module], None] | None = None,
             **overrides: Any) -> torch.nn.Module:
    """transformers' model of ``family`` with config ``overrides``, ``hf``'s weights, then ``edit``ed."""
    other = tiny_model(family, seed=1, **overrides)
    other.load_state_dict(hf.state_dict(), strict=False)
    if edit is not None:
        with torch.no_grad():
            edit(other)
    return other


def _zero_biases(m: torch.nn.Module) -> None:
    for name, p in m.named_parameters():
        if name.endswith(".bias"):
            p.zero_()


def _no_qk_norm(m: torch.nn.Module) -> None:
    for layer in m.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


_NO_WINDOW = dict(sliding_window=None)
_GEMMA_FULL = dict(layer_types=["full_attention"] * 3)
#: family -> {feature: (config overrides, weight edit)} that switch the feature off
FEATURES: dict[str, dict[str, tuple[dict[str, Any], Callable[[torch.nn.Module], None] | None]]] = {
    "llama": {"llama3 rope scaling": (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), None)},
    "qwen2": {"q/k/v bias": ({}, _zero_biases), "sliding window": (dict(use_sliding_window=False), None)},
    "qwen3": {"q/k norm": ({}, _no_qk_norm),
              "attention bias": ({}, _zero_biases)},
    "mistral": {"sliding window": (_NO_WINDOW, None)},
    "mixtral": {"top-2 routing": (dict(num_experts_per_tok=1), None)},
    "gemma2": {"attention soft-cap": (dict(attn_logit_softcapping=None), None),
               "final soft-cap": (dict(final_logit_softcapping=None), None),
               "sliding window": (_GEMMA_FULL, None),
               "query_pre_attn_scalar": (dict(query_pre_attn_scalar=32), None)},
    "gemma3": {"final soft-cap": (dict(final_logit_softcapping=None), None),
               "sliding window": (_GEMMA_FULL, None),
               "q/k norm": ({}, _no_qk_norm),
               "linear global rope": (dict(rope_parameters={
                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                   "full_attention": {"rope_type": "default", "rope_theta": 1e6}}), None)},
    "deepseek": {"YaRN": (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), None)},
}


@torch.no_grad()
def test_features_bite(family: str, hf: torch.nn.Module) -> None:
    (seq,) = _prompts((30,), seed=11)
    want = hf_logits(hf, seq)
    for feature, (overrides, edit) in FEATURES[family].items():
        moved = float((hf_logits(_variant(family, hf, edit, **overrides), seq) - want).abs().max())
        assert moved > 0.3, f"{family}: switching off {feature} moves the logits by only {moved:.3g}"


# -- the engine against transformers -------------------------------------------------------------------------
@torch.no_grad()
def test_prefill_logits_match(hf: torch.nn.Module, model: Any) -> None:
    prefill_matches(hf, model, _prompts((21, 13, 30, 1), seed=2))


@torch.no_grad()
def test_chunked_prefill_logits_match(hf: torch.nn.Module, model: Any) -> None:
    """A 29-token prompt in chunks of 6 while another request decodes in the same (mixed) steps."""
    long, short = _prompts((29, 5), seed=3)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    tables.extend("short", len(short))
    model.forward(build_batch(tables, ["short"], [short], ["last"]), cache)
    want_long = hf_logits(hf, long)
    seq_short = list(short)
    g = torch.Generator().manual_seed(4)
    for start in range(0, len(long), 6):
        chunk = long[start: start + 6]
        token = int(torch.randint(0, 128, (1,), generator=g))
        tables.extend("short", 1)
        tables.extend("long", len(chunk))
        batch = build_batch(tables, ["short", "long"], [[token], chunk], ["last", "all"])
        out = model.forward(batch, cache)
        seq_short.append(token)
        torch.testing.assert_close(out[0], hf_logits(hf, seq_short)[-1], **TOL)
        torch.testing.assert_close(out[1:], want_long[start: start + len(chunk)], **TOL)


@torch.no_grad()
def test_16_greedy_decode_steps_match(hf: torch.nn.Module, model: Any) -> None:
    prompts = _prompts((12, 7), seed=5)
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    rids = [0, 1]
    for r, p in zip(rids, prompts):
        tables.extend(r, len(p))
    logits = model.forward(build_batch(tables, rids, prompts, ["last", "last"]), cache)
    seqs = [list(p) for p in prompts]
    for step in range(STEPS):
        for r in rids:
            torch.testing.assert_close(logits[r], hf_logits(hf, seqs[r])[-1], **TOL, msg=lambda m, s=step: f"step {s}: {m}")
        new = logits.argmax(dim=-1).tolist()
        for r in rids:
            seqs[r].append(int(new[r]))
            tables.extend(r, 1)
        batch = build_batch(tables, rids, [[t] for t in new], ["last", "last"])
        assert batch.is_decode
        logits = model.forward(batch, cache)
    for r, p in zip(rids, prompts):
        assert seqs[r][len(p):] == hf_greedy(hf, p, STEPS)


@torch.no_grad()
def test_planless_decode_step_matches(hf: torch.nn.Module, model: Any) -> None:
    """``decode_step`` without plans (what torch.compile traces): per-layer attention.decode with the layer's
    window and soft-cap, static-shape page tables with padding rows."""
    prompts = _prompts((11, 4, 17), seed=6)
    tables = BlockTables(32, 4, reserved_pages=1)
    cache = model.new_cache(32, 4)
    rids = [0, 1, 2]
    for r, p in zip(rids, prompts):
        tables.extend(r, len(p))
    model.forward(build_batch(tables, rids, prompts, ["last"] * 3), cache)
    runner = DecodeRunner(model, cache, tables, mode="eager", max_batch=4, width=8)
    seqs = [list(p) for p in prompts]
    for tokens in ([20, 21, 22], [23, 24, 25], [26, 27, 28]):
        for r in rids:
            tables.extend(r, 1)
            seqs[r].append(tokens[r])
        out = runner(rids, tokens)
        for r in rids:
            torch.testing.assert_close(out[r], hf_logits(hf, seqs[r])[-1], **TOL)


# -- what the engine refuses -------------------------------------------------------------------------------
#: family -> (config overrides, the field the error must name, text the error must list)
REFUSED = {
    "llama": (dict(hidden_act="gelu"), "config.hidden_act", "silu, gelu_pytorch_tanh"),
    "qwen2": (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
              "config.rope_parameters.rope_type", "default, llama3, linear, yarn"),
    "qwen3": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
              "config.rope_parameters.partial_rotary_factor", "1.0"),
    "mistral": (dict(quantization_config={"quant_method": "fp8"}), "config.quantization_config", "sliding_window"),
    "mixtral": (dict(hidden_act="gelu_pytorch_tanh"), "config.hidden_act", "silu"),
    "gemma2": (dict(use_bidirectional_attention=True), "config.use_bidirectional_attention", "causal"),
    "gemma3": (dict(attn_logit_softcapping=50.0), "config.attn_logit_softcapping", "applies no attention soft-cap"),
    "deepseek": (dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
                 "config.rope_parameters.rope_type", "default, yarn"),
}


def test_unsupported_value_is_refused_by_name(family: str) -> None:
    overrides, field, listed = REFUSED[family]
    with pytest.raises(ksb.InvalidArgumentError) as err:
        spec_from_config(config(family, **overrides))
    assert field in str(err.value) and listed in str(err.value), str(err.value)


def test_unknown_model_type_lists_the_supported_ones() -> None:
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(ksb.InvalidArgumentError, match=r"config\.model_type.*gpt2.*" + ", ".join(SUPPORTED)):
        spec_from_config(cfg)
    with pytest.raises(ksb.InvalidArgumentError, match=r"gemma3.*Gemma3ForCausalLM"):
        spec_from_config(transformers.Gemma3Config())


def test_a_refused_model_never_loads() -> None:
    hf = tiny_model("qwen2", seed=1)
    hf.config.use_mrope = True  # transformers' Qwen2 ignores it; the engine names it instead
    with pytest.raises(ksb.InvalidArgumentError, match=r"config\.use_mrope"):
        from_hf(hf)


def test_gemma_alternation_makes_one_plan_per_window() -> None:
    spec = spec_from_config(config("gemma2"))
    assert spec.windows == (7, -1, 7) and spec.distinct_windows == (7, -1)
