"""TensorRT-LLM kernels (through flashinfer-python) on a GPU against the reference: a sweep of the
declared decode space (layouts, page sizes, GQA groups, head dims, fp8 KV, windows, empty requests),
CUDA-graph replay of a plan, the fused MoE in bf16/fp16 and DeepSeek fp8 block scales, and the
first call after a build in a fresh process. Each new XQA configuration JIT-compiles (~10 s); the
fused-MoE module compiles once (minutes on a first run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.reference import moe as ref_moe
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case
from kernel_switchboard.testing.cases.moe import expert_weights
from kernel_switchboard_trtllm import jit

pytestmark = pytest.mark.gpu

F16, BF16, E4M3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn

#: (spec, why it is in the sweep); kv_lens include an empty request and ones that end mid-page
SWEEP = [
    (AttnSpec(BF16, "HND", 64, 32, 8, 128, kv_lens=(2048, 0, 1, 700)), "Llama-3-8B, page 64 (benchmark shape)"),
    (AttnSpec(BF16, "HND", 16, 32, 8, 128, kv_lens=(1000, 17, 0)), "page 16"),
    (AttnSpec(F16, "NHD", 32, 32, 4, 128, kv_lens=(513, 64, 1), window=100), "NHD, page 32, window"),
    (AttnSpec(F16, "HND", 128, 16, 1, 128, kv_lens=(3000, 5)), "MQA group 16, page 128"),
    (AttnSpec(BF16, "NHD", 16, 64, 1, 128, kv_lens=(900, 33)), "group 64, the declared maximum at d128"),
    (AttnSpec(BF16, "HND", 16, 8, 8, 256, kv_lens=(1200, 2)), "head_dim 256, no GQA"),
    (AttnSpec(F16, "NHD", 16, 8, 4, 64, kv_lens=(77, 0, 300)), "head_dim 64"),
    (AttnSpec(BF16, "HND", 64, 32, 8, 128, kv_lens=(2048, 1, 0, 999), kv_dtype=E4M3), "fp8 e4m3 KV (Hopper fp8 kernel)"),
    (AttnSpec(BF16, "NHD", 16, 32, 8, 128, kv_lens=(600, 3), window=31, kv_dtype=E4M3), "fp8 KV + window"),
]


@pytest.fixture(scope="module")
def device() -> torch.device:
    backend = ksb.registry.all_backends()["trtllm"]
    if not backend.available or any(k.unavailable for k in backend.kernels if "flashinfer" in k.name
                                    and k.op == "attention.decode"):
        pytest.skip(f"trtllm backend unavailable: {backend.unavailable}")
    return torch.device("cuda")


@pytest.mark.parametrize(("spec", "why"), SWEEP, ids=[w for _, w in SWEEP])
def test_decode_sweep(device: torch.device, spec: AttnSpec, why: str) -> None:
    # XQA declares reads_stale_slots: the unwritten slots hold a finite value, which any weight on it would show
    case = decode_case(spec, device, seed=11)
    kernel = next(k for k in ksb.registry.all_backends()["trtllm"].kernels if k.op == "attention.decode")
    case.compare(kernel.id, computes_in=spec.kv_dtype, finite_stale_slots=kernel.reads_stale_slots)


def test_decode_plan_replays_in_a_cuda_graph(device: torch.device) -> None:
    spec = SWEEP[0][0]
    case = decode_case(spec, device, seed=12)
    q, cache, table = case.args
    plan = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=BF16, layout="HND",
                                     page_size=64, backend="trtllm")
    out = torch.empty_like(q)
    plan.run(q, cache, out=out)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, cache, out=out)
    q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = ksb.attention.decode(q, cache, table, backend="reference")
    assert_close(out, want, atol=2e-2, rtol=2e-2, what="graph replay")


def _moe_case(tokens: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype, fp8: bool,
              device: torch.device):
    g = torch.Generator(device=device).manual_seed(5)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    w13, w2, s13, s2 = expert_weights(experts, hidden, inter, dtype, fp8, g, device)
    logits = torch.randn(tokens, experts, generator=g, device=device)
    return x, logits, w13, w2, s13, s2


@pytest.mark.parametrize(("tokens", "hidden", "inter", "experts", "top_k", "dtype", "fp8"), [
    (96, 4096, 14336, 8, 2, BF16, False),  # Mixtral-8x7B
    (33, 2048, 768, 128, 8, F16, False),  # Qwen3-30B-A3B
    (40, 7168, 2048, 256, 8, BF16, True),  # DeepSeek-V3, fp8 128x128 block scales
], ids=["mixtral-bf16", "qwen3-fp16", "deepseek-fp8"])
@pytest.mark.skipif(jit.moe_module_missing(), reason=jit.MOE_NOT_BUILT)
def test_fused_moe(device: torch.device, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
                   dtype: torch.dtype, fp8: bool) -> None:
    x, logits, w13, w2, s13, s2 = _moe_case(tokens, hidden, inter, experts, top_k, dtype, fp8, device)
    kw = {"w13_scale": s13, "w2_scale": s2} if fp8 else {}
    got = ksb.moe.fused_moe(x, logits, w13, w2, top_k, backend="trtllm", route_backend="reference", **kw)
    weights, ids = ref_moe.route(logits, top_k, "softmax", True, None, None, None, 1.0)
    want = ref_moe.fused_moe(x, weights, ids, w13, w2, s13, s2)
    atol, rtol = (1.5e-1, 1e-1) if fp8 else ((3e-2, 3e-2) if dtype == BF16 else (5e-3, 5e-3))
    assert_close(got, want, atol=atol, rtol=rtol, what=f"fused_moe {dtype} fp8={fp8}")


_FRESH = textwrap.dedent("""
    import json, sys, time, torch
    import kernel_switchboard as ksb
    from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case
    spec = AttnSpec(torch.bfloat16, "HND", 64, 32, 8, 128, kv_lens=(2048,) * 16)
    q, cache, table = decode_case(spec, "cuda", seed=1).args
    ksb.registry.all_backends()  # plugin discovery (no vendor import) is not the first call
    sel = ksb.explain("attention.decode", q, cache, table, backend="trtllm")
    needs = next(c.needs_build for c in sel.candidates if c.kernel.backend == "trtllm")
    if sys.argv[1] == "build":
        sel.kernel.build(sel.problem)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ksb.attention.decode(q, cache, table, backend="trtllm")
    torch.cuda.synchronize()
    print(json.dumps({"needs_build": needs, "first_call_s": time.perf_counter() - t0, "explain": str(sel)}))
""")


def _fresh(mode: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _FRESH, mode], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _libraries(root: Path) -> dict[str, int]:
    """Every compiled module under ``root`` with its modification time (a rebuild rewrites it)."""
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*.so")}


def test_build_then_first_call_compiles_nothing_and_explain_says_when_not_built(device: torch.device,
                                                                                 tmp_path: Path) -> None:
    """``build`` compiles the module in a first process; a second process's first call loads it and compiles nothing
    (no library under the JIT cache is added or rewritten). The first-call times are printed, not asserted: the
    first-call benchmark (``switchboard bench --preset first-call``) measures them."""
    # an empty flashinfer JIT cache, and no record of a module built (the switchboard's records of the modules this
    # process's earlier tests compiled live in its own cache directory)
    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "flashinfer"), "KSB_CACHE_DIR": str(tmp_path / "ksb")}
    cold = _fresh("build", env)
    assert cold["needs_build"] is True and "not compiled yet" in cold["explain"]
    built = _libraries(tmp_path / "flashinfer")
    assert built, "build compiled no module into the JIT cache"
    warm = _fresh("run", env)
    assert warm["needs_build"] is False
    assert _libraries(tmp_path / "flashinfer") == built
    print(f"first call: {cold['first_call_s']:.2f} s after build in that process, {warm['first_call_s']:.2f} s in a "
          "fresh one")
