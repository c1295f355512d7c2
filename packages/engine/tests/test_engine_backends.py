"""The same engine on every available backend gives the reference backend's results within tolerance.

On a CPU without ``TRITON_INTERPRET=1`` the Triton backend cannot run here, so one test re-runs
this file in a subprocess with the interpreter on (tiny shapes; the Triton attention kernels take
fp16/bf16 and head dims 64/128/192/256, MLA 512 + 64, so the test models use those).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from kernel_switchboard.availability import triton_interpreting  # noqa: E402
from kernel_switchboard.dispatch import use  # noqa: E402
from kernel_switchboard.registry import registry  # noqa: E402
from kernel_switchboard_engine.cache import BlockTables, build_batch  # noqa: E402
from kernel_switchboard_engine.calls import OpTracer  # noqa: E402
from kernel_switchboard_engine.deepseek import DeepseekModel  # noqa: E402
from kernel_switchboard_engine.llama import LlamaModel  # noqa: E402
from kernel_switchboard_engine.tiny import tiny_model  # noqa: E402
from kernel_switchboard_engine.weights import deepseek_from_hf, llama_from_hf  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.float16


def _model(family: str) -> LlamaModel | DeepseekModel:
    if family == "llama":
        return LlamaModel(llama_from_hf(tiny_model("llama", seed=1, head_dim=64), device=DEVICE, dtype=DTYPE))
    hf = tiny_model("deepseek", seed=1, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                    num_attention_heads=2, num_key_value_heads=2)
    return DeepseekModel(deepseek_from_hf(hf, device=DEVICE, dtype=DTYPE))


@torch.no_grad()
def _run(model: LlamaModel | DeepseekModel, backends: tuple[str, ...]) -> tuple[list[torch.Tensor], OpTracer]:
    """Prefill of two prompts, a mixed step, then two decode steps; every step's logits."""
    tables = BlockTables(16, 4, DEVICE)
    cache = model.new_cache(16, 4)
    tracer = OpTracer()
    steps = [(["a", "b"], [[1, 2, 3, 4, 5], [6, 7, 8]], ["all", "all"]),
             (["a", "b", "c"], [[9], [10], [11, 12, 13, 14]], ["last", "last", "all"]),
             (["a", "b", "c"], [[15], [16], [17]], ["last"] * 3),
             (["a", "b", "c"], [[18], [19], [20]], ["last"] * 3)]
    outs = []
    with use(*backends), tracer.active():
        for rids, toks, wants in steps:
            for r, t in zip(rids, toks):
                tables.extend(r, len(t))
            outs.append(model.forward(build_batch(tables, rids, toks, wants), cache).float())
    return outs, tracer


def _other_backends() -> list[str]:
    return [name for name, b in registry.all_backends().items() if name != "reference" and b.available]


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_every_available_backend_matches_reference(family: str) -> None:
    model = _model(family)
    want, _ = _run(model, ("reference",))
    exercised = []
    for name in _other_backends():
        got, tracer = _run(model, (name, "reference"))
        served = sorted({op for op, rec in tracer.records.items() for k in rec.selections if k.startswith(name + ":")})
        if not served:
            continue  # nothing of this backend runs on this device (e.g. Triton on a CPU without the interpreter)
        exercised.append(name)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=3e-2, rtol=1e-2, msg=lambda m, n=name, s=served: f"{n} ({s}): {m}")
        if name == "triton":  # the attention kernels must really have run, not only the norms
            needed = {"attention.prefill", "attention.decode"} if family == "llama" else {
                "attention.prefill_ragged", "attention.mla_decode"}
            assert needed <= set(served), served
    if triton_interpreting():
        assert "triton" in exercised


@pytest.mark.slow
@pytest.mark.skipif(triton_interpreting() or torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="Triton already runs in this process (interpreter or GPU), or is not installed")
def test_triton_interpreter_in_subprocess() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "every_available_backend"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
