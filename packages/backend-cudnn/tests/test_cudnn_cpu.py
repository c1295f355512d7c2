"""cuDNN backend on a machine without cuDNN or a GPU: gating, declarations, conversions, errors.

The conversions are checked end to end: the kernels run on CPU tensors with the cuDNN graph
replaced by a model that reads the bound buffers only through the graph spec (cudnn_emulate.py),
and their outputs are compared with the reference kernels.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import replace
from typing import Any

import pytest
import torch
from cudnn_emulate import install

import kernel_switchboard as ksb
from kernel_switchboard import KernelUnavailableError
from kernel_switchboard.ops.attention import AttnParams, DecodeProblem, PrefillProblem, RaggedPrefillProblem
from kernel_switchboard.reference import attention as ref
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, prefill_case, ragged_case
from kernel_switchboard_cudnn import attention, convert, cost, plugin
from kernel_switchboard_cudnn.support import REFERENCE_SUPPORT, Support

F16, BF16 = torch.float16, torch.bfloat16


# -- gating -------------------------------------------------------------------------------------------------
def test_backend_lists_every_kernel_unavailable_with_reason_and_install() -> None:
    backend = registry.all_backends()["cudnn"]
    assert backend.unavailable is not None
    assert backend.install == 'pip install "kernel-switchboard[cudnn]"'
    ids = {k.id for k in backend.kernels}
    assert ids == {"cudnn:sdpa_paged_decode", "cudnn:sdpa_paged_prefill", "cudnn:sdpa_ragged_prefill"}
    for k in backend.kernels:
        (reason,) = k.reasons(None)
        assert reason.startswith("unavailable: ") and 'install: pip install "kernel-switchboard[cudnn]"' in reason


def test_missing_frontend_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import of cudnn fails
    _, reason, _ = plugin.probe()
    assert reason is not None and "cudnn" in reason


def _fake_frontend(monkeypatch: pytest.MonkeyPatch, version: int | Exception, cc: tuple[int, int] = (9, 0)) -> None:
    monkeypatch.setattr(plugin, "missing_module", lambda *a, **k: None)
    monkeypatch.setattr(plugin, "missing_cuda", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)

    def library_version() -> int:
        if isinstance(version, Exception):
            raise version
        return version

    monkeypatch.setattr(plugin, "library_version", library_version)


def test_no_gpu_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "missing_module", lambda *a, **k: None)
    if torch.cuda.is_available():
        pytest.skip("this check needs a machine without a GPU")
    _, reason, _ = plugin.probe()
    assert reason is not None and ("CUDA" in reason or "cuda" in reason)


@pytest.mark.parametrize(("version", "words"), [(90400, "below 9.5.0"), (91000, "known bugs"), (91001, "known bugs")])
def test_old_or_broken_cudnn_is_the_reason(monkeypatch: pytest.MonkeyPatch, version: int, words: str) -> None:
    _fake_frontend(monkeypatch, version)
    _, reason, _ = plugin.probe()
    assert reason is not None and words in reason


def test_library_that_does_not_load_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_frontend(monkeypatch, OSError("libcudnn.so.9: cannot open shared object file"))
    _, reason, _ = plugin.probe()
    assert reason is not None and "could not be loaded" in reason and "libcudnn" in reason


def test_available_backend_names_versions_and_gates_prefill_on_97(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_frontend(monkeypatch, 90600)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # discovery never imports the frontend
    backend = plugin.ksb_backend()
    assert backend.unavailable is None
    assert backend.providers["cudnn"] == "9.6.0"
    kernels = {k.name: k for k in backend.kernels}
    assert kernels["sdpa_paged_decode"].unavailable is None
    assert "cuDNN 9.6.0" in kernels["sdpa_paged_decode"].version
    assert "below 9.7.0" in (kernels["sdpa_paged_prefill"].unavailable or "")
    assert "nvidia-cudnn" in (kernels["sdpa_paged_prefill"].install or "")


def test_library_version_comes_from_torch_or_the_wheel_without_the_frontend(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard_cudnn import support

    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    assert support.library_version() == 91002
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: None)
    monkeypatch.setattr(support, "package_version", lambda dist: {"nvidia-cudnn-cu12": "9.13.0.50"}.get(dist))
    assert support.library_version() == 91300
    monkeypatch.setattr(support, "package_version", lambda dist: None)
    assert support.library_version() is None
    monkeypatch.setattr(plugin, "missing_module", lambda *a, **k: None)
    monkeypatch.setattr(plugin, "missing_cuda", lambda *a, **k: None)
    _, reason, _ = plugin.probe()
    assert reason is not None and "could not be found" in reason and "nvidia-cudnn-cu13" in reason
    assert "cudnn" not in sys.modules


def test_a_frontend_on_another_cudnn_than_declared_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard_cudnn import graphs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    graphs.check_declared(91002, 91002)
    graphs.check_declared(91300, 91002)  # newer, same declarations (no threshold between them)
    with pytest.raises(KernelUnavailableError, match=r"loaded cuDNN 9\.6\.0, but .* declared for cuDNN 9\.10\.2"):
        graphs.check_declared(90600, 91002)


def test_explicit_choice_on_this_machine_raises_with_the_reason() -> None:
    case = decode_case(AttnSpec(F16, "HND", 16, 4, 2, kv_lens=(5, 9)), "cpu")
    with pytest.raises(KernelUnavailableError, match=r"cudnn:sdpa_paged_decode: unavailable: .*kernel-switchboard\[cudnn\]"):
        ksb.attention.decode(*case.args, backend="cudnn", **case.kwargs)
    text = str(ksb.explain("attention.decode", *case.args))
    assert "cudnn:sdpa_paged_decode" in text and "rejected: unavailable" in text


# -- declarations -------------------------------------------------------------------------------------------
def _decode(**kw: object) -> DecodeProblem:
    base = DecodeProblem("cuda", (9, 0), BF16, BF16, 128, 128, 16, "HND", 32, 8, 4, 64, 4096, frozenset({"paged"}))
    return base._replace(**kw)


def _prefill(**kw: object) -> PrefillProblem:
    base = PrefillProblem("cuda", (9, 0), BF16, BF16, 128, 128, 16, "HND", 32, 8, 4, 8, 2048, 2048,
                          frozenset({"paged", "causal"}))
    return base._replace(**kw)


def test_declared_decode_accepts_the_llama_shape_and_names_each_mismatch() -> None:
    cap = attention.capabilities(REFERENCE_SUPPORT)["attention.decode"]
    assert cap.reasons(_decode()) == []
    assert cap.reasons(_decode(features=frozenset({"paged", "return_lse", "sliding_window", "cuda_graph"}))) == []
    (r,) = cap.reasons(_decode(layout="NHD"))
    assert r == "layout=NHD not supported (supported: {HND})"
    assert "features {soft_cap} not supported" in cap.reasons(_decode(features=frozenset({"paged", "soft_cap"})))[0]
    assert "kv_dtype=float8_e4m3fn" in cap.reasons(_decode(kv_dtype=torch.float8_e4m3fn))[0]
    assert "dtype=float32" in cap.reasons(_decode(dtype=torch.float32, kv_dtype=torch.float32))[0]
    assert "page_size=48" in cap.reasons(_decode(page_size=48))[0]
    assert "compute capability 7.5 below minimum 8.0" in cap.reasons(_decode(cc=(7, 5)))[0]


def test_head_dims_follow_the_version_and_the_gpu() -> None:
    new, old = Support(91300, (9, 0)), Support(90900, (9, 0))
    dec_new = attention.capabilities(new)["attention.decode"]
    assert dec_new.reasons(_decode(head_dim=256, head_dim_v=256)) == []
    assert dec_new.reasons(_decode(head_dim=192, head_dim_v=128, features=frozenset({"paged", "qk_v_dims_differ"}))) == []
    (r,) = dec_new.reasons(_decode(head_dim=256, head_dim_v=256, cc=(10, 0)))
    assert "head_dim=256 not supported on compute capability 10.0" in r
    assert "(head_dim, head_dim_v)=(256, 128)" in dec_new.reasons(
        _decode(head_dim=256, head_dim_v=128, features=frozenset({"paged", "qk_v_dims_differ"})))[0]
    dec_old = attention.capabilities(old)["attention.decode"]
    assert "head_dim=256" in dec_old.reasons(_decode(head_dim=256, head_dim_v=256))[0]
    assert "features {sliding_window} not supported" in dec_old.reasons(
        _decode(features=frozenset({"paged", "sliding_window"})))[0]
    assert dec_old.reasons(_decode(head_dim=72, head_dim_v=72)) == []
    assert "head_dim=60" in dec_old.reasons(_decode(head_dim=60, head_dim_v=60))[0]


def test_window_needs_causal_in_prefill() -> None:
    cap = attention.capabilities(REFERENCE_SUPPORT)["attention.prefill"]
    assert cap.reasons(_prefill(features=frozenset({"paged", "causal", "sliding_window", "mixed_batch"}))) == []
    (r,) = cap.reasons(_prefill(features=frozenset({"paged", "sliding_window"})))
    assert "sliding_window without causal" in r
    ragged = attention.capabilities(REFERENCE_SUPPORT)["attention.prefill_ragged"]
    prob = RaggedPrefillProblem("cuda", (9, 0), F16, F16, 64, 64, None, None, 8, 8, 1, 4, 512, 512,
                                frozenset({"ragged", "causal", "return_lse"}))
    assert ragged.reasons(prob) == []
    assert "sliding_window without causal" in ragged.reasons(prob._replace(features=frozenset({"ragged", "sliding_window"})))[0]


def test_support_rows() -> None:
    assert Support(91801, (8, 0)).ragged_unavailable() is None
    assert "Hopper" in (Support(91300, (8, 0)).ragged_unavailable() or "")
    assert Support(91300, (9, 0)).ragged_unavailable() is None
    assert Support(90700, (9, 0)).prefill_unavailable() is None
    assert not Support(90900, (9, 0)).sliding_window and Support(91002, (9, 0)).sliding_window
    assert max(Support(91300, (8, 0)).head_dims(decode=True)) == 128


def test_costs_rank_by_work_and_are_infinite_off_the_gpu() -> None:
    small, big = _decode(batch=16, max_kv_len=2048), _decode(batch=128, max_kv_len=8192)
    assert cost.decode_cost(small) < cost.decode_cost(big)
    bw = cost.kv_bytes(big) / cost.decode_cost(big)
    assert 4.0e12 < bw < 4.5e12  # measured 4.37 TB/s at this point (H200, CUDA-graph replays)
    assert cost.decode_cost(_decode(device="cpu")) == math.inf
    long = _prefill(batch=1, max_q_len=8192, max_kv_len=8192)
    rate = cost.attention_flops(long, True) / cost.prefill_cost(long)
    assert 520e12 < rate < 580e12  # the measured 550 TFLOP/s
    assert cost.prefill_cost(_prefill(features=frozenset({"paged"}))) > cost.prefill_cost(_prefill())


# -- conversions against the reference -----------------------------------------------------------------------
def _params(case: object, causal: bool, max_q: int, max_kv: int) -> AttnParams:
    kw = case.kwargs  # type: ignore[attr-defined]
    d = case.args[0].shape[-1]  # type: ignore[attr-defined]
    w = kw.get("window_left")
    return AttnParams(1.0 / math.sqrt(d), kw.get("logits_soft_cap"), -1 if w is None else w, causal,
                      bool(kw.get("return_lse")), max_q, max_kv)


def _close(got: tuple[torch.Tensor, torch.Tensor | None], want: tuple[torch.Tensor, torch.Tensor | None],
           dtype: torch.dtype) -> None:
    atol, rtol = tolerance(dtype)
    assert_close(got[0], want[0], atol=atol, rtol=rtol, what="out")
    assert (got[1] is None) == (want[1] is None)
    if got[1] is not None and want[1] is not None:
        assert_close(got[1], want[1], atol=1e-3, rtol=1e-3, what="lse")


DECODE_SPECS = [
    AttnSpec(F16, "HND", 16, 8, 2, 64, kv_lens=(37, 1, 0, 16), lse=True),
    AttnSpec(BF16, "NHD", 4, 4, 4, 32, kv_lens=(9, 30)),
    AttnSpec(F16, "HND", 8, 6, 3, 64, kv_lens=(40, 5, 17), window=6, lse=True),
    AttnSpec(F16, "NHD", 16, 4, 1, 64, head_dim_v=32, kv_lens=(21, 2), lse=True),
]


@pytest.mark.parametrize("spec", DECODE_SPECS, ids=lambda s: s.tag("decode"))
def test_decode_conversions_match_the_reference(monkeypatch: pytest.MonkeyPatch, spec: AttnSpec) -> None:
    counts = install(monkeypatch)
    case = decode_case(spec, "cpu", seed=3)
    q, cache, table = case.args
    p = _params(case, True, 1, table.max_pages * cache.page_size)
    want = ref.decode(q, cache, table, p)
    _close(attention.decode(q, cache, table, p), want, spec.dtype)
    out = torch.full((q.shape[0], q.shape[1], cache.head_dim_v), float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:2], float("nan")) if p.return_lse else None
    plan = attention.DecodePlan(None, table, p)
    plan.run(q, cache, out, lse)
    plan.run(q, cache, out, lse)
    _close((out, lse), want, spec.dtype)
    assert counts["get"] == 2  # one for run, one for the plan's first run; its second run reuses it


PREFILL_SPECS = [
    AttnSpec(F16, "HND", 16, 8, 2, 64, kv_lens=(37, 20, 0, 16), q_lens=(37, 1, 0, 5), lse=True),
    AttnSpec(BF16, "NHD", 8, 4, 4, 32, kv_lens=(9, 30, 12), q_lens=(9, 7, 1), causal=False, lse=True),
    AttnSpec(F16, "HND", 4, 6, 3, 64, kv_lens=(40, 25), q_lens=(13, 25), window=5, lse=True),
    AttnSpec(F16, "NHD", 16, 4, 2, 64, head_dim_v=32, kv_lens=(21, 3), q_lens=(21, 2)),
    # non-causal queries of a request with no keys: out 0, lse -inf (cuDNN leaves those rows undefined)
    AttnSpec(F16, "HND", 8, 4, 2, 64, kv_lens=(0, 11), q_lens=(3, 4), causal=False, lse=True),
]


@pytest.mark.parametrize("spec", PREFILL_SPECS, ids=lambda s: s.tag("prefill"))
def test_prefill_conversions_match_the_reference(monkeypatch: pytest.MonkeyPatch, spec: AttnSpec) -> None:
    install(monkeypatch)
    case = prefill_case(spec, "cpu", seed=5)
    q, qo_indptr, cache, table = case.args
    p = _params(case, spec.causal, max(spec.q_lens or (0,)), table.max_pages * cache.page_size)
    want = ref.prefill(q, qo_indptr, cache, table, p)
    _close(attention.prefill(q, qo_indptr, cache, table, p), want, spec.dtype)
    out = torch.full((q.shape[0], q.shape[1], cache.head_dim_v), float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:2], float("nan")) if p.return_lse else None
    problem = types.SimpleNamespace(num_q_heads=q.shape[1], head_dim=q.shape[2], head_dim_v=cache.head_dim_v)
    got = attention.PrefillPlan(problem, table, p, qo_indptr=qo_indptr,  # side tensors at plan time
                                host_qo_indptr=qo_indptr.tolist()).run(q, cache, out, lse)
    assert got[0] is out and got[1] is lse
    _close((out, lse), want, spec.dtype)
    out.fill_(float("nan"))
    attention.PrefillPlan(None, table, p, qo_indptr=qo_indptr).run(q, cache, out, lse)  # made at the first run
    _close((out, lse), want, spec.dtype)


def _ragged(monkeypatch: pytest.MonkeyPatch, spec: AttnSpec, seed: int) -> tuple[Any, ...]:
    """The emulated cuDNN installed, and (q, k, v, qo_indptr, kv_indptr, params) of a ragged case."""
    install(monkeypatch)
    case = ragged_case(spec, "cpu", seed=seed)
    return (*case.args, _params(case, spec.causal, max(spec.q_lens or (0,)), max(spec.kv_lens)))


@pytest.mark.parametrize("spec", PREFILL_SPECS, ids=lambda s: s.tag("ragged"))
def test_ragged_conversions_match_the_reference(monkeypatch: pytest.MonkeyPatch, spec: AttnSpec) -> None:
    q, k, v, qo_indptr, kv_indptr, p = _ragged(monkeypatch, spec, seed=7)
    _close(attention.prefill_ragged(q, k, v, qo_indptr, kv_indptr, p),
           ref.prefill_ragged(q, k, v, qo_indptr, kv_indptr, p), spec.dtype)


RAGGED_PLAN_SPECS = [
    AttnSpec(F16, "NHD", 16, 8, 2, 64, kv_lens=(37, 20, 0, 5), q_lens=(37, 3, 2, 0), lse=True),  # ragged, one empty
    AttnSpec(BF16, "NHD", 16, 8, 2, 64, kv_lens=(48,), q_lens=(48,), lse=True),  # one request: dense
    AttnSpec(F16, "NHD", 16, 4, 4, 64, kv_lens=(30, 30, 30), q_lens=(30, 30, 30), lse=True),  # uniform: dense
    AttnSpec(F16, "NHD", 16, 4, 2, 64, kv_lens=(40, 40), q_lens=(9, 9), causal=False),  # uniform, q < kv: dense
    AttnSpec(F16, "NHD", 16, 4, 2, 64, kv_lens=(40, 40), q_lens=(9, 9), lse=True),  # causal q < kv: ragged
]


@pytest.mark.parametrize("spec", RAGGED_PLAN_SPECS, ids=lambda s: s.tag("ragged-plan"))
def test_ragged_plan_matches_the_reference(monkeypatch: pytest.MonkeyPatch, spec: AttnSpec) -> None:
    """The ragged plan's graphs (dense without padding mask for uniform batches) through the core plan."""
    q, k, v, qo_indptr, kv_indptr, p = _ragged(monkeypatch, spec, seed=11)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    plan = attention.RaggedPrefillPlan(None, None, p, qo_indptr=qo_indptr, kv_indptr=kv_indptr, host_indptrs=(qo, kv))
    uniform = len(set(spec.q_lens)) == 1 and len(set(spec.kv_lens)) == 1 and (not spec.causal or spec.q_lens == spec.kv_lens)
    assert plan.uniform is uniform and (plan.empty is not None) is (0 in spec.kv_lens)
    want = ref.prefill_ragged(q, k, v, qo_indptr, kv_indptr, p)
    _close(plan.run(q, k, v, None, None), want, spec.dtype)
    out = torch.full((q.shape[0], q.shape[1], v.shape[2]), float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:2], float("nan")) if p.return_lse else None
    got = plan.run(q, k, v, out, lse)  # the second run reuses the graph and side tensors, writing the given buffers
    assert got[0] is out and got[1] is lse
    _close(got, want, spec.dtype)
    if uniform:
        built = next(iter(plan._entries.values()))[0]
        assert not built.spec.padding and built.spec.q.ragged is None and "seq_q" not in convert.int_specs(built.spec)


def test_strided_views_are_passed_by_strides_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """q, k, v as column slices of one fused qkv projection (token stride 3 * H * D)."""
    install(monkeypatch)
    spec = replace(PREFILL_SPECS[0], q_heads=2, kv_heads=2)
    case = ragged_case(spec, "cpu", seed=9)
    k0, kv_indptr = case.args[1], case.args[4]
    t = k0.shape[0]
    fused = torch.randn(t, 3, 2, 64).to(F16)
    q, k, v = fused[:, 0], fused[:, 1], fused[:, 2]
    qo = kv_indptr  # one query per cached token
    p = _params(case, True, max(spec.kv_lens), max(spec.kv_lens))
    want = ref.prefill_ragged(q, k, v, qo, kv_indptr, p)
    got = attention.prefill_ragged(q, k, v, qo, kv_indptr, p)
    _close(got, want, F16)
    s = convert.ragged_spec(q, k, v, 4, p, 64, 64)
    assert s.q.strides[2] == 3 * 2 * 64 and s.k.strides[2] == 3 * 2 * 64


def test_spec_shapes_and_masks() -> None:
    case = prefill_case(AttnSpec(F16, "NHD", 16, 8, 2, 64, kv_lens=(37, 20), q_lens=(37, 3), window=7, lse=True),
                        "cpu")
    q, qo_indptr, cache, table = case.args
    p = _params(case, True, 37, 48)
    s = convert.prefill_spec(q, cache, table, p, convert.q_bucket(37))
    assert s.q.dims == (2, 8, 64, 64) and s.q.ragged == "q_off"
    assert s.k.dims == (cache.num_pages, 2, 16, 64)  # logical HND of an NHD pool, by strides
    assert s.k.strides == (16 * 2 * 64, 64, 2 * 64, 1)
    assert s.table is not None and s.table.dims == (2, 1, table.max_pages, 1)
    assert s.causal and s.left_bound == 8 and s.max_seq_len_kv == table.max_pages * 16
    assert convert.left_bound(-1) is None and convert.left_bound(0) == 1
    assert set(convert.int_specs(s)) == {"seq_q", "seq_kv", "q_off", "o_off"}
    idx = convert.lse_gather_index(qo_indptr, q.shape[0], 64)
    assert idx.tolist() == [*range(37), 64, 65, 66]


def test_offsets_that_overflow_int32_are_an_argument_error() -> None:
    q = torch.empty_strided((3, 1, 8), (2**30, 8, 1), device="meta")
    with pytest.raises(ksb.InvalidArgumentError, match=r"q\.shape=.*int32 ragged offsets"):
        convert.check_offsets(q, "q")
