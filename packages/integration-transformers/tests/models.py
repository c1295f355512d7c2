"""Tiny random-weight causal LMs of six families, with the features the adapter must serve switched on at strengths
that matter: prompts longer than the sliding window, q/k weights scaled so that Gemma 2's attention soft-cap bites.

Nothing is downloaded: each model is built from a config and initialised with a fixed seed (float32, eval mode).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

VOCAB = 128
WINDOW = 8  # shorter than the test prompts (12-24 tokens), so the window masks real positions
_COMMON: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                           "max_position_embeddings": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_HYBRID = ["sliding_attention", "full_attention"]

#: family -> (config class, model class, config arguments beyond _COMMON)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0, "layer_types": _HYBRID}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"sliding_window": WINDOW, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 30.0,
                "query_pre_attn_scalar": 16, "layer_types": _HYBRID}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0, "layer_types": _HYBRID}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2}),
}


def build(family: str, seed: int = 0, **overrides: Any) -> Any:
    """The family's tiny model, random weights from ``seed``; Gemma 2's q/k projections scaled x4 so that attention
    logits reach past its soft-cap."""
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    if family == "gemma2":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(4.0)
                layer.self_attn.k_proj.weight.mul_(4.0)
    return model


def prompts(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    """(batch, length) token ids avoiding the pad / bos / eos ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def left_padded(ids: torch.Tensor, pads: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b keeps its last ``len - pads[b]`` tokens, left-padded with the pad id: (ids, attention_mask)."""
    ids = ids.clone()
    mask = torch.ones_like(ids)
    for b, n in enumerate(pads):
        ids[b, :n] = 0
        mask[b, :n] = 0
    return ids, mask
