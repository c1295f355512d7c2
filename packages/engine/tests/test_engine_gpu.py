"""The engine on a GPU: the decode step captured in a CUDA graph through attention.plan_decode/run,
the engine end to end, and the demo. Random weights from specs, so transformers is optional here."""

from __future__ import annotations

import pytest
import torch

from kernel_switchboard_engine.cache import BlockTables, build_batch
from kernel_switchboard_engine.deepseek import DeepseekModel
from kernel_switchboard_engine.graphs import DecodeRunner, missing_capturable
from kernel_switchboard_engine.llama import LlamaModel
from kernel_switchboard_engine.sampling import SamplingParams
from kernel_switchboard_engine.scheduler import Engine
from kernel_switchboard_engine.synthetic import DEEPSEEK_PRESETS, LLAMA_PRESETS, random_deepseek, random_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = "cuda"


def _model(family: str, dtype: torch.dtype, size: str = "small") -> LlamaModel | DeepseekModel:
    if family == "llama":
        return LlamaModel(random_llama(LLAMA_PRESETS[size], 1, CUDA, dtype))
    return DeepseekModel(random_deepseek(DEEPSEEK_PRESETS[size], 1, CUDA, dtype))


def _decode_twice(model: LlamaModel | DeepseekModel, mode: str) -> tuple[list[torch.Tensor], DecodeRunner]:
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]]
    tables = BlockTables(32, 16, CUDA, reserved_pages=1)
    cache = model.new_cache(32, 16)
    rids = list(range(3))
    with torch.no_grad():
        for r, p in zip(rids, prompts):
            tables.extend(r, len(p))
        model.forward(build_batch(tables, rids, prompts, ["last"] * 3), cache)
        runner = DecodeRunner(model, cache, tables, mode=mode, max_batch=4, width=8)
        outs = []
        for tokens in ([30, 31, 32], [33, 34, 35], [36, 37, 38]):
            for r in rids:
                tables.extend(r, 1)
            outs.append(runner(rids, tokens).float().clone())
    return outs, runner


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_cuda_graph_decode_matches_eager(family: str) -> None:
    model = _model(family, torch.bfloat16)
    missing = missing_capturable(model)
    if missing:  # e.g. the reference MoE / grouped GEMM read back from the device
        pytest.skip(f"no available CUDA-graph-capturable kernel for {missing}")
    eager, _ = _decode_twice(model, "eager")
    graphed, runner = _decode_twice(model, "cuda_graph")
    for a, b in zip(graphed, eager):  # bf16, possibly different (capturable) kernels: loose, but a wrong page is O(1)
        torch.testing.assert_close(a, b, rtol=5e-2, atol=1e-1)
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 2 / 3
    plans = runner.plans()
    assert plans and all("cuda_graph" in p.problem.features for p in plans)
    assert all(p.selection.op == ("attention.decode" if family == "llama" else "attention.mla_decode") for p in plans)


def test_engine_cuda_graph_greedy_equals_eager_engine() -> None:
    model = _model("llama", torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (5, 40, 17, 3)]
    params = SamplingParams(max_new_tokens=32)
    eager = Engine(model, num_pages=64, page_size=16, max_running=4).generate(prompts, params)
    graphed_engine = Engine(model, num_pages=64, page_size=16, max_running=4, decode_mode="cuda_graph")
    graphed_engine.warmup()
    assert graphed_engine.generate(prompts, params) == eager


def test_engine_on_gpu_equals_transformers_generate() -> None:
    pytest.importorskip("transformers")
    from kernel_switchboard_engine.tiny import hf_greedy, tiny_model
    from kernel_switchboard_engine.weights import llama_from_hf

    hf = tiny_model("llama", seed=1)
    model = LlamaModel(llama_from_hf(hf, device=CUDA))
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [7] * 11]
    outs = Engine(model, num_pages=64, page_size=4, decode_mode="cuda_graph", max_running=4).generate(
        prompts, SamplingParams(max_new_tokens=32))
    assert outs == [hf_greedy(hf, p, 32) for p in prompts]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "mixtral", "gemma2", "gemma3", "deepseek"])
def test_demo_on_gpu(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's default GPU run (bf16, CUDA-graph decode where capturable) of every family, checked against
    transformers (see demo._check for the bf16 tolerance)."""
    pytest.importorskip("transformers")
    from kernel_switchboard_engine.demo import main

    code = main(["--model", family, "--requests", "4", "--max-new-tokens", "8", "--speculative", "2", "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "generated tokens/s" in out and "cuda" in out
