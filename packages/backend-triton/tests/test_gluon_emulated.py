"""The Hopper Gluon kernels (MLA decode, the soft-capped prefill, the fp8 block GEMM) run on the CPU by
``gluon_emulator`` (partitions as threads, mbarriers, TMA loads landing late, wgmma groups checked at retirement)
against the reference kernels; and the emulator's own checks fail on a kernel with a planted race, a missing wait or
a deadlock."""

from __future__ import annotations

import functools

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, mla_case, prefill_case, ragged_case
from kernel_switchboard.testing.cases.gemm import quantize_fp8

gluon = pytest.importorskip("triton.experimental.gluon")
pytestmark = pytest.mark.skipif(torch.cuda.is_available() or not triton_interpreting(),
                                reason="CPU only: the split merge runs in Triton's interpreter (TRITON_INTERPRET=1)")

from gluon_emulator import EmulationError, emulated, emulating  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from kernel_switchboard_triton import _gemm_gluon, _mla, _mla_gluon, _mla_gluon_ws, _prefill, _prefill_gluon_ws  # noqa: E402

#: kernel -> (MLAConfig fields, the module whose kernel runs emulated, its kernel's name)
KERNELS = {
    "gluon": ({"gluon_ws": False}, _mla_gluon, "mla_decode_kernel"),
    "ws": ({"gluon_ws": True}, _mla_gluon_ws, "mla_decode_ws_kernel"),
}


def _emulated_mla(kernel: str, heads: int, lens: list[int], splits: int, monkeypatch: pytest.MonkeyPatch,
                  seed: int = 0) -> None:
    """``kernel``'s answer through the backend's ``MLAPlan`` (its split workspace, ``_mla.launch_mla``: pages flattened
    for TMA, the split merge) against the reference's."""
    monkeypatch.setattr(_mla, "has_tma", lambda device: True)  # the pages' TMA path, as on a Hopper GPU
    fields, module, name = KERNELS[kernel]
    case = mla_case(torch.bfloat16, tuple(lens), heads, 64, "cpu", lse=True, seed=seed)  # NaN in unwritten slots
    qn, qp, ckv, kpe, table = case.args
    cfg = _mla.MLAConfig(64, 64, splits, 8, 2, False, True, True, **fields)
    plan = _mla.MLAPlan(table, heads, 512, 64, case.kwargs["sm_scale"], max(lens), cfg)
    with emulating(module, name):
        out, lse = plan.run(qn, qp, ckv, kpe, torch.empty_like(qn))
    want = ksb.attention.mla_decode(*case.args, **case.kwargs, backend="reference")
    assert not out.isnan().any()
    atol, rtol = tolerance(torch.bfloat16)
    assert_close(out, want[0], atol=atol, rtol=rtol)
    assert_close(lse, want[1], atol=atol, rtol=rtol)


# heads: padded rows (16), one head block (64), two (128); lens: empty requests, one partial tile, whole tiles,
# odd and even tile counts per split (warpgroup 1's last tile or none), a 16-tile split
MLA_CASES = [(16, [0, 1, 64, 200], 1), (64, [130, 64, 257], 2), (128, [321, 5], 3), (16, [448, 383], 2), (64, [1000], 1)]


@pytest.mark.parametrize(("heads", "lens", "splits"), MLA_CASES)
@pytest.mark.parametrize("kernel", ["gluon", "ws"])
def test_gluon_mla_kernels_match_reference_emulated(kernel: str, heads: int, lens: list[int], splits: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _emulated_mla(kernel, heads, lens, splits, monkeypatch)


# -- the warp-specialised soft-capped prefill ------------------------------------------------------------------
# (layout: None ragged, else pages of 128 slots; q heads over 2 KV heads; query and KV lengths per request): whole
# and partial last tiles, several tiles, append rows (queries < keys), a decode row, an empty request, GQA groups
# of 1 and 4, several row tiles of one request (heavy first)
PREFILL_CASES = [
    (None, 8, True, (40, 1, 0, 77), (300, 129, 0, 77)),
    (None, 2, True, (128, 5), (256, 133)),
    (None, 8, False, (33, 2), (200, 64)),
    ("NHD", 8, True, (20, 1, 3), (260, 70, 128)),
    ("HND", 2, True, (90,), (300,)),
    ("HND", 8, False, (7, 1), (129, 40)),
]


@pytest.fixture
def ws_routes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The Triton backend's prefill as on a Hopper GPU with ``PrefillConfig.gluon_ws``; the list it returns collects
    each call's Gluon descriptors (None: the call did not take the Gluon kernel)."""
    monkeypatch.setattr(_prefill, "gluon_hopper", lambda device: True)
    real_config = _prefill.prefill_config
    monkeypatch.setattr(_prefill, "prefill_config", lambda *a: real_config(*a)._replace(gluon_ws=True))
    routes: list[object] = []
    real_descriptors = _prefill.gluon_ws_descriptors
    monkeypatch.setattr(_prefill, "gluon_ws_descriptors", lambda *a: routes.append(real_descriptors(*a)) or routes[-1])
    return routes


@pytest.mark.parametrize(("programs", "search"), [(None, False), (3, False), (10**6, False), (None, True)], ids=str)
@pytest.mark.parametrize(("layout", "q_heads", "causal", "q_lens", "kv_lens"), PREFILL_CASES, ids=str)
def test_gluon_ws_prefill_matches_reference_emulated(layout: str | None, q_heads: int, causal: bool,
                                                     q_lens: tuple[int, ...], kv_lens: tuple[int, ...],
                                                     programs: int | None, search: bool, ws_routes: list[object],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``_prefill_gluon_ws`` through the Triton backend's launcher (``PrefillConfig.gluon_ws``, the Hopper checks
    answered yes), soft cap 30, lse, against the reference; pages' unwritten slots hold NaN. ``programs``: the
    default (one per SM: 2 on the CPU) or 3 persistent programs claiming several items each (the ring, the
    partial-tile barrier and the item handoff carry on across items), or one program per item; ``search``:
    requests found by binary search (the large-batch path), not by vector loads."""
    if search:
        monkeypatch.setattr(_prefill_gluon_ws, "MAX_VEC_B", 0)
    monkeypatch.setattr(_prefill_gluon_ws, "launch", functools.partial(_prefill_gluon_ws.launch, programs=programs))
    spec = AttnSpec(torch.bfloat16, layout or "NHD", 128, q_heads, 2, 128, kv_lens=kv_lens, q_lens=q_lens,
                    causal=causal, soft_cap=30.0, lse=True)
    case = (ragged_case if layout is None else prefill_case)(spec, "cpu", 1)
    with emulating(_prefill_gluon_ws, "prefill_ws_kernel"):
        out, lse = getattr(ksb.attention, case.op.split(".")[1])(*case.args, **case.kwargs, backend="triton")
    assert ws_routes and ws_routes[0] is not None  # the Gluon kernel ran
    want = getattr(ksb.attention, case.op.split(".")[1])(*case.args, **case.kwargs, backend="reference")
    atol, rtol = tolerance(torch.bfloat16)
    assert_close(out, want[0], atol=atol, rtol=rtol)
    assert_close(lse, want[1], atol=atol, rtol=rtol)


def test_gluon_ws_prefill_leaves_queries_cp_async_cannot_copy_to_the_triton_kernel(ws_routes: list[object]) -> None:
    """Queries whose rows are not whole 16-byte pieces (a view with a head stride of 129 elements) do not take the
    Gluon kernel, whose consumers copy them 16 bytes at a time with cp.async; the Triton kernel serves them."""
    spec = AttnSpec(torch.bfloat16, "NHD", 128, 4, 2, 128, kv_lens=(90,), q_lens=(20,), causal=True, soft_cap=30.0,
                    lse=True)
    case = ragged_case(spec, "cpu", 1)
    q = case.args[0]
    wide = torch.zeros(*q.shape[:2], 129, dtype=q.dtype)
    wide[..., :128] = q
    args = (wide[..., :128], *case.args[1:])
    with emulating(_prefill_gluon_ws, "prefill_ws_kernel"):
        out, lse = ksb.attention.prefill_ragged(*args, **case.kwargs, backend="triton")
    assert ws_routes == [None]
    want = ksb.attention.prefill_ragged(*case.args, **case.kwargs, backend="reference")
    atol, rtol = tolerance(torch.bfloat16)
    assert_close(out, want[0], atol=atol, rtol=rtol)
    assert_close(lse, want[1], atol=atol, rtol=rtol)


# -- the emulator fails where the hardware would go wrong ------------------------------------------------------
@gluon.jit
def _ring_loader(desc, smem, ready, empty, TILES: gl.constexpr, PHASE_FLIP: gl.constexpr):
    for t in range(TILES):
        mbarrier.wait(empty.index(0), (t & 1) ^ 1 ^ PHASE_FLIP)  # a fresh barrier passes phase 1
        mbarrier.expect(ready.index(0), desc.block_type.nbytes)
        tma.async_load(desc, [t * 64, 0], ready.index(0), smem)


@gluon.jit
def _ring_consumer(desc, smem, ready, empty, q_smem, out_ptr, TILES: gl.constexpr, WAIT: gl.constexpr,
                   EARLY_RELEASE: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    acc = gl.zeros([64, 64], gl.float32, layout=layout)
    for t in range(TILES):
        if WAIT:
            mbarrier.wait(ready.index(0), t & 1)
        acc = warpgroup_mma(q_smem, smem.permute((1, 0)), acc, is_async=True)
        if EARLY_RELEASE:  # the slot freed while the MMA still reads it (a slow MMA: the next tile lands first)
            mbarrier.arrive(empty.index(0), count=1)
            mbarrier.wait(ready.index(0), (t + 1) & 1, pred=t + 1 < TILES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(0), count=1)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    gl.store(out_ptr + rows[:, None] * 64 + cols[None, :], acc)


@gluon.jit
def _ring_kernel(desc, q_ptr, out_ptr, TILES: gl.constexpr, WAIT: gl.constexpr, EARLY_RELEASE: gl.constexpr,
                 PHASE_FLIP: gl.constexpr):
    """out (64, 64) = q (64, 64) @ sum of the TILES (64, 64) tiles of desc's tensor, transposed: one ring slot."""
    smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], desc.layout)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    q = gl.load(q_ptr + rows[:, None] * 64 + cols[None, :])
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], desc.layout, q)
    ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(ready.index(0), count=1)
    mbarrier.init(empty.index(0), count=1)
    gl.warp_specialize([(_ring_consumer, (desc, smem, ready, empty, q_smem, out_ptr, TILES, WAIT, EARLY_RELEASE)),
                        (_ring_loader, (desc, smem, ready, empty, TILES, PHASE_FLIP))], [1], [40])


def _ring(wait: bool = True, early_release: bool = False, phase_flip: bool = False, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    k = torch.randn(4 * 64, 64, generator=g).to(torch.bfloat16)
    q = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    out = torch.empty(64, 64)
    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    desc = TensorDescriptor.from_tensor(k, [64, 64], layout)
    emulated(_ring_kernel, seed=seed)[(1,)](desc, q, out, TILES=4, WAIT=wait, EARLY_RELEASE=early_release,
                                           PHASE_FLIP=phase_flip, num_warps=4)
    want = q.float() @ k.float().view(4, 64, 64).sum(0).T
    assert_close(out, want, atol=1e-3, rtol=1e-4)
    return out


def test_emulator_runs_a_correct_ring() -> None:
    for seed in range(3):
        _ring(seed=seed)


def test_emulator_catches_an_mma_on_a_tile_not_yet_loaded() -> None:
    """No wait for the tile, and the loader holds back until the first tile is consumed: the MMA reads nothing."""
    with pytest.raises(EmulationError, match="holds no data"):
        _ring(wait=False, phase_flip=True)


def test_emulator_catches_a_slot_released_under_an_mma_in_flight() -> None:
    with pytest.raises(EmulationError, match="overwritten before warpgroup_mma_wait"):
        _ring(early_release=True)


def test_emulator_catches_a_deadlock() -> None:
    with pytest.raises(EmulationError, match="deadlock"):
        _ring(phase_flip=True)


# -- the fp8 block-scaled GEMM ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("m", "n", "k", "stages", "programs", "out"), [
    (200, 256, 384, 2, 2, torch.bfloat16), (64, 128, 128, 4, 1, torch.float32), (130, 384, 256, 3, 4, torch.float16)],
    ids=str)
def test_gluon_fp8_block_gemm_matches_reference_emulated(m: int, n: int, k: int, stages: int, programs: int,
                                                         out: torch.dtype) -> None:
    """Edge tiles in M, several tiles per persistent program (the ring and the two store buffers carry on across
    tiles), a ring shorter than the K steps, one K step; every output dtype."""
    g = torch.Generator().manual_seed(m + n + k)
    qa, sa = quantize_fp8(torch.randn(m, k, generator=g), 1, 128)
    qw, sw = quantize_fp8(torch.randn(n, k, generator=g) * k**-0.5, 128, 128)
    c = torch.full((m, n), float("nan"), dtype=out)
    with emulating(_gemm_gluon, "mm_fp8_block_kernel"):
        _gemm_gluon.mm_fp8_block(qa, qw.t(), sa, sw.t(), c, stages=stages, programs=programs)
    want = ksb.gemm.mm_fp8(qa, qw.t(), sa, sw.t(), out_dtype=torch.float32, backend="reference")
    atol, rtol = tolerance(out)
    assert_close(c.float(), want, atol=atol, rtol=rtol)
