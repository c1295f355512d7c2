"""The backend contract of the paged and ragged attention ops: a kernel's ``plan`` returns a runner.

``Kernel.plan(problem, table, p, **static)`` does the kernel's host work for one step (split schedule, workspace,
graph build) and returns a runner; ``runner.run(*inputs, out, lse)`` launches with no host synchronisation (so it
can be captured in a CUDA graph) and returns ``(out, lse)``:

=========================  ===============================================  =========================================
op                         ``plan(problem, table, p, **static)``            ``run(...)``
=========================  ===============================================  =========================================
attention.decode           table; no static                                 ``(q, cache, out, lse)``
attention.prefill          table; ``qo_indptr``, ``host_qo_indptr``         ``(q, cache, out, lse)``
attention.prefill_ragged   None; ``qo_indptr``, ``kv_indptr``,              ``(q, k, v, out, lse)``
                           ``host_indptrs``
attention.mla_decode       table (of the decode rows); no static            ``(q_nope, q_pe, ckv_pages, kpe_pages,
                                                                            out, lse)``
attention.mla_prefill      table; ``qo_indptr``, ``host_qo_indptr``         ``(q_nope, q_pe, ckv_pages, kpe_pages,
                                                                            out, lse)``
attention.pod              the prefill table; ``qo_indptr``,                ``(q_prefill, q_decode, cache, out_prefill,
                           ``host_qo_indptr``, ``decode_table``             out_decode, lse_prefill, lse_decode)`` ->
                                                                            the four, lse None where not wanted
=========================  ===============================================  =========================================

- ``out``, ``lse``: each a buffer to write into, or None: the runner returns a new tensor of its own in its place
  (an allocating vendor entry's output needs no copy then). ``lse`` (float32, the rows of ``out``) is wanted
  exactly when ``p.return_lse``; otherwise the runner gets None for it and returns None in its place.
- ``host_qo_indptr`` / ``host_indptrs``: the indptrs' values as host lists, read once by the core (None while a
  CUDA graph is captured: the runner then takes what it needs from the inputs' shapes at run time).
- ``lse`` is the natural log of the softmax denominator, unless the plan was made with ``p.lse_base2``: a kernel
  with ``writes_lse_base2`` then writes it in base 2 itself; any other kernel's runner is wrapped by
  :class:`Base2LSE`, which converts after the run.
- A kernel without ``plan`` is wrapped by :class:`RunOnly`: its ``run`` (the op's run signature, see
  :mod:`.attention`) returns new tensors, copied into the buffers when some are given.

Every call goes this way: an eager call is ``plan`` then ``run(..., None, None)`` (a run-only kernel's ``run``
directly); a planned call keeps the runner and runs it per layer and step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ..paged import PagedKVCache, PageTable

_Tensor = torch.Tensor
Outputs = tuple[_Tensor, _Tensor | None]

#: natural log-sum-exp to base 2: ``lse2 = lse * LOG2E``
LOG2E = 1.0 / math.log(2.0)
#: ``LOG2E`` as a 0-d float32 CPU tensor, for converting an LSE in place: ``lse.mul_(LOG2E_TENSOR)``. It multiplies a
#: tensor on any device as a scalar (a captured graph keeps its value), in float32 as the Python float would, with
#: half the host work of wrapping a Python float at every call. Never written.
LOG2E_TENSOR = torch.tensor(LOG2E, dtype=torch.float32, device="cpu")


class PagedRunner(Protocol):
    """The runner of a planned ``attention.decode`` or ``attention.prefill``."""

    def run(self, q: _Tensor, cache: PagedKVCache, out: _Tensor | None, lse: _Tensor | None, /) -> Outputs: ...


class RaggedRunner(Protocol):
    """The runner of a planned ``attention.prefill_ragged``."""

    def run(self, q: _Tensor, k: _Tensor, v: _Tensor, out: _Tensor | None, lse: _Tensor | None, /) -> Outputs: ...


class MLARunner(Protocol):
    """The runner of a planned ``attention.mla_decode`` or ``attention.mla_prefill``."""

    def run(self, q_nope: _Tensor, q_pe: _Tensor, ckv_pages: _Tensor, kpe_pages: _Tensor, out: _Tensor | None,
            lse: _Tensor | None, /) -> Outputs: ...


class PODRunner(Protocol):
    """The runner of a planned ``attention.pod``."""

    def run(self, q_prefill: _Tensor, q_decode: _Tensor, cache: PagedKVCache, out_prefill: _Tensor | None,
            out_decode: _Tensor | None, lse_prefill: _Tensor | None, lse_decode: _Tensor | None, /
            ) -> tuple[_Tensor, _Tensor, _Tensor | None, _Tensor | None]: ...


AttentionRunner = PagedRunner | RaggedRunner | MLARunner | PODRunner


class Planner(Protocol):
    """``Kernel.plan`` of an attention kernel."""

    def __call__(self, problem: Any, table: PageTable | None, p: Any, /, **static: Any) -> AttentionRunner: ...


def buffers(out: _Tensor | None, lse: _Tensor | None, like: _Tensor, rows: tuple[int, ...], dv: int,
            want_lse: bool) -> tuple[_Tensor, _Tensor | None]:
    """A runner's outputs: ``out`` / ``lse`` as given, else new ones, out (*rows, dv) in ``like``'s dtype and, when
    wanted, lse (*rows) float32 (the helper of runners that write into buffers)."""
    if out is None:
        out = like.new_empty((*rows, dv))
    if want_lse and lse is None:
        lse = like.new_empty(rows, dtype=torch.float32)
    return out, (lse if want_lse else None)


def into(result: Outputs, out: _Tensor | None, lse: _Tensor | None) -> Outputs:
    """A kernel's new ``(out, lse)`` ``result`` as a runner returns it: copied into each given buffer, as it is
    where none is given."""
    res_out, res_lse = result
    if out is not None:
        res_out = out.copy_(res_out)
    if lse is not None and res_lse is not None:
        res_lse = lse.copy_(res_lse)
    return res_out, res_lse


class RunOnly:
    """The runner of a kernel without ``plan``: ``call(*inputs)`` is the kernel's ``run`` with the call's other
    arguments bound; its new tensors are returned as they are, or copied into the given buffers (the last
    ``buffers`` arguments of ``run``, one per output, in the order of the kernel's outputs)."""

    __slots__ = ("buffers", "call")

    def __init__(self, call: Callable[..., Any], buffers: int = 2) -> None:
        self.call, self.buffers = call, buffers

    def run(self, *args: Any) -> Any:
        inputs, given = args[:-self.buffers], args[-self.buffers:]
        result = self.call(*inputs)
        return tuple(r if buf is None or r is None else buf.copy_(r) for r, buf in zip(result, given))


class Base2LSE:
    """The runner of a kernel that writes a natural-log LSE, under a plan that wants it in base 2: the kernel's
    runner, then the LSE multiplied by log2(e) in place (one launch; capturable). Paged and ragged runners."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, *args: Any) -> Outputs:
        out, lse = self.inner.run(*args)
        if lse is not None:
            lse.mul_(LOG2E_TENSOR)
        return out, lse


def lse_base(runner: Any, kernel: Any, p: Any) -> Any:
    """``runner`` as the plan runs it: wrapped by :class:`Base2LSE` when ``p`` wants a base-2 LSE that the kernel
    does not write itself."""
    if p.lse_base2 and p.return_lse and not kernel.writes_lse_base2:
        return Base2LSE(runner)
    return runner
