"""Capabilities, registry, dispatch ranking, overrides and explanations."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl
from kernel_switchboard.ops.attention import DecodeProblem
from kernel_switchboard.ops.norm import NormProblem
from kernel_switchboard.reference.attention import decode as ref_decode
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case


def _problem(**kw: Any) -> NormProblem:
    base = dict(device="cpu", cc=None, dtype=torch.float32, hidden=64, rows=4, gemma=False, features=frozenset())
    base.update(kw)
    return NormProblem(**base)


def _plugin(name: str, kernels: list[Kernel], **backend_kw: Any) -> Any:
    @hookimpl
    def ksb_backend() -> Backend:
        return Backend(name, "9.9", kernels, **backend_kw)

    return types.SimpleNamespace(__name__=f"test_{name}", ksb_backend=ksb_backend)


def _double(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    from kernel_switchboard.reference.norm import rms_norm

    return rms_norm(x, w, eps, gemma) * 1.0


def test_capability_reasons_name_actual_and_allowed_values() -> None:
    cap = Capability(devices=frozenset({"cuda"}), dtypes=frozenset({torch.bfloat16}), min_cc=(9, 0),
                     features=frozenset({"causal"}), limits={"rows": 2}, allowed={"gemma": frozenset({False})})
    reasons = cap.reasons(_problem(cc=(8, 0), features=frozenset({"soft_cap"}), gemma=True))
    text = " | ".join(reasons)
    assert "device=cpu not supported (supported: {cuda})" in text
    assert "dtype=float32 not supported (supported: {bfloat16})" in text
    assert "compute capability 8.0 below minimum 9.0" in text
    assert "features {soft_cap} not supported (supported: {causal})" in text
    assert "rows=4 above limit 2" in text
    assert "gemma=True not supported" in text
    assert Capability(devices=None).reasons(_problem()) == []


def test_unknown_feature_name_is_rejected_at_declaration() -> None:
    with pytest.raises(ValueError, match="unknown names"):
        Capability(features=frozenset({"causall"}))


def test_cost_ranks_eligible_kernels_and_explain_lists_every_candidate(register) -> None:
    cap = Capability(devices=frozenset({"cpu"}))
    fast = Kernel("norm.rms_norm", "fast", "t1", cap, _double, cost=lambda p: 1e-6)
    slow = Kernel("norm.rms_norm", "slow", "t1", cap, _double, cost=lambda p: 1e-3)
    gpu_only = Kernel("norm.rms_norm", "gpu", "t1", Capability(devices=frozenset({"cuda"})), _double, cost=lambda p: 0)
    register(_plugin("t1", [slow, fast, gpu_only]))
    x, w = torch.randn(4, 64), torch.randn(64)
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "t1:fast" and sel.source == "cost"
    text = str(sel)
    assert "t1:gpu" in text and "device=cpu not supported (supported: {cuda})" in text
    assert text.index("t1:fast") < text.index("t1:slow") < text.index("reference:rms_norm")
    torch.testing.assert_close(ksb.norm.rms_norm(x, w), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))


def test_explicit_choice_that_cannot_run_raises_and_never_falls_back(register) -> None:
    register(_plugin("t2", [Kernel("norm.rms_norm", "bf16only", "t2",
                                   Capability(devices=frozenset({"cpu"}), dtypes=frozenset({torch.bfloat16})), _double)]))
    x, w = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(ksb.KernelUnavailableError, match=r"dtype=float32 not supported"):
        ksb.norm.rms_norm(x, w, backend="t2")
    with pytest.raises(ksb.KernelUnavailableError, match="matches no registered kernel"):
        ksb.norm.rms_norm(x, w, backend="nonexistent")
    assert ksb.explain("norm.rms_norm", x.bfloat16(), w.bfloat16(), backend="t2").source == "explicit"


def test_use_scope_prefers_backends_only_for_ops_they_implement(register) -> None:
    cap = Capability(devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32}))
    register(_plugin("t3", [Kernel("norm.rms_norm", "k", "t3", cap, _double, cost=lambda p: 1.0)]))
    x, w = torch.randn(4, 64), torch.randn(64)
    with ksb.use("reference"):
        assert ksb.explain("norm.rms_norm", x, w).kernel.id == "reference:rms_norm"
    with ksb.use("t3"):
        assert ksb.explain("norm.rms_norm", x, w).kernel.id == "t3:k"
        # t3 has no layer_norm kernel: automatic selection continues for that op
        assert ksb.explain("norm.layer_norm", x, w).kernel.id == "reference:layer_norm"
    with ksb.use("t3"), pytest.raises(ksb.KernelUnavailableError, match="never silently replaced"):
        ksb.norm.rms_norm(x.bfloat16(), w.bfloat16())  # t3 implements rms_norm but not for bf16: no fallback


def test_no_eligible_kernel_lists_every_reason(register, monkeypatch) -> None:
    monkeypatch.setenv("KSB_DISABLE_BACKENDS", "t4")
    register(_plugin("t4", [Kernel("norm.rms_norm", "k", "t4", Capability(devices=frozenset({"cpu"})), _double)]))
    sel = ksb.explain("norm.rms_norm", torch.randn(4, 64), torch.randn(64))
    assert "disabled by KSB_BACKENDS / KSB_DISABLE_BACKENDS" in str(sel)


def test_allow_list_keeps_reference(register, monkeypatch) -> None:
    monkeypatch.setenv("KSB_BACKENDS", "t5")
    register(_plugin("t5", [Kernel("norm.rms_norm", "k", "t5", Capability(devices=frozenset({"cpu"})), _double)]))
    backends = ksb.registry.all_backends()
    assert backends["t5"].available and backends["reference"].available
    assert all(not b.available for n, b in backends.items() if n not in ("t5", "reference"))


def test_broken_plugin_is_listed_unavailable_and_others_still_work(register) -> None:
    @hookimpl
    def ksb_backend() -> Backend:
        raise RuntimeError("vendor library exploded")

    register(types.SimpleNamespace(__name__="exploding", ksb_backend=ksb_backend))
    backends = ksb.registry.all_backends()
    assert "vendor library exploded" in (backends["exploding"].unavailable or "")
    x, w = torch.randn(4, 64), torch.randn(64)
    torch.testing.assert_close(ksb.norm.rms_norm(x, w), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))


def test_broken_entry_point_import_is_listed_with_reason(monkeypatch) -> None:
    from importlib import metadata

    real = metadata.entry_points

    def fake_entry_points(group: str):  # type: ignore[no-untyped-def]
        eps = list(real(group=group))
        eps.append(metadata.EntryPoint("broken", "no_such_module_xyz.plugin", group))
        return eps

    monkeypatch.setattr(metadata, "entry_points", fake_entry_points)
    ksb.registry.reload()
    try:
        backends = ksb.registry.all_backends()
        assert "import of no_such_module_xyz.plugin failed" in (backends["broken"].unavailable or "")
        assert backends["reference"].available
    finally:
        monkeypatch.undo()
        ksb.registry.reload()


def test_unavailable_backend_keeps_kernels_listed_with_install_command(register) -> None:
    k = Kernel("norm.rms_norm", "k", "t6", Capability(devices=frozenset({"cpu"})), _double)
    register(_plugin("t6", [k], unavailable="libfoo is not installed", install="pip install foo"))
    sel = ksb.explain("norm.rms_norm", torch.randn(4, 64), torch.randn(64))
    assert "t6:k" in str(sel) and "unavailable: libfoo is not installed; install: pip install foo" in str(sel)


def test_uncompiled_kernels_rank_after_compiled_ones(register) -> None:
    cap = Capability(devices=frozenset({"cpu"}))
    jit = Kernel("norm.rms_norm", "jit", "t7", cap, _double, cost=lambda p: 1e-9, needs_build=lambda p: True)
    ready = Kernel("norm.rms_norm", "ready", "t7", cap, _double, cost=lambda p: 1e-3)
    register(_plugin("t7", [jit, ready]))
    sel = ksb.explain("norm.rms_norm", torch.randn(4, 64), torch.randn(64))
    assert sel.kernel.id == "t7:ready"
    assert "not compiled yet" in str(sel)


def test_a_kernel_computing_in_a_narrower_dtype_is_never_chosen_automatically(register) -> None:
    """XQA on an fp8 cache rounds Q and P to e4m3: cheaper, but the automatic choice keeps the query's precision;
    named explicitly it runs."""
    cap = Capability(devices=frozenset({"cpu"}))
    narrow = Kernel("norm.rms_norm", "narrow", "t8", cap, _double, cost=lambda p: 1e-9,
                    math_dtype=lambda p: torch.float8_e4m3fn)
    same = Kernel("norm.rms_norm", "same", "t8", cap, _double, cost=lambda p: 1e-3, math_dtype=lambda p: None)
    register(_plugin("t8", [narrow, same]))
    x, w = torch.randn(4, 64), torch.randn(64)
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "t8:same"
    assert "computes in float8_e4m3fn, narrower than the query" in str(sel)
    assert ksb.explain("norm.rms_norm", x, w, backend="t8:narrow").kernel.id == "t8:narrow"
    with ksb.use("t8:narrow"):
        assert ksb.explain("norm.rms_norm", x, w).kernel.id == "t8:narrow"


def test_selection_is_cached_by_problem() -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    a = ksb.select("norm.rms_norm", _problem())
    assert ksb.select("norm.rms_norm", _problem()) is a
    assert ksb.explain("norm.rms_norm", x, w) is a


def test_example_third_party_backend_registers_and_conforms(register) -> None:
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).parents[3] / "examples" / "ksb-example-backend" / "src"
    sys.path.insert(0, str(path))
    try:
        spec = importlib.util.find_spec("ksb_example_backend.plugin")
        assert spec is not None
        plugin = importlib.import_module("ksb_example_backend.plugin")
    finally:
        sys.path.remove(str(path))
    register(plugin)
    x, w = torch.randn(8, 64), torch.randn(64)
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "example:torch_rms_norm"
    from kernel_switchboard.testing import kernel_cases

    cases = kernel_cases(sel.kernel, torch.device("cpu"))
    assert cases and all("gemma" not in c.id for c in cases)
    for case in cases:
        case.compare(sel.kernel.id, finite_stale_slots=sel.kernel.reads_stale_slots)



def test_explain_in_one_thread_never_disturbs_ops_in_another() -> None:
    import threading

    x, w = torch.randn(4, 64), torch.randn(64)
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker() -> None:
        try:
            while not stop.is_set():
                ksb.norm.rms_norm(x, w)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    try:
        for _ in range(200):
            ksb.explain("norm.rms_norm", x, w)
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_explain_warns_when_the_chosen_kernel_reads_stale_page_slots(register) -> None:
    cap = Capability(devices=frozenset({"cpu"}), features=frozenset({"paged"}))
    register(_plugin("t_stale", [Kernel("attention.decode", "k", "t_stale", cap, ref_decode, cost=lambda p: 1e-9,
                                        reads_stale_slots=True)]))
    q, cache, table = decode_case(AttnSpec(torch.float32, "NHD", 16, 4, 2, kv_lens=(5, 20)), "cpu").args
    sel = ksb.explain("attention.decode", q, cache, table)
    assert sel.kernel.id == "t_stale:k" and isinstance(sel.problem, DecodeProblem)
    assert "must hold finite values" in str(sel)
    assert "must hold finite" not in str(ksb.explain("attention.decode", q, cache, table, backend="reference"))


def test_collectives_are_never_autotuned(register, monkeypatch) -> None:
    """Ranks that time kernels apart could pick different ones for one collective, which would then never meet;
    a local op with the same two candidates is autotuned (the control)."""
    from kernel_switchboard.ops.comm import CommProblem

    monkeypatch.setenv("KSB_TUNE_CACHE", "unused-by-select.json")
    cap = Capability(devices=frozenset({"cuda"}))
    ops = ("comm.all_reduce_fused_rms_norm", "norm.rms_norm")
    register(_plugin("tt", [Kernel(op, name, "tt", cap, _double, cost=lambda p, c=c: c)
                            for op in ops for name, c in (("a", 1e-6), ("b", 2e-6))]))
    comm = CommProblem("cuda", (9, 0), torch.bfloat16, 8192, 16, 2, "nccl", frozenset())
    with ksb.autotune():
        assert ksb.select("norm.rms_norm", _problem(device="cuda", cc=(9, 0))).kernel.id.startswith("autotune(")
        sel = ksb.select("comm.all_reduce_fused_rms_norm", comm)
    assert sel.kernel.id == "tt:a" and not any("autotuning" in n for n in sel.notes)
