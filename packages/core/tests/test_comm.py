"""all_reduce and all_reduce_fused_rms_norm: one process (identity all-reduce), two gloo processes, bad inputs,
compile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("comm.all_reduce", "comm.all_reduce_fused_rms_norm"))

if torch.cuda.is_available():  # the large (model-sized) cases on the GPU; built only where a GPU is
    test_reference_conformance_gpu = conformance_test("reference", device="cuda", size="large",
                                                      ops=("comm.all_reduce", "comm.all_reduce_fused_rms_norm"))

WORLD = 2


def _inputs(rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(3, 4, 48, generator=g).to(dtype)
    residual = torch.randn(3, 4, 48, generator=torch.Generator().manual_seed(7)).to(dtype)  # same on every rank
    weight = (torch.rand(48, generator=torch.Generator().manual_seed(8)) + 0.5).to(dtype)
    return x, residual, weight


def _expected(dtype: torch.dtype, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs = [_inputs(r, dtype) for r in range(world)]
    total = sum(x.double() for x, _, _ in xs) + xs[0][1].double()
    w = xs[0][2].double()
    y = total / (total.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w
    return y, total


def _worker(rank: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            x, r, w = _inputs(rank, dtype)
            x0 = x.clone()
            y, r_out = ksb.comm.all_reduce_fused_rms_norm(x, r, w)
            want_y, want_r = _expected(dtype, WORLD)
            assert torch.equal(x, x0), "x must not be modified"
            assert y.dtype == r_out.dtype == dtype and y.shape == x.shape
            torch.testing.assert_close(r_out.double(), want_r, atol=tol, rtol=tol)
            torch.testing.assert_close(y.double(), want_y, atol=tol, rtol=tol)
            assert ksb.explain("comm.all_reduce_fused_rms_norm", x, r, w).problem.world_size == WORLD
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            x, _, _ = _inputs(rank, dtype)
            x0 = x.clone()
            total = ksb.comm.all_reduce(x)
            assert torch.equal(x, x0) and total.dtype == dtype and total.shape == x.shape
            torch.testing.assert_close(total.double(), sum(_inputs(r, dtype)[0].double() for r in range(WORLD)),
                                       atol=tol, rtol=tol)
        group = dist.new_group([0, 1])
        x, r, w = _inputs(rank, torch.float32)
        y, _ = ksb.comm.all_reduce_fused_rms_norm(x, r, w, group=group)
        torch.testing.assert_close(y.double(), _expected(torch.float32, WORLD)[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ksb.comm.all_reduce(x, group=group).double(), _expected(torch.float32, WORLD)[1]
                                   - r.double(), atol=1e-5, rtol=1e-5)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_sum_then_normalise(tmp_path: Path) -> None:
    init_file = str(tmp_path / "rendezvous")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(init_file,), nprocs=WORLD, join=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_single_process_is_residual_add_then_rms_norm(dtype: torch.dtype) -> None:
    x, r, w = _inputs(0, dtype)
    y, r_out = ksb.comm.all_reduce_fused_rms_norm(x, r, w, 1e-6)
    s = x.float() + r.float()
    torch.testing.assert_close(r_out, s.to(dtype))
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(s, (48,), w.float(), 1e-6).to(dtype))


def test_bad_inputs_name_the_argument() -> None:
    x, r, w = _inputs(0, torch.float32)
    err = ksb.InvalidArgumentError
    with pytest.raises(err, match=r"^residual\.shape"):
        ksb.comm.all_reduce_fused_rms_norm(x, r[:2], w)
    with pytest.raises(err, match=r"^residual\.dtype"):
        ksb.comm.all_reduce_fused_rms_norm(x, r.half(), w)
    with pytest.raises(err, match=r"^weight\.shape"):
        ksb.comm.all_reduce_fused_rms_norm(x, r, w[:5])
    with pytest.raises(err, match=r"^eps"):
        ksb.comm.all_reduce_fused_rms_norm(x, r, w, eps=0.0)
    with pytest.raises(err, match=r"^x\.dtype"):
        ksb.comm.all_reduce_fused_rms_norm(x.int(), r, w)
    with pytest.raises(err, match=r"^group"):
        ksb.comm.all_reduce_fused_rms_norm(x, r, w, group=object())
    with pytest.raises(err, match=r"^x\.dtype"):
        ksb.comm.all_reduce(x.int())
    with pytest.raises(err, match=r"^x\.shape"):
        ksb.comm.all_reduce(torch.zeros(()))
    with pytest.raises(err, match=r"^group"):
        ksb.comm.all_reduce(x, group=object())


def test_single_process_all_reduce_is_a_copy() -> None:
    x, _, _ = _inputs(0, torch.bfloat16)
    y = ksb.comm.all_reduce(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()


def test_torch_compile_fullgraph_traces_comm_op() -> None:
    x, r, w = _inputs(0, torch.float32)

    def f(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, r_out = ksb.comm.all_reduce_fused_rms_norm(ksb.comm.all_reduce(x) * 2, r, w)
        return y + 1, r_out

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, r), f(x, r))


def test_opcheck_comm_op() -> None:
    x, r, w = _inputs(0, torch.float32)
    torch.library.opcheck(torch.ops.ksb.all_reduce_fused_rms_norm.default, (x, r, w, 1e-6, None))
    torch.library.opcheck(torch.ops.ksb.all_reduce.default, (x, None))


def test_example_case_runs() -> None:
    from kernel_switchboard.testing.cases import comm as cases

    cases.example("comm.all_reduce_fused_rms_norm", torch.device("cpu"), rows="4", hidden="96", dtype="fp16").compare("reference")


@pytest.mark.gpu
def test_reference_on_gpu_matches_cpu() -> None:
    x, r, w = _inputs(0, torch.bfloat16)
    want = ksb.comm.all_reduce_fused_rms_norm(x, r, w)
    got = ksb.comm.all_reduce_fused_rms_norm(x.cuda(), r.cuda(), w.cuda())
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e, atol=2e-2, rtol=2e-2)
