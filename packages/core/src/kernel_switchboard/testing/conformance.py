"""Generation of conformance tests from the registry and the case families."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from ..dispatch import explain
from ..errors import KernelUnavailableError
from ..registry import Kernel, registry
from ..spec import spec_of
from .case import Case


def op_cases(op: str, device: torch.device, size: str = "small") -> list[Case]:
    """Every case of ``op`` (fixed seeds) at ``size`` ("small" for CPU/interpreter, "large" for GPU), from the
    module its spec names (``kernel_switchboard.testing.cases.<module>``, with ``cases(op, device, size)``)."""
    module = importlib.import_module(f"{__package__}.cases.{spec_of(op).cases}")
    return list(module.cases(op, device, size))


def declares(kernel: Kernel, case: Case) -> bool:
    """Whether ``case`` lies inside ``kernel``'s declared capability (dispatch with ``backend=kernel.id`` accepts it)."""
    try:
        explain(case.op, *case.args, backend=kernel.id, **case.kwargs)
    except KernelUnavailableError:
        return False
    return True


def kernel_cases(kernel: Kernel, device: torch.device, size: str = "small") -> list[Case]:
    """The cases of ``kernel.op`` that lie inside ``kernel``'s declared capability."""
    return [c for c in op_cases(kernel.op, device, size) if declares(kernel, c)]


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class LazyCase:
    """A case that is built when its test runs, not when tests are collected: collection keeps no tensor (on a
    GPU, a suite's model-sized cases would otherwise all sit in GPU memory from import to exit).

    ``build()`` returns the list the case is ``index`` of (deterministic: fixed seeds); the lists of one ``key``
    are built once while tests that use them run back to back (one list is kept at a time).
    """

    key: tuple[Any, ...]
    build: Callable[[], list[Case]] = field(compare=False, repr=False)
    index: int = 0
    id: str = ""

    def load(self) -> Case:
        cases = _built.get(self.key)
        if cases is None:
            _built.clear()  # one list at a time: the previous op's tensors are freed before these are built
            cases = _built[self.key] = self.build()
        case = cases[self.index]
        if case.id != self.id:
            raise RuntimeError(f"case {self.index} of {self.key} is {case.id!r} now, {self.id!r} at collection: "
                               "case builders must be deterministic")
        return case


_built: dict[tuple[Any, ...], list[Case]] = {}


def lazy_kernel_cases(kernels: list[Kernel], device: torch.device, size: str = "small",
                      extra: Callable[[], list[Case]] | None = None) -> dict[str, list[LazyCase]]:
    """For each kernel (by id), its eligible cases as :class:`LazyCase` s: the cases of ``kernel.op`` (plus
    ``extra()``, cases of the same op) that lie inside its declared capability. The cases of each op are built
    once here, checked against every kernel of that op, and dropped (GPU memory released). On a GPU, processes
    that collect at once (pytest-xdist workers) build them one process at a time (:func:`_one_builder_at_a_time`):
    the large cases of one op hold GBs, and eight workers building them together exhaust an 80 GB card."""
    out: dict[str, list[LazyCase]] = {k.id: [] for k in kernels}
    with _one_builder_at_a_time(device):
        for op in dict.fromkeys(k.op for k in kernels):
            key = (op, str(device), size, extra)
            build = functools.partial(_op_cases_plus, op, device, size, extra)
            of_op = [k for k in kernels if k.op == op]
            found = _eligible(build, of_op, _shared_eligibility(device, (op, size, _name(extra),
                                                                          sorted(k.id for k in of_op))))
            for kernel in of_op:
                out[kernel.id] = [LazyCase(key, build, i, found["ids"][i]) for i in found["eligible"][kernel.id]]
        _release(device)
    return out


def _eligible(build: Callable[[], list[Case]], kernels: list[Kernel], shared: str | None) -> dict[str, Any]:
    """``{"ids": case ids, "eligible": {kernel id: indices of the cases it declares}}`` of one op's cases: read from
    the ``shared`` file when another worker wrote it, else found by building the cases (and written there)."""
    if shared is not None and os.path.exists(shared):
        with open(shared) as f:
            found: dict[str, Any] = json.load(f)
        return found
    cases = build()
    found = {"ids": [c.id for c in cases],
             "eligible": {k.id: [i for i, c in enumerate(cases) if declares(k, c)] for k in kernels}}
    if shared is not None:  # written whole, then renamed: a reader never sees half a file
        with open(f"{shared}.{os.getpid()}", "w") as f:
            json.dump(found, f)
        os.replace(f"{shared}.{os.getpid()}", shared)
    return found


def _name(fn: Callable[..., Any] | None) -> str | None:
    return None if fn is None else f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _shared_eligibility(device: torch.device, what: tuple[Any, ...]) -> str | None:
    """The file where the pytest-xdist workers of one run on a GPU (the ``PYTEST_XDIST_TESTRUNUID`` they share)
    keep which cases of an op each kernel declares: the first worker builds the cases and writes the answer, the
    others read it instead of building the same GBs of GPU tensors again, one process after another under the lock.
    None (nothing shared) on the CPU, in one process, or for extra cases whose builder's name is not unique."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if device.type != "cuda" or not run or "<" in repr(what):  # a lambda's or local function's name is not unique
        return None
    digest = hashlib.sha256(repr((str(device), what)).encode()).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"kernel-switchboard-eligible-{run}-{digest}.json")


@contextlib.contextmanager
def _one_builder_at_a_time(device: torch.device) -> Iterator[None]:
    """Hold a lock file shared by every process of this machine while building cases on a GPU (no lock on the CPU,
    or off POSIX, where ``fcntl`` is missing)."""
    if device.type != "cuda" or os.name != "posix":
        yield
        return
    import fcntl

    path = os.path.join(tempfile.gettempdir(), "kernel-switchboard-conformance-build.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _op_cases_plus(op: str, device: torch.device, size: str, extra: Callable[[], list[Case]] | None) -> list[Case]:
    return op_cases(op, device, size) + (extra() if extra is not None else [])


def _release(device: torch.device) -> None:
    """Give the GPU memory that collection used back to the driver (other processes may need it)."""
    import gc

    if device.type == "cuda" and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def conformance_test(backend: str, device: str | None = None, size: str | None = None,
                     ops: tuple[str, ...] | None = None) -> Callable[..., None]:
    """A pytest test function parametrized over every (kernel of ``backend``, eligible case).

    ``device`` defaults to ``KSB_TEST_DEVICE`` or the GPU when there is one; ``size`` to
    ``KSB_TEST_SIZE`` or "small" on the CPU and "large" on a GPU. Cases are built when their test runs
    (:class:`LazyCase`): collection holds no tensor.
    """
    dev = torch.device(device or os.environ.get("KSB_TEST_DEVICE") or _default_device())
    size = size or os.environ.get("KSB_TEST_SIZE") or ("small" if dev.type == "cpu" else "large")
    params: list[Any] = []
    marks = [pytest.mark.gpu] if dev.type == "cuda" else []
    backends = registry.all_backends()
    if backend not in backends:
        raise LookupError(f"backend {backend!r} is not registered; registered: {sorted(backends)}")
    kernels = [k for k in backends[backend].kernels if ops is None or k.op in ops]
    available = [k for k in kernels if k.unavailable is None]
    eligible = lazy_kernel_cases(available, dev, size)
    # grouped by op, so that each op's cases are built once when the tests run
    op_order = list(dict.fromkeys(k.op for k in kernels))
    for kernel in sorted(kernels, key=lambda k: op_order.index(k.op)):
        if kernel.unavailable is not None:
            params.append(pytest.param(kernel, None, id=f"{kernel.id}-unavailable",
                                       marks=[pytest.mark.skip(reason=f"{kernel.id}: {kernel.unavailable}")]))
            continue
        cases = eligible[kernel.id]
        if not cases:
            params.append(pytest.param(kernel, None, id=f"{kernel.id}-nocase", marks=marks))
        for lazy in cases:
            params.append(pytest.param(kernel, lazy, id=f"{kernel.id}-{lazy.id}", marks=marks))

    @pytest.mark.parametrize(("kernel", "case"), params)
    def test_conformance(kernel: Kernel, case: LazyCase | None) -> None:
        if case is None:
            pytest.fail(f"{kernel.id}: no conformance case of {kernel.op} on {dev} lies inside its declared "
                        f"capability, so the declaration is untested")
        run_conformance(kernel, case.load())

    return test_conformance


def run_conformance(kernel: Kernel, case: Case) -> None:
    """Compare ``kernel`` with the reference on ``case`` (the body of every conformance test)."""
    computes_in = None
    if kernel.math_dtype is not None and case.check is None:
        computes_in = kernel.math_dtype(explain(case.op, *case.args, **case.kwargs).problem)
    case.compare(kernel.id, computes_in=computes_in, finite_stale_slots=kernel.reads_stale_slots)
