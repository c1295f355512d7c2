"""The conformance case record and the comparison rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

#: (atol, rtol) by the dtype the kernel computes in; elementwise after float64 upcast
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float8_e4m3fn: (6e-2, 6e-2),
    torch.float8_e5m2: (1.2e-1, 1.2e-1),
}


#: kernels that compute in a lower dtype than their inputs (``Kernel.math_dtype``): XQA on an fp8 cache rounds
#: Q, K and P to e4m3, and the roundings compound (H200: max abs error 0.067 on unit-scale values)
MATH_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {torch.float8_e4m3fn: (1e-1, 1e-1)}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Default (atol, rtol) for outputs computed from inputs of ``dtype``."""
    return TOLERANCES.get(dtype, (1e-4, 1e-4))


@dataclass
class Case:
    """One call of an op's public function, with how to compare two runs of it.

    ``outputs(args, result)`` returns the tensors to compare (default: the result itself, or its
    tensors when it is a tuple); in-place ops return the mutated arguments. ``check``, when set,
    replaces the comparison: it gets a function ``run(backend) -> result`` and asserts itself
    (statistical tests of samplers); ``run()`` without an argument runs the kernel under test.
    ``tol`` overrides the dtype default.
    """

    op: str
    id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    dtype: torch.dtype = torch.float32
    tol: tuple[float, float] | None = None
    outputs: Callable[[tuple[Any, ...], Any], list[torch.Tensor]] | None = None
    check: Callable[[Callable[[str], Any]], None] | None = None

    @property
    def function(self) -> Callable[..., Any]:
        import importlib

        family, _, name = self.op.partition(".")
        return getattr(importlib.import_module(f"kernel_switchboard.ops.{family}"), name)  # type: ignore[no-any-return]

    def run(self, backend: str) -> tuple[tuple[Any, ...], Any]:
        """Call the public function on cloned inputs with ``backend=``; returns (args, result)."""
        args, kwargs = clone_args(self.args), clone_args(self.kwargs)
        return args, self.function(*args, backend=backend, **kwargs)

    def compare(self, kernel_id: str, computes_in: torch.dtype | None = None, finite_stale_slots: bool = False) -> None:
        """Run ``kernel_id`` and the reference and assert that their outputs agree; ``computes_in``: a
        lower dtype the kernel declares it computes in (``Kernel.math_dtype``), whose tolerance then applies;
        ``finite_stale_slots``: the kernel declares ``Kernel.reads_stale_slots``, so the unwritten page
        slots (NaN in the cases) hold :data:`STALE_VALUE` instead."""
        if finite_stale_slots:
            self = replace(self, args=finite_stale(self.args), kwargs=finite_stale(self.kwargs))
        if self.check is not None:
            self.check(lambda backend=kernel_id: self.run(backend)[1])  # run() = the kernel under test
            return
        got = self._outputs(*self.run(kernel_id))
        want = self._outputs(*self.run("reference"))
        assert len(got) == len(want), f"{kernel_id} returned {len(got)} outputs, the reference {len(want)}"
        atol, rtol = self.tol or tolerance(self.dtype)
        if computes_in is not None:
            math_atol, math_rtol = MATH_TOLERANCES.get(computes_in, tolerance(computes_in))
            atol, rtol = max(atol, math_atol), max(rtol, math_rtol)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, atol=atol, rtol=rtol, what=f"{self.op}[{self.id}] output {i} of {kernel_id}")

    def _outputs(self, args: tuple[Any, ...], result: Any) -> list[torch.Tensor]:
        if self.outputs is not None:
            return self.outputs(args, result)
        if isinstance(result, torch.Tensor):
            return [result]
        return [r for r in result if isinstance(r, torch.Tensor)]


def assert_close(got: torch.Tensor, want: torch.Tensor, *, atol: float, rtol: float, what: str = "output") -> None:
    """Elementwise |got - want| <= atol + rtol * |want| in float64; NaN never passes unless both NaN."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != reference {want.dtype}"
    g, w = got.detach().cpu(), want.detach().cpu()
    if not g.is_floating_point():
        mism = (g != w).sum().item()
        assert mism == 0, f"{what}: {mism} of {g.numel()} entries differ from the reference"
        return
    g, w = g.double(), w.double()
    both_nan = torch.isnan(g) & torch.isnan(w)
    both_inf = torch.isinf(g) & torch.isinf(w) & (torch.sign(g) == torch.sign(w))
    err = (g - w).abs()
    bad = ~(err <= atol + rtol * w.abs()) & ~both_nan & ~both_inf
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        rel = (err[~both_nan & ~both_inf].norm() / w[~both_nan & ~both_inf].norm().clamp_min(1e-30)).item()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {g.numel()} entries outside atol={atol} rtol={rtol}; "
            f"first at {idx}: got {g[idx].item():.6g}, reference {w[idx].item():.6g}; "
            f"max abs err {err.nan_to_num(float('inf')).max().item():.3g}, relative norm err {rel:.3g}"
        )


#: what unwritten page slots hold for kernels that read them with a zero weight: finite (e4m3 has it
#: exactly) and large, so a kernel that gave such a slot any weight would miss the reference by far
STALE_VALUE = 64.0


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` (args: tuples, lists, dicts, PagedKVCache, PageTable) rebuilt with ``fn`` applied to every tensor."""
    from ..paged import PagedKVCache, PageTable

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, PagedKVCache):
        fp8 = obj.is_fp8
        scales = [fn(s) if isinstance(s, torch.Tensor) else s for s in (obj.k_scale, obj.v_scale)]
        return PagedKVCache(fn(obj.k_pages), fn(obj.v_pages), obj.layout, *(scales if fp8 else (None, None)))
    if isinstance(obj, PageTable):
        return PageTable(fn(obj.block_table), fn(obj.seq_lens), obj.max_seq_len)
    return obj


def _nan_to_stale(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    wide = t if t.dtype in (torch.float32, torch.float64) else t.float()  # fp8 has no nan_to_num
    return wide.nan_to_num(nan=STALE_VALUE).to(t.dtype)


def finite_stale(obj: Any) -> Any:
    """A copy of ``obj`` (args as :func:`clone_args` walks them) whose floating tensors have NaN -> ``STALE_VALUE``.

    The paged attention cases put NaN only in the slots past each request's length, so this turns
    "no kernel may read them" into "a kernel may read them with a zero weight"."""
    return map_tensors(obj, _nan_to_stale)


def clone_args(obj: Any) -> Any:
    """Deep-copy the tensors in args (tuples, lists, dicts, PagedKVCache, PageTable), keeping the rest."""
    return map_tensors(obj, torch.Tensor.clone)
