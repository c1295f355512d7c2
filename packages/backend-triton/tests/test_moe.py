"""Triton fused MoE against the reference: conformance cases, the expert sort, skewed and empty experts."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.reference.moe import dequantize_block
from kernel_switchboard.testing import assert_close, conformance_test
from kernel_switchboard.testing.cases.moe import expert_weights, fp8_check
from kernel_switchboard_triton import moe

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test("triton", ops=("moe.fused_moe",))


@pytest.mark.parametrize(("tokens", "top_k", "experts", "block_m"), [(7, 2, 5, 4), (1, 1, 3, 16), (40, 4, 16, 8)])
def test_sort_by_expert_places_every_assignment_once(tokens: int, top_k: int, experts: int, block_m: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts, (tokens, top_k), generator=g, dtype=torch.int32)
    ids[0, 0] = 0  # at least one used expert
    sorted_ids, block_expert = moe.sort_by_expert(ids.to(DEVICE), experts, block_m)
    sorted_ids, block_expert = sorted_ids.cpu().long(), block_expert.cpu().long()
    n = tokens * top_k
    real = sorted_ids[sorted_ids < n]
    assert torch.equal(real.sort().values, torch.arange(n)), "each assignment exactly once"
    flat = ids.reshape(-1).long()
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_ids[b * block_m:(b + 1) * block_m]
        rows = rows[rows < n]
        if e >= experts:
            assert rows.numel() == 0, "blocks past the used ones hold padding only"
        else:
            assert bool((flat[rows] == e).all()), f"block {b} mixes experts"
    assert sorted(block_expert.tolist()) == block_expert.tolist(), "blocks ordered by expert"


def _moe_inputs(tokens: int, hidden: int, inter: int, experts: int, dtype: torch.dtype, fp8: bool,
                ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g, device=DEVICE).to(dtype)
    w13, w2, s13, s2 = expert_weights(experts, hidden, inter, dtype, fp8, g, torch.device(DEVICE))
    weights = torch.rand(ids.shape, generator=g, device=DEVICE)
    return x, weights, ids.to(DEVICE), w13, w2, s13, s2


@pytest.mark.parametrize("fp8", [False, True])
def test_skewed_routing_with_empty_experts(fp8: bool) -> None:
    # every token sends both slots to experts 0 and 5 of 6; experts 1-4 get nothing
    tokens = 19
    ids = torch.tensor([[0, 5]] * tokens, dtype=torch.int32)
    args = _moe_inputs(tokens, 128 if fp8 else 48, 128 if fp8 else 40, 6, torch.bfloat16, fp8, ids)
    x, w, i, w13, w2, s13, s2 = args

    def run(backend: str = "triton") -> torch.Tensor:
        return ksb.moe.experts(x, w, i, w13, w2, w13_scale=s13, w2_scale=s2, backend=backend)

    if fp8:
        fp8_check(run)
    else:
        assert_close(run(), run("reference"), atol=3e-2, rtol=3e-2)


def _torch_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's activation quantization of x (R, C) float32 in torch: (float8_e4m3fn (R, C), float32
    scales (R, ceil(C/128))), per row and 128 columns, amax / 448."""
    rows, cols = x.shape
    groups = torch.nn.functional.pad(x, (0, -cols % 128)).view(rows, -1, 128)
    scale = groups.abs().amax(-1).clamp_min(1e-12) / 448.0
    q = (groups / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(rows, -1)[:, :cols], scale


def _quantized(x: torch.Tensor) -> torch.Tensor:
    """x (R, C) float32 through :func:`_torch_quantize` and back."""
    q, scale = _torch_quantize(x)
    return q.float() * scale.repeat_interleave(128, dim=1)[:, : x.shape[1]]


def test_quantize_groups_matches_torch() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 300, generator=g) * torch.logspace(-6, 2, 37)[:, None]  # some groups in fp8's subnormals
    x[0] = 0.0
    q, s = moe.quantize_groups(x.to(DEVICE))
    want_q, want_s = _torch_quantize(x)
    assert torch.equal(s.cpu(), want_s)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize(("hidden", "inter"), [(256, 192), (200, 128)])
def test_fp8_experts_compute_the_w8a8_math(hidden: int, inter: int) -> None:
    # float32 activations keep the intermediate unrounded, so only summation order separates the kernel from
    # the same quantize -> fp8 GEMM -> quantize -> fp8 GEMM chain in torch; sizes off multiples of 128 leave
    # partial scale groups
    tokens, experts, top_k = 24, 4, 2
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, experts, (tokens, top_k), generator=g, dtype=torch.int32)
    x, w, i, w13, w2, s13, s2 = _moe_inputs(tokens, hidden, inter, experts, torch.float32, True, ids)
    got = ksb.moe.experts(x, w, i, w13, w2, w13_scale=s13, w2_scale=s2, backend="triton").cpu()
    x, w, i, w13, w2, s13, s2 = (t.cpu() for t in (x, w, i, w13, w2, s13, s2))
    xq = _quantized(x)
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(top_k):
            e = int(i[t, j])
            gate_up = xq[t] @ dequantize_block(w13[e], s13[e]).T
            h = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            want[t] += w[t, j] * (_quantized(h[None])[0] @ dequantize_block(w2[e], s2[e]).T)
    assert ((got - want).norm() / want.norm()).item() < 1e-4


def test_float32_top1_matches_an_explicit_loop() -> None:
    tokens, hidden, inter, experts = 9, 32, 24, 3
    ids = torch.tensor([[t % experts] for t in range(tokens)], dtype=torch.int32)
    x, w, i, w13, w2, _, _ = _moe_inputs(tokens, hidden, inter, experts, torch.float32, False, ids)
    got = ksb.moe.experts(x, w, i, w13, w2, backend="triton")
    want = torch.stack([
        w[t, 0] * (torch.nn.functional.silu(x[t] @ w13[i[t, 0], :inter].T) * (x[t] @ w13[i[t, 0], inter:].T))
        @ w2[i[t, 0]].T for t in range(tokens)])
    assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "hidden", "inter", "experts", "top_k", "fp8"), [
    (4096, 4096, 14336, 8, 2, False),  # Mixtral
    (3, 4096, 14336, 8, 2, False),  # decode
    (1024, 7168, 2048, 256, 8, True),  # DeepSeek-V3
    (1, 7168, 2048, 256, 8, True),
])
def test_gpu_model_shapes(tokens: int, hidden: int, inter: int, experts: int, top_k: int, fp8: bool) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(0)
    logits = torch.randn(tokens, experts, generator=g, device=DEVICE)
    w, ids = ksb.moe.route(logits, top_k, backend="reference")
    x, _, _, w13, w2, s13, s2 = _moe_inputs(tokens, hidden, inter, experts, torch.bfloat16, fp8, ids.cpu())

    def run(backend: str = "triton") -> torch.Tensor:
        return ksb.moe.experts(x, w, ids, w13, w2, w13_scale=s13, w2_scale=s2, backend=backend)

    if fp8:  # activations quantized per row and 128 columns: the norm-based fp8 check
        fp8_check(run)
        return
    got, want = run().float(), run("reference").float()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel
