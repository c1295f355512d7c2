"""A tiny random Llama (and a Mistral with a sliding window) served end to end by vLLM on the CPU, attention on the
switchboard (its reference kernels), against the same engine with vLLM's own CPU attention: same greedy tokens,
same log-probabilities within float32 rounding. Chunked prefill (small token budget), prefix caching, decode
batches and page sizes 16 and 1 all run through the KSB backend's builder and implementation.

vLLM's CPU platform ignores ``attention_backend`` (it always returns its CPU_ATTN class), so these tests point
the CPU_ATTN slot at the switchboard's backend class with vLLM's own ``register_backend``; on a GPU the backend
is selected by name (``attention_config={"backend": "KSB"}``).
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the vLLM adapter's tests run against the real vLLM (nox -s tests-vllm)")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: E402

import kernel_switchboard_vllm  # noqa: E402
from kernel_switchboard_vllm.attention import SwitchboardAttentionImpl  # noqa: E402

PROMPTS = [
    list(range(3, 90)),  # longer than the token budget: chunked prefill
    [1, 5, 7, 9, 11],
    [*range(3, 40), 200, 201],  # shares a prefix with the first: prefix caching
    [17] * 23,
]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts the KSB implementation's forwards by step kind and its KV writes."""
    counter: collections.Counter[str] = collections.Counter()
    forward, update = SwitchboardAttentionImpl.forward, SwitchboardAttentionImpl.do_kv_cache_update

    def counted_forward(self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, metadata: Any,
                        output: Any, *args: Any, **kwargs: Any) -> Any:
        if metadata is not None:
            counter["decode" if metadata.decode else "prefill"] += 1
        return forward(self, layer, query, key, value, kv_cache, metadata, output, *args, **kwargs)

    def counted_update(self: Any, *args: Any, **kwargs: Any) -> None:
        counter["kv_write"] += 1
        update(self, *args, **kwargs)

    monkeypatch.setattr(SwitchboardAttentionImpl, "forward", counted_forward)
    monkeypatch.setattr(SwitchboardAttentionImpl, "do_kv_cache_update", counted_update)
    return counter


@pytest.fixture
def switchboard_on_cpu() -> Iterator[None]:
    register_backend(AttentionBackendEnum.CPU_ATTN, kernel_switchboard_vllm.BACKEND_PATH)
    try:
        yield
    finally:
        AttentionBackendEnum.CPU_ATTN.clear_override()


def _generate(model: Path, block_size: int) -> list[tuple[list[int], list[float]]]:
    from vllm.v1.attention.selector import _cached_get_attn_backend

    _cached_get_attn_backend.cache_clear()  # the backend slot may have been pointed elsewhere since the last engine
    llm = LLM(model=str(model), skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True,
              max_num_seqs=4, max_num_batched_tokens=48, block_size=block_size, enable_prefix_caching=True,
              gpu_memory_utilization=0.05, kv_cache_memory_bytes=16 * 2**20, seed=0)
    params = SamplingParams(max_tokens=12, temperature=0.0, detokenize=False, logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    result = []
    for out in outputs:
        completion = out.outputs[0]
        chosen = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)]
        result.append((list(completion.token_ids), chosen))
    del llm
    gc.collect()
    return result


@pytest.mark.parametrize(("model", "block_size"), [("llama", 16), ("llama", 1), ("mistral", 16)])
def test_ksb_generates_what_vllm_cpu_attention_generates(model: str, block_size: int, llama_dir: Path,
                                                         mistral_dir: Path, calls: collections.Counter[str],
                                                         request: pytest.FixtureRequest) -> None:
    path = llama_dir if model == "llama" else mistral_dir
    want = _generate(path, 32)  # vLLM's CPU attention (its block size: multiples of 32)
    assert not calls
    request.getfixturevalue("switchboard_on_cpu")
    got = _generate(path, block_size)
    assert calls["prefill"] > 0 and calls["decode"] > 0 and calls["kv_write"] > 0, calls
    for (got_tokens, got_lp), (want_tokens, want_lp) in zip(got, want):
        assert got_tokens == want_tokens
        assert max(abs(a - b) for a, b in zip(got_lp, want_lp)) < 1e-3
