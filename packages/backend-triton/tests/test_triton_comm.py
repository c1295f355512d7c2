"""Triton's comm kernels: the one-shot sums (plain, and fused with the residual add and RMSNorm) over simulated peers
(several buffers of one process, CPU interpreter or GPU), the launchers' exchange through a simulated symmetric
memory, all-reduce-then-norm on two gloo ranks, the declared capabilities and costs, and real ranks (GPU: one rank
on one GPU, two where two GPUs are)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.ops.comm import CommProblem
from kernel_switchboard.testing import assert_close, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
OP = "comm.all_reduce_fused_rms_norm"
EPS = 1e-6


def _inputs(world: int, rows: int, hidden: int, dtype: torch.dtype,
            device: str = DEVICE) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Every rank's contribution (rank r seeded 100 + r), the residual and the weight (the same on every rank)."""
    xs = [torch.randn(rows, hidden, generator=torch.Generator().manual_seed(100 + r)).to(device, dtype)
          for r in range(world)]
    residual = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(7)).to(device, dtype)
    weight = (torch.rand(hidden, generator=torch.Generator().manual_seed(8)) + 0.5).to(device, dtype)
    return xs, residual, weight


def _expected(xs: list[torch.Tensor], residual: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s) in float64: s = sum of the contributions + residual, y = rms_norm(s) * weight."""
    s = sum(x.double() for x in xs) + residual.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * weight.double(), s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (5, 200), (33, 96)])
def test_kernel_sums_simulated_peers_then_normalises(world: int, dtype: torch.dtype, rows: int, hidden: int) -> None:
    from kernel_switchboard_triton.comm import sum_add_rms_norm

    xs, residual, weight = _inputs(world, rows, hidden, dtype)
    peers = torch.tensor([x.data_ptr() for x in xs], dtype=torch.int64, device=DEVICE)
    y, s = sum_add_rms_norm(peers, residual, weight, EPS)
    want_y, want_s = _expected(xs, residual, weight)
    atol, rtol = tolerance(dtype)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == residual.shape
    assert_close(s, want_s.to(dtype), atol=atol, rtol=rtol)
    assert_close(y, want_y.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 700), (0, 8)])  # 4,900 elements: a partial last block
def test_sum_kernel_adds_simulated_peers(world: int, dtype: torch.dtype, rows: int, hidden: int) -> None:
    from kernel_switchboard_triton.comm import sum_peers

    xs, _, _ = _inputs(world, rows, hidden, dtype)
    peers = torch.tensor([x.data_ptr() for x in xs], dtype=torch.int64, device=DEVICE)
    got = sum_peers(peers, xs[0])
    atol, rtol = tolerance(dtype)
    assert got.dtype == dtype and got.shape == xs[0].shape
    assert_close(got, sum(x.double() for x in xs).to(dtype), atol=atol, rtol=rtol)


def test_kernel_takes_no_rows() -> None:
    from kernel_switchboard_triton.comm import sum_add_rms_norm

    xs, residual, weight = _inputs(2, 0, 64, torch.float32)
    peers = torch.tensor([x.data_ptr() for x in xs], dtype=torch.int64, device=DEVICE)
    y, s = sum_add_rms_norm(peers, residual, weight, EPS)
    assert y.shape == s.shape == (0, 64)


def _kernel(name: str = "one_shot_all_reduce_rms_norm") -> Any:
    kernels = ksb.registry.kernels(OP) + ksb.registry.kernels("comm.all_reduce")
    return next(k for k in kernels if k.id == f"triton:{name}")


def _problem(**fields: Any) -> CommProblem:
    base: dict[str, Any] = dict(device="cuda", cc=(9, 0), dtype=torch.bfloat16, hidden=8192, rows=256, world_size=2,
                                group_backend="nccl", features=frozenset())
    return CommProblem(**(base | fields))


def test_capability_declines_what_one_shot_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared: 2-8 GPU ranks of one host with peer access, in an NCCL group; messages <= 4 MiB, hidden <= 16384."""
    from kernel_switchboard_triton.catalog import comm

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(comm, "_peer_access", lambda world: True)
    cap = _kernel().capability
    assert cap.reasons(_problem()) == []
    cases = {
        "world_size=1": _problem(world_size=1),
        "group_backend='gloo'": _problem(group_backend="gloo"),
        "message 128.0 MiB > 4 MiB": _problem(rows=8192),
        "hidden=32768": _problem(hidden=32768, rows=1),
        "world_size=16": _problem(world_size=16),
        "device=cpu": _problem(device="cpu"),
        "dtype=float8_e4m3fn": _problem(dtype=torch.float8_e4m3fn),
    }
    for expected, problem in cases.items():
        reasons = cap.reasons(problem)
        assert any(expected in r for r in reasons), (expected, reasons)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert any("needs every rank on this host" in r for r in cap.reasons(_problem()))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(comm, "_peer_access", lambda world: False)
    assert any("cannot all map each other's memory" in r for r in cap.reasons(_problem()))
    monkeypatch.setattr(comm, "_peer_access", lambda world: True)
    plain = _kernel("one_shot_all_reduce").capability  # no norm: rows need not fit in registers
    assert plain.reasons(_problem(hidden=32768, rows=1)) == [] and plain.reasons(_problem(rows=8192))


def test_cost_grows_with_message_and_peers() -> None:
    for kernel in (_kernel(), _kernel("all_reduce_then_norm")):
        assert kernel.cost(_problem(device="cpu")) == float("inf")
        assert 0 < kernel.cost(_problem(rows=1)) < kernel.cost(_problem(rows=256))
        assert kernel.cost(_problem(rows=256)) < kernel.cost(_problem(rows=256, world_size=4))


def test_one_shot_ranks_first_for_decode_sizes_and_all_reduce_then_norm_serves_the_rest() -> None:
    one_shot, then_norm = _kernel(), _kernel("all_reduce_then_norm")
    for rows in (1, 16, 256):
        assert one_shot.cost(_problem(rows=rows)) < then_norm.cost(_problem(rows=rows))
    large = _problem(rows=8192)
    assert one_shot.capability.reasons(large) and not then_norm.capability.reasons(large)
    assert any("world_size=1" in r for r in then_norm.capability.reasons(_problem(world_size=1)))


def test_one_process_is_served_by_the_reference() -> None:
    """Without a process group the op is the residual add + RMSNorm: the one-shot kernel says why it declines."""
    xs, residual, weight = _inputs(1, 3, 64, torch.float32)
    sel = ksb.explain(OP, xs[0], residual, weight)
    assert sel.kernel.backend == "reference"
    assert "world_size=1" in str(sel) or "device=cpu" in str(sel)


class _SimulatedPeers:
    """torch's ``_SymmetricMemory`` for ranks simulated in this process (rank 0 is this one): at the first barrier
    of a call every peer "copies" its contribution into its buffer; barriers record their channels."""

    def __init__(self, allocation: torch.Tensor, contributions: list[torch.Tensor]) -> None:
        self.rank, self.world_size, self.contributions = 0, len(contributions), contributions
        self.buffers = [allocation] + [torch.full_like(allocation, float("nan")) for _ in contributions[1:]]
        self.channels: list[int] = []

    def get_buffer(self, rank: int, sizes: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.buffers[rank].view(dtype)[: sizes[0]]

    def barrier(self, channel: int = 0) -> None:
        self.channels.append(channel)
        if channel == 0:
            for buffer, x in zip(self.buffers[1:], self.contributions[1:]):
                buffer[: x.numel()].copy_(x.flatten())


def test_exchange_through_simulated_symmetric_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launchers' exchange, as far as one process can take it: buffers made on first use and grown for a larger
    message, this rank's x copied in, the peers' addresses read from the handle, barrier 0 before the kernel and
    barrier 1 after it; for the fused op and the plain all-reduce."""
    from types import SimpleNamespace

    from torch.distributed import _symmetric_memory as symm_mem

    from kernel_switchboard_triton import comm

    handles: list[_SimulatedPeers] = []
    contributions: list[torch.Tensor] = []

    def rendezvous(allocation: torch.Tensor, group: str) -> _SimulatedPeers:
        assert group == "simulated"
        handles.append(_SimulatedPeers(allocation, contributions))
        return handles[-1]

    monkeypatch.setattr(symm_mem, "empty", lambda n, dtype, device: torch.empty(n, dtype=dtype, device=device))
    monkeypatch.setattr(symm_mem, "rendezvous", rendezvous)
    monkeypatch.setattr(symm_mem, "enable_symm_mem_for_group", lambda name: None, raising=False)
    monkeypatch.setattr(dist, "group", SimpleNamespace(WORLD=SimpleNamespace(group_name="simulated")))
    monkeypatch.setattr(comm, "_EXCHANGES", {})
    for rows, world in ((3, 2), (2, 2), (9, 2)):  # the third message outgrows the first buffer
        xs, residual, weight = _inputs(world, rows, 48, torch.float32)
        contributions[:] = xs
        y, s = comm.all_reduce_fused_rms_norm(xs[0], residual, weight, EPS, None)
        want_y, want_s = _expected(xs, residual, weight)
        assert_close(s, want_s.float(), atol=1e-5, rtol=1e-5)
        assert_close(y, want_y.float(), atol=1e-5, rtol=1e-5)
        assert_close(comm.all_reduce(xs[0], None), (want_s - residual.double()).float(), atol=1e-5, rtol=1e-5)
    assert len(handles) == 2 and handles[0].channels == [0, 1] * 4 and handles[1].channels == [0, 1] * 2


def _gloo_worker(rank: int, world: int, init_file: str) -> None:
    """One CPU rank: the all-reduce-then-norm kernel named explicitly (on the CPU the reference ranks first)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            xs, residual, weight = _inputs(world, 5, 72, dtype, device="cpu")
            x0 = xs[rank].clone()
            assert ksb.explain(OP, xs[rank], residual, weight, EPS).kernel.backend == "reference"
            y, s = ksb.comm.all_reduce_fused_rms_norm(xs[rank], residual, weight, EPS,
                                                      backend="triton:all_reduce_then_norm")
            want_y, want_s = _expected(xs, residual, weight)
            atol, rtol = tolerance(dtype)
            assert torch.equal(xs[rank], x0)
            assert_close(s, want_s.to(dtype), atol=atol, rtol=rtol)
            assert_close(y, want_y.to(dtype), atol=atol, rtol=rtol)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not triton_interpreting(), reason="the CPU ranks run the norm under TRITON_INTERPRET=1")
def test_all_reduce_then_norm_on_two_gloo_ranks(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_gloo_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)


# -- real ranks (GPU) --------------------------------------------------------------------------------------------


def _rank_worker(rank: int, world: int, init_file: str) -> None:
    """One rank: its contribution through the public op where 2+ ranks are (one-shot up to 4 MiB, all-reduce then
    norm past it), else through the kernels directly, against the float64 expectation; every rank's outputs
    bit-identical."""
    from kernel_switchboard_triton import comm
    from kernel_switchboard_triton.catalog.comm import ONE_SHOT_MAX_BYTES

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        for rows, hidden, dtype in ((1, 8192, torch.bfloat16), (7, 4096, torch.float16), (256, 7168, torch.bfloat16),
                                    (3, 200, torch.float32), (64, 8192, torch.bfloat16), (1024, 8192, torch.bfloat16)):
            xs, residual, weight = _inputs(world, rows, hidden, dtype, device="cuda")
            x0 = xs[rank].clone()
            one_shot = rows * hidden * dtype.itemsize <= ONE_SHOT_MAX_BYTES
            for _ in range(3):  # the buffer is reused: its barriers keep each call's contributions apart
                if world >= 2:
                    chosen = ksb.explain(OP, xs[rank], residual, weight, EPS).kernel.id
                    assert chosen == ("triton:one_shot_all_reduce_rms_norm" if one_shot
                                      else "triton:all_reduce_then_norm"), chosen
                    y, s = ksb.comm.all_reduce_fused_rms_norm(xs[rank], residual, weight, EPS)
                elif one_shot:
                    y, s = comm.all_reduce_fused_rms_norm(xs[rank], residual, weight, EPS, None)
                else:
                    y, s = comm.all_reduce_then_norm(xs[rank], residual, weight, EPS, None)
                total = ksb.comm.all_reduce(xs[rank]) if world >= 2 else comm.all_reduce(xs[rank], None)
                want_y, want_s = _expected(xs, residual, weight)
                atol, rtol = tolerance(dtype)
                assert torch.equal(xs[rank], x0)
                assert_close(s, want_s.to(dtype), atol=atol, rtol=rtol)
                assert_close(y, want_y.to(dtype), atol=atol, rtol=rtol)
                assert_close(total, sum(x.double() for x in xs).to(dtype), atol=atol, rtol=rtol)
                gathered = [torch.empty_like(y) for _ in range(world)]
                dist.all_gather(gathered, y)
                assert all(torch.equal(g, y) for g in gathered), "ranks disagree"
    finally:
        dist.destroy_process_group()


def _spawn(world: int, tmp_path: Path) -> None:
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, {torch.cuda.device_count()} here")
    # NVLink multicast stays off on shared hosts (inherited by the spawned ranks)
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    mp.spawn(_rank_worker, args=(world, str(tmp_path / "rendezvous")), nprocs=world, join=True)


@pytest.mark.gpu
def test_exchange_on_one_gpu(tmp_path: Path) -> None:
    _spawn(1, tmp_path)


@pytest.mark.gpu
def test_exchange_on_two_gpus(tmp_path: Path) -> None:
    _spawn(2, tmp_path)
