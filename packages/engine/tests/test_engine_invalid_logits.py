"""A model step whose logits the sampler cannot draw from stops the engine with a clear error: the sampling ops
mark such rows on the device (token -1) instead of synchronising, and the engine checks the host copy it reads."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard_engine import calls
from kernel_switchboard_engine.sampling import SamplingParams, sample


def test_a_nan_row_of_logits_is_refused_naming_the_row() -> None:
    logits = torch.randn(3, 50)
    logits[1, 7] = float("nan")
    params = [SamplingParams(temperature=0.8, top_k=10, top_p=0.9)] * 3
    tokens = sample(logits, params, torch.Generator().manual_seed(0)).tolist()
    assert tokens[1] == ksb.sampling.INVALID and tokens[0] >= 0 and tokens[2] >= 0
    with pytest.raises(calls.InvalidLogitsError, match=r"rows \[1\] of 3"):
        calls.check_sampled(tokens, "sampling")


def test_valid_rows_pass_through() -> None:
    tokens = sample(torch.randn(4, 50), [SamplingParams(temperature=1.0)] * 4, torch.Generator().manual_seed(0)).tolist()
    assert calls.check_sampled(tokens, "sampling") == tokens
