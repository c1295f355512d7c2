"""The ``ksb`` backend against SGLang's own classes: its plugin registration, RadixAttention layers, ForwardBatch
(decode, extend with cached prefixes, mixed), ReqToTokenPool and MHATokenToKVPool on the CPU; outputs compared
with a float64 attention written here; page sizes 1 and 16, GQA, sliding window, soft-cap, fp8 pools, and the
CUDA-graph capture/replay sequence of SGLang's graph runner."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("sglang", reason="the SGLang adapter's tests run against the real SGLang (nox -s tests-sglang)")

from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402

import kernel_switchboard as ksb  # noqa: E402
import kernel_switchboard_sglang  # noqa: E402
from kernel_switchboard_sglang.backend import SwitchboardAttnBackend  # noqa: E402

HEADS, KV_HEADS, HEAD = 4, 2, 32
CONTEXT = 128


def test_plugin_registers_the_backend_with_sglang() -> None:
    from importlib.metadata import entry_points

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP

    assert "kernel_switchboard" in {ep.name for ep in entry_points(group=GENERAL_PLUGINS_GROUP)}
    kernel_switchboard_sglang.register()
    kernel_switchboard_sglang.register()  # SGLang loads plugins in every process: idempotent
    assert ATTENTION_BACKEND_CHOICES.count("ksb") == 1
    assert ATTENTION_BACKENDS["ksb"] is kernel_switchboard_sglang.create_backend
    with pytest.raises(NotImplementedError, match="MLA"):
        kernel_switchboard_sglang.create_backend(SimpleNamespace(use_mla_backend=True))


@dataclass
class Setup:
    backend: SwitchboardAttnBackend
    layers: list[RadixAttention]
    req_to_token: ReqToTokenPool
    kv_pool: MHATokenToKVPool


def _setup(page_size: int, kv_dtype: torch.dtype = torch.float32, window: int = -1, logit_cap: float = 0.0,
           scales: tuple[float, float] = (1.0, 1.0)) -> Setup:
    layers = [RadixAttention(HEADS, HEAD, HEAD ** -0.5, KV_HEADS, layer_id=i, logit_cap=logit_cap,
                             sliding_window_size=window) for i in range(2)]
    for layer in layers:
        layer.k_scale_float, layer.v_scale_float = scales
    req_to_token = ReqToTokenPool(size=8, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(size=64 * page_size, page_size=page_size, dtype=kv_dtype, head_num=KV_HEADS,
                               head_dim=HEAD, layer_num=2, device="cpu", enable_memory_saver=False)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=req_to_token, token_to_kv_pool=kv_pool,
                             page_size=page_size, dtype=torch.float32, kv_cache_dtype=kv_dtype,
                             model_config=SimpleNamespace(context_len=CONTEXT), model=torch.nn.ModuleList(layers),
                             use_mla_backend=False)
    backend = kernel_switchboard_sglang.create_backend(runner)
    assert isinstance(backend, SwitchboardAttnBackend)
    return Setup(backend, layers, req_to_token, kv_pool)


@dataclass
class Step:
    batch: ForwardBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    history: list[tuple[torch.Tensor, torch.Tensor]]  # each request's cached K/V (as stored) before the step
    q_lens: list[int]
    seq_lens: list[int]


def _step(s: Setup, q_lens: list[int], seq_lens: list[int], scales: tuple[float, float], seed: int,
          decode: bool | None = None) -> Step:
    """Requests in SGLang's pools: each gets whole pages of slots in ``req_to_token``, its cached prefix written
    into every layer's buffers (as stored), and the new tokens' slots in ``out_cache_loc``."""
    g = torch.Generator().manual_seed(seed)
    ps = s.backend.page_size
    kv_dtype = s.backend.kv_cache_dtype
    free_pages = (torch.randperm(63, generator=g) + 1).tolist()  # page 0 is SGLang's padding page
    history, out_loc = [], []
    for b, (q, n) in enumerate(zip(q_lens, seq_lens)):
        pages = [free_pages.pop() for _ in range(math.ceil(n / ps))]
        slots = torch.tensor([pages[t // ps] * ps + t % ps for t in range(n)], dtype=torch.int32)
        s.req_to_token.req_to_token[b + 1, :n] = slots  # request pool slot b + 1 (0 is padding)
        k = torch.randn(n - q, KV_HEADS, HEAD, generator=g)
        v = torch.randn(n - q, KV_HEADS, HEAD, generator=g)
        ks, vs = (k / scales[0]).to(kv_dtype), (v / scales[1]).to(kv_dtype)
        for layer in range(2):
            kb, vb = s.kv_pool.get_kv_buffer(layer)
            kb.view(kv_dtype)[slots[: n - q].long()] = ks
            vb.view(kv_dtype)[slots[: n - q].long()] = vs
        history.append((ks.float() * scales[0], vs.float() * scales[1]))
        out_loc += slots[n - q:].tolist()
    tokens = sum(q_lens)
    bs = len(q_lens)
    decode = all(q == 1 for q in q_lens) if decode is None else decode
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    extend = {} if decode else dict(
        extend_seq_lens=torch.tensor(q_lens, dtype=torch.int32),
        extend_prefix_lens=torch.tensor([n - q for q, n in zip(q_lens, seq_lens)], dtype=torch.int32),
        extend_start_loc=torch.tensor([0, *q_lens[:-1]], dtype=torch.int32).cumsum(0).to(torch.int32),
        extend_seq_lens_cpu=list(q_lens), extend_prefix_lens_cpu=[n - q for q, n in zip(q_lens, seq_lens)],
        extend_num_tokens=tokens)
    batch = ForwardBatch(forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=bs,
                         input_ids=torch.zeros(tokens, dtype=torch.int64),
                         req_pool_indices=torch.arange(1, bs + 1, dtype=torch.int64), seq_lens=lens,
                         out_cache_loc=torch.tensor(out_loc, dtype=torch.int64), seq_lens_sum=sum(seq_lens),
                         seq_lens_cpu=lens.clone(), **extend)
    q = torch.randn(tokens, HEADS * HEAD, generator=g)
    k = torch.randn(tokens, KV_HEADS, HEAD, generator=g)
    v = torch.randn(tokens, KV_HEADS, HEAD, generator=g)
    return Step(batch, q, k, v, history, q_lens, seq_lens)


def _expected(step: Step, kv_dtype: torch.dtype, scales: tuple[float, float], window: int, cap: float) -> torch.Tensor:
    """Causal attention of each request's new queries over its cached + new keys, float64, one head at a time."""
    out, start = [], 0
    group = HEADS // KV_HEADS
    q_all = step.q.view(-1, HEADS, HEAD).double()
    for (hk, hv), q_len, n in zip(step.history, step.q_lens, step.seq_lens):
        new_k, new_v = step.k[start:start + q_len].double(), step.v[start:start + q_len].double()
        if kv_dtype != torch.float32:
            new_k = (new_k / scales[0]).clamp(-448, 448).to(kv_dtype).double() * scales[0]
            new_v = (new_v / scales[1]).clamp(-448, 448).to(kv_dtype).double() * scales[1]
        k, v = torch.cat((hk.double(), new_k)), torch.cat((hv.double(), new_v))
        rows = torch.empty(q_len, HEADS, HEAD, dtype=torch.float64)
        for i in range(q_len):
            pos = n - q_len + i
            lo = 0 if window < 0 else max(0, pos - window)
            for h in range(HEADS):
                logits = k[lo:pos + 1, h // group] @ q_all[start + i, h] * HEAD ** -0.5
                if cap:
                    logits = cap * torch.tanh(logits / cap)
                rows[i, h] = torch.softmax(logits, 0) @ v[lo:pos + 1, h // group]
        out.append(rows)
        start += q_len
    return torch.cat(out).view(-1, HEADS * HEAD)


def _run(q_lens: list[int], seq_lens: list[int], page_size: int, *, kv_dtype: torch.dtype = torch.float32,
         window: int = -1, cap: float = 0.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Setup, Step]:
    scales = (0.5, 0.25) if kv_dtype != torch.float32 else (1.0, 1.0)
    s = _setup(page_size, kv_dtype, window, cap, scales)
    step = _step(s, q_lens, seq_lens, scales, seed)
    step.batch.attn_backend = s.backend
    s.backend.init_forward_metadata(step.batch)
    outs = [s.backend.forward(step.q, step.k, step.v, layer, step.batch) for layer in s.layers]
    torch.testing.assert_close(outs[0], outs[1])  # the same inputs through both layers' buffers
    return outs[1], _expected(step, kv_dtype, scales, window, cap), s, step


CASES = {  # q_lens, seq_lens, page size
    "extend": ([9, 5], [9, 5], 1),
    "extend-with-cached-prefix": ([6, 3], [14, 11], 1),
    "mixed-decode-rows-in-extend": ([1, 7, 1, 4], [17, 7, 3, 12], 1),
    "decode": ([1, 1, 1], [13, 1, 30], 1),
    "page-size-16-extend": ([1, 20], [40, 33], 16),
    "page-size-16-decode": ([1, 1], [17, 64], 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_float64_attention(name: str) -> None:
    q_lens, seq_lens, ps = CASES[name]
    got, want, s, step = _run(q_lens, seq_lens, ps)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
    metadata = s.backend.forward_metadata
    assert metadata is not None and len(metadata.plans) == 1  # one plan for both layers
    plan_type = ksb.attention.DecodePlan if step.batch.forward_mode.is_decode() else ksb.attention.PrefillPlan
    assert isinstance(next(iter(metadata.plans.values())), plan_type)


def test_the_kv_write_lands_in_sglang_slots() -> None:
    _, _, s, step = _run([2, 3], [5, 3], 1)
    for layer in range(2):
        kb, vb = s.kv_pool.get_kv_buffer(layer)
        assert torch.equal(kb[step.batch.out_cache_loc], step.k) and torch.equal(vb[step.batch.out_cache_loc], step.v)


@pytest.mark.parametrize(("window", "cap"), [(4, 0.0), (-1, 3.0), (2, 5.0)])
def test_sliding_window_and_soft_cap(window: int, cap: float) -> None:
    for q_lens, seq_lens in (([1, 9, 2], [14, 9, 12]), ([1, 1], [14, 9])):
        got, want, _, _ = _run(q_lens, seq_lens, 1, window=window, cap=cap, seed=1)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pool_with_scales(kv_dtype: torch.dtype) -> None:
    for q_lens, seq_lens in (([1, 6, 1], [10, 6, 21]), ([1, 1], [7, 12])):
        got, want, _, _ = _run(q_lens, seq_lens, 1, kv_dtype=kv_dtype, seed=2)
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_cuda_graph_capture_and_replay_sequence() -> None:
    """SGLang's decode graph runner: init_cuda_graph_state, then at capture out_graph(in_capture=True) + in_graph +
    forward; at each replay out_graph + (the graph's) in_graph + forward on refilled buffers, planning nothing."""
    s = _setup(16)
    s.backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    capture = _step(s, [1, 1, 1], [5, 9, 2], (1.0, 1.0), seed=3)
    s.backend.init_forward_metadata_out_graph(capture.batch, in_capture=True)
    s.backend.init_forward_metadata_in_graph(capture.batch)
    captured = s.backend.forward_metadata
    assert captured is not None and all(p.params.max_kv_len == CONTEXT for p in captured.plans.values())
    for seed, lens in ((4, [30, 3, 17]), (5, [64, 1, 40])):
        replay = _step(s, [1, 1, 1], lens, (1.0, 1.0), seed=seed)
        s.backend.init_forward_metadata_out_graph(replay.batch)
        s.backend.init_forward_metadata_in_graph(replay.batch)
        assert s.backend.forward_metadata is captured
        got = s.backend.forward(replay.q, replay.k, replay.v, s.layers[0], replay.batch)
        torch.testing.assert_close(got.double(), _expected(replay, torch.float32, (1.0, 1.0), -1, 0.0),
                                   atol=2e-5, rtol=2e-5)
    with pytest.raises(NotImplementedError, match="decode batches only"):
        s.backend.init_forward_metadata_out_graph(_step(s, [3], [3], (1.0, 1.0), seed=6).batch, in_capture=True)


def test_unsupported_features_are_refused_by_name() -> None:
    s = _setup(1)
    step = _step(s, [1], [4], (1.0, 1.0), seed=7)
    s.backend.init_forward_metadata(step.batch)
    with pytest.raises(NotImplementedError, match="sinks"):
        s.backend.forward(step.q, step.k, step.v, s.layers[0], step.batch, sinks=torch.zeros(HEADS))
    cross = RadixAttention(HEADS, HEAD, 1.0, KV_HEADS, layer_id=0, is_cross_attention=True)
    with pytest.raises(NotImplementedError, match="cross-attention"):
        s.backend.forward(step.q, step.k, step.v, cross, step.batch)
    target_verify: Any = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY)
    with pytest.raises(NotImplementedError, match="TARGET_VERIFY"):
        s.backend.init_forward_metadata(target_verify)
