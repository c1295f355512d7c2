"""The decode step under torch.compile(fullgraph=True) on the CPU (CUDA graphs: test_engine_gpu.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kernel_switchboard_engine.cache import BlockTables  # noqa: E402
from kernel_switchboard_engine.deepseek import DeepseekModel  # noqa: E402
from kernel_switchboard_engine.families import from_hf  # noqa: E402
from kernel_switchboard_engine.graphs import DecodeRunner  # noqa: E402
from kernel_switchboard_engine.llama import LlamaModel  # noqa: E402
from kernel_switchboard_engine.sampling import SamplingParams  # noqa: E402
from kernel_switchboard_engine.scheduler import Engine  # noqa: E402
from kernel_switchboard_engine.tiny import hf_greedy, tiny_model  # noqa: E402


def _model(family: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, **kw: object
           ) -> tuple[torch.nn.Module, LlamaModel | DeepseekModel]:
    hf = tiny_model(family, seed=1, **kw)
    return hf, from_hf(hf, device=device, dtype=dtype)


def _prefilled(model: LlamaModel | DeepseekModel, prompts: list[list[int]], device: torch.device | str
               ) -> tuple[BlockTables, object]:
    from kernel_switchboard_engine.cache import build_batch

    tables = BlockTables(32, 4, device, reserved_pages=1)
    cache = model.new_cache(32, 4)
    rids = list(range(len(prompts)))
    for r, p in zip(rids, prompts):
        tables.extend(r, len(p))
    with torch.no_grad():
        model.forward(build_batch(tables, rids, prompts, ["last"] * len(rids)), cache)
    return tables, cache


def _decode_twice(model: LlamaModel | DeepseekModel, mode: str, device: torch.device | str) -> list[torch.Tensor]:
    """Logits of two decode steps of three requests through a DecodeRunner in ``mode``."""
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16]]
    tables, cache = _prefilled(model, prompts, device)
    runner = DecodeRunner(model, cache, tables, mode=mode, max_batch=4, width=8)
    outs = []
    with torch.no_grad():
        for tokens in ([20, 21, 22], [23, 24, 25]):
            for r in range(3):
                tables.extend(r, 1)
            outs.append(runner(list(range(3)), tokens).float().clone())
    return outs


@pytest.mark.parametrize("family", ["llama", "deepseek", "gemma3"])
def test_compiled_decode_step_matches_eager(family: str) -> None:
    torch._dynamo.reset()
    _, model = _model(family)
    eager = _decode_twice(model, "eager", "cpu")
    compiled = _decode_twice(model, "compile", "cpu")
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_engine_with_compiled_decode_equals_generate() -> None:
    torch._dynamo.reset()
    hf, model = _model("llama")
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    outs = Engine(model, num_pages=32, page_size=4, decode_mode="compile", max_running=2).generate(
        prompts, SamplingParams(max_new_tokens=12))
    for p, out in zip(prompts, outs):
        ref = hf_greedy(hf, p, 12)
        assert out == ref
