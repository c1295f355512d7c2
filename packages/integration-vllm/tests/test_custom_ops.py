"""RMSNorm, SiluAndMul and RotaryEmbedding through vLLM's out-of-tree custom-op registration: vLLM's own layer
classes instantiate the switchboard's subclasses, whose every forward path matches vLLM's native formulas; the
opt-in environment variable; and a tiny Llama served by vLLM with all three and KSB attention."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM adapter's tests run against the real vLLM (nox -s tests-vllm)")

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.custom_op import op_registry_oot  # noqa: E402
from vllm.model_executor.layers.activation import SiluAndMul  # noqa: E402
from vllm.model_executor.layers.layernorm import RMSNorm  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding  # noqa: E402

import kernel_switchboard as ksb  # noqa: E402
from kernel_switchboard_vllm import custom_ops  # noqa: E402
from kernel_switchboard_vllm.registration import CUSTOM_OPS, register_custom_ops, requested_custom_ops  # noqa: E402


@pytest.fixture
def registered_ops() -> Iterator[list[str]]:
    """The three ops registered for one test, then removed from vLLM's registry again."""
    before = dict(op_registry_oot)
    try:
        yield register_custom_ops("all")
    finally:
        for name in CUSTOM_OPS.values():
            if name not in before:
                op_registry_oot.pop(name, None)


def test_requested_ops_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KSB_VLLM_CUSTOM_OPS", raising=False)
    assert requested_custom_ops() == []
    monkeypatch.setenv("KSB_VLLM_CUSTOM_OPS", "rms_norm, rope")
    assert requested_custom_ops() == ["rms_norm", "rope"]
    assert requested_custom_ops("all") == ["rms_norm", "silu_and_mul", "rope"]
    with pytest.raises(ksb.InvalidArgumentError, match=r"KSB_VLLM_CUSTOM_OPS='gelu'.*rms_norm"):
        requested_custom_ops("gelu")


def test_vllm_layers_become_the_switchboard_ones(registered_ops: list[str]) -> None:
    assert registered_ops == ["rms_norm", "silu_and_mul", "rope"]
    with set_current_vllm_config(VllmConfig()):
        assert type(RMSNorm(64)) is custom_ops.SwitchboardRMSNorm
        assert type(SiluAndMul()) is custom_ops.SwitchboardSiluAndMul
        assert type(RotaryEmbedding(32, 32, 128, 10000.0, True, torch.float32)) is custom_ops.SwitchboardRotaryEmbedding
    assert register_custom_ops("all") == registered_ops  # idempotent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_the_formula(dtype: torch.dtype, registered_ops: list[str]) -> None:
    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(64, eps=1e-5)
    norm.weight.data = torch.randn(64)
    x, residual = torch.randn(7, 64).to(dtype), torch.randn(7, 64).to(dtype)

    def expected(h: torch.Tensor) -> torch.Tensor:
        h = h.double()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()).to(dtype)

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for forward in (norm.forward, norm.forward_native, norm.forward_cpu, norm.forward_cuda):
        torch.testing.assert_close(forward(x), expected(x), atol=tol, rtol=tol)
        out, res = forward(x.clone(), residual.clone())
        total = (x.float() + residual.float()).to(dtype)
        torch.testing.assert_close(res, total, atol=tol, rtol=tol)
        torch.testing.assert_close(out, expected(total), atol=tol, rtol=tol)


def test_silu_and_mul_matches_the_formula(registered_ops: list[str]) -> None:
    with set_current_vllm_config(VllmConfig()):
        act = SiluAndMul()
    x = torch.randn(5, 3, 96)
    want = torch.nn.functional.silu(x[..., :48]) * x[..., 48:]
    for forward in (act.forward, act.forward_native, act.forward_cpu, act.forward_cuda):
        torch.testing.assert_close(forward(x), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("neox", "rotary_dim"), [(True, 32), (False, 32), (True, 16)])
def test_rope_matches_vllms_native_rope(neox: bool, rotary_dim: int, registered_ops: list[str]) -> None:
    with set_current_vllm_config(VllmConfig()):
        rope = RotaryEmbedding(32, rotary_dim, 128, 10000.0, neox, torch.float32)
    positions = torch.tensor([0, 5, 17, 100, 3])
    qkv = torch.randn(5, (4 + 2 + 2) * 32)
    query, key = qkv[:, :128], qkv[:, 128:192]  # views into one buffer, as vLLM splits its qkv projection
    want_q, want_k = RotaryEmbedding.forward_static(positions, query.clone(), key.clone(), 32, rotary_dim,
                                                    rope.cos_sin_cache, neox)
    got_q, got_k = rope.forward(positions, query, key)
    assert got_q.data_ptr() == query.data_ptr(), "rotated in place, as vLLM's kernel does"
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)


def test_rms_norm_over_part_of_the_row_keeps_vllms_forward(registered_ops: list[str]) -> None:
    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(64, var_hidden_size=32)
    x = torch.randn(3, 64)
    want = (x * torch.rsqrt(x[:, :32].pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(norm.forward(x), want, atol=1e-5, rtol=1e-5)


def test_tiny_llama_with_switchboard_ops_generates_what_vllm_does(llama_dir: Path, registered_ops: list[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import LLM, SamplingParams
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    import kernel_switchboard_vllm

    def generate() -> list[list[int]]:
        from vllm.v1.attention.selector import _cached_get_attn_backend

        _cached_get_attn_backend.cache_clear()  # the backend slot may have been pointed elsewhere since the last engine
        llm = LLM(model=str(llama_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=128,
                  enforce_eager=True, max_num_seqs=2, block_size=32, gpu_memory_utilization=0.05,
                  kv_cache_memory_bytes=8 * 2**20, seed=0)
        outs = llm.generate([{"prompt_token_ids": list(range(3, 40))}, {"prompt_token_ids": [7, 8, 9]}],
                            SamplingParams(max_tokens=10, temperature=0.0, detokenize=False), use_tqdm=False)
        del llm
        return [list(o.outputs[0].token_ids) for o in outs]

    calls: collections.Counter[str] = collections.Counter()
    for cls in (custom_ops.SwitchboardRMSNorm, custom_ops.SwitchboardSiluAndMul, custom_ops.SwitchboardRotaryEmbedding):
        def counted(self: object, *args: object, _f: object = cls._ksb, _n: str = cls.__name__) -> object:
            calls[_n] += 1
            return _f(self, *args)  # type: ignore[operator]
        for name in ("forward_native", "forward_cuda", "forward_cpu"):
            monkeypatch.setattr(cls, name, counted)
    register_backend(AttentionBackendEnum.CPU_ATTN, kernel_switchboard_vllm.BACKEND_PATH)
    try:
        got = generate()
    finally:
        AttentionBackendEnum.CPU_ATTN.clear_override()
    assert set(calls) == {"SwitchboardRMSNorm", "SwitchboardSiluAndMul", "SwitchboardRotaryEmbedding"}, calls
    for name in CUSTOM_OPS.values():
        op_registry_oot.pop(name)
    assert got == generate()  # vLLM's own layers and attention
