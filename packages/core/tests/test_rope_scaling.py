"""The rope table builder's linear and YaRN scalings against loop formulations of transformers' definitions, and
rope.apply_cos_sin_cache over such tables against a float64 rotation."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.ops.rope import LinearScaling, Llama3Scaling, YarnScaling, cos_sin_cache


def _yarn_loop(theta: float, dim: int, s: YarnScaling) -> tuple[list[float], float]:
    """(inv_freq, cos/sin factor) of transformers' ``_compute_yarn_parameters``, one dim at a time in float64."""

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def corr(rot: float) -> float:
        return dim * math.log(s.original_max_position / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = corr(s.beta_fast), corr(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    inv = []
    for i in range(dim // 2):
        base = 1.0 / theta ** (2 * i / dim)
        keep = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)  # 1: extrapolate (plain), 0: interpolate
        inv.append(base / s.factor * (1 - keep) + base * keep)
    if s.attention_factor is not None:
        factor = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        factor = mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
    else:
        factor = mscale(s.factor)
    return inv, factor


YARNS = [
    (YarnScaling(40.0, 4096, mscale=1.0, mscale_all_dim=1.0), 10000.0, 64),  # DeepSeek-V3's checkpoints
    (YarnScaling(40.0, 64, mscale=1.0, mscale_all_dim=0.5), 10000.0, 16),  # a factor != 1 on cos/sin
    (YarnScaling(4.0, 512, beta_fast=16.0, beta_slow=2.0, truncate=False), 1e6, 128),  # Qwen2.5-style, no rounding
    (YarnScaling(8.0, 256, attention_factor=0.7), 5e5, 32),
]


@pytest.mark.parametrize(("scaling", "theta", "dim"), YARNS)
def test_yarn_table_matches_the_loop_formula(scaling: YarnScaling, theta: float, dim: int) -> None:
    inv, factor = _yarn_loop(theta, dim, scaling)
    assert scaling.cos_sin_factor == pytest.approx(factor, rel=1e-12)
    positions = torch.tensor([0, 1, 7, 100, 1000, 4095], dtype=torch.float64)
    angles = positions[:, None] * torch.tensor(inv, dtype=torch.float64)[None, :]
    want = torch.cat((angles.cos(), angles.sin()), dim=-1) * factor
    table = cos_sin_cache(4096, dim, theta, scaling)
    assert table.shape == (4096, dim) and table.dtype == torch.float32
    # float32 angles: the error grows with the angle (half an ulp of 4e3 radians is 2.4e-4)
    torch.testing.assert_close(table[positions.long()].double(), want, atol=1e-3, rtol=0)
    plain = cos_sin_cache(4096, dim, theta)
    assert not torch.allclose(table, plain * factor, atol=1e-3), "the scaling must change some frequencies"


def test_deepseek_v3_yarn_keeps_cos_sin_and_names_its_mscale() -> None:
    s = YarnScaling(40.0, 4096, mscale=1.0, mscale_all_dim=1.0)
    assert s.cos_sin_factor == 1.0
    assert YarnScaling.mscale_of(40.0, 1.0) == pytest.approx(0.1 * math.log(40.0) + 1.0)
    assert YarnScaling.mscale_of(0.5, 1.0) == 1.0


def test_linear_table_is_the_plain_table_at_divided_positions() -> None:
    table = cos_sin_cache(64, 32, 1e4, LinearScaling(8.0))
    inv = 1.0 / 1e4 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    angles = torch.arange(64, dtype=torch.float64)[:, None] / 8.0 * inv[None, :]
    torch.testing.assert_close(table.double(), torch.cat((angles.cos(), angles.sin()), dim=-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("scaling", [YarnScaling(16.0, 32, mscale=1.0, mscale_all_dim=0.25), LinearScaling(4.0)])
def test_apply_over_a_scaled_table_rotates_and_scales(interleaved: bool, scaling: object) -> None:
    t, h, d = 9, 3, 32
    q, k = torch.randn(t, h, d), torch.randn(t, 1, d)
    positions = torch.randint(0, 200, (t,))
    table = cos_sin_cache(256, d, 1e4, scaling)  # type: ignore[arg-type]
    got_q, got_k = ksb.rope.apply_cos_sin_cache(q, k, positions, table, interleaved=interleaved)
    rows = table.double()[positions][:, None, :]
    cos, sin = rows[..., : d // 2], rows[..., d // 2:]
    for x, got in ((q, got_q), (k, got_k)):
        x = x.double()
        x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : d // 2], x[..., d // 2:])
        a, b = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        want = torch.stack((a, b), dim=-1).flatten(-2) if interleaved else torch.cat((a, b), dim=-1)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_bad_scalings_are_named() -> None:
    with pytest.raises(ksb.InvalidArgumentError, match=r"scaling\.factor"):
        YarnScaling(0.0, 4096)
    with pytest.raises(ksb.InvalidArgumentError, match=r"scaling\.original_max_position"):
        YarnScaling(4.0, 0)
    with pytest.raises(ksb.InvalidArgumentError, match=r"scaling\.factor"):
        LinearScaling(-1.0)
    with pytest.raises(ksb.InvalidArgumentError, match=r"scaling.*dict.*YarnScaling"):
        cos_sin_cache(16, 8, 1e4, {"rope_type": "yarn"})  # type: ignore[arg-type]
    q = torch.randn(2, 1, 8)
    with pytest.raises(ksb.InvalidArgumentError, match=r"scaling.*YarnScaling.*Llama3Scaling"):
        ksb.rope.apply(q, q.clone(), torch.arange(2), scaling=YarnScaling(4.0, 64))  # type: ignore[arg-type]
    assert cos_sin_cache(16, 8, 1e4, Llama3Scaling(original_max_position=4)).shape == (16, 8)
