"""The KSB backend against vLLM's own classes: vLLM's Attention layers built on it, its CommonAttentionMetadata, its
cache layout (K|V halves of one tensor); the builder's plans and the implementation's KV write + forward compared with
a float64 attention written here, for prefill, chunked prefill with cached tokens, decode, mixed batches, padding
tokens, page size 1, GQA, sliding window, soft-cap, fp8 caches, and the CUDA-graph plan reuse."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM adapter's tests run against the real vLLM (nox -s tests-vllm)")

from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention import Attention  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402

import kernel_switchboard as ksb  # noqa: E402
from kernel_switchboard_vllm.attention import (  # noqa: E402
    SwitchboardAttentionBackend,
    SwitchboardAttentionImpl,
    SwitchboardMetadataBuilder,
)

HEADS, KV_HEADS, HEAD = 4, 2, 32
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class Step:
    """One engine step's inputs, built the way vLLM's model runner builds them."""

    cm: CommonAttentionMetadata
    query: torch.Tensor  # (padded tokens, H, D)
    key: torch.Tensor
    value: torch.Tensor
    history: list[tuple[torch.Tensor, torch.Tensor]]  # each request's cached K/V before the step (as stored)
    q_lens: list[int]
    seq_lens: list[int]


def _config(model_dir: Path, block_size: int, kv_cache_dtype: str = "auto") -> VllmConfig:
    model = ModelConfig(model=str(model_dir), dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    return VllmConfig(model_config=model, cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype))


def _layers(config: VllmConfig, n: int, **kwargs: Any) -> list[Attention]:
    with set_current_vllm_config(config):
        return [Attention(HEADS, HEAD, HEAD ** -0.5, KV_HEADS, cache_config=config.cache_config,
                          prefix=f"model.layers.{i}.self_attn.attn", attn_backend=SwitchboardAttentionBackend, **kwargs)
                for i in range(n)]


def _builder(config: VllmConfig, layers: list[Attention]) -> SwitchboardMetadataBuilder:
    spec = layers[0].get_kv_cache_spec(config)
    return SwitchboardMetadataBuilder(spec, [layer.layer_name for layer in layers], config, torch.device("cpu"))


def _step(q_lens: list[int], seq_lens: list[int], block_size: int, num_blocks: int, kv_cache: torch.Tensor,
          kv_dtype: torch.dtype, scales: tuple[float, float], pad_tokens: int, seed: int, width: int | None = None
          ) -> Step:
    """Random block tables and history written into ``kv_cache`` (as stored: quantised for fp8), new tokens' q/k/v,
    the slot mapping of the new tokens and ``pad_tokens`` padding rows (slot -1), as vLLM pads a batch."""
    g = torch.Generator().manual_seed(seed)
    width = width or max(math.ceil(s / block_size) for s in seq_lens) + 1  # vLLM's: the model's longest sequence
    blocks = torch.randperm(num_blocks, generator=g)[: len(seq_lens) * width].view(len(seq_lens), width)
    block_table = blocks.to(torch.int32)
    pages = kv_cache.view(kv_dtype) if kv_cache.dtype != kv_dtype else kv_cache  # (blocks, H, bs, 2D)
    history, slots = [], []
    for b, (q, s) in enumerate(zip(q_lens, seq_lens)):
        past = s - q
        k = torch.randn(past, KV_HEADS, HEAD, generator=g)
        v = torch.randn(past, KV_HEADS, HEAD, generator=g)
        ks, vs = (k / scales[0]).to(kv_dtype), (v / scales[1]).to(kv_dtype)
        for t in range(past):
            blk, off = int(block_table[b, t // block_size]), t % block_size
            pages[blk, :, off, :HEAD], pages[blk, :, off, HEAD:] = ks[t], vs[t]
        history.append((ks.float() * scales[0], vs.float() * scales[1]))
        slots += [int(block_table[b, t // block_size]) * block_size + t % block_size for t in range(past, s)]
    tokens = sum(q_lens)
    padded = tokens + pad_tokens
    query = torch.randn(padded, HEADS, HEAD, generator=g)
    key = torch.randn(padded, KV_HEADS, HEAD, generator=g)
    value = torch.randn(padded, KV_HEADS, HEAD, generator=g)
    start = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=start, query_start_loc_cpu=start.clone(), seq_lens=lens, num_reqs=len(q_lens),
        num_actual_tokens=tokens, max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_table_tensor=block_table,
        slot_mapping=torch.tensor(slots + [-1] * pad_tokens, dtype=torch.int64), causal=True,
        seq_lens_cpu_upper_bound=lens.clone())
    return Step(cm, query, key, value, history, q_lens, seq_lens)


def _expected(step: Step, kv_dtype: torch.dtype, scales: tuple[float, float], scale: float, window: int | None,
              soft_cap: float | None) -> torch.Tensor:
    """Causal attention of each request's new queries over its history + new keys, float64, one head at a time."""
    out, start = [], 0
    group = HEADS // KV_HEADS
    for (hk, hv), q_len, s in zip(step.history, step.q_lens, step.seq_lens):
        new_k = step.key[start:start + q_len]
        new_v = step.value[start:start + q_len]
        if kv_dtype in FP8.values():  # the cache holds what an fp8 write stores
            new_k = (new_k / scales[0]).clamp(-448, 448).to(kv_dtype).double() * scales[0]
            new_v = (new_v / scales[1]).clamp(-448, 448).to(kv_dtype).double() * scales[1]
        k = torch.cat((hk.double(), new_k.double()))
        v = torch.cat((hv.double(), new_v.double()))
        q = step.query[start:start + q_len].double()
        rows = torch.empty(q_len, HEADS, HEAD, dtype=torch.float64)
        for i in range(q_len):
            pos = s - q_len + i
            lo = 0 if window is None else max(0, pos - window + 1)
            for h in range(HEADS):
                logits = k[lo:pos + 1, h // group] @ q[i, h] * scale
                if soft_cap is not None:
                    logits = soft_cap * torch.tanh(logits / soft_cap)
                rows[i, h] = torch.softmax(logits, 0) @ v[lo:pos + 1, h // group]
        out.append(rows)
        start += q_len
    return torch.cat(out)


def _run(model_dir: Path, q_lens: list[int], seq_lens: list[int], *, block_size: int = 4, kv_cache_dtype: str = "auto",
         pad_tokens: int = 3, window: int | None = None, soft_cap: float | None = None, seed: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor, Any]:
    config = _config(model_dir, block_size, kv_cache_dtype)
    kwargs: dict[str, Any] = {}
    if window is not None:
        kwargs["per_layer_sliding_window"] = window
    if soft_cap is not None:
        kwargs["logits_soft_cap"] = soft_cap
    layers = _layers(config, 2, **kwargs)
    kv_dtype = FP8.get(kv_cache_dtype, torch.float32)
    scales = (0.5, 0.25) if kv_dtype in FP8.values() else (1.0, 1.0)
    for layer in layers:
        layer._k_scale_float, layer._v_scale_float = scales
    num_blocks = 64
    storage = torch.uint8 if kv_dtype in FP8.values() else torch.float32
    kv_cache = torch.zeros(num_blocks, KV_HEADS, block_size, 2 * HEAD, dtype=storage)
    step = _step(q_lens, seq_lens, block_size, num_blocks, kv_cache, kv_dtype, scales, pad_tokens, seed)
    metadata = _builder(config, layers).build(0, step.cm)
    layer = layers[1]
    impl = layer.impl
    assert isinstance(impl, SwitchboardAttentionImpl)
    impl.do_kv_cache_update(layer, step.key, step.value, kv_cache, step.cm.slot_mapping)
    output = torch.full((step.query.shape[0], HEADS, HEAD), 7.0)
    impl.forward(layer, step.query, step.key, step.value, kv_cache, metadata, output)
    want = _expected(step, kv_dtype, scales, HEAD ** -0.5, window, soft_cap)
    assert torch.all(output[step.cm.num_actual_tokens:] == 7.0), "padding rows of the output were written"
    return output[: step.cm.num_actual_tokens], want, metadata


CASES = {  # q_lens, seq_lens, block size
    "prefill": ([9, 5], [9, 5], 4),
    "chunked-prefill-with-cached-tokens": ([6, 3], [14, 11], 4),
    "mixed-decode-and-prefill": ([1, 7, 1, 4], [17, 7, 3, 12], 4),
    "decode": ([1, 1, 1], [13, 1, 30], 4),
    "page-size-1-mixed": ([1, 5, 2], [9, 5, 20], 1),
    "page-size-1-decode": ([1, 1], [6, 31], 1),
    "block-size-16": ([1, 20], [40, 33], 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_float64_attention(name: str, llama_dir: Path) -> None:
    q_lens, seq_lens, block_size = CASES[name]
    got, want, metadata = _run(llama_dir, q_lens, seq_lens, block_size=block_size)
    assert metadata.decode == all(q == 1 for q in q_lens)
    plan_type = ksb.attention.DecodePlan if metadata.decode else ksb.attention.PrefillPlan
    assert all(isinstance(p, plan_type) for p in metadata.plans.values())
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("window", "soft_cap"), [(5, None), (None, 2.0), (3, 5.0)])
def test_sliding_window_and_soft_cap(window: int | None, soft_cap: float | None, llama_dir: Path) -> None:
    got, want, _ = _run(llama_dir, [1, 9, 2], [14, 9, 12], window=window, soft_cap=soft_cap, seed=1)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
    got, want, _ = _run(llama_dir, [1, 1], [14, 9], window=window, soft_cap=soft_cap, seed=2)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache_with_scales(kv_cache_dtype: str, llama_dir: Path) -> None:
    for q_lens, seq_lens in (([1, 6, 1], [10, 6, 21]), ([1, 1], [7, 12])):
        got, want, _ = _run(llama_dir, q_lens, seq_lens, kv_cache_dtype=kv_cache_dtype, seed=3)
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_the_kv_write_lands_in_vllm_slots_and_skips_padding(llama_dir: Path) -> None:
    config = _config(llama_dir, 4)
    layer = _layers(config, 1)[0]
    kv_cache = torch.zeros(8, KV_HEADS, 4, 2 * HEAD)
    key, value = torch.randn(5, KV_HEADS, HEAD), torch.randn(5, KV_HEADS, HEAD)
    slots = torch.tensor([9, -1, 0, 31, -1])
    layer.impl.do_kv_cache_update(layer, key, value, kv_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(kv_cache[slot // 4, :, slot % 4, :HEAD], key[t])
            assert torch.equal(kv_cache[slot // 4, :, slot % 4, HEAD:], value[t])
    assert int((kv_cache != 0).any(dim=(1, 3)).sum()) == 3, "exactly the three real tokens' slots were written"


def test_cuda_graph_plans_are_kept_and_serve_later_decode_steps(llama_dir: Path) -> None:
    """The plans made for a capture are reused by later decode batches of that size, reading vLLM's persistent
    buffers refilled in place: a replay would see the new lengths and block tables."""
    config = _config(llama_dir, 4)
    layers = _layers(config, 2)
    builder = _builder(config, layers)
    assert builder.get_cudagraph_support(config, layers[0].get_kv_cache_spec(config)) == \
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    kv_cache = torch.zeros(200, KV_HEADS, 4, 2 * HEAD)
    capture = _step([1, 1, 1], [3, 5, 2], 4, 200, kv_cache, torch.float32, (1.0, 1.0), 0, seed=4, width=64)
    captured = builder.build_for_cudagraph_capture(capture.cm)
    assert all(p.params.max_kv_len == 256 for p in captured.plans.values()), "captured plans serve the longest"
    later = _step([1, 1, 1], [30, 9, 17], 4, 200, kv_cache, torch.float32, (1.0, 1.0), 0, seed=5, width=64)
    capture.cm.block_table_tensor.copy_(later.cm.block_table_tensor)  # vLLM refills its persistent buffers in place
    capture.cm.seq_lens.copy_(later.cm.seq_lens)
    refilled = CommonAttentionMetadata(**{**vars(later.cm), "block_table_tensor": capture.cm.block_table_tensor,
                                          "seq_lens": capture.cm.seq_lens})
    metadata = builder.build(0, refilled)
    assert metadata is captured
    impl, layer = layers[0].impl, layers[0]
    impl.do_kv_cache_update(layer, later.key, later.value, kv_cache, later.cm.slot_mapping)
    output = torch.empty(3, HEADS, HEAD)
    impl.forward(layer, later.query, later.key, later.value, kv_cache, metadata, output)
    torch.testing.assert_close(output.double(), _expected(later, torch.float32, (1.0, 1.0), HEAD ** -0.5, None, None),
                               atol=2e-5, rtol=2e-5)


def test_profiling_run_without_metadata_zeroes_the_output(llama_dir: Path) -> None:
    layer = _layers(_config(llama_dir, 4), 1)[0]
    output = torch.ones(3, HEADS, HEAD)
    layer.impl.forward(layer, torch.randn(3, HEADS, HEAD), None, None, torch.empty(0), None, output)
    assert torch.all(output == 0)


def test_unsupported_layer_features_are_refused_by_name(llama_dir: Path) -> None:
    config = _config(llama_dir, 4)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        _layers(config, 1, alibi_slopes=[1.0, 0.5, 0.25, 0.125])
    with pytest.raises(NotImplementedError, match="sinks"):
        _layers(config, 1, sinks=torch.zeros(HEADS))


def test_backend_declarations(llama_dir: Path) -> None:
    """What vLLM's selector reads: name, dtypes, fp8 caches, any block size, decoder attention with sliding windows,
    not MLA."""
    from vllm.platforms.interface import DeviceCapability

    reasons = SwitchboardAttentionBackend.validate_configuration(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="fp8", block_size=1, use_mla=False, has_sink=False,
        use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder", has_sliding_window=True)
    assert reasons == []
    assert "MLA not supported" in SwitchboardAttentionBackend.validate_configuration(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True, has_sink=False,
        use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder")
    assert SwitchboardAttentionBackend.get_name() == "KSB"
