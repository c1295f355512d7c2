"""Run Gluon kernels on the CPU, for the tests of the Hopper Gluon kernels on machines without a GPU.

Triton's interpreter does not run Gluon, so without this the Gluon kernels are only compiled in CI. Here each CTA of
the grid runs on its own, its warp partitions (``gl.warp_specialize``) as Python threads over torch tensors: a
partition's code is one program over whole tiles, as Gluon writes it, and layouts change no value, so they are
ignored. What the emulator models, and checks, is what the kernels' correctness rests on between partitions:

- **mbarriers**: arrival counts, the transaction bytes of ``expect``, phases and parity waits.
- **TMA loads** are asynchronous: the destination holds no data (NaN, and marked undefined) from the issue until the
  load completes, which happens at a random later sync point or when a partition waits on its barrier. Two loads in
  flight into one buffer, and a load never waited for, are errors. **TMA stores** complete at ``store_wait``: a
  source overwritten before then is an error.
- **cp.async** (``async_copy``): a copy's destination holds no data from the issue until ``wait_group`` retires
  its commit group; a copy never committed or waited for is an error.
- **wgmma**: each asynchronous ``warpgroup_mma`` is a commit group, computed in float32 when issued. A shared-memory
  operand with undefined elements is an error at the issue. When ``warpgroup_mma_wait`` retires a group, it is
  computed again from the operands as they are then: a difference means a buffer was overwritten under an MMA in
  flight (released too early, or read before it was written). A result used before its group retired is an error.
- **deadlock**: every live partition waiting, none able to pass, is an error listing each one's barrier and phase.
- **Schedules**: threads switch every few microseconds and sync points add random delays; half the time a
  partition that releases a buffer (``arrive``) or waits for its MMAs lets the others run until they block first,
  so a refill that would land under a read does. Each run sees other interleavings.

Not modelled: races between the warps of one partition (one thread runs them; the compiler syncs them), the memory
proxies (``fence_async_shared`` does nothing), clusters and multicast, and the physical XOR swizzle (a shared layout
stores 128-byte-wide column blocks one after another, which is what ``reinterpret`` views rely on).

    emulated(kernel)[grid](*args, **constexprs)   # as ``kernel[grid](...)``, on CPU tensors
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import random
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from triton.experimental.gluon import language as real_gl
from triton.experimental.gluon.language.nvidia import hopper as real_hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as real_async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier as real_mbarrier
from triton.experimental.gluon.language.nvidia.hopper import tma as real_tma
from triton.runtime.jit import ConstexprFunction, JITFunction


class EmulationError(AssertionError):
    """A kernel broke a rule the hardware relies on (a race, a deadlock, an undefined read, a misuse)."""


class _Aborted(Exception):
    """Another partition of the CTA failed: this one stops."""


_tls = threading.local()
#: Gluon's element types (by their names in ``gl``) as torch's; in emulated code ``gl.bfloat16`` is torch's
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
           "int64": torch.int64, "int16": torch.int16, "int8": torch.int8, "int1": torch.bool,
           "float8e4nv": torch.float8_e4m3fn, "float8e5": torch.float8_e5m2, "uint8": torch.uint8}


# -- register tensors and global memory ---------------------------------------------------------------------
class Tensor(torch.Tensor):
    """A register tensor: a torch tensor whose ``type.layout`` exists (kernels read it to build layouts)."""

    @property
    def type(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(layout=None, shape=list(self.shape), element_ty=self.dtype)


def _t(x: Any, dtype: torch.dtype | None = None) -> Tensor:
    return torch.as_tensor(x, dtype=dtype).as_subclass(Tensor)


class Pointer:
    """A pointer (or block of pointers) into a CPU tensor's storage: ``offsets`` in elements from its first."""

    def __init__(self, base: torch.Tensor, offsets: Any = 0) -> None:
        self.base, self.offsets = base, torch.as_tensor(offsets, dtype=torch.int64)

    def __add__(self, other: Any) -> Pointer:
        return Pointer(self.base, self.offsets + torch.as_tensor(other).to(torch.int64))

    __radd__ = __add__

    @property
    def dtype(self) -> Any:
        return types.SimpleNamespace(element_ty=self.base.dtype)

    def flat(self) -> torch.Tensor:
        """The storage from the base's first element on, as one dimension."""
        start = self.base.storage_offset()
        count = self.base.untyped_storage().nbytes() // self.base.element_size() - start
        return self.base.as_strided((count,), (1,), start)

    def checked(self, mask: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(storage, offsets, mask) broadcast together; masked-in offsets must lie in the storage."""
        flat = self.flat()
        mask = torch.ones((), dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        offsets, mask = torch.broadcast_tensors(self.offsets, mask)
        bad = mask & ((offsets < 0) | (offsets >= flat.numel()))
        if bad.any():
            raise EmulationError(f"global access out of bounds: offset {int(offsets[bad][0])} of a storage of "
                                 f"{flat.numel()} elements")
        return flat, offsets, mask


def _load(pointer: Pointer, mask: Any = None, other: Any = None, **_: Any) -> Tensor:
    flat, offsets, mask = pointer.checked(mask)
    values = flat[offsets.clamp(0, max(flat.numel() - 1, 0))]
    if other is None:  # masked-out lanes of a load without ``other`` are undefined
        other = float("nan") if values.is_floating_point() else 0
    return torch.where(mask, values, torch.as_tensor(other, dtype=values.dtype)).as_subclass(Tensor)


def _store(pointer: Pointer, value: Any, mask: Any = None, **_: Any) -> None:
    flat, offsets, mask = pointer.checked(mask)
    offsets, mask, value = torch.broadcast_tensors(offsets, mask, torch.as_tensor(value).to(flat.dtype))
    flat[offsets[mask]] = value[mask]


def _atomic_add(pointer: Pointer, val: Any, mask: Any = None, sem: Any = None, scope: Any = None, **_: Any) -> Any:
    """The old values; the partitions' threads take the CTA's lock, and CTAs run one after another."""
    with _cta().cond:
        flat, offsets, mask = pointer.checked(mask)
        old = flat[offsets].clone()
        add = torch.as_tensor(val, dtype=flat.dtype).expand_as(offsets)
        flat.index_put_((offsets[mask],), add[mask], accumulate=True)
    return old.as_subclass(Tensor)


# -- shared memory ------------------------------------------------------------------------------------------
class _Storage:
    """One shared-memory allocation: values, which elements hold data, which a TMA load is writing."""

    def __init__(self, numel: int, dtype: torch.dtype, name: str) -> None:
        poison = float("nan") if dtype.is_floating_point else 0
        # one-byte types kept as float32 (exactly): torch cannot scatter into float8 tensors on the CPU
        self.data = torch.full((numel,), poison, dtype=torch.float32 if dtype.itemsize == 1 else dtype)
        self.dtype, self.name = dtype, name
        self.defined = torch.zeros(numel, dtype=torch.bool)
        self.loading = torch.zeros(numel, dtype=torch.bool)


def _physical_offsets(shape: list[int], layout: Any) -> torch.Tensor:
    """Element offsets of a (..., rows, cols) buffer in ``layout``: an NVMMA layout whose swizzle is narrower than a
    row stores the columns in swizzle-wide blocks, one after another (the swizzle within a block is left out), and a
    transposed one the same with rows and columns swapped; leading dims stack whole tiles; anything else is
    row-major."""
    if len(shape) < 2 or not isinstance(layout, real_gl.NVMMASharedLayout):
        return torch.arange(math.prod(shape), dtype=torch.int64).view(shape)
    rows, cols = shape[-2:][::-1] if layout.transposed else shape[-2:]
    width = layout.swizzle_byte_width * 8 // layout.element_bitwidth
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    if width and cols > width and cols % width == 0:
        tile = (c // width) * rows * width + r * width + c % width
    else:
        tile = r * cols + c
    if layout.transposed:
        tile = tile.T
    lead = math.prod(shape[:-2])
    return (torch.arange(lead)[:, None, None] * rows * cols + tile).reshape(shape)


class SharedMemory:
    """A view of a shared-memory allocation: its elements' offsets in logical (row-major) order."""

    def __init__(self, storage: _Storage, offsets: torch.Tensor, layout: Any) -> None:
        self.storage, self.offsets, self.layout = storage, offsets, layout

    @property
    def shape(self) -> list[int]:
        return list(self.offsets.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.dtype

    def _view(self, offsets: torch.Tensor) -> SharedMemory:
        return SharedMemory(self.storage, offsets, self.layout)

    def index(self, i: Any) -> SharedMemory:
        return self._view(self.offsets[int(i)])

    def slice(self, start: Any, length: int, dim: int = 0) -> SharedMemory:
        return self._view(self.offsets.narrow(int(dim), int(start), int(length)))

    def permute(self, order: Any) -> SharedMemory:
        return self._view(self.offsets.permute(*[int(o) for o in order]))

    def reinterpret(self, dtype: Any, shape: Any, layout: Any) -> SharedMemory:
        """The same bytes in another shape and layout (same element type)."""
        if _dtype(dtype) != self.dtype:
            raise NotImplementedError("gluon_emulator: reinterpret to another element type")
        first = int(self.offsets.min())
        if not torch.equal(self.offsets.flatten().sort().values, torch.arange(first, first + self.offsets.numel())):
            raise EmulationError("reinterpret of a view that is not one contiguous range of its allocation")
        shape = [int(s) for s in shape]
        if math.prod(shape) != self.offsets.numel():
            raise EmulationError(f"reinterpret to {shape}: {self.offsets.numel()} elements, not {math.prod(shape)}")
        return SharedMemory(self.storage, first + _physical_offsets(shape, layout), layout)

    _reinterpret = reinterpret

    def values(self) -> torch.Tensor:
        return self.storage.data[self.offsets].to(self.dtype)

    def load(self, layout: Any = None) -> Tensor:
        return self.values().as_subclass(Tensor)

    def store(self, value: Any) -> None:
        value = torch.as_tensor(value)
        if value.dtype != self.dtype or list(value.shape) != self.shape:
            raise EmulationError(f"store of {value.dtype} {list(value.shape)} into {self.storage.name}: "
                                 f"{self.dtype} {self.shape}")
        self._write(value)

    def _write(self, value: torch.Tensor) -> None:
        self.storage.data[self.offsets] = value.to(self.storage.data.dtype)
        self.storage.defined[self.offsets] = True

    def undefined(self) -> bool:
        return not bool(self.storage.defined[self.offsets].all())


# -- mbarriers ----------------------------------------------------------------------------------------------
class _Barrier:
    def __init__(self, name: str) -> None:
        self.name, self.count, self.left, self.tx, self.phases = name, 0, 0, 0, 0

    def describe(self) -> str:
        return f"{self.name} (phases completed {self.phases}, arrivals missing {self.left}, bytes missing {self.tx})"

    def arrive(self, cta: _CTA, count: int) -> None:
        if not self.count:
            raise EmulationError(f"arrive on {self.name} before mbarrier.init")
        self.left -= count
        if self.left < 0:
            raise EmulationError(f"more arrivals than {self.count} in one phase of {self.describe()}")
        self._flip_if_done(cta)

    def _flip_if_done(self, cta: _CTA) -> None:
        if self.count and self.left == 0 and self.tx == 0:
            self.phases += 1
            self.left = self.count
            cta.changed()


class BarrierArray:
    """``allocate_shared_memory(int64, shape, MBarrierLayout())``: mbarriers; a one-element array is one."""

    def __init__(self, barriers: list[_Barrier], shape: list[int]) -> None:
        self.barriers, self.shape = barriers, shape

    def index(self, i: Any) -> BarrierArray:
        step = math.prod(self.shape[1:])
        return BarrierArray(self.barriers[int(i) * step:(int(i) + 1) * step], self.shape[1:])

    def one(self) -> _Barrier:
        if len(self.barriers) != 1:
            raise EmulationError(f"an mbarrier operation on {len(self.barriers)} barriers (shape {self.shape})")
        return self.barriers[0]


class _Copy:
    def __init__(self, barrier: _Barrier, dest: SharedMemory, box: torch.Tensor) -> None:
        self.barrier, self.dest, self.box = barrier, dest, box
        self.nbytes = box.numel() * box.element_size()


# -- a CTA: its partitions, their waits, the loads and MMAs in flight ------------------------------------------
class _CTA:
    def __init__(self, pid: tuple[int, int, int], grid: tuple[int, int, int], seed: int) -> None:
        self.pid, self.grid = pid, grid
        self.cond = threading.Condition()
        self.rng = random.Random(seed)
        self.copies: list[_Copy] = []
        self.epoch = 0  # bumped by every change a waiter could be waiting for
        self.live: dict[str, str | None] = {}  # partition -> what it waits for (None: running)
        self.seen: dict[str, int] = {}  # partition -> the epoch it last checked its wait at
        self.failure: BaseException | None = None
        self.settling: str | None = None  # the partition letting the others run (``settle``)
        self.names = itertools.count()

    def changed(self) -> None:
        self.epoch += 1
        self.cond.notify_all()

    def complete(self, copy: _Copy) -> None:
        self.copies.remove(copy)
        copy.dest._write(copy.box)
        copy.dest.storage.loading[copy.dest.offsets] = False
        copy.barrier.tx -= copy.nbytes
        copy.barrier._flip_if_done(self)

    def jitter(self) -> None:
        """At a sync point: maybe land a TMA load early, maybe let another partition run."""
        with self.cond:
            if self.copies and self.rng.random() < 0.3:
                self.complete(self.rng.choice(self.copies))
            pause = self.rng.random() < 0.3
        if pause:
            time.sleep(self.rng.random() * 2e-4)

    def settle(self) -> None:
        """Let the other partitions run until each waits on a barrier it cannot pass (or 50 ms): after a release
        they act on it at once, so a buffer released while this partition still reads it is refilled under it."""
        me = _tls.name
        deadline = time.monotonic() + 0.05
        with self.cond:
            if self.settling is not None:  # one at a time: the others run on, as they are the ones to let run
                return
            self.settling = me
            try:
                while not all(w is not None and self.seen.get(p) == self.epoch
                              for p, w in self.live.items() if p != me):
                    if self.failure is not None:
                        raise _Aborted
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.cond.wait(left):
                        return
            finally:
                self.settling = None

    def wait_for(self, barrier: _Barrier, phase: int) -> None:
        """Block until ``barrier``'s current phase parity differs from ``phase`` (a completed phase ``phase``)."""
        me = _tls.name
        with self.cond:
            while True:
                if self.failure is not None:
                    raise _Aborted
                for copy in [c for c in self.copies if c.barrier is barrier]:
                    self.complete(copy)
                if barrier.phases % 2 != phase:
                    self.live[me] = None
                    return
                self.live[me] = f"waits for phase {phase} of {barrier.describe()}"
                self.seen[me] = self.epoch
                self.cond.notify_all()  # a partition settling may be waiting for this one to block
                if all(w is not None and self.seen.get(p) == self.epoch for p, w in self.live.items()):
                    waits = "\n  ".join(f"{p}: {w}" for p, w in self.live.items())
                    raise EmulationError(f"deadlock in CTA {self.pid}:\n  {waits}")
                if not self.cond.wait(timeout=60):
                    raise EmulationError(f"CTA {self.pid}: {me} waited 60 s for {barrier.describe()}")

    def enter(self, name: str) -> None:
        with self.cond:
            self.live[name] = None

    def leave(self, name: str) -> None:
        with self.cond:
            self.live.pop(name, None)
            self.changed()

    def fail(self, error: BaseException) -> None:
        """Record the CTA's first failure and wake every partition, to stop."""
        with self.cond:
            if self.failure is None and not isinstance(error, _Aborted):
                self.failure = error
            self.changed()

    def run(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run partition ``name`` in this thread to its end; a failure is recorded, not raised."""
        _tls.cta, _tls.name, _tls.groups, _tls.stores = self, name, [], []
        _tls.copies_open, _tls.copy_groups = [], []
        try:
            fn(*args)
            _check_drained()
        except BaseException as e:
            self.fail(e)
        finally:
            self.leave(name)


def _cta() -> _CTA:
    return _tls.cta


def _check_drained() -> None:
    if _tls.groups:
        raise EmulationError(f"{_tls.name} ended with {len(_tls.groups)} wgmma groups never waited for")
    if _tls.stores:
        raise EmulationError(f"{_tls.name} ended with {len(_tls.stores)} TMA stores never waited for")
    if _tls.copies_open or _tls.copy_groups:
        raise EmulationError(f"{_tls.name} ended with cp.async copies never committed or waited for")


def _warp_specialize(functions_and_args: Any, worker_num_warps: Any = None, worker_num_regs: Any = None) -> Any:
    """The default partition in this thread, each worker in its own; returns when all have ended."""
    cta, me = _cta(), _tls.name
    (default, default_args), *workers = functions_and_args
    threads = []
    for i, (fn, args) in enumerate(workers, start=1):
        name = f"partition {i} ({getattr(fn, '__name__', '?')})"
        cta.enter(name)
        threads.append(threading.Thread(target=cta.run, args=(name, fn, tuple(args)), daemon=True))
    for thread in threads:
        thread.start()
    try:
        result = default(*default_args)
        _check_drained()
    except BaseException as e:
        cta.fail(e)
        raise
    finally:
        cta.leave(me)  # while it joins the workers, they alone decide whether the CTA is deadlocked
        for thread in threads:
            thread.join()
        cta.enter(me)
    if cta.failure is not None:
        raise _Aborted
    return result


# -- the gl / mbarrier / tma / hopper builtins -------------------------------------------------------------
def _dtype(d: Any) -> torch.dtype:
    """A torch dtype from a torch or a Gluon one."""
    if isinstance(d, torch.dtype):
        return d
    return next(t for name, t in _DTYPES.items() if str(getattr(real_gl, name)) == str(d))


def _gluon_dtype(d: Any) -> Any:
    return next(getattr(real_gl, name) for name, t in _DTYPES.items() if t == _dtype(d))


class _NVMMASharedLayout:
    """``gl.NVMMASharedLayout`` taking torch dtypes in ``get_default_for``; its layouts are Gluon's own."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return real_gl.NVMMASharedLayout(*args, **kwargs)

    @staticmethod
    def get_default_for(block: Any, dtype: Any, *args: Any, **kwargs: Any) -> Any:
        return real_gl.NVMMASharedLayout.get_default_for(block, _gluon_dtype(dtype), *args, **kwargs)


def _allocate_shared_memory(dtype: Any, shape: Any, layout: Any, value: Any = None) -> Any:
    cta = _cta()
    shape = [int(s) for s in shape]
    caller = traceback.extract_stack(limit=2)[0]
    name = f"smem#{next(cta.names)} {list(shape)} ({caller.name}, line {caller.lineno})"
    if isinstance(layout, real_mbarrier.MBarrierLayout):
        return BarrierArray([_Barrier(f"{name}[{i}]") for i in range(math.prod(shape))], shape)
    storage = _Storage(math.prod(shape), _dtype(dtype), name)
    view = SharedMemory(storage, _physical_offsets(shape, layout), layout)
    if value is not None:
        view.store(value)
    return view


def _where(cond: Any, x: Any, y: Any) -> Any:
    if not isinstance(cond, torch.Tensor):
        return x if cond else y
    ref = x if isinstance(x, torch.Tensor) else y
    dtype = ref.dtype if isinstance(ref, torch.Tensor) else None
    return torch.where(cond, torch.as_tensor(x, dtype=dtype), torch.as_tensor(y, dtype=dtype)).as_subclass(Tensor)


def _binary(op: Callable[..., torch.Tensor]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any, **_: Any) -> Any:
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            return op(torch.as_tensor(a), torch.as_tensor(b)).item()
        ref = a if isinstance(a, torch.Tensor) else b
        return op(torch.as_tensor(a, dtype=ref.dtype), torch.as_tensor(b, dtype=ref.dtype)).as_subclass(Tensor)
    return apply


#: the PTX of ``inline_asm_elementwise`` the emulator runs: the instruction -> its value on one operand
_ASM = {"tanh.approx.f32 $0, $1;": torch.tanh}


def _inline_asm_elementwise(asm: str, constraints: str, args: Any, dtype: Any, is_pure: bool, pack: int) -> Tensor:
    if asm not in _ASM or len(args) != 1 or pack != 1:
        raise EmulationError(f"inline_asm_elementwise: the emulator does not run {asm!r} on {len(args)} operands")
    return _t(_ASM[asm](args[0].float()), _dtype(dtype))


def _program_id(axis: int) -> Tensor:
    return _t(_cta().pid[int(axis)], torch.int32)


def _num_programs(axis: int) -> Tensor:
    return _t(_cta().grid[int(axis)], torch.int32)


def _static_range(*args: Any) -> range:
    return range(*[int(a) for a in args])


_gl = types.SimpleNamespace(
    allocate_shared_memory=_allocate_shared_memory,
    warp_specialize=_warp_specialize,
    program_id=_program_id,
    num_programs=_num_programs,
    static_range=_static_range,
    load=_load,
    store=_store,
    atomic_add=_atomic_add,
    arange=lambda start, end, layout=None: _t(torch.arange(int(start), int(end), dtype=torch.int32)),
    zeros=lambda shape, dtype, layout=None: _t(torch.zeros([int(s) for s in shape], dtype=_dtype(dtype))),
    full=lambda shape, value, dtype, layout=None: _t(torch.full([int(s) for s in shape], value, dtype=_dtype(dtype))),
    zeros_like=lambda t, **_: torch.zeros_like(t).as_subclass(Tensor),
    convert_layout=lambda x, layout=None, **_: x,
    multiple_of=lambda x, values: x,
    where=_where,
    inline_asm_elementwise=_inline_asm_elementwise,
    maximum=_binary(torch.maximum),
    minimum=_binary(torch.minimum),
    cdiv=lambda a, b: (a + b - 1) // b,
    max=lambda x, axis, keep_dims=False: torch.amax(x, dim=int(axis), keepdim=bool(keep_dims)).as_subclass(Tensor),
    sum=lambda x, axis, keep_dims=False: torch.sum(x, dim=int(axis), keepdim=bool(keep_dims)).as_subclass(Tensor),
    exp2=torch.exp2, log2=torch.log2,
    barrier=lambda: None, thread_barrier=lambda: None,
    constexpr=lambda v: v,
    **{name: _DTYPES[name] for name in _DTYPES},
)
# register layouts change no value: stand-ins; shared layouts are Gluon's (they place a buffer's elements)
for _name in ("BlockedLayout", "SliceLayout", "NVMMADistributedLayout", "DotOperandLayout", "DistributedLinearLayout"):
    setattr(_gl, _name, lambda *args, **kwargs: None)
_gl.NVMMASharedLayout = _NVMMASharedLayout
_gl.SwizzledSharedLayout = real_gl.SwizzledSharedLayout


def _init(bar: BarrierArray, count: int) -> None:
    cta = _cta()
    b = bar.one()
    with cta.cond:
        b.count = b.left = int(count)


def _arrive(bar: BarrierArray, *, count: int = 1, pred: Any = True, **_: Any) -> None:
    cta = _cta()
    cta.jitter()
    if not bool(pred):
        return
    with cta.cond:
        bar.one().arrive(cta, int(count))
        settle = cta.rng.random() < 0.5
    if settle:  # half the time the other partitions act on the release at once
        cta.settle()


def _expect(bar: BarrierArray, nbytes: int, pred: Any = True, **_: Any) -> None:
    """Arrive once, and the phase also waits for ``nbytes`` of TMA loads."""
    cta = _cta()
    if not bool(pred):
        return
    with cta.cond:
        b = bar.one()
        b.tx += int(nbytes)
        b.arrive(cta, 1)


def _wait(bar: BarrierArray, phase: Any, pred: Any = True, deps: Any = ()) -> None:
    cta = _cta()
    cta.jitter()
    if bool(pred):
        cta.wait_for(bar.one(), int(phase) & 1)


_mbarrier = types.SimpleNamespace(init=_init, arrive=_arrive, expect=_expect, wait=_wait,
                                  invalidate=lambda bar: None, MBarrierLayout=real_mbarrier.MBarrierLayout)


class Descriptor:
    """A host ``TensorDescriptor`` as a kernel sees it: ``block_type.shape / nbytes``, ``dtype``, ``layout``."""

    def __init__(self, host: Any) -> None:
        self.tensor = host.base.as_strided(list(host.shape), list(host.strides))
        self.block_shape = [int(s) for s in host.block_shape]
        self.layout = host.layout
        self.dtype = self.tensor.dtype
        nbytes = math.prod(self.block_shape) * self.tensor.element_size()
        self.block_type = types.SimpleNamespace(shape=self.block_shape, nbytes=nbytes)

    def _clip(self, coords: list[int]) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
        """(tensor slices, box slices) of the part of the box at ``coords`` inside the tensor; None if none is."""
        src, dst = [], []
        for c, b, n in zip(coords, self.block_shape, self.tensor.shape, strict=True):
            lo, hi = max(c, 0), min(c + b, n)
            if hi <= lo:
                return None
            src.append(slice(lo, hi))
            dst.append(slice(lo - c, hi - c))
        return tuple(src), tuple(dst)

    def write(self, coords: list[int], values: torch.Tensor) -> None:
        """A TMA store: the part of the box inside the tensor."""
        clipped = self._clip(coords)
        if clipped is not None:
            self.tensor[clipped[0]] = values[clipped[1]]

    def box(self, coords: list[int]) -> torch.Tensor:
        """The block at ``coords``, zeros where it leaves the tensor (TMA's zero padding)."""
        out = torch.zeros(self.block_shape, dtype=self.dtype)
        clipped = self._clip(coords)
        if clipped is not None:
            out[clipped[1]] = self.tensor[clipped[0]]
        return out


def _claim(dest: SharedMemory, what: str) -> None:
    """Mark ``dest`` as the destination of an asynchronous copy (``what``, for the error): it holds no data (NaN, or
    0 for integers, and undefined) until the copy lands; two copies in flight into one element are an error. Called
    under the CTA's lock."""
    storage = dest.storage
    if storage.loading[dest.offsets].any():
        raise EmulationError(f"two {what} in flight into {storage.name}")
    storage.loading[dest.offsets] = True
    storage.defined[dest.offsets] = False
    storage.data[dest.offsets] = float("nan") if storage.data.is_floating_point() else 0


def _tma_load(desc: Descriptor, coord: Any, bar: BarrierArray, result: SharedMemory, pred: Any = True,
              multicast: bool = False, **_: Any) -> None:
    cta = _cta()
    if multicast:
        raise NotImplementedError("gluon_emulator: TMA multicast (clusters) is not modelled")
    if not bool(pred):
        return
    box = desc.box([int(c) for c in coord])
    if list(box.shape) != result.shape:
        raise EmulationError(f"TMA box {list(box.shape)} into {result.storage.name} viewed as {result.shape}")
    with cta.cond:
        _claim(result, "TMA loads")
        cta.copies.append(_Copy(bar.one(), result, box))
        cta.changed()  # a partition waiting on ``bar`` can now land it
    cta.jitter()


class _Store:
    """A TMA store in flight: its source, and the values it held at the issue."""

    def __init__(self, desc: Descriptor, coords: list[int], src: SharedMemory) -> None:
        self.desc, self.coords, self.src, self.values = desc, coords, src, src.values()


def _tma_store(desc: Descriptor, coord: Any, src: SharedMemory, **_: Any) -> None:
    _cta().jitter()
    if src.undefined():
        raise EmulationError(f"TMA store from {src.storage.name} where it holds no data")
    if src.shape != desc.block_shape:
        raise EmulationError(f"TMA store of {src.shape} from {src.storage.name} as a {desc.block_shape} box")
    _tls.stores.append(_Store(desc, [int(c) for c in coord], src))


def _store_wait(pendings: int = 0) -> None:
    """Complete this partition's TMA stores but the last ``pendings``; a source changed meanwhile is an error."""
    _cta().jitter()
    while len(_tls.stores) > int(pendings):
        store = _tls.stores.pop(0)
        if not _same(store.src.values(), store.values):
            raise EmulationError(f"{store.src.storage.name} was overwritten under a TMA store in flight (before "
                                 f"store_wait)")
        store.desc.write(store.coords, store.values)


_tma = types.SimpleNamespace(async_load=_tma_load, async_copy_global_to_shared=_tma_load, async_store=_tma_store,
                             async_copy_shared_to_global=_tma_store, store_wait=_store_wait)


def _async_copy_load(smem: SharedMemory, pointer: Pointer, mask: Any = None, **_: Any) -> None:
    """cp.async: the values (zeros where masked out) land at this partition's ``wait_group``."""
    cta = _cta()
    values = _load(pointer, mask, other=0)
    if list(values.shape) != smem.shape:
        raise EmulationError(f"cp.async of {list(values.shape)} into {smem.storage.name} viewed as {smem.shape}")
    with cta.cond:
        _claim(smem, "copies")
    _tls.copies_open.append((smem, torch.as_tensor(values).clone()))
    cta.jitter()


def _commit_group() -> None:
    _tls.copy_groups.append(_tls.copies_open)
    _tls.copies_open = []


def _wait_group(num_outstanding: int = 0) -> None:
    """Land this partition's committed cp.async groups but the last ``num_outstanding``."""
    cta = _cta()
    cta.jitter()
    while len(_tls.copy_groups) > int(num_outstanding):
        for smem, values in _tls.copy_groups.pop(0):
            with cta.cond:
                smem._write(values)
                smem.storage.loading[smem.offsets] = False


_async_copy = types.SimpleNamespace(async_load=_async_copy_load, async_copy_global_to_shared=_async_copy_load,
                                    commit_group=_commit_group, wait_group=_wait_group)


class _Group:
    """An asynchronous wgmma: its operands and its result as computed at the issue."""

    def __init__(self, a: Any, b: SharedMemory, acc: torch.Tensor | None, result: torch.Tensor) -> None:
        self.a, self.b, self.acc, self.result, self.retired = a, b, acc, result, False

    def recompute(self) -> torch.Tensor:
        return _mma_value(self.a, self.b, self.acc)


class MMAResult:
    """The token of an asynchronous ``warpgroup_mma``: only another wgmma's accumulator or ``warpgroup_mma_wait``
    may take it."""

    def __init__(self, group: _Group) -> None:
        self.group = group


def _mma_value(a: Any, b: SharedMemory, acc: torch.Tensor | None) -> torch.Tensor:
    av = a.values() if isinstance(a, SharedMemory) else a
    out = av.float() @ b.values().float()
    return out if acc is None else out + acc


def _warpgroup_mma(a: Any, b: SharedMemory, acc: Any, *, use_acc: Any = True, is_async: bool = False,
                   **_: Any) -> Any:
    cta = _cta()
    cta.jitter()
    if isinstance(acc, MMAResult):
        if acc.group not in _tls.groups and not acc.group.retired:
            raise EmulationError("warpgroup_mma accumulates into another partition's MMA")
        acc_value = acc.group.result
    else:
        acc_value = acc
    for name, op in (("a", a), ("b", b)):
        if isinstance(op, SharedMemory) and op.undefined():
            raise EmulationError(f"warpgroup_mma operand {name} reads {op.storage.name} where it holds no data "
                                 f"(never written, or a TMA load into it not yet waited for)")
    a_dtype = a.dtype
    if a_dtype != b.dtype or a_dtype not in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        raise EmulationError(f"warpgroup_mma operands {a_dtype} x {b.dtype}")
    a_snapshot = a if isinstance(a, SharedMemory) else torch.as_tensor(a).clone()
    base = acc_value if bool(use_acc) else None
    result = _mma_value(a_snapshot, b, base)
    if list(result.shape) != list(acc_value.shape):
        raise EmulationError(f"warpgroup_mma result {list(result.shape)} into an accumulator {list(acc_value.shape)}")
    group = _Group(a_snapshot, b, base, result)
    _tls.groups.append(group)
    if is_async:
        return MMAResult(group)
    _retire(0)
    return result.clone().as_subclass(Tensor)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where NaN."""
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))


def _retire(outstanding: int) -> None:
    groups = _tls.groups
    while len(groups) > outstanding:
        group = groups.pop(0)
        again = group.recompute()
        if not _same(again, group.result):
            where = group.b.storage.name if not isinstance(group.a, SharedMemory) else \
                f"{group.a.storage.name} or {group.b.storage.name}"
            raise EmulationError(f"shared memory read by an MMA in flight ({where}) was overwritten before "
                                 f"warpgroup_mma_wait retired the MMA (released too early, or read before written)")
        group.retired = True


def _warpgroup_mma_wait(num_outstanding: int = 0, deps: Any = None) -> Any:
    cta = _cta()
    cta.jitter()
    if cta.rng.random() < 0.5:  # a slow MMA: the other partitions run first
        cta.settle()
    if deps is None:
        raise EmulationError("warpgroup_mma_wait without deps")
    _retire(int(num_outstanding))
    out = []
    for dep in deps:
        if isinstance(dep, MMAResult):
            if not dep.group.retired:
                raise EmulationError(f"warpgroup_mma_wait(num_outstanding={num_outstanding}) returns an MMA result "
                                     f"still in flight")
            out.append(dep.group.result.clone().as_subclass(Tensor))
        else:
            out.append(dep)
    return out[0] if len(out) == 1 else tuple(out)


_hopper = types.SimpleNamespace(warpgroup_mma=_warpgroup_mma, warpgroup_mma_wait=_warpgroup_mma_wait,
                                fence_async_shared=lambda **_: None, mbarrier=_mbarrier, tma=_tma)


# -- running a kernel's Python code against the builtins above ------------------------------------------------
def _replacements() -> dict[int, Any]:
    """id(real Gluon object) -> its stand-in, for the names a kernel module may hold."""
    pairs: dict[int, Any] = {id(real_gl): _gl, id(real_mbarrier): _mbarrier, id(real_tma): _tma,
                             id(real_hopper): _hopper, id(real_async_copy): _async_copy}
    for real, fake in ((real_gl, _gl), (real_mbarrier, _mbarrier), (real_tma, _tma), (real_hopper, _hopper),
                       (real_async_copy, _async_copy)):
        for name, value in vars(fake).items():
            original = getattr(real, name, None)
            if original is not None and callable(value) and not isinstance(original, type):
                pairs[id(original)] = value
    return pairs


_REPLACE = _replacements()
#: id(jit function) -> (it, its plain function); id(module globals) -> (them, patched); the originals are kept so
#: that their ids stay theirs
_PLAIN: dict[int, tuple[Any, Callable[..., Any]]] = {}
_GLOBALS: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}


def _plain(fn: Any) -> Callable[..., Any]:
    """``fn`` (a Gluon jit or constexpr function) as a Python function over the stand-ins."""
    if id(fn) not in _PLAIN:
        raw = fn.fn if isinstance(fn, (JITFunction, ConstexprFunction)) else fn
        plain = types.FunctionType(raw.__code__, _patched(raw.__globals__), raw.__name__, raw.__defaults__,
                                   raw.__closure__)
        plain.__kwdefaults__ = raw.__kwdefaults__
        _PLAIN[id(fn)] = (fn, plain)
    return _PLAIN[id(fn)][1]


def _patched(module_globals: dict[str, Any]) -> dict[str, Any]:
    """A copy of a module's globals, taken once, with the Gluon builtins, modules and constexprs replaced and its
    jit helpers made plain when called."""
    if id(module_globals) not in _GLOBALS:
        patched: dict[str, Any] = {}
        _GLOBALS[id(module_globals)] = (module_globals, patched)
        for name, value in module_globals.items():
            if id(value) in _REPLACE:
                patched[name] = _REPLACE[id(value)]
            elif isinstance(value, real_gl.constexpr):
                patched[name] = value.value
            elif isinstance(value, (JITFunction, ConstexprFunction)):
                patched[name] = _Deferred(value)
            else:
                patched[name] = value
    return _GLOBALS[id(module_globals)][1]


class _Deferred:
    """A jit helper named in a module's globals, made plain when first called (helpers may refer to each other)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "?")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _plain(self.fn)(*args, **kwargs)


class emulated:  # noqa: N801 - used as ``emulated(kernel)[grid](...)``, as a jit kernel is
    """A Gluon kernel to run on the CPU: ``emulated(kernel)[grid](*args, **constexprs)``. Tensor arguments become
    pointers, host ``TensorDescriptor``s device descriptors; launch options that are not parameters (``maxnreg``,
    ``num_ctas``, ...) are ignored. ``seed`` varies the random delays."""

    def __init__(self, kernel: Any, seed: int = 0) -> None:
        self.kernel, self.seed = kernel, seed
        self.params = list(inspect.signature(kernel.fn).parameters)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            if kwargs.get("num_ctas", 1) > 1 or kwargs.get("CTAS", 1) > 1:
                raise NotImplementedError("gluon_emulator: clusters of several CTAs are not modelled")
            bound = dict(zip(self.params, args, strict=False))
            bound.update({k: v for k, v in kwargs.items() if k in self.params})
            missing = [p for p in self.params if p not in bound]
            if missing:
                raise TypeError(f"{self.kernel.fn.__name__}: missing arguments {missing}")
            values = [_argument(bound[p]) for p in self.params]
            dims = (*(grid(bound) if callable(grid) else grid), 1, 1)
            self.run(dims[:3], values)
        return launch

    def run(self, grid: tuple[int, int, int], args: list[Any]) -> None:
        kernel = _plain(self.kernel)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(5e-6)
        try:
            for pid in itertools.product(*[range(int(g)) for g in grid]):
                cta = _CTA(pid, grid, hash((self.seed, pid)))  # type: ignore[arg-type]
                cta.enter("partition 0")
                cta.run("partition 0", kernel, tuple(args))
                if cta.failure is not None:
                    raise cta.failure
                if cta.copies:
                    raise EmulationError(f"CTA {pid} ended with {len(cta.copies)} TMA loads never waited for")
        finally:
            sys.setswitchinterval(interval)


def _argument(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError("gluon_emulator runs on CPU tensors")
        return Pointer(value)
    if type(value).__name__ == "TensorDescriptor":
        return Descriptor(value)
    return value


@contextlib.contextmanager
def emulating(module: Any, *names: str) -> Iterator[None]:
    """Context: ``module.name`` (jit kernels) replaced by their emulated launchers, so a host launcher that indexes
    them by grid runs on the CPU."""
    saved = {n: getattr(module, n) for n in names}
    try:
        for n in names:
            setattr(module, n, emulated(saved[n]))
        yield
    finally:
        for n, v in saved.items():
            setattr(module, n, v)
