"""Batch invariance: ``with ksb.batch_invariant():`` makes every op in the scope give a request (a row of its batch)
the same bits whatever batch it sits in and whatever its position there.

What changes inside the scope:

- every problem carries the feature ``batch_invariant`` (:func:`mark`, applied by ``dispatch.select``), so only
  kernels that declare it are eligible; the others are rejected with that reason (``ksb.explain`` shows it);
- the ranking ignores cost estimates, the autotune cache and whether a kernel is compiled yet, all of which change
  with the batch's size bucket or over time: the eligible kernels are ordered by explicit choice, then by priority
  (a kernel whose cost is infinite on this device, such as an interpreted Triton kernel on the CPU, after the
  others), so every batch of an op's problem picks the same kernel;
- the kernels that declare the feature fix what they would otherwise choose by batch: split-KV chunks of a fixed
  number of tokens merged in a fixed order (paged decode), tile shapes independent of the number of rows (prefill,
  GEMM, RMSNorm, MoE), reductions over a row in one fixed order. Attention kernels read the mode from
  ``AttnParams.batch_invariant`` (fixed when a plan is made, so a plan made inside the scope stays invariant);
  the other families' kernels read :func:`active` when they launch.

What it means per family:

- attention: a request's outputs depend only on its own queries, pages and lengths, within one op (``decode`` and
  ``prefill`` are different kernels: an engine that wants a decode row to match in both uses ``prefill`` for both,
  whose mixed batches hold decode rows);
- norm, GEMM (``mm``, ``mm_fp8``), MoE (``route``, ``fused_moe``), activation, RoPE, KV-cache appends and
  ``merge_states``: a row's outputs depend only on that row (and the weights);
- sampling: ``renorm`` is a function of each row. A draw (``top_k_top_p``, ``chain_speculative``) takes its random
  numbers from one stream shared by the batch, so a row's draw depends on the rows before it: inside the scope
  these ops take a batch of one request (each request sampled with its own ``torch.Generator``, the generator per
  request that reproducible serving keeps anyway) and refuse larger batches with that reason;
- refused (no kernel declares it): collectives (``comm.*``: the reduction order of an all-reduce depends on the
  message size) and ``gemm.grouped_mm`` (its rows belong to groups by position).

The reference kernels are invariant by construction inside the scope: they compute each request (row) alone, on
its own copy, with shapes that depend on that request only (so no vectorised-versus-scalar split of a CPU loop or
reduction layout of a GPU one depends on the batch).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

#: the capability feature of kernels whose results for a request do not depend on its batch
FEATURE = "batch_invariant"

#: True inside the scope; hot paths read it with ``SCOPE.get()`` (a C-level call)
SCOPE: contextvars.ContextVar[bool] = contextvars.ContextVar("ksb_batch_invariant", default=False)


@contextlib.contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """Inside the ``with`` block every op gives a request bitwise-identical results whatever batch it sits in and
    whatever its position (see the module docstring); ``enabled=False`` turns the mode off for a nested block."""
    token = SCOPE.set(bool(enabled))
    try:
        yield
    finally:
        SCOPE.reset(token)


def active() -> bool:
    """True inside a :func:`batch_invariant` scope (this thread or task)."""
    return SCOPE.get()


@functools.lru_cache(maxsize=4096)
def mark(problem: Any) -> Any:
    """``problem`` with the feature :data:`FEATURE` (a problem without a ``features`` field is returned as it is)."""
    features = getattr(problem, "features", None)
    if features is None or FEATURE in features:
        return problem
    return problem._replace(features=features | {FEATURE})


def one_request_draws(problem: Any) -> list[str]:
    """``Capability.check`` of sampling kernels that draw random numbers: inside the scope only a batch of one request
    (a draw's random numbers come from one stream shared by the batch, so a row's draw depends on the rows before
    it; a request sampled alone with its own generator is invariant)."""
    if FEATURE in getattr(problem, "features", ()) and getattr(problem, "batch", 1) > 1:
        return ["in the batch-invariant scope a draw takes a batch of one request (the batch shares one random "
                "stream, so a row's draw would depend on the rows before it): sample each request alone, with its own "
                "torch.Generator"]
    return []
