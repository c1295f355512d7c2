"""Tiny random-initialised ``transformers`` models of every supported family, for tests and the demo (no downloads).

Each family's config switches its features on at strengths that show: sliding windows of 8 tokens (prompts run
longer), soft-caps below the scores' spread, a softmax scale that is not head_dim ** -0.5, YaRN with its softmax
mscale, a linear-scaled global rope beside a local one. The weights are redrawn with unit-scale statistics (std
1/sqrt(fan_in) for projections, norms near 1 -- (1 + w) norms near 1 too --, biases as large as the products, a
spread-out router) so that logits are far from ties and greedy generation does not collapse onto one repeated
token, which keeps token-level comparisons meaningful.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.rope import Llama3Scaling

#: the demo's family names -> transformers' model_type
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral", "mixtral": "mixtral",
            "gemma2": "gemma2", "gemma3": "gemma3_text", "deepseek": "deepseek_v3"}
#: family -> (config class, model class) names in transformers
_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
            "mixtral": ("MixtralConfig", "MixtralForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
            "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
            "deepseek": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}

_SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
_WINDOW = 8
#: each family's tiny config: its features on (shapes above unless given)
_TINY: dict[str, dict[str, Any]] = {
    "llama": dict(rms_norm_eps=1e-5, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "qwen2": dict(rope_parameters=_ROPE, use_sliding_window=True, sliding_window=_WINDOW, max_window_layers=1),
    "qwen3": dict(head_dim=32, attention_bias=True, rope_parameters={**_ROPE, "rope_theta": 1e6}),
    "mistral": dict(head_dim=32, sliding_window=_WINDOW, rope_parameters=_ROPE),
    "mixtral": dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                    rope_parameters=_ROPE),
    "gemma2": dict(num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=_WINDOW,
                   attn_logit_softcapping=5.0, final_logit_softcapping=4.0, hidden_activation="gelu_pytorch_tanh",
                   rope_parameters=_ROPE),
    "gemma3": dict(num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=_WINDOW,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   final_logit_softcapping=4.0, hidden_activation="gelu_pytorch_tanh",
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
    # MLA (q_lora 32, kv_lora 32, nope 16, rope 8, v 16), 1 dense + 1 MoE layer with 8 routed experts in 4 groups
    # (top-2 groups, top-2 experts) and 1 shared expert; YaRN as DeepSeek-V3's checkpoints set it
    "deepseek": dict(num_key_value_heads=4, moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=8,
                     routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
                     qk_nope_head_dim=16, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
                     norm_topk_prob=True, rms_norm_eps=1e-6, rope_interleave=True, max_position_embeddings=163840,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                      "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                                      "mscale": 1.0, "mscale_all_dim": 1.0}),
}
#: the demo's GPU size: shapes the GPU kernels take (head_dim 64 / 128), windows shorter than its prompts
_SMALL = dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
_SMALL_BY_FAMILY: dict[str, dict[str, Any]] = {
    "qwen2": dict(sliding_window=32, max_window_layers=2),
    "mistral": dict(sliding_window=32),
    "mixtral": dict(intermediate_size=512, num_local_experts=8),
    "gemma2": dict(sliding_window=32, query_pre_attn_scalar=96, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0),
    "gemma3": dict(sliding_window=32, query_pre_attn_scalar=96,
                   layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]),
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("the engine's Hugging Face path needs transformers: "
                          'pip install "transformers>=5.23,<6" (a dependency of kernel-switchboard-engine)') from None
    return transformers


def config(family: str, **overrides: Any) -> Any:
    """The tiny config of ``family`` (a key of :data:`FAMILIES`) with ``overrides``, eager attention."""
    if family not in FAMILIES:
        raise fail("family", family, f"one of {', '.join(FAMILIES)}")
    tf = _transformers()
    kw: dict[str, Any] = {**_SHAPE, **_TINY[family], **overrides}
    if family == "deepseek" and "head_dim" in kw:  # DeepSeek-V3 derives head_dim from its rope dims
        kw.pop("head_dim")
    cfg = getattr(tf, _CLASSES[family][0])(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def small_overrides(family: str) -> dict[str, Any]:
    """Config overrides of the demo's GPU-sized model of ``family``."""
    return {**_SMALL, **_SMALL_BY_FAMILY.get(family, {})}


@torch.no_grad()
def randomize(model: Any, seed: int = 0) -> Any:
    """Redraw every parameter and buffer of ``model`` with unit-scale statistics (seeded); returns it."""
    gen = torch.Generator().manual_seed(seed)
    gemma = model.config.model_type.startswith("gemma")
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:  # norm weights: x * w, or x * (1 + w) for Gemma
            p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=gen))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=gen) / (math.sqrt(p.shape[-1]) if gemma else 1.0))
        else:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=gen) * _scale(model.config, name) / math.sqrt(fan_in))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model.eval()


def _scale(cfg: Any, name: str) -> float:
    """Spread of a projection beyond 1/sqrt(fan_in): a decisive router; q/k and lm_head large enough that the
    attention and final soft-caps bite (scores and logits several times the cap)."""
    if name.endswith("gate.weight"):
        return 4.0
    if getattr(cfg, "attn_logit_softcapping", None) and name.endswith(("q_proj.weight", "k_proj.weight")):
        return 3.0
    if getattr(cfg, "final_logit_softcapping", None) and name == "lm_head.weight":
        return 4.0
    return 1.0


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A random ``*ForCausalLM`` of ``family`` (a key of :data:`FAMILIES`) from its tiny config and ``overrides``."""
    tf = _transformers()
    cfg = config(family, **overrides)
    torch.manual_seed(seed)
    model = randomize(getattr(tf, _CLASSES[family][1])(cfg), seed)
    if getattr(model, "generation_config", None) is not None:  # generate() runs to max_new_tokens, like the engine
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return model.to(dtype)


def hf_overrides(spec: Any) -> dict[str, Any]:
    """``transformers`` config arguments (for :func:`tiny_model`) that give a model of this Llama or DeepSeek spec."""
    from .weights import LlamaSpec

    if isinstance(spec, LlamaSpec):
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
        sc = spec.rope_scaling
        if isinstance(sc, Llama3Scaling):
            rope.update(rope_type="llama3", factor=sc.factor, low_freq_factor=sc.low_freq_factor,
                        high_freq_factor=sc.high_freq_factor, original_max_position_embeddings=sc.original_max_position)
        elif sc is not None:
            raise fail("spec.rope_scaling", sc, "None or a Llama3Scaling")
        return dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                    num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                    num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.rms_eps,
                    max_position_embeddings=4096, rope_parameters=rope)
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                moe_intermediate_size=spec.moe_intermediate_size, num_hidden_layers=spec.num_layers,
                num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads, q_lora_rank=spec.q_lora_rank,
                kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                first_k_dense_replace=spec.first_k_dense_replace, n_routed_experts=spec.n_routed_experts,
                n_shared_experts=spec.n_shared_experts, num_experts_per_tok=spec.num_experts_per_tok,
                n_group=spec.n_group or 1, topk_group=spec.topk_group or 1, norm_topk_prob=spec.norm_topk_prob,
                routed_scaling_factor=spec.routed_scaling_factor, rms_norm_eps=spec.rms_eps,
                rope_interleave=spec.rope_interleave, max_position_embeddings=spec.max_position,
                rope_parameters=_deepseek_rope(spec))


def _deepseek_rope(spec: Any) -> dict[str, Any]:
    sc = spec.rope_scaling
    if sc is None:
        return {"rope_type": "default", "rope_theta": spec.rope_theta}
    rope = {"rope_type": "yarn", "rope_theta": spec.rope_theta, "factor": sc.factor,
            "original_max_position_embeddings": sc.original_max_position, "beta_fast": sc.beta_fast,
            "beta_slow": sc.beta_slow, "mscale": sc.mscale, "mscale_all_dim": sc.mscale_all_dim}
    if sc.attention_factor is not None:
        rope["attention_factor"] = sc.attention_factor
    return rope


@torch.no_grad()
def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' ``generate(do_sample=False)`` continuation of one prompt (explicit all-ones attention
    mask: without it a prompt token equal to ``pad_token_id`` would be masked out)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()
