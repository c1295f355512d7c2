"""Tiny random-initialised ``transformers`` models for tests and the demo (no downloads).

The weights are redrawn with unit-scale statistics (std 1/sqrt(fan_in) for projections, norms near
1, a spread-out router) so that logits are far from ties and greedy generation does not collapse
onto one repeated token, which keeps token-level comparisons meaningful.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernel_switchboard.errors import fail


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("the engine's Hugging Face path needs transformers: "
                          'pip install "transformers>=5.23,<6" (a dependency of kernel-switchboard-engine)') from None
    return transformers


def llama_config(**overrides: Any) -> Any:
    """A small ``LlamaConfig`` (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 128, Llama-3.1 rope scaling)."""
    tf = _transformers()
    kw: dict[str, Any] = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                              rms_norm_eps=1e-5, tie_word_embeddings=False)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    kw.update(overrides)
    cfg = tf.LlamaConfig(**kw, **_rope_kwargs(tf, rope, kw))
    cfg._attn_implementation = "eager"
    return cfg


def deepseek_config(**overrides: Any) -> Any:
    """A small ``DeepseekV3Config``: MLA (q_lora 32, kv_lora 32, nope 16, rope 8, v 16), 1 dense + 1 MoE layer
    with 8 routed experts in 4 groups (top-2 groups, top-2 experts) and 1 shared expert."""
    tf = _transformers()
    kw: dict[str, Any] = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                              n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=32,
                              qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2,
                              num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
                              max_position_embeddings=512, rms_norm_eps=1e-6, rope_interleave=True,
                              tie_word_embeddings=False)
    kw.update(overrides)
    cfg = tf.DeepseekV3Config(**kw, **_rope_kwargs(tf, {"rope_type": "default", "rope_theta": 10000.0}, kw))
    cfg._attn_implementation = "eager"
    return cfg


def _rope_kwargs(tf: Any, rope: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The rope arguments in the form this transformers version takes (``rope_parameters`` from 5.0)."""
    if "rope_parameters" in given or "rope_scaling" in given:
        return {}
    major = int(tf.__version__.split(".")[0])
    if major >= 5:
        return {"rope_parameters": dict(rope)}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": rope["rope_theta"], "rope_scaling": None if rope["rope_type"] == "default" else scaling}


@torch.no_grad()
def randomize(model: Any, seed: int = 0) -> Any:
    """Redraw every parameter and buffer of ``model`` with unit-scale statistics (seeded); returns it."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:  # norm weights
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif "embed" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        else:
            fan_in = p.shape[-1]
            scale = 4.0 if name.endswith("gate.weight") else 1.0  # a decisive router
            p.copy_(torch.randn(p.shape, generator=gen) * scale / math.sqrt(fan_in))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model.eval()


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A random ``LlamaForCausalLM`` (``family="llama"``) or ``DeepseekV3ForCausalLM`` (``"deepseek"``)."""
    tf = _transformers()
    if family == "llama":
        cfg, cls = llama_config(**overrides), tf.LlamaForCausalLM
    elif family == "deepseek":
        cfg, cls = deepseek_config(**overrides), tf.DeepseekV3ForCausalLM
    else:
        raise fail("family", family, "'llama' or 'deepseek'")
    torch.manual_seed(seed)
    model = randomize(cls(cfg), seed)
    if getattr(model, "generation_config", None) is not None:  # generate() runs to max_new_tokens, like the engine
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return model.to(dtype)


def hf_overrides(spec: Any) -> dict[str, Any]:
    """``transformers`` config arguments (for :func:`tiny_model`) that give a model of this engine spec."""
    from .weights import LlamaSpec

    if isinstance(spec, LlamaSpec):
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
        if spec.rope_scaling is not None:
            sc = spec.rope_scaling
            rope.update(rope_type="llama3", factor=sc.factor, low_freq_factor=sc.low_freq_factor,
                        high_freq_factor=sc.high_freq_factor, original_max_position_embeddings=sc.original_max_position)
        kw: dict[str, Any] = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                                  intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
                                  num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
                                  head_dim=spec.head_dim, rms_norm_eps=spec.rms_eps, max_position_embeddings=4096)
        return {**kw, **_rope_kwargs(_transformers(), rope, {})}
    kw = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
              moe_intermediate_size=spec.moe_intermediate_size, num_hidden_layers=spec.num_layers,
              num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads, q_lora_rank=spec.q_lora_rank,
              kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
              qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
              first_k_dense_replace=spec.first_k_dense_replace, n_routed_experts=spec.n_routed_experts,
              n_shared_experts=spec.n_shared_experts, num_experts_per_tok=spec.num_experts_per_tok,
              n_group=spec.n_group or 1, topk_group=spec.topk_group or 1, norm_topk_prob=spec.norm_topk_prob,
              routed_scaling_factor=spec.routed_scaling_factor, rms_norm_eps=spec.rms_eps,
              rope_interleave=spec.rope_interleave, max_position_embeddings=4096)
    return {**kw, **_rope_kwargs(_transformers(), {"rope_type": "default", "rope_theta": spec.rope_theta}, {})}


@torch.no_grad()
def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' ``generate(do_sample=False)`` continuation of one prompt (explicit all-ones attention
    mask: without it a prompt token equal to ``pad_token_id`` would be masked out)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()
