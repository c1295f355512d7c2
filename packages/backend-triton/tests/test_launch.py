"""Relaunch: a kept launch goes to the compiled kernel's launcher with every argument in signature order and this
launch's tensors in their places; a tensor the kept arguments cannot describe is refused; without a compiled kernel
to call (interpreter, launch hook, another device) the launch is Triton's own, with the same arguments."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kernel_switchboard_triton import _launch


def _kernel_fn(x_ptr, y_ptr, n, SCALE=2, BLOCK=None):  # type: ignore[no-untyped-def] # noqa: N803
    """The Python function of the stand-in kernel: two pointers, an int, a defaulted and a constexpr parameter."""


class _FakeCompiled:
    """A compiled kernel: ``run`` is the launcher Triton's launch calls."""

    function = object()
    packed_metadata = object()

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []

    def run(self, *args: Any) -> None:
        self.launches.append(args)


class _FakeKernel:
    """A JIT function: ``kernel[grid](...)`` records Triton's own launch and returns the compiled kernel (None
    when ``interpreted``, as Triton's interpreter does)."""

    fn = staticmethod(_kernel_fn)

    def __init__(self, interpreted: bool = False) -> None:
        self.compiled = None if interpreted else _FakeCompiled()
        self.own: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> _FakeCompiled | None:
            self.own.append((grid, args, kwargs))
            return self.compiled
        return launch


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Triton's driver as a Relaunch reads it: the current device (changeable) and its stream."""
    current = SimpleNamespace(index=0)
    active = SimpleNamespace(get_current_device=lambda: current.index, get_current_stream=lambda i: 1000 + i)
    monkeypatch.setattr(_launch, "driver", SimpleNamespace(active=active))
    return current


def _kept(kernel: _FakeKernel) -> tuple[_launch.Relaunch, torch.Tensor]:
    x = torch.zeros(64)
    return _launch.Relaunch(kernel, (4, 2), (x, torch.zeros(8), 128), {"BLOCK": 32, "num_warps": 4}, (0,)), x


def test_a_kept_launch_calls_the_launcher_with_every_argument_in_order(device: SimpleNamespace) -> None:
    kernel = _FakeKernel()
    kept, _ = _kept(kernel)
    assert len(kernel.own) == 1 and kernel.compiled is not None and kernel.compiled.launches == []
    y = torch.ones(64)
    args = kept.bind(y)
    assert args is not None
    kept.launch(args)
    (launch,) = kernel.compiled.launches
    assert launch[:9] == (4, 2, 1, 1000, _FakeCompiled.function, _FakeCompiled.packed_metadata, None, None, None)
    assert launch[9] is y and launch[10] is kernel.own[0][1][1] and launch[11:] == (128, 2, 32)  # default, constexpr
    assert len(kernel.own) == 1


@pytest.mark.parametrize("change", ["dtype", "strides", "alignment"])
def test_a_tensor_the_kept_arguments_cannot_describe_is_refused(change: str, device: SimpleNamespace) -> None:
    kept, x = _kept(_FakeKernel())
    other = {"dtype": x.half(), "strides": torch.zeros(64, 2)[:, 0], "alignment": torch.zeros(65)[1:]}[change]
    assert kept.bind(other) is None


def test_an_unaligned_first_tensor_takes_any_alignment(device: SimpleNamespace) -> None:
    x = torch.zeros(65)[1:]
    kept = _launch.Relaunch(_FakeKernel(), (1,), (x, x, 64), {"BLOCK": 8}, (0, 1))
    assert kept.bind(torch.zeros(64), torch.zeros(65)[1:]) is not None


@pytest.mark.parametrize("why", ["interpreted", "launch hook", "exit hook", "other device"])
def test_without_a_compiled_kernel_to_call_the_launch_is_tritons_own(why: str, device: SimpleNamespace,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _FakeKernel(interpreted=why == "interpreted")
    kept, _ = _kept(kernel)
    if why.endswith("hook"):  # what a profiler does: a hook joins Triton's chain
        chain = _launch.knobs.HookChain()
        chain.add(lambda metadata: None)
        monkeypatch.setattr(_launch.knobs.runtime, "launch_enter_hook" if why == "launch hook" else "launch_exit_hook",
                            chain)
    elif why == "other device":
        device.index = 1
    y = torch.ones(64)
    args = kept.bind(y)
    assert args is not None
    kept.launch(args)
    assert len(kernel.own) == 2
    grid, again, options = kernel.own[1]
    assert grid == (4, 2, 1) and again[0] is y and again[1:] == (kernel.own[0][1][1], 128, 2, 32)
    assert options == {"num_warps": 4}
    assert kernel.compiled is None or kernel.compiled.launches == []


def test_a_kept_launch_holds_no_tensor_of_its_slots(device: SimpleNamespace) -> None:
    """The tensors a launch is given in its slots (a run's queries, an engine's KV pages) are not kept alive by it."""
    kernel = _FakeKernel()
    kept, x = _kept(kernel)
    gone = weakref.ref(x)
    del x
    kernel.own.clear()  # the stand-in's record of Triton's own launch holds the arguments too
    gc.collect()
    assert gone() is None
    args = kept.bind(torch.ones(64))
    assert args is not None and args[0] is not None
