"""zero_empty_requests: rows of requests with no cached token get out 0 and lse -inf, NaN included;
other rows are untouched. Both paths: torch ops, and the one-launch Triton kernel (interpreter on a CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernel_switchboard import empty_rows
from kernel_switchboard.availability import triton_interpreting

PATHS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or not triton_interpreting(),
    reason="the Triton path runs where Triton is installed and interpreting (tests-triton)"))]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_lse", [False, True])
def test_only_empty_requests_are_cleared(path: str, dtype: torch.dtype, with_lse: bool, monkeypatch) -> None:
    if path == "torch":
        monkeypatch.setattr(empty_rows, "_triton_kernel", lambda: None)
    g = torch.Generator().manual_seed(0)
    seq_lens = torch.tensor([5, 0, 17, 0, 0, 3], dtype=torch.int32)
    out = torch.randn(6, 4, 1100, generator=g).to(dtype)  # a row longer than one 1024-element block
    out[1, 2, 7] = float("nan")
    lse = torch.randn(6, 4, generator=g) if with_lse else None
    want_out, want_lse = out.clone(), lse.clone() if lse is not None else None
    empty = seq_lens == 0
    want_out[empty] = 0
    if want_lse is not None:
        want_lse[empty] = float("-inf")

    empty_rows.zero_empty_requests(seq_lens, out, lse)

    assert torch.equal(out, want_out)
    if lse is not None:
        assert torch.equal(lse, want_lse)


def test_rows_that_are_not_contiguous_take_the_torch_path() -> None:
    seq_lens = torch.tensor([0, 2], dtype=torch.int32)
    base = torch.ones(2, 8, 6)
    out = base[:, :, :4]  # each row strided: not one run of elements
    assert not empty_rows._one_launch_fits(seq_lens, out, None)
    empty_rows.zero_empty_requests(seq_lens, out, None)
    assert out[0].abs().sum() == 0 and torch.equal(out[1], torch.ones(8, 4))
    assert torch.equal(base[:, :, 4:], torch.ones(2, 8, 2))


def test_inside_a_capture_only_a_compiled_signature_takes_the_one_launch(monkeypatch) -> None:
    launched: list[tuple[int, ...]] = []
    monkeypatch.setattr(empty_rows, "_triton_kernel", lambda: "kernel")
    monkeypatch.setattr(empty_rows, "_one_launch_fits", lambda *a: True)
    monkeypatch.setattr(empty_rows, "_launch", lambda kernel, s, out, lse: launched.append(tuple(out.shape)))
    monkeypatch.setattr(empty_rows, "_compiled", set())
    monkeypatch.setattr(empty_rows, "is_capturing", lambda: True)
    seq_lens = torch.tensor([0, 3], dtype=torch.int32)
    out = torch.full((2, 4, 8), float("nan"))
    empty_rows.zero_empty_requests(seq_lens, out)  # never compiled: the torch ops, no launch
    assert launched == [] and out[0].abs().sum() == 0 and out[1].isnan().all()
    monkeypatch.setattr(empty_rows, "is_capturing", lambda: False)
    empty_rows.zero_empty_requests(seq_lens, out)  # outside capture: launches, so compiles
    monkeypatch.setattr(empty_rows, "is_capturing", lambda: True)
    empty_rows.zero_empty_requests(seq_lens, out)  # the same signature inside a capture: launches
    assert launched == [(2, 4, 8), (2, 4, 8)]
