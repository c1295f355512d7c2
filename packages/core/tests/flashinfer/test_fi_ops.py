"""``kernel_switchboard.flashinfer`` page, norm, rope, activation and gemm functions against float64 torch
definitions written here."""

from __future__ import annotations

import math

import pytest
import torch
from fi_oracle import close, make_paged, qo_indptr

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

# -- page ------------------------------------------------------------------------------------------------------


def test_get_seq_lens_and_batch_indices_positions() -> None:
    indptr = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    last = torch.tensor([2, 1, 16], dtype=torch.int32)
    assert flashinfer.get_seq_lens(indptr, last, 16).tolist() == [34, 1, 32]
    append = qo_indptr([2, 0, 3])
    seq = torch.tensor([34, 1, 32], dtype=torch.int32)
    b, p = flashinfer.get_batch_indices_positions(append, seq, 7)  # 2 padding entries past append[-1]
    assert b.dtype == p.dtype == torch.int32
    assert b.tolist() == [0, 0, 2, 2, 2, -1, -1]
    assert p.tolist() == [32, 33, 29, 30, 31, 0, 0]
    b_buf, p_buf = torch.empty(7, dtype=torch.int32), torch.empty(7, dtype=torch.int32)
    got = flashinfer.get_batch_indices_positions(append, seq, 7, b_buf, p_buf)
    assert got[0] is b_buf and got[1] is p_buf and b_buf.tolist() == b.tolist()


@pytest.mark.parametrize(("layout", "dtype"), [("NHD", torch.float32), ("HND", torch.float8_e4m3fn)])
def test_append_paged_kv_cache(layout: str, dtype: torch.dtype) -> None:
    kv_lens, new = [20, 3, 9], [4, 3, 1]
    paged = make_paged(kv_lens, 16, 2, 64, layout=layout, dtype=dtype)
    k_new = torch.randn(sum(new), 2, 64)
    v_new = torch.randn(sum(new), 2, 64)
    append = qo_indptr(new)
    b, p = flashinfer.get_batch_indices_positions(append, flashinfer.get_seq_lens(paged.indptr, paged.last_page_len,
                                                                                  16), sum(new))
    kv = paged.combined()
    flashinfer.append_paged_kv_cache(k_new.to(dtype) if dtype == torch.float32 else k_new, v_new, b, p, kv,
                                     paged.indices, paged.indptr, paged.last_page_len, kv_layout=layout)
    kv_nhd = kv if layout == "NHD" else kv.transpose(2, 3)
    for t in range(sum(new)):
        req, pos = int(b[t]), int(p[t])
        page = int(paged.indices[paged.indptr[req] + pos // 16])
        stored_k, stored_v = kv_nhd[page, 0, pos % 16], kv_nhd[page, 1, pos % 16]
        assert torch.equal(stored_k.float(), k_new[t].to(dtype).float())
        assert torch.equal(stored_v.float(), v_new[t].to(dtype).float())


def test_append_paged_mla_kv_cache() -> None:
    ckv, kpe = torch.zeros(6, 16, 32), torch.zeros(6, 16, 8)
    indptr, indices = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([4, 1, 5], dtype=torch.int32)
    last = torch.tensor([3, 16], dtype=torch.int32)
    new_ckv, new_kpe = torch.randn(2, 32), torch.randn(2, 8)
    b = torch.tensor([0, 1], dtype=torch.int32)
    p = torch.tensor([18, 15], dtype=torch.int32)
    flashinfer.append_paged_mla_kv_cache(new_ckv, new_kpe, b, p, ckv, kpe, indices, indptr, last)
    assert torch.equal(ckv[1, 2], new_ckv[0]) and torch.equal(kpe[1, 2], new_kpe[0])
    assert torch.equal(ckv[5, 15], new_ckv[1]) and torch.equal(kpe[5, 15], new_kpe[1])


# -- norm ------------------------------------------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    x = x.double()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1 + w.double()) if gemma else w.double())


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(7, 64), (3, 4, 128)])
def test_rmsnorm(gemma: bool, shape: tuple[int, ...]) -> None:
    x, w = torch.randn(*shape), torch.randn(shape[-1])
    fn = flashinfer.gemma_rmsnorm if gemma else flashinfer.rmsnorm
    close(fn(x, w, eps=1e-5), _rms(x, w, 1e-5, gemma), torch.float32)
    out = torch.empty_like(x)
    assert fn(x, w, 1e-5, out=out) is out
    close(out, _rms(x, w, 1e-5, gemma), torch.float32)


@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm(gemma: bool) -> None:
    x, r, w = torch.randn(6, 96).bfloat16(), torch.randn(6, 96).bfloat16(), torch.randn(96).bfloat16()
    total = x.double() + r.double()
    (flashinfer.gemma_fused_add_rmsnorm if gemma else flashinfer.fused_add_rmsnorm)(x, r, w, 1e-6)
    close(r, total, torch.bfloat16)
    close(x, _rms(total, w, 1e-6, gemma), torch.bfloat16)


def test_layernorm_bf16_input_fp32_params() -> None:
    x, g, b = torch.randn(5, 128).bfloat16(), torch.randn(128), torch.randn(128)
    xd = x.double()
    want = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-6) * g + b
    got = flashinfer.layernorm(x, g, b, 1e-6)
    assert got.dtype == torch.bfloat16
    close(got, want, torch.bfloat16)


# -- rope ------------------------------------------------------------------------------------------------------


def _inv_freq(rotary_dim: int, theta: float, scale: float = 1.0, llama31: tuple[float, float, int] | None = None
              ) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    if llama31 is None:
        return inv / scale
    low, high, old = llama31
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - low) / (high - low)
    out = torch.where(wavelen > old / low, inv / scale, inv)
    mid = (wavelen <= old / low) & (wavelen >= old / high)
    return torch.where(mid, (1 - smooth) * inv / scale + smooth * inv, out)


def _rotate(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, interleave: bool) -> torch.Tensor:
    rd = 2 * inv.numel()
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x = x.double().clone()
    r = x[..., :rd]
    if interleave:
        a, b = r[..., 0::2].clone(), r[..., 1::2].clone()
        r[..., 0::2], r[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = r[..., : rd // 2].clone(), r[..., rd // 2:].clone()
        r[..., : rd // 2], r[..., rd // 2:] = a * cos - b * sin, b * cos + a * sin
    return x


@pytest.mark.parametrize(("interleave", "rotary_dim", "rope_scale"), [(False, None, 1.0), (True, 32, 2.0)])
def test_apply_rope_forms(interleave: bool, rotary_dim: int | None, rope_scale: float) -> None:
    qo = [3, 0, 5]
    q, k = torch.randn(8, 4, 64), torch.randn(8, 2, 64)
    indptr, offsets = qo_indptr(qo), torch.tensor([10, 0, 100], dtype=torch.int32)
    pos = torch.tensor([10, 11, 12, 100, 101, 102, 103, 104])
    inv = _inv_freq(rotary_dim or 64, 1e4, rope_scale)
    want_q, want_k = _rotate(q, pos, inv, interleave), _rotate(k, pos, inv, interleave)
    kw = {"rotary_dim": rotary_dim, "interleave": interleave, "rope_scale": rope_scale}
    got_q, got_k = flashinfer.apply_rope(q, k, indptr, offsets, **kw)
    close(got_q, want_q, torch.float32)
    close(got_k, want_k, torch.float32)
    got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos.to(torch.int32), **kw)
    close(got_q, want_q, torch.float32)
    q2, k2 = q.clone(), k.clone()
    flashinfer.apply_rope_inplace(q2, k2, indptr, offsets, **kw)
    close(q2, want_q, torch.float32)
    close(k2, want_k, torch.float32)
    q2, k2 = q.clone(), k.clone()
    flashinfer.apply_rope_pos_ids_inplace(q2, k2, pos, **kw)
    close(q2, want_q, torch.float32)


def test_apply_llama31_rope_forms() -> None:
    """Positions to a few thousand: the angle ``pos * inv_freq`` is taken in float32 (by FlashInfer too), so farther
    positions differ from a float64 angle by ~pos * 2^-24."""
    q, k = torch.randn(6, 4, 128), torch.randn(6, 1, 128)
    pos = torch.tensor([0, 1, 900, 1500, 2500, 3000])
    inv = _inv_freq(128, 5e5, 8.0, (1.0, 4.0, 8192))
    want_q, want_k = _rotate(q, pos, inv, False), _rotate(k, pos, inv, False)
    got_q, got_k = flashinfer.apply_llama31_rope_pos_ids(q, k, pos)
    close(got_q, want_q, torch.float32, 5e-4)
    close(got_k, want_k, torch.float32, 5e-4)
    indptr, offsets = qo_indptr([2, 4]), torch.tensor([0, 898])
    pos2 = torch.tensor([0, 1, 898, 899, 900, 901])
    got_q, _ = flashinfer.apply_llama31_rope(q, k, indptr, offsets)
    close(got_q, _rotate(q, pos2, inv, False), torch.float32, 5e-4)
    q2, k2 = q.clone(), k.clone()
    flashinfer.apply_llama31_rope_pos_ids_inplace(q2, k2, pos)
    close(q2, want_q, torch.float32, 5e-4)
    q2, k2 = q.clone(), k.clone()
    flashinfer.apply_llama31_rope_inplace(q2, k2, indptr, offsets)
    close(k2, _rotate(k, pos2, inv, False), torch.float32, 5e-4)


@pytest.mark.parametrize("is_neox", [True, False])
def test_apply_rope_with_cos_sin_cache(is_neox: bool) -> None:
    head_size, rotary_dim = 64, 32
    inv = _inv_freq(rotary_dim, 1e4)
    ang = torch.arange(50, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat((ang.cos(), ang.sin()), -1).float()
    pos = torch.tensor([3, 49, 0, 17])
    qkv = torch.randn(4, (4 + 2 + 2) * head_size)
    query, key = qkv[:, : 4 * head_size], qkv[:, 4 * head_size: 6 * head_size]  # slices of a fused qkv tensor
    want_q = _rotate(query.view(4, 4, head_size), pos, inv, not is_neox).view(4, -1)
    want_k = _rotate(key.view(4, 2, head_size), pos, inv, not is_neox).view(4, -1)
    got_q, got_k = flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, head_size, cache, is_neox=is_neox)
    assert got_q.shape == query.shape
    close(got_q, want_q, torch.float32)
    close(got_k, want_k, torch.float32)
    flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, head_size, cache, is_neox=is_neox)
    close(qkv[:, : 4 * head_size], want_q, torch.float32)
    close(qkv[:, 4 * head_size: 6 * head_size], want_k, torch.float32)


# -- activation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "act"), [
    ("silu_and_mul", lambda a: a * torch.sigmoid(a)),
    ("gelu_and_mul", lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),
    ("gelu_tanh_and_mul", lambda a: 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))),
])
def test_gated_activations(name: str, act: object) -> None:
    x = torch.randn(3, 5, 128)
    want = act(x[..., :64].double()) * x[..., 64:].double()  # type: ignore[operator]
    fn = getattr(flashinfer, name)
    close(fn(x), want, torch.float32)
    out = torch.empty(3, 5, 64)
    assert fn(x, out=out) is out
    close(out, want, torch.float32)


@pytest.mark.parametrize("call", [
    lambda x, out: flashinfer.rmsnorm(x, torch.ones(8), out=out),
    lambda x, out: flashinfer.gemma_rmsnorm(x, torch.ones(8), out=out),
    lambda x, out: flashinfer.silu_and_mul(torch.cat((x, x), -1), out=out),
    lambda x, out: flashinfer.gelu_tanh_and_mul(torch.cat((x, x), -1), out=out),
])
@pytest.mark.parametrize("out", [torch.empty(2, 4, 8), torch.empty(4, 8, dtype=torch.float16), torch.empty(4, 7)])
def test_an_out_unlike_the_result_is_refused(call: object, out: torch.Tensor) -> None:
    """``out`` of another shape (even one the result broadcasts to) or dtype is refused, not cast or broadcast."""
    with pytest.raises(InvalidArgumentError, match=r"^out=.* is invalid: expected \(4, 8\) torch.float32"):
        call(torch.randn(4, 8), out)  # type: ignore[operator]


# -- gemm ------------------------------------------------------------------------------------------------------


def test_bmm_fp8() -> None:
    a = (torch.randn(3, 16, 64) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(3, 32, 64) * 4).to(torch.float8_e4m3fn).transpose(1, 2)  # column-major weights
    sa, sb = torch.tensor(0.5), torch.tensor(0.25)
    out = flashinfer.bmm_fp8(a, b, sa, sb, torch.bfloat16)
    assert out.shape == (3, 16, 32) and out.dtype == torch.bfloat16
    close(out, (a.double() * 0.5) @ (b.double() * 0.25), torch.bfloat16)


@pytest.mark.parametrize("column_major", [False, True])
def test_segment_gemm(column_major: bool) -> None:
    lens = [3, 0, 5, 2]
    x = torch.randn(sum(lens), 32)
    weights = torch.randn(6, 32, 24)
    w_arg = weights.transpose(1, 2).contiguous() if column_major else weights
    idx = torch.tensor([5, 1, 0, 3], dtype=torch.int64)
    gemm = flashinfer.SegmentGEMMWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    y = gemm.run(x, w_arg, 4, column_major, seg_lens=torch.tensor(lens), weight_indices=idx)
    want, at = [], 0
    for n, i in zip(lens, idx.tolist()):
        want.append(x[at:at + n].double() @ weights[i].double())
        at += n
    close(y, torch.cat(want), torch.float32)
    y2 = gemm.run(x, w_arg[:4], 4, column_major, seg_indptr=qo_indptr(lens).long())
    want2, at = [], 0
    for i, n in enumerate(lens):
        want2.append(x[at:at + n].double() @ weights[i].double())
        at += n
    close(y2, torch.cat(want2), torch.float32)
