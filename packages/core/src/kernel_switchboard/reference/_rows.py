"""Batch-invariant evaluation of the reference kernels: each row (request) of a batch alone.

Inside a :func:`~kernel_switchboard.batch_invariant` scope a kernel wrapped by :func:`rowwise` runs once per row of
its batch, on fresh copies of that row's inputs, and stacks the results. A row's computation then has the same
shapes and the same memory alignment in every batch, so neither the vectorised / scalar split of a CPU loop nor the
layout of a GPU reduction depends on the batch: torch's CPU ``sigmoid``, for one, rounds some inputs differently in
a loop's scalar tail than in its vector body, so a row's bits would otherwise depend on where the row sits. Outside
the scope the kernel runs as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..invariance import active


def rowwise(fn: Callable[..., Any], rows: Sequence[int], mutated: Callable[[tuple[Any, ...]], Sequence[int]] | None = None,
            ) -> Callable[..., Any]:
    """``fn`` evaluated row by row inside the batch-invariant scope.

    ``rows``: the positions of the arguments whose dim 0 is the batch (the first one gives the row count; an
    argument there that is not a tensor or has no dims, such as a scalar standing for a per-row parameter, is passed
    as it is);
    ``mutated(args)``: the positions ``fn`` writes in place (each row's copy is written back into its row). ``fn``
    returns a tensor, a tuple of tensors (or None entries), or None; a returned tensor that is a row's copy of a
    mutated argument comes back as that argument."""

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        if not active():
            return fn(*args)
        n = args[rows[0]].shape[0]
        if n == 0:
            return fn(*args)
        written = tuple(mutated(args)) if mutated is not None else ()
        parts: list[Any] = []
        for i in range(n):
            row_args = list(args)
            for j in rows:
                if isinstance(args[j], torch.Tensor) and args[j].dim() > 0:
                    row_args[j] = args[j][i:i + 1].clone()
            result = fn(*row_args)
            for j in written:
                args[j][i:i + 1].copy_(row_args[j])
            parts.append(_mark_written(result, row_args, written))
        return _stack(parts, args)

    return run


def _mark_written(result: Any, row_args: list[Any], written: tuple[int, ...]) -> Any:
    """``result`` with each tensor that is a row's copy of a written argument replaced by that argument's position."""
    def mark(t: Any) -> Any:
        for j in written:
            if t is row_args[j]:
                return _Written(j)
        return t

    return tuple(mark(t) for t in result) if isinstance(result, tuple) else mark(result)


class _Written:
    """Stands for argument ``index``, written in place, among a row's results."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _stack(parts: list[Any], args: tuple[Any, ...]) -> Any:
    """The rows' results as one batch: tensors concatenated along dim 0, written arguments as themselves."""
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(_stack([p[k] for p in parts], args) for k in range(len(first)))
    if first is None:
        return None
    if isinstance(first, _Written):
        return args[first.index]
    return torch.cat(parts)
