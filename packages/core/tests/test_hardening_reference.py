"""The reference kernels are every test's oracle: their corners follow their documented definitions.

- Attention: masked positions (past a request's length, outside the causal mask or the sliding window, masked
  by a boolean mask or a -inf bias) contribute exactly nothing, NaN and inf included; a non-finite V value at a
  position a query attends reaches that query's output (the oracle never hides bad data).
- Sampling: temperature -> 0 is the argmax, however small the positive temperature.
"""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case

NAN, INF = float("nan"), float("inf")


# -- attention ------------------------------------------------------------------------------------
def _poison_decode(v_pages: torch.Tensor, table: ksb.PageTable, page_size: int, window: int, value: float) -> None:
    """Write ``value`` into every V slot (NHD pages) that a window of ``window`` leaves out of each request."""
    for b, n in enumerate(table.seq_lens.tolist()):
        for pos in range(max(n - 1 - window, 0)):
            v_pages[int(table.block_table[b, pos // page_size]), pos % page_size] = value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_decode_ignores_non_finite_v_outside_the_sliding_window(dtype: torch.dtype, value: float) -> None:
    spec = AttnSpec(dtype, "NHD", 4, 4, 2, kv_lens=(37, 9, 20), head_dim=16)
    q, cache, table = decode_case(spec, "cpu").args
    used = [int(table.block_table[b, j]) for b, n in enumerate(table.seq_lens.tolist()) for j in range((n + 3) // 4)]
    assert len(set(used)) == len(used)  # no page is shared: a poisoned slot is outside every window
    want = ksb.attention.decode(q, cache, table, window_left=5, backend="reference")
    _poison_decode(cache.v_pages, table, cache.page_size, 5, value)
    _poison_decode(cache.k_pages, table, cache.page_size, 5, value)
    got = ksb.attention.decode(q, cache, table, window_left=5, backend="reference")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def _ragged(q_len: int, kv_len: int, dtype: torch.dtype = torch.float32
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(q_len, 4, 16, generator=g).to(dtype)
    k, v = (torch.randn(kv_len, 2, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v, torch.tensor([0, q_len], dtype=torch.int32), torch.tensor([0, kv_len], dtype=torch.int32)


@pytest.mark.parametrize("window", [-1, 3])
def test_prefill_non_finite_v_reaches_exactly_the_queries_that_attend_it(window: int) -> None:
    """Causal (and windowed) prefill: each query masks a different set of positions. A NaN / +inf / -inf in V
    column c of one position shows in column c of the outputs of the queries (of that KV head's group) that
    attend it, and nowhere else; every other output is bitwise the clean one."""
    q, k, v, qo, kv = _ragged(12, 12)
    clean = ksb.attention.prefill_ragged(q, k, v, qo, kv, window_left=window, backend="reference")
    pos, head = 6, 1
    v[pos, head, 0], v[pos, head, 1], v[pos, head, 2] = NAN, INF, -INF
    got = ksb.attention.prefill_ragged(q, k, v, qo, kv, window_left=window, backend="reference")
    attends = torch.tensor([pos <= i and (window < 0 or pos >= i - window) for i in range(12)])
    group = torch.arange(4) // 2 == head  # query heads reading KV head 1
    hit = attends[:, None] & group[None, :]  # (tokens, q heads)
    assert torch.isnan(got[..., 0][hit]).all() and torch.isfinite(got[..., 0][~hit]).all()
    assert (got[..., 1][hit] == INF).all() and (got[..., 2][hit] == -INF).all()
    torch.testing.assert_close(got[~hit], clean[~hit], atol=0, rtol=0)
    torch.testing.assert_close(got[hit][:, 3:], clean[hit][:, 3:], atol=0, rtol=0)


def test_prefill_plus_and_minus_inf_in_one_column_give_nan() -> None:
    q, k, v, qo, kv = _ragged(4, 4)
    v[0, 0, 0], v[1, 0, 0] = INF, -INF
    got = ksb.attention.prefill_ragged(q, k, v, qo, kv, backend="reference")
    assert (got[0, :2, 0] == INF).all() and torch.isnan(got[1:, :2, 0]).all()


def test_another_requests_non_finite_values_stay_in_that_request() -> None:
    q, k, v, _, _ = _ragged(4, 8)
    qo, kv = torch.tensor([0, 3, 4], dtype=torch.int32), torch.tensor([0, 5, 8], dtype=torch.int32)
    want = ksb.attention.prefill_ragged(q[:3], k[:5], v[:5], qo[:2], kv[:2], backend="reference")
    k[5:], v[5:] = NAN, NAN
    got = ksb.attention.prefill_ragged(q, k, v, qo, kv, backend="reference")
    torch.testing.assert_close(got[:3], want, atol=0, rtol=0)
    assert torch.isnan(got[3]).all()


@pytest.mark.parametrize("how", ["causal", "bool", "bias"])
def test_dense_masked_positions_contribute_nothing(how: str) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6, 16, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    bias = {"causal": None, "bool": keep, "bias": torch.zeros(6, 6).masked_fill(~keep, -INF)}[how]
    kwargs = {"causal": how == "causal", "backend": "reference"}
    want = ksb.attention.dense(q, k, v, bias, **kwargs)
    v[:, :, 5] = NAN  # attended by the last query only
    got = ksb.attention.dense(q, k, v, bias, **kwargs)
    assert torch.isnan(got[:, :, 5]).all()
    torch.testing.assert_close(got[:, :, :5], want[:, :, :5], atol=0, rtol=0)


# -- sampling -------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-30, 1e-6])
@pytest.mark.parametrize("per_row", [False, True])
def test_tiny_temperature_samples_the_argmax(temperature: float, per_row: bool) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 100, generator=g) * 4
    t = torch.full((16,), temperature) if per_row else temperature
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        tokens = ksb.sampling.top_k_top_p(xs, is_logits=True, temperature=t, generator=g, backend="reference")
        assert tokens.tolist() == xs.float().argmax(-1).tolist()


def test_tiny_temperature_splits_the_mass_among_tied_maxima() -> None:
    x = torch.tensor([[0.0, 3.0, 3.0, -1.0]]).expand(4000, 4).contiguous()
    tokens = ksb.sampling.top_k_top_p(x, is_logits=True, temperature=1e-38, generator=torch.Generator().manual_seed(0),
                                      backend="reference")
    counts = torch.bincount(tokens, minlength=4).tolist()
    assert counts[0] == counts[3] == 0 and min(counts[1], counts[2]) > 1800
