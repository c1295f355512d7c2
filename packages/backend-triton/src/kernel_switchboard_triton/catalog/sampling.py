"""Records of the Triton sampling kernels (launchers in :mod:`..sampling`): top-k / top-p / min-p sampling from
probabilities or logits, renorm, and chain speculative verification, without sorting the vocabulary."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.invariance import one_request_draws

from .._common import BACKEND, DEVICES, PRIORITY
from .._perf import memory_bound
from . import launcher

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
FEATURES = frozenset({"cuda_graph", "deterministic", "generator", "per_row_params", "batch_invariant"})
_CAP = Capability(devices=DEVICES, dtypes=DTYPES, features=FEATURES)
#: a draw is batch invariant for a batch of one request only (the batch shares one random stream)
_DRAWS = dataclasses.replace(_CAP, check=one_request_draws)


def _sample_cost(problem: Any) -> float:
    # about three passes over the input (a logits max, a candidate pass, a check pass); top-k adds two
    passes = 2 + int(problem.is_logits) + 2 * int(problem.uses_top_k) + int(problem.uses_min_p and not problem.is_logits)
    return memory_bound(problem, passes * problem.batch * problem.vocab * problem.dtype.itemsize)


def _renorm_cost(problem: Any) -> float:
    passes = 3 + 2 * int(problem.uses_top_k) + 2 * int(problem.uses_top_p)
    return memory_bound(problem, passes * problem.batch * problem.vocab * problem.dtype.itemsize
                        + 4 * problem.batch * problem.vocab)


def _spec_cost(problem: Any) -> float:
    return memory_bound(problem, 3 * problem.batch * problem.vocab * problem.dtype.itemsize)


def kernels() -> list[Kernel]:
    return [
        Kernel("sampling.top_k_top_p", "top_k_top_p", BACKEND, _DRAWS, launcher("sampling:top_k_top_p"),
               priority=PRIORITY, cost=_sample_cost,
               doc="sorting-free: exact top-k threshold search, top-p by rejection with 4 candidates per pass"),
        Kernel("sampling.renorm", "renorm", BACKEND, _CAP, launcher("sampling:renorm"), priority=PRIORITY,
               cost=_renorm_cost, doc="exact top-k / top-p / min-p thresholds by pivot search, then one normalised write"),
        Kernel("sampling.chain_speculative", "chain_speculative", BACKEND, _DRAWS, launcher("sampling:chain_speculative"),
               priority=PRIORITY, cost=_spec_cost,
               doc="acceptance tests, then the residual draw by inverse CDF, one program per row tile"),
    ]
