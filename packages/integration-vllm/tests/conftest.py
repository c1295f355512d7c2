"""Fixtures: the plugin registered, tiny random Llama checkpoints on disk. Each test module skips without vLLM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: tests can see it


@pytest.fixture(scope="session", autouse=True)
def registered() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return
    import kernel_switchboard_vllm

    kernel_switchboard_vllm.register()


def tiny_llama(path: Path, *, heads: int = 4, kv_heads: int = 2, head_dim: int = 32, layers: int = 2,
               sliding_window: int | None = None, seed: int = 0) -> Path:
    """A random Llama (or Mistral, with a sliding window) checkpoint small enough for the CPU, with weights large
    enough that attention decides the next token (near-uniform logits would hide attention errors)."""
    import torch
    import transformers

    common = dict(vocab_size=256, hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False)
    if sliding_window is None:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM
    else:
        config = transformers.MistralConfig(sliding_window=sliding_window, **common)
        model = transformers.MistralForCausalLM
    torch.manual_seed(seed)
    model(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-mistral"), sliding_window=24, seed=1)

