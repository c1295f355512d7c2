"""Triton RoPE against independent formulations: NeoX halves, GPT-J pairs as complex rotation, caches."""

from __future__ import annotations

import functools

import pytest
import torch
import triton
import triton.language as tl

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, conformance_test, tolerance
from kernel_switchboard_triton import rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test("triton", ops=("rope.apply", "rope.apply_cos_sin_cache"))


@triton.jit
def _fma_residual_kernel(x_ptr, out_ptr):
    x = tl.load(x_ptr)
    tl.store(out_ptr, tl.fma(x, x, -(x * x)))


@functools.cache
def _interpreter_fma_rounds_twice() -> bool:
    """Triton 3.7's interpreter computes ``tl.fma`` as a multiply then an add (two roundings; 3.9's rounds once).
    The kernel's range reduction of float32 angles is exact only with a fused fma (as on every GPU): with two
    roundings long positions come out ~2e-4 off, beyond float32's tolerance."""
    if not triton_interpreting():
        return False
    out = torch.empty(1)
    _fma_residual_kernel[(1,)](torch.tensor([1 + 2**-12]), out)  # x * x rounds off 2**-24, which a fused fma keeps
    return out.item() == 0.0


def _skip_float32_angles_without_fused_fma() -> None:
    if _interpreter_fma_rounds_twice():
        pytest.skip("this Triton's interpreter rounds tl.fma twice; the float32 range reduction needs a fused fma")


def _inv_freq(rotary_dim: int, theta: float = 1e4) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def _want(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool,
          fp32_angle: bool = True) -> torch.Tensor:
    """Rotation in float64: GPT-J as complex multiplication of (2i, 2i+1) pairs, NeoX on halves.

    ``fp32_angle``: the angle is the float32 product pos * inv_freq (what a kernel given float32
    inv_freq computes); else exact float64 angles (what a float64-built cos/sin cache holds).
    """
    r = 2 * inv_freq.numel()
    if fp32_angle:
        ang = (pos.cpu().float()[:, None] * inv_freq.cpu().float()[None, :]).double()  # (T, r/2)
    else:
        ang = pos.double().cpu()[:, None] * inv_freq.double().cpu()[None, :]
    xr = x[..., :r].double().cpu()
    if interleaved:
        z = torch.view_as_complex(xr.reshape(*xr.shape[:-1], r // 2, 2).contiguous())
        rot = torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)[:, None, :]).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2 :]
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
        rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return torch.cat([rot, x[..., r:].double().cpu()], dim=-1).to(x.dtype)


def _cos_sin_cache(inv_freq: torch.Tensor, max_pos: int) -> torch.Tensor:
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 64), (80, 32)])
@pytest.mark.parametrize("form", ["inv_freq", "cache"])
def test_matches_formulation(interleaved: bool, inplace: bool, dtype: torch.dtype, head_dim: int, rotary_dim: int,
                             form: str) -> None:
    if form == "inv_freq" and dtype == torch.float32:
        _skip_float32_angles_without_fused_fma()
    g = torch.Generator().manual_seed(head_dim + rotary_dim)
    tokens, hq, hk = 3, 5, 2
    q = torch.randn(tokens, hq, head_dim, generator=g).to(DEVICE, dtype)
    k = torch.randn(tokens, hk, head_dim, generator=g).to(DEVICE, dtype)
    pos = torch.tensor([0, 7, 4093], dtype=torch.int64, device=DEVICE)
    inv = _inv_freq(rotary_dim)
    q0, k0 = q.clone(), k.clone()
    if form == "inv_freq":
        qo, ko = rope.apply(q, k, pos, inv.float().to(DEVICE), interleaved, inplace)
    else:
        qo, ko = rope.apply_cos_sin_cache(q, k, pos.int(), _cos_sin_cache(inv, 4096).to(DEVICE), interleaved, inplace)
    atol, rtol = tolerance(dtype)
    fp32_angle = form == "inv_freq"
    assert_close(qo.cpu(), _want(q0, pos, inv, interleaved, fp32_angle), atol=atol, rtol=rtol)
    assert_close(ko.cpu(), _want(k0, pos, inv, interleaved, fp32_angle), atol=atol, rtol=rtol)
    if inplace:
        assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
    else:
        assert torch.equal(q, q0) and torch.equal(k, k0), "out of place must not touch its inputs"


def test_long_context_positions_keep_float32_accuracy() -> None:
    _skip_float32_angles_without_fused_fma()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 2, 64, generator=g).to(DEVICE)
    pos = torch.tensor([65535, 131071, 500000, 1048575], device=DEVICE)
    inv = _inv_freq(64, 5e5)
    qo, _ = rope.apply(q, None, pos, inv.float().to(DEVICE), False, False)
    assert_close(qo.cpu(), _want(q, pos, inv, False), atol=2e-5, rtol=2e-5)


def test_strided_views_of_a_fused_qkv_tensor() -> None:
    # q and k are views into one (T, Hq + 2 Hk, D) buffer: token stride 8 * 32
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(4, 8, 32, generator=g).to(DEVICE)
    q, k = qkv[:, :4], qkv[:, 4:6]
    pos = torch.tensor([1, 2, 3, 100], device=DEVICE)
    inv = _inv_freq(32)
    want_q, want_k, v0 = _want(q, pos, inv, False), _want(k, pos, inv, False), qkv[:, 6:].clone()
    rope.apply(q, k, pos, inv.float().to(DEVICE), False, True)
    assert_close(q.cpu(), want_q, atol=1e-5, rtol=1e-5)
    assert_close(k.cpu(), want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, 6:], v0), "the kernel wrote outside q and k"


def test_query_only_and_empty() -> None:
    q = torch.randn(2, 3, 16, device=DEVICE)
    qo, ko = rope.apply(q, None, torch.tensor([5, 6], device=DEVICE), _inv_freq(16).float().to(DEVICE), False, False)
    assert ko is None
    assert_close(qo.cpu(), _want(q, torch.tensor([5, 6]), _inv_freq(16), False), atol=1e-5, rtol=1e-5)
    e = torch.empty(0, 3, 16, device=DEVICE)
    assert rope.apply(e, e.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE),
                      _inv_freq(16).float().to(DEVICE), False, False)[0].shape == (0, 3, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_gpu_llama_shape(interleaved: bool) -> None:
    q = torch.randn(8192, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(8192, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    pos = torch.randint(0, 8192, (8192,), device=DEVICE)
    inv = _inv_freq(128, 5e5)
    qo, ko = rope.apply(q, k, pos, inv.float().to(DEVICE), interleaved, False)
    assert_close(qo.cpu(), _want(q, pos, inv, interleaved), atol=3e-2, rtol=2e-2)
    assert_close(ko.cpu(), _want(k, pos, inv, interleaved), atol=3e-2, rtol=2e-2)
