"""The model families the engine serves, read from ``transformers`` configs, and everything else refused.

:func:`from_hf` dispatches on ``config.model_type`` over :data:`SUPPORTED`. Each family's reader takes every
config field that changes the forward pass, checks its value against what the engine implements, and turns
it into a spec (:class:`~.weights.LlamaSpec` or :class:`~.weights.DeepseekSpec`). Every other field of the
config must be one the reader knows to be inert at inference (token ids, training knobs, bookkeeping): an
unknown field (``quantization_config``, a new switch of a later transformers) is refused by name rather than
ignored, so a model the engine would compute differently from transformers never loads.

========================  ===============================================================================
model_type                what the engine reads (beyond shapes, RMSNorm eps and rope)
========================  ===============================================================================
``llama``                 Llama 2/3.x: GQA, rope default / llama3 / linear / yarn, ``attention_bias``
``qwen2``                 Qwen2 / Qwen2.5: q/k/v biases, sliding layers (``use_sliding_window``)
``qwen3``                 Qwen3: per-head q/k RMSNorm, ``attention_bias``, sliding layers
``mistral``               Mistral: ``sliding_window`` on every layer
``mixtral``               Mixtral: softmax top-k MoE (renormalised), ``sliding_window``
``gemma2``                Gemma 2: attention and final logit soft-caps, alternating sliding / global layers,
                          (1 + w) norms before and after attention and MLP, GeGLU (tanh), embedding scale
                          sqrt(hidden), ``query_pre_attn_scalar``
``gemma3_text``           Gemma 3 (text): Gemma 2's layout with per-head q/k norms, a local rope for sliding
                          layers, no attention soft-cap
``deepseek_v3``           DeepSeek-V3: MLA, grouped sigmoid top-k MoE with shared experts, YaRN rope with its
                          mscale on the softmax scale
========================  ===============================================================================
"""

from __future__ import annotations

import math
from typing import Any

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.rope import LinearScaling, Llama3Scaling, YarnScaling

from .weights import DeepseekSpec, LlamaSpec, RopeScaling, RopeSpec

DENSE = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "gemma2", "gemma3_text")
SUPPORTED = (*DENSE, "deepseek_v3")

#: config fields that never change an inference forward pass: bookkeeping, token ids, training-only knobs
INERT = frozenset({
    "_name_or_path", "architectures", "auto_map", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label",
    "label2id", "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states", "problem_type",
    "return_dict", "transformers_version", "tokenizer_class", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "use_cache", "attention_dropout", "tie_word_embeddings", "pretraining_tp",
    "cache_implementation", "max_position_embeddings", "rope_scaling", "rope_theta",
})
#: the fields every reader takes
_COMMON = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                         "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "hidden_act"})
#: family -> the further fields its reader takes or knows to be inert
_FIELDS = {
    "llama": {"attention_bias", "mlp_bias"},
    "qwen2": {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "use_mrope"},
    "qwen3": {"attention_bias", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"},
    "mistral": {"sliding_window"},
    "mixtral": {"sliding_window", "num_local_experts", "num_experts_per_tok", "output_router_logits",
                "router_aux_loss_coef", "router_jitter_noise"},
    "gemma2": {"attention_bias", "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
               "sliding_window", "layer_types", "use_bidirectional_attention", "hidden_activation",
               "sliding_window_size", "_sliding_window_pattern", "sliding_window_pattern"},
    "deepseek_v3": {"attention_bias", "moe_intermediate_size", "n_shared_experts", "n_routed_experts",
                    "routed_scaling_factor", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
                    "qk_nope_head_dim", "qk_head_dim", "n_group", "topk_group", "num_experts_per_tok",
                    "first_k_dense_replace", "norm_topk_prob", "rope_interleave", "output_router_logits",
                    "num_nextn_predict_layers", "scoring_func", "topk_method", "moe_layer_freq", "aux_loss_alpha",
                    "seq_aux", "ep_size"},
}
_FIELDS["gemma3_text"] = _FIELDS["gemma2"]
#: gated activations: transformers' name -> the engine's
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
#: rope types and the keys each may carry
ROPE_KEYS = {
    "default": frozenset(),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "linear": frozenset({"factor"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                       "mscale_all_dim", "attention_factor", "truncate"}),
}
_LAYER_TYPES = ("full_attention", "sliding_attention")


# -- checks ------------------------------------------------------------------------------------------------
def _family(cfg: Any) -> str:
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED:
        hint = " (multimodal: load its language model, Gemma3ForCausalLM / gemma3_text)" if model_type == "gemma3" else ""
        raise fail("config.model_type", model_type, f"one of {', '.join(SUPPORTED)}{hint}")
    return str(model_type)


def _require(cfg: Any, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise fail(f"config.{name}", getattr(cfg, name, None), allowed)


def _check_fields(cfg: Any, family: str) -> None:
    """Refuse any config field this family's reader neither takes nor knows to be inert."""
    known = INERT | _COMMON | _FIELDS[family]
    unknown = sorted(k for k in cfg.to_dict() if k not in known)
    if unknown:
        raise fail(f"config.{unknown[0]}", getattr(cfg, unknown[0], None),
                   f"no such field: the engine's {family} reader does not know what it changes "
                   f"(it reads or knows: {', '.join(sorted(known - INERT))})")


def _rope_params(cfg: Any) -> dict[str, Any]:
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    out = {"rope_type": "default", "rope_theta": getattr(cfg, "rope_theta", 10000.0)}
    out.update(getattr(cfg, "rope_scaling", None) or {})
    out["rope_type"] = out.get("rope_type", out.get("type", "default"))
    return out


def _rope(cfg: Any, params: dict[str, Any], name: str, allowed: tuple[str, ...]) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of one rope parameter dict; refuses a rope type or key it does not implement."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in allowed:
        raise fail(f"config.{name}.rope_type", kind, f"one of {', '.join(allowed)}")
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"} - ROPE_KEYS[kind])
    if extra:
        raise fail(f"config.{name}.{extra[0]}", params[extra[0]],
                   f"only {', '.join(sorted(ROPE_KEYS[kind])) or 'rope_theta'} with rope_type {kind!r}")
    partial = params.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise fail(f"config.{name}.partial_rotary_factor", partial, "1.0 (every head dim rotates)")
    theta = float(params["rope_theta"])
    if kind == "llama3":
        return theta, Llama3Scaling(float(params["factor"]), float(params["low_freq_factor"]),
                                    float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]))
    if kind == "linear":
        return theta, LinearScaling(float(params["factor"]))
    if kind == "yarn":
        original = int(params["original_max_position_embeddings"])
        factor = params.get("factor") or cfg.max_position_embeddings / original
        # transformers reads `truncate` from the top level of rope_parameters
        truncate = bool(_rope_params(cfg).get("truncate", True))
        return theta, YarnScaling(float(factor), original, float(params.get("beta_fast") or 32.0),
                                  float(params.get("beta_slow") or 1.0), params.get("mscale"),
                                  params.get("mscale_all_dim"), params.get("attention_factor"), truncate)
    return theta, None


# -- dense families ------------------------------------------------------------------------------------------
def dense_spec(cfg: Any) -> LlamaSpec:
    """:class:`LlamaSpec` of a config of one of :data:`DENSE`; raises naming what the engine does not implement."""
    family = _family(cfg)
    if family not in DENSE:
        raise fail("config.model_type", family, f"a dense family: one of {', '.join(DENSE)}")
    _check_fields(cfg, family)
    gemma = family in ("gemma2", "gemma3_text")
    act_name = "hidden_activation" if gemma else "hidden_act"
    act = getattr(cfg, act_name)
    acts = ("silu",) if family == "mixtral" else tuple(ACTIVATIONS)
    _require(cfg, act_name, act in acts, f"one of {', '.join(acts)} (gated: act(x W_gate) * x W_up)")
    _require(cfg, "mlp_bias", not getattr(cfg, "mlp_bias", False), "False (no MLP biases)")
    if gemma:
        _require(cfg, "use_bidirectional_attention", not getattr(cfg, "use_bidirectional_attention", False),
                 "False or None (causal attention)")
    if family == "gemma3_text":
        _require(cfg, "attn_logit_softcapping", cfg.attn_logit_softcapping is None,
                 "None (transformers' Gemma 3 applies no attention soft-cap)")
    if family in ("qwen2", "qwen3") and getattr(cfg, "use_mrope", False):
        _require(cfg, "use_mrope", False, "False (multimodal rope is not implemented)")

    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = _rope_params(cfg)
    local = None
    if family == "gemma3_text":
        theta, scaling = _rope(cfg, rope["full_attention"], "rope_parameters.full_attention", tuple(ROPE_KEYS))
        local_theta, local_scaling = _rope(cfg, rope["sliding_attention"], "rope_parameters.sliding_attention",
                                           tuple(ROPE_KEYS))
        local = RopeSpec(local_theta, local_scaling)
    else:
        theta, scaling = _rope(cfg, rope, "rope_parameters", tuple(ROPE_KEYS))
    bias = bool(getattr(cfg, "attention_bias", False))
    experts = cfg.num_local_experts if family == "mixtral" else 0
    return LlamaSpec(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers, num_heads=heads,
        num_kv_heads=cfg.num_key_value_heads or heads, head_dim=head_dim, intermediate_size=cfg.intermediate_size,
        rms_eps=float(cfg.rms_norm_eps), rope_theta=theta, rope_scaling=scaling, family=family,
        qkv_bias=bias or family == "qwen2", o_bias=bias, qk_norm=family in ("qwen3", "gemma3_text"),
        gemma_norms=gemma, sandwich_norms=gemma, activation=ACTIVATIONS[act],
        embed_scale=math.sqrt(cfg.hidden_size) if gemma else None,
        attn_scale=float(cfg.query_pre_attn_scalar) ** -0.5 if gemma else None,
        attn_soft_cap=_cap(cfg, "attn_logit_softcapping") if family == "gemma2" else None,
        final_soft_cap=_cap(cfg, "final_logit_softcapping") if gemma else None,
        windows=_windows(cfg, family), local_rope=local, num_experts=experts,
        experts_per_tok=cfg.num_experts_per_tok if experts else 0, max_position=int(cfg.max_position_embeddings))


def _cap(cfg: Any, name: str) -> float | None:
    value = getattr(cfg, name, None)
    _require(cfg, name, value is None or (isinstance(value, (int, float)) and value > 0), "None or a positive float")
    return None if value is None else float(value)


def _windows(cfg: Any, family: str) -> tuple[int, ...]:
    """``window_left`` per layer: transformers' ``sliding_window`` W keeps the W newest keys, i.e. W - 1 left."""
    window = getattr(cfg, "sliding_window", None)
    _require(cfg, "sliding_window", window is None or (isinstance(window, int) and window >= 1), "None or an int >= 1")
    layers = cfg.num_hidden_layers
    if family in ("mistral", "mixtral"):  # one window for every layer
        return () if window is None else (window - 1,) * layers
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return ()
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad or len(types) != layers:
        raise fail("config.layer_types", types, f"{layers} entries from {', '.join(_LAYER_TYPES)}")
    wins = tuple(window - 1 if t == "sliding_attention" and window is not None else -1 for t in types)
    return wins if any(w >= 0 for w in wins) else ()


# -- DeepSeek-V3 -----------------------------------------------------------------------------------------------
def deepseek_spec(cfg: Any) -> DeepseekSpec:
    """:class:`DeepseekSpec` of a ``transformers.DeepseekV3Config``."""
    family = _family(cfg)
    if family != "deepseek_v3":
        raise fail("config.model_type", family, "'deepseek_v3'")
    _check_fields(cfg, family)
    _require(cfg, "hidden_act", cfg.hidden_act == "silu", "'silu' (SwiGLU)")
    _require(cfg, "attention_bias", not getattr(cfg, "attention_bias", False), "False")
    for name, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1)):
        if hasattr(cfg, name):  # transformers' DeepSeek-V3 implements only these, whatever the config says
            _require(cfg, name, getattr(cfg, name) == want, repr(want))
    theta, scaling = _rope(cfg, _rope_params(cfg), "rope_parameters", ("default", "yarn"))
    assert scaling is None or isinstance(scaling, YarnScaling)
    mscale = 1.0
    if scaling is not None and scaling.mscale_all_dim:  # transformers' yarn_apply_mscale on the softmax scale
        mscale = YarnScaling.mscale_of(scaling.factor, scaling.mscale_all_dim) ** 2
    n_group = cfg.n_group if cfg.n_group and cfg.n_group > 1 else None
    return DeepseekSpec(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
        intermediate_size=cfg.intermediate_size, moe_intermediate_size=cfg.moe_intermediate_size,
        first_k_dense_replace=cfg.first_k_dense_replace or 0, n_routed_experts=cfg.n_routed_experts,
        n_shared_experts=cfg.n_shared_experts or 0, num_experts_per_tok=cfg.num_experts_per_tok,
        n_group=n_group, topk_group=cfg.topk_group if n_group else None, norm_topk_prob=bool(cfg.norm_topk_prob),
        routed_scaling_factor=float(cfg.routed_scaling_factor), rms_eps=float(cfg.rms_norm_eps),
        rope_theta=theta, rope_interleave=bool(getattr(cfg, "rope_interleave", True)), rope_scaling=scaling,
        attn_mscale=mscale, max_position=int(cfg.max_position_embeddings))


# -- loading -----------------------------------------------------------------------------------------------
def spec_from_config(cfg: Any) -> LlamaSpec | DeepseekSpec:
    """The engine spec of any supported config."""
    return deepseek_spec(cfg) if _family(cfg) == "deepseek_v3" else dense_spec(cfg)


def from_hf(model: Any, device: Any = None, dtype: Any = None) -> Any:
    """The engine model of a ``transformers`` causal LM of a supported family (:data:`SUPPORTED`), its weights in
    the engine's layout on ``device`` in ``dtype`` (default: the model's)."""
    from .deepseek import DeepseekModel
    from .llama import LlamaModel
    from .weights import deepseek_from_hf, llama_from_hf

    if _family(model.config) == "deepseek_v3":
        return DeepseekModel(deepseek_from_hf(model, device, dtype))
    return LlamaModel(llama_from_hf(model, device, dtype))
