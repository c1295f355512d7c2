"""The Triton kernels inside ``ksb.batch_invariant()``: one request's outputs have the same bits in batches of other
sizes and compositions (the interpreter on tiny shapes on the CPU; real sizes on a GPU, ``gpu``), the results still
match the reference, and the launch choices that follow the batch outside the scope are fixed inside it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.invariance import OPS, InvarianceCase, invariance_cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")


def _triton_ops() -> list[str]:
    return [op for op in OPS if any(k.backend == "triton" for k in ksb.registry.kernels(op))]


def _small_cases() -> list[InvarianceCase]:
    """The interpreter's cases (CPU tensors: built at collection, which must not touch a GPU)."""
    return [case for op in _triton_ops() for case in invariance_cases(op, "cpu", "small", torch.float16)]


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter shapes; the GPU runs the large ones")
@pytest.mark.parametrize("case", _small_cases(), ids=lambda c: c.id)
def test_triton_gives_a_request_the_same_bits_in_every_batch(case: InvarianceCase) -> None:
    found = case.check("triton")
    want = case.outputs("reference")  # and the invariant launches still compute the op
    for got, ref in zip(found, want):
        for g, w in zip(got, ref):
            if g.is_floating_point() and g.dtype.itemsize > 1:
                atol, rtol = (5e-2, 5e-2) if case.op.startswith("gemm.mm_fp8") else tolerance(g.dtype)
                assert_close(g, w, atol=max(atol, 2e-3), rtol=max(rtol, 2e-3), what=case.id)


@pytest.mark.gpu
@pytest.mark.parametrize("op", _triton_ops())
def test_triton_is_batch_invariant_at_real_sizes(op: str) -> None:
    """Real sizes (built here, on the GPU): without the scope the decode split counts, the prefill, norm, GEMM and MoE
    tiles and the sampling rows per program change between these batches."""
    for case in invariance_cases(op, "cuda", "large", torch.bfloat16):
        case.check("triton")


def _cpu_as_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch configuration a Hopper GPU would get, computed on the CPU."""
    from kernel_switchboard_triton import _attn_common, _decode, _prefill

    for module in (_attn_common, _decode, _prefill):
        monkeypatch.setattr(module, "interpreting", lambda: False)
        for name, value in (("cc_major", lambda device: 9), ("sm_count", lambda device: 132)):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
    _decode.decode_config.cache_clear()
    _decode.invariant_decode_config.cache_clear()
    _prefill.prefill_config.cache_clear()


def test_decode_and_prefill_launch_choices_do_not_follow_the_batch_in_the_scope(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """On a GPU the decode split count and the prefill tile follow the batch (B and the longest query); in the scope
    they follow the head dims and the longest KV only (a request's splits: its own KV in 2048-token chunks)."""
    from kernel_switchboard_triton import _decode, _prefill

    _cpu_as_hopper(monkeypatch)
    try:
        def decode_cfg(batch: int, invariant: bool) -> _decode.DecodeConfig:
            table = SimpleNamespace(block_table=torch.zeros(batch, 4, dtype=torch.int32))
            plan = _decode.DecodePlan(table, num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128, sm_scale=0.1,
                                      logits_soft_cap=None, window_left=-1, max_kv_len=4096, invariant=invariant)
            return plan.cfg

        assert decode_cfg(1, False) != decode_cfg(64, False)  # the split count fills the GPU
        assert decode_cfg(1, True) == decode_cfg(64, True) == decode_cfg(256, True)
        assert decode_cfg(64, True).split_tokens == 2048 and decode_cfg(64, True).num_splits == 2

        def prefill_cfg(max_q: int, invariant: bool) -> _prefill.PrefillConfig:
            p = SimpleNamespace(max_q_len=max_q, batch_invariant=invariant)
            return _prefill.prefill_config(torch.device("cpu"), 128, 128, _prefill.rows_bucket(p, 4))

        assert prefill_cfg(1, False) != prefill_cfg(8192, False)  # decode rows take short tiles
        assert prefill_cfg(1, True) == prefill_cfg(8192, True) == prefill_cfg(8192, False)
    finally:
        _decode.decode_config.cache_clear()
        _decode.invariant_decode_config.cache_clear()
        _prefill.prefill_config.cache_clear()


def test_decode_in_the_scope_merges_every_request_in_split_order() -> None:
    """A batch whose requests all fit one split still goes through the ordered merge, as a batch with longer
    requests does, so a short request's bits do not depend on its neighbours' lengths."""
    from kernel_switchboard_triton import _decode

    case = invariance_cases("attention.decode", DEVICE, "small", torch.float16)[0]
    q, cache, table = case.batches[0].args
    with ksb.batch_invariant():
        runner = _decode.DecodeRunner(ksb.explain("attention.decode", q, cache, table, backend="triton").problem, table,
                                      SimpleNamespace(sm_scale=0.125, logits_soft_cap=None, window_left=-1,
                                                      max_kv_len=20, return_lse=True, batch_invariant=True))
    assert runner.plan.cfg.split_tokens and runner.plan.cfg.num_splits == 1 and runner.plan.part_out is not None
