"""Rope reference kernels against independent formulations, and the rope public API."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.ops import rope
from kernel_switchboard.ops.rope import Llama3Scaling
from kernel_switchboard.testing import conformance_test

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("rope.apply", "rope.apply_cos_sin_cache"))


# -- independent formulations --------------------------------------------------------------------------
def _complex_rotate(x: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """float64 rotation as complex multiplication, pair (u, v) -> (u + iv) * exp(i * angle); angles (T, rot/2)."""
    rot = 2 * angles.shape[1]
    angles = angles.double()
    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
    head = x.double()[..., :rot]
    if interleaved:
        z = torch.view_as_complex(head.reshape(*head.shape[:-1], rot // 2, 2).contiguous())
        turned = torch.view_as_real(z * turn).flatten(-2)
    else:
        zt = torch.complex(head[..., : rot // 2], head[..., rot // 2 :]) * turn
        turned = torch.cat((zt.real, zt.imag), dim=-1)
    return torch.cat((turned, x.double()[..., rot:]), dim=-1)


def _hf_apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor,
                             rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF transformers' Llama rotary embedding (rotate_half form), written out; q, k (B, H, S, D) float32."""

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    return torch.cat((q_embed, q_pass), dim=-1), torch.cat((k_embed, k_pass), dim=-1)


def _llama3_loop(theta: float, dim: int, factor: float, low: float, high: float, old_len: int) -> list[float]:
    """Meta's Llama-3.1 ``apply_scaling``, one frequency at a time in float64."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(freq)
        elif wavelen > old_len / low:
            out.append(freq / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


# -- tests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 32])
def test_apply_matches_complex_rotation(interleaved: bool, rotary_dim: int | None) -> None:
    q, k = torch.randn(9, 4, 64), torch.randn(9, 2, 64)
    positions = torch.randint(0, 30000, (9,))
    rot = rotary_dim or 64
    qo, ko = ksb.rope.apply(q, k, positions, theta=5e5, rotary_dim=rotary_dim, interleaved=interleaved)
    # the same float32 angles (p * inv_freq, as the contract fixes them), then a float64 complex rotation
    angles = positions.float()[:, None] * rope.inv_freq(5e5, rot, None, q.device)
    for x, got in ((q, qo), (k, ko)):
        torch.testing.assert_close(got.double(), _complex_rotate(x, angles, interleaved), rtol=1e-5, atol=1e-5)
        assert torch.equal(got[..., rot:], x[..., rot:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_matches_float64_definition_end_to_end(interleaved: bool) -> None:
    q, k = torch.randn(6, 3, 48), torch.randn(6, 1, 48)
    positions = torch.arange(6) * 7
    inv64 = torch.tensor([1e4 ** (-i / 48) for i in range(0, 48, 2)], dtype=torch.float64)
    angles = positions.double()[:, None] * inv64
    qo, ko = ksb.rope.apply(q, k, positions, interleaved=interleaved)
    torch.testing.assert_close(qo.double(), _complex_rotate(q, angles, interleaved), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ko.double(), _complex_rotate(k, angles, interleaved), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("scaling", [None, Llama3Scaling()])
def test_apply_matches_hf_transformers_formula(rotary_dim: int, scaling: Llama3Scaling | None) -> None:
    batch, seq, hq, hk, d = 2, 5, 4, 2, 64
    q, k = torch.randn(batch, hq, seq, d), torch.randn(batch, hk, seq, d)
    position_ids = torch.randint(0, 20000, (batch, seq))
    inv = rope.inv_freq(5e5, rotary_dim, scaling, torch.device("cpu"))
    want_q, want_k = _hf_apply_rotary_pos_emb(q, k, position_ids, inv, rotary_dim)
    # ksb layout: tokens first, (T, H, D)
    qt, kt = q.transpose(1, 2).reshape(-1, hq, d), k.transpose(1, 2).reshape(-1, hk, d)
    qo, ko = ksb.rope.apply(qt, kt, position_ids.reshape(-1), theta=5e5, rotary_dim=rotary_dim, scaling=scaling)
    torch.testing.assert_close(qo, want_q.transpose(1, 2).reshape(-1, hq, d), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ko, want_k.transpose(1, 2).reshape(-1, hk, d), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scaling", [Llama3Scaling(), Llama3Scaling(32.0, 1.0, 4.0, 8192), Llama3Scaling(8, 2, 8, 4096)])
def test_llama3_inv_freq_matches_loop(scaling: Llama3Scaling) -> None:
    got = rope.inv_freq(5e5, 128, scaling, torch.device("cpu"))
    want = _llama3_loop(5e5, 128, scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                        scaling.original_max_position)
    assert got.dtype == torch.float32 and got.shape == (64,)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=2e-6, atol=0)
    plain = rope.inv_freq(5e5, 128, None, torch.device("cpu"))
    assert (got < plain).any() and torch.equal(got[:4], plain[:4])  # low frequencies slowed, high ones kept


def test_inv_freq_is_cached() -> None:
    a = rope.inv_freq(1e4, 64, Llama3Scaling(), torch.device("cpu"))
    assert rope.inv_freq(1e4, 64, Llama3Scaling(), torch.device("cpu")) is a


@pytest.mark.parametrize("interleaved", [False, True])
def test_cos_sin_cache_form_matches_inv_freq_form(interleaved: bool) -> None:
    q, k = torch.randn(8, 4, 128).bfloat16(), torch.randn(8, 2, 128).bfloat16()
    positions = torch.randint(0, 4096, (8,), dtype=torch.int32)
    scaling = Llama3Scaling()
    cache = ksb.rope.cos_sin_cache(4096, 96, theta=5e5, scaling=scaling)
    assert cache.shape == (4096, 96) and cache.dtype == torch.float32
    got = ksb.rope.apply_cos_sin_cache(q, k, positions, cache, interleaved=interleaved)
    want = ksb.rope.apply(q, k, positions, theta=5e5, rotary_dim=96, scaling=scaling, interleaved=interleaved)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_inplace_writes_inputs_and_strided_views_work() -> None:
    t, hq, hk, d = 5, 4, 2, 64
    qkv = torch.randn(t, (hq + 2 * hk) * d)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    v_before = qkv[:, (hq + hk) * d :].clone()
    positions = torch.arange(t)
    want_q, want_k = ksb.rope.apply(q.contiguous(), k.contiguous(), positions, rotary_dim=32)
    got_q, got_k = ksb.rope.apply(q, k, positions, rotary_dim=32)
    assert got_q.is_contiguous() and got_q.data_ptr() != q.data_ptr()
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
    out_q, out_k = ksb.rope.apply(q, k, positions, rotary_dim=32, inplace=True)
    assert out_q is q and out_k is k
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(k, want_k, rtol=0, atol=0)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)


def test_bad_inputs_name_the_argument() -> None:
    q, k, pos = torch.randn(4, 2, 64), torch.randn(4, 1, 64), torch.arange(4)
    cases = [
        (r"rotary_dim", lambda: ksb.rope.apply(q, k, pos, rotary_dim=33)),
        (r"rotary_dim", lambda: ksb.rope.apply(q, k, pos, rotary_dim=128)),
        (r"positions\.dtype", lambda: ksb.rope.apply(q, k, pos.float())),
        (r"positions\.shape", lambda: ksb.rope.apply(q, k, torch.arange(5))),
        (r"k\.dtype", lambda: ksb.rope.apply(q, k.half(), pos)),
        (r"k\.shape", lambda: ksb.rope.apply(q, torch.randn(4, 1, 32), pos)),
        (r"q\.shape", lambda: ksb.rope.apply(q.reshape(4, 128), k, pos)),
        (r"q\.dtype", lambda: ksb.rope.apply(q.int(), k, pos)),
        (r"q\.stride", lambda: ksb.rope.apply(torch.randn(4, 64, 2).transpose(1, 2), k, pos)),
        (r"theta", lambda: ksb.rope.apply(q, k, pos, theta=-1.0)),
        (r"scaling", lambda: ksb.rope.apply(q, k, pos, scaling={"factor": 8})),  # type: ignore[arg-type]
        (r"scaling\.high_freq_factor", lambda: Llama3Scaling(8.0, 4.0, 1.0, 8192)),
        (r"cos_sin_cache\.dtype", lambda: ksb.rope.apply_cos_sin_cache(q, k, pos, torch.randn(16, 64).half())),
        (r"cos_sin_cache\.shape\[1\]", lambda: ksb.rope.apply_cos_sin_cache(q, k, pos, torch.randn(16, 66))),
        (r"positions", lambda: ksb.rope.apply_cos_sin_cache(q, k, pos + 13, torch.randn(16, 64))),
        (r"positions", lambda: ksb.rope.apply_cos_sin_cache(q, k, pos - 1, torch.randn(16, 64))),
        (r"max_position", lambda: ksb.rope.cos_sin_cache(0, 64)),
    ]
    for pattern, call in cases:
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()


def test_capture_skips_the_sync_and_needs_a_warm_table(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, pos = torch.randn(4, 2, 64), torch.randn(4, 1, 64), torch.arange(4)
    cache = ksb.rope.cos_sin_cache(16, 64)
    monkeypatch.setattr(rope, "graph_features", lambda dev: frozenset({"cuda_graph"}))

    def no_sync(*_: object) -> None:
        raise AssertionError("positions were read on the host during capture")

    monkeypatch.setattr(rope, "_check_positions_in_range", no_sync)
    ksb.rope.apply_cos_sin_cache(q, k, pos, cache)  # reference kernel is capturable: eligible, no sync
    with pytest.raises(ksb.InvalidArgumentError, match=r"warm-up"):
        ksb.rope.apply(q, k, pos, theta=12345.0)
    monkeypatch.setattr(rope, "graph_features", lambda dev: frozenset())
    want = ksb.rope.apply(q, k, pos, theta=12345.0)
    monkeypatch.setattr(rope, "graph_features", lambda dev: frozenset({"cuda_graph"}))
    got = ksb.rope.apply(q, k, pos, theta=12345.0)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("inplace", [False, True])
def test_unchecked_positions_outside_the_table_come_out_nan(monkeypatch: pytest.MonkeyPatch, inplace: bool) -> None:
    """check_positions=False reads nothing back; a token whose position lies outside the table gets NaN in its
    rotated dims and keeps its pass-through dims, the other tokens are rotated as with the check."""
    q, k = torch.randn(5, 2, 64), torch.randn(5, 1, 64)
    cache = ksb.rope.cos_sin_cache(16, 32)
    inside = torch.tensor([3, 15, 0, 7, 9])
    outside = torch.tensor([3, 16, -1, 7, 2**40])
    want_q, want_k = ksb.rope.apply_cos_sin_cache(q, k, inside, cache)
    monkeypatch.setattr(rope, "_check_positions_in_range", lambda *_: pytest.fail("a host read"))
    qa, ka = q.clone(), k.clone()
    got_q, got_k = ksb.rope.apply_cos_sin_cache(qa, ka, outside, cache, inplace=inplace, check_positions=False)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        bad = torch.tensor([False, True, True, False, True])
        torch.testing.assert_close(got[~bad], want[~bad])
        assert got[bad][..., :32].isnan().all() and not got[bad][..., 32:].isnan().any()
        torch.testing.assert_close(got[bad][..., 32:], want[bad][..., 32:])
    if inplace:
        assert got_q is qa and got_k is ka


def test_flashinfer_compat_rope_from_a_table_reads_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply_rope_with_cos_sin_cache(_inplace)`` do not check the positions on the host (as FlashInfer's)."""
    import kernel_switchboard.flashinfer as fi

    q, k, pos = torch.randn(4, 2 * 64), torch.randn(4, 64), torch.arange(4)
    cache = ksb.rope.cos_sin_cache(16, 64)
    want_q, want_k = ksb.rope.apply_cos_sin_cache(q.view(4, 2, 64), k.view(4, 1, 64), pos, cache)
    monkeypatch.setattr(rope, "_check_positions_in_range", lambda *_: pytest.fail("a host read"))
    got_q, got_k = fi.apply_rope_with_cos_sin_cache(pos, q, k, 64, cache)
    torch.testing.assert_close((got_q, got_k), (want_q.view(4, -1), want_k.view(4, -1)))
    fi.apply_rope_with_cos_sin_cache_inplace(pos, q, k, 64, cache)
    torch.testing.assert_close((q, k), (want_q.view(4, -1), want_k.view(4, -1)))


def test_problem_records_layout_and_features() -> None:
    q, k, pos = torch.randn(4, 2, 64), torch.randn(4, 1, 64), torch.arange(4, dtype=torch.int32)
    sel = ksb.explain("rope.apply", q, k, pos, rotary_dim=32, interleaved=True, inplace=True)
    p = sel.problem
    assert (p.layout, p.rotary_dim, p.head_dim, p.q_heads, p.kv_heads, p.positions_dtype) == (
        "interleaved", 32, 64, 2, 1, torch.int32)
    assert "in_place" in p.features and sel.kernel.id == "reference:rope"


def test_torch_compile_fullgraph_traces_rope_ops() -> None:
    q, k, pos = torch.randn(4, 2, 64), torch.randn(4, 1, 64), torch.arange(4)
    cache = ksb.rope.cos_sin_cache(16, 32)

    def f(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        a, b = ksb.rope.apply(q, k, pos, rotary_dim=48, scaling=Llama3Scaling(), interleaved=True)
        c, d = ksb.rope.apply_cos_sin_cache(q * 2, k, pos, cache)
        return a.sum() + b.sum() + c.sum() + d.sum()

    def g(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        ksb.rope.apply(q, k, pos, inplace=True)
        ksb.rope.apply_cos_sin_cache(q, k, pos, cache, inplace=True)
        return q + 1

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, pos), f(q, k, pos))
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    torch.testing.assert_close(torch.compile(g, fullgraph=True, backend="aot_eager")(q1, k1, pos), g(q2, k2, pos))
    torch.testing.assert_close((q1, k1), (q2, k2))


def test_opcheck_rope_ops() -> None:
    q, k, pos = torch.randn(4, 2, 64), torch.randn(4, 1, 64), torch.arange(4)
    cache = ksb.rope.cos_sin_cache(16, 32)
    torch.library.opcheck(torch.ops.ksb.rope_apply.default, (q, k, pos, 1e4, 32, False, [8.0, 1.0, 4.0, 8192.0], None))
    torch.library.opcheck(torch.ops.ksb.rope_apply_inplace.default, (q.clone(), k.clone(), pos, 1e4, None, True, None,
                                                                     None))
    torch.library.opcheck(torch.ops.ksb.rope_apply_cos_sin_cache.default, (q, k, pos, cache, True, True, None))
    torch.library.opcheck(torch.ops.ksb.rope_apply_cos_sin_cache_inplace.default,
                          (q.clone(), k.clone(), pos, cache, False, False, None))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_rope_captures_in_cuda_graph() -> None:
    dev = torch.device("cuda")
    q, k = torch.randn(64, 8, 128, device=dev), torch.randn(64, 2, 128, device=dev)
    pos = torch.randint(0, 4096, (64,), device=dev)
    cache = ksb.rope.cos_sin_cache(4096, 128, device=dev)
    want = ksb.rope.apply(q, k, pos, scaling=Llama3Scaling(), backend="reference")  # warm-up builds inv_freq
    want_c = ksb.rope.apply_cos_sin_cache(q, k, pos, cache, backend="reference")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        got = ksb.rope.apply(q, k, pos, scaling=Llama3Scaling(), backend="reference")
        got_c = ksb.rope.apply_cos_sin_cache(q, k, pos, cache, backend="reference")
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_c, want_c)
