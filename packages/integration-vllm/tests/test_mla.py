"""The KSB_MLA backend in vLLM: a tiny random DeepSeek-V2 (latent attention, kv_lora_rank 512, rope 64) served end to
end on the CPU with its decode attention and latent-cache writes on the switchboard, against vLLM's own CPU MLA
backend: same greedy tokens and log-probabilities. Prefill runs on vLLM's MLA prefill path in both.

vLLM's CPU platform picks its MLA backend itself, so the test points the CPU_MLA slot at the switchboard's class
with vLLM's ``register_backend``; on a GPU the backend is selected by name (``KSB_MLA``)."""

from __future__ import annotations

import collections
import gc
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the vLLM adapter's tests run against the real vLLM (nox -s tests-vllm)")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: E402

import kernel_switchboard_vllm  # noqa: E402
from kernel_switchboard_vllm.mla import SwitchboardMLABackend, SwitchboardMLAImpl  # noqa: E402


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    config = transformers.DeepseekV2Config(
        vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=2, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-deepseek")
    transformers.DeepseekV2ForCausalLM(config).save_pretrained(path)
    return path


def _generate(model: Path, backend: str | None) -> list[tuple[list[int], list[float]]]:
    from vllm.v1.attention.selector import _cached_get_attn_backend

    _cached_get_attn_backend.cache_clear()  # the backend slot may have been pointed elsewhere since the last engine
    llm = LLM(model=str(model), skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True,
              attention_config={"backend": backend} if backend else None, max_num_seqs=4, block_size=16,
              gpu_memory_utilization=0.05, kv_cache_memory_bytes=16 * 2**20, seed=0)
    prompts = [{"prompt_token_ids": list(range(3, 40))}, {"prompt_token_ids": [5, 6, 7]}]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, detokenize=False, logprobs=1),
                           use_tqdm=False)
    del llm
    gc.collect()
    return [(list(o.outputs[0].token_ids), [step[t].logprob for step, t in zip(o.outputs[0].logprobs,
                                                                             o.outputs[0].token_ids)])
            for o in outputs]


def test_ksb_mla_generates_what_vllm_cpu_mla_generates(deepseek_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = _generate(deepseek_dir, "CPU_MLA")
    calls: collections.Counter[str] = collections.Counter()
    forward_mqa, update = SwitchboardMLAImpl.forward_mqa, SwitchboardMLAImpl.do_kv_cache_update

    def counted_mqa(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["decode"] += 1
        return forward_mqa(self, *args, **kwargs)

    def counted_update(self: Any, *args: Any, **kwargs: Any) -> None:
        calls["kv_write"] += 1
        update(self, *args, **kwargs)

    monkeypatch.setattr(SwitchboardMLAImpl, "forward_mqa", counted_mqa)
    monkeypatch.setattr(SwitchboardMLAImpl, "do_kv_cache_update", counted_update)
    register_backend(AttentionBackendEnum.CPU_MLA, kernel_switchboard_vllm.MLA_BACKEND_PATH)
    try:
        got = _generate(deepseek_dir, "CPU_MLA")
    finally:
        AttentionBackendEnum.CPU_MLA.clear_override()
    assert calls["decode"] > 0 and calls["kv_write"] > 0, calls
    for (got_tokens, got_lp), (want_tokens, want_lp) in zip(got, want):
        assert got_tokens == want_tokens
        assert max(abs(a - b) for a, b in zip(got_lp, want_lp)) < 1e-3


def test_mla_backend_declarations() -> None:
    import torch
    from vllm.platforms.interface import DeviceCapability

    common = dict(head_size=576, dtype=torch.bfloat16, block_size=1, use_mla=True, has_sink=False, use_sparse=False,
                  use_mm_prefix=False, use_per_head_quant_scales=False, device_capability=DeviceCapability(9, 0),
                  attn_type="decoder")
    assert SwitchboardMLABackend.validate_configuration(kv_cache_dtype="auto", **common) == []
    assert "kv_cache_dtype not supported" in SwitchboardMLABackend.validate_configuration(kv_cache_dtype="fp8", **common)
    assert SwitchboardMLABackend.get_name() == "KSB_MLA" and SwitchboardMLABackend.is_mla()
