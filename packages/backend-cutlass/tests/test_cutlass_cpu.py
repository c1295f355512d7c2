"""CUTLASS backend without a GPU: gating, declarations, configurations, emitted source, and the
translation of torch operands into kernel arguments (run through a model of the C entry points,
cutlass_emulate.py, and compared with the reference kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cutlass_emulate import run as emulate

import kernel_switchboard as ksb
from kernel_switchboard import KernelUnavailableError
from kernel_switchboard.ops.gemm import GemmProblem, scale_mode_of
from kernel_switchboard.reference import gemm as ref
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases import gemm as gemm_cases
from kernel_switchboard_cutlass import build, configs, emit, gemm, operands, plugin, toolchain

BF16, F16, F32, FP8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_toolchain():
    toolchain.reset()
    build.forget()
    yield
    toolchain.reset()
    build.forget()


def _problem(**kw: object) -> GemmProblem:
    base = dict(device="cuda", cc=(9, 0), dtype=BF16, out_dtype=BF16, m=4096, n=4096, k=4096, layout="RR",
                align_bytes=16, scale_mode=None, groups=None, features=frozenset())
    base.update(kw)
    return GemmProblem(**base)  # type: ignore[arg-type]


def _kernels() -> dict[str, ksb.Kernel]:
    return {k.name: k for k in gemm.kernels("test")}


# -- gating -------------------------------------------------------------------------------------------------
def test_backend_lists_its_kernels_unavailable_with_reason_and_command() -> None:
    backend = registry.all_backends()["cutlass"]
    dense = f"cutlass:sdpa_efficient@torch-{torch.__version__.split('+')[0]}"
    assert {k.id for k in backend.kernels} == {"cutlass:mm", "cutlass:mm_fp8", "cutlass:grouped_mm", dense}
    assert backend.unavailable is not None  # no GPU here (and maybe no headers / nvcc)
    assert backend.install
    for k in backend.kernels:
        (reason,) = k.reasons(_problem())
        assert reason.startswith("unavailable: ") and "install: " in reason
    assert "no CUDA" in next(k for k in backend.kernels if k.id == dense).unavailable


def test_dense_attention_wrapper_keeps_the_op_conventions() -> None:
    """The SDPA wrapper (run here on torch's CPU backends; the efficient one is CUDA-only) against the reference
    on the core's cases: bottom-right causal folded into the mask, GQA, rows that keep nothing give 0."""
    from kernel_switchboard.ops.attention import DenseParams
    from kernel_switchboard.testing.cases.attention_dense import dense_case, dense_specs
    from kernel_switchboard_cutlass.attention import sdpa_dense

    for i, spec in enumerate(dense_specs("small")):
        q, k, v, bias = (t if t is None or t.dtype == torch.bool else t.float() for t in dense_case(spec, "cpu", i).args)
        got = sdpa_dense(q, k, v, bias, DenseParams(q.shape[-1] ** -0.5, spec.causal), backends=None)
        want = ksb.attention.dense(q, k, v, bias, causal=spec.causal, backend="reference")
        assert_close(got, want, atol=1e-4, rtol=1e-4, what=spec.tag())


def test_missing_headers_reason_names_the_package_and_install_command(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KSB_CUTLASS_DIR", str(tmp_path))
    toolchain.reset()
    reason, install = plugin.unavailable_reason()
    assert "include/cutlass/cutlass.h is missing" in reason and str(tmp_path) in reason
    assert install == 'pip install --no-deps "nvidia-cutlass>=4.2,<5"'
    with pytest.raises(RuntimeError, match=r"pip install --no-deps \"nvidia-cutlass"):
        toolchain.headers()


def test_missing_nvcc_reason(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KSB_NVCC", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(toolchain, "DEFAULT_NVCC", str(tmp_path / "missing" / "nvcc"))
    toolchain.reset()
    assert toolchain.missing_nvcc().startswith("nvcc not found")


def test_old_nvcc_is_refused(monkeypatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.1, V12.1.105'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KSB_NVCC", str(fake))
    toolchain.reset()
    assert "nvcc 12.1" in toolchain.missing_nvcc() and "too old" in toolchain.missing_nvcc()


def test_explicit_backend_on_cpu_raises_with_the_reason() -> None:
    a, b = torch.randn(8, 16, dtype=BF16), torch.randn(16, 8, dtype=BF16)
    with pytest.raises(KernelUnavailableError, match="cutlass:mm: unavailable"):
        ksb.gemm.mm(a, b, backend="cutlass")


def test_version_parsers(tmp_path: Path) -> None:
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert toolchain.parse_nvcc_version(text) == ((13, 0), "V13.0.88")
    assert toolchain.parse_nvcc_version("garbage") is None
    (tmp_path / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 1\n")
    assert toolchain.read_cutlass_version(tmp_path) == "4.2.1"


# -- declarations -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "change", "words"), [
    ("mm", {"cc": (8, 0)}, "below minimum 9.0"),
    ("mm", {"cc": (10, 0)}, "above maximum 9.0"),
    ("mm", {"dtype": F32, "out_dtype": F32}, "dtype=float32 not supported"),
    ("mm", {"layout": "SR"}, "layout=SR not supported"),
    ("mm", {"align_bytes": 8}, "align_bytes=8: TMA needs 16-byte"),
    ("mm", {"features": frozenset({"in_place"})}, "features {in_place} not supported"),
    ("mm_fp8", {"dtype": FP8, "layout": "RR", "scale_mode": "block"}, "layout=RR not supported"),
    ("mm_fp8", {"dtype": FP8, "layout": "RC", "scale_mode": "row_col"}, "scale_mode=row_col not supported"),
    ("grouped_mm", {"layout": "CR", "groups": 8}, "a must be row-major"),
])
def test_capability_reasons(name: str, change: dict[str, object], words: str) -> None:
    reasons = _kernels()[name].reasons(_problem(**change))
    assert any(words in r for r in reasons), reasons


@pytest.mark.parametrize(("name", "problem"), [
    ("mm", _problem()),
    ("mm", _problem(dtype=F16, out_dtype=F16, layout="CC", m=1)),
    ("mm_fp8", _problem(dtype=FP8, layout="RC", scale_mode="block")),
    ("mm_fp8", _problem(dtype=FP8, out_dtype=F32, layout="RC", scale_mode="tensor")),
    ("grouped_mm", _problem(layout="RC", groups=256)),
])
def test_capability_accepts(name: str, problem: GemmProblem) -> None:
    assert _kernels()[name].reasons(problem) == []


@pytest.mark.parametrize(("mode", "low", "high"), [("block", 1050e12, 1250e12), ("tensor", 1100e12, 1250e12)])
def test_fp8_cost_matches_the_h200_rates(mode: str, low: float, high: float) -> None:
    # H200 8192^3 with the overlapped promotion: block scales 1121-1150 TFLOP/s, per-tensor 1166-1187; both
    # above Triton's (block 954-965 in the same calls, estimate 1000; per-tensor 938-1158, estimate 1050)
    problem = _problem(dtype=FP8, layout="RC", scale_mode=mode, m=8192, n=8192, k=8192)
    rate = 2.0 * 8192**3 / _kernels()["mm_fp8"].cost(problem)
    assert low <= rate <= high, rate


def test_cost_is_infinite_off_the_gpu_and_grows_with_size() -> None:
    k = _kernels()["mm"]
    assert k.cost(_problem(device="cpu")) == float("inf")
    assert k.cost(_problem(m=8192, n=8192, k=8192)) > k.cost(_problem(m=1024, n=1024, k=1024)) > 0


# -- configurations and emitted source ----------------------------------------------------------------------
def test_config_names_are_unique_and_readable() -> None:
    cfgs = [c for la in ("row", "col") for lb in ("row", "col") for c in configs.mm_configs("bf16", la, lb)]
    cfgs += [configs.fp8_block_config("bf16", m) for m in (16, 4096)] + [configs.fp8_tensor_config("fp32", 16)]
    cfgs += [configs.fp8_block_config("bf16", 4096, role) for role in configs.FP8_BLOCK_TILES]
    cfgs += [configs.fp8_tensor_config("bf16", 4096, role) for role in configs.FP8_TENSOR_TILES]
    cfgs += [configs.grouped_config("fp16", "col")]
    names = [c.name for c in cfgs]
    assert len(set(names)) == len(set(cfgs))
    assert "mm_bf16_bf16_rc_128x256x64_c2x1_coop" in names
    assert "mm_fp8_block_e4m3_bf16_rc_128x128x128_c2x1_coop_ovl" in names
    assert "mm_fp8_tensor_e4m3_bf16_rc_128x128x128_c2x1_coop_ovl" in names


def test_tile_choice_by_shape(monkeypatch) -> None:
    assert configs.mm_role(16, 8192) == "small_m"
    assert configs.mm_role(8192, 8192) == "large"  # 64 x 32 = 2048 tiles of 128x256
    assert configs.mm_role(512, 1024) == "medium"  # 4 x 4 = 16 tiles of 128x256 would idle the GPU
    monkeypatch.setenv("KSB_CUTLASS_MM_TILE", "medium")
    assert configs.mm_config("bf16", "row", "row", 8192, 8192).tile == (128, 128, 64)
    monkeypatch.setenv("KSB_CUTLASS_MM_TILE", "huge")
    with pytest.raises(ValueError, match="KSB_CUTLASS_MM_TILE='huge'"):
        configs.mm_config("bf16", "row", "row", 8192, 8192)
    assert configs.fp8_block_config("bf16", 64).tile == (64, 128, 128)
    assert configs.fp8_block_config("bf16", 128).tile == (64, 128, 128)  # two tile rows: twice the programs
    # 128-row tiles without a cluster up to 1024 rows, 64-row ones where 128-row tiles would idle half the SMs
    assert [configs.fp8_role(m, 8192) for m in (256, 512, 1024, 2048)] == ["coop_c1x1"] * 3 + ["coop_c2x1_ovl"]
    assert configs.fp8_role(256, 4096) == "small_m"  # 2 x 32 tiles of 128x128 for 132 SMs
    assert configs.fp8_role(1024, 4096) == configs.fp8_role(256) == "coop_c1x1"
    assert configs.fp8_block_config("bf16", 256, n=8192).name == configs.fp8_block_config("bf16", 0, "coop_c1x1").name
    assert configs.fp8_block_config("bf16", 8192).cluster == (2, 1, 1)
    assert configs.fp8_block_config("bf16", 8192, "coop_c1x1").cluster == (1, 1, 1)  # a tile named by the caller
    monkeypatch.setenv("KSB_CUTLASS_FP8_BLOCK_TILE", "coop")
    assert configs.fp8_block_config("bf16", 8192).cluster == (1, 2, 1)
    monkeypatch.setenv("KSB_CUTLASS_FP8_BLOCK_TILE", "huge")
    with pytest.raises(ValueError, match="KSB_CUTLASS_FP8_BLOCK_TILE='huge'"):
        configs.fp8_block_config("bf16", 8192)
    assert configs.fp8_tensor_config("bf16", 64).schedule == "pingpong"
    # per-tensor scales follow the same rule (fp8_role)
    assert configs.fp8_tensor_config("bf16", 128).tile == (64, 128, 128)
    assert configs.fp8_tensor_config("bf16", 1024, n=8192).name == configs.fp8_tensor_config("bf16", 0, "coop_c1x1").name
    assert configs.fp8_tensor_config("bf16", 2048, n=8192).overlap_promotion is True
    assert configs.fp8_tensor_config("bf16", 8192).tile == (128, 128, 128)  # 128x256 spilled
    monkeypatch.setenv("KSB_CUTLASS_FP8_TENSOR_TILE", "coop_c2x1_ovl")
    assert configs.fp8_tensor_config("bf16", 16).overlap_promotion is True
    monkeypatch.setenv("KSB_CUTLASS_FP8_TENSOR_TILE", "huge")
    with pytest.raises(ValueError, match="KSB_CUTLASS_FP8_TENSOR_TILE='huge'"):
        configs.fp8_tensor_config("bf16", 8192)


@pytest.mark.parametrize(("change", "words"), [
    ({"schedule": "cooperative", "tile": (64, 128, 64)}, "tile M of at least 128"),
    ({"dtype": "e4m3", "layout_b": "row"}, "K-major"),
    ({"kind": "conv"}, "kind='conv'"),
    ({"out_dtype": "e4m3"}, "output one of"),
    ({"overlap_promotion": True}, "overlap_promotion: only for kinds 'mm_fp8_block' / 'mm_fp8_tensor'"),
    ({"split_k": 0}, "split_k=0: at least 1"),
    ({"split_k": 2, "schedule": "pingpong", "tile": (64, 128, 64)}, "split_k=2: .* only with the cooperative"),
    ({"split_k": 2, "kind": "mm_fp8_block", "dtype": "e4m3", "tile": (128, 128, 128), "overlap_promotion": True},
     "split_k=2: .* with overlap_promotion"),
])
def test_invalid_configs_raise(change: dict[str, object], words: str) -> None:
    base = dict(kind="mm", dtype="bf16", out_dtype="bf16", layout_a="row", layout_b="col", tile=(128, 128, 64),
                cluster=(1, 2, 1), schedule="cooperative")
    base.update(change)
    with pytest.raises(ValueError, match=words):
        configs.GemmConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("cfg", [
    configs.mm_config("bf16", "col", "row", 8192, 8192),
    configs.mm_config("fp16", "row", "col", 16, 512),
    configs.fp8_block_config("bf16", 4096),
    configs.fp8_block_config("bf16", 4096, "coop_c2x1_ovl"),
    configs.fp8_block_config("bf16", 128, "coop_sk2"),
    configs.fp8_tensor_config("fp32", 8),
    configs.fp8_tensor_config("bf16", 4096, "coop_c2x1_ovl"),
    configs.grouped_config("bf16", "col"),
], ids=lambda c: c.name)
def test_emitted_source_is_complete_and_matches_the_config(cfg: configs.GemmConfig) -> None:
    src = emit.emit(cfg)
    assert "$" not in src
    assert f"Shape<_{cfg.tile[0]}, _{cfg.tile[1]}, _{cfg.tile[2]}>" in src
    assert f"Shape<_{cfg.cluster[0]}, _{cfg.cluster[1]}, _1>" in src
    assert f'extern "C" int {emit.entry_point(cfg.kind)}(' in src and 'extern "C" size_t ksb_workspace(' in src
    sched = "Cooperative" if cfg.schedule == "cooperative" else "Pingpong"
    assert f"KernelTmaWarpSpecialized{sched}" in src or f"KernelPtrArrayTmaWarpSpecialized{sched}" in src
    layout_b = "RowMajor" if cfg.layout_b == "row" else "ColumnMajor"
    assert f"using LayoutB = cutlass::layout::{layout_b};" in src
    if cfg.kind == "mm_fp8_block":
        assert "FP8Blockwise" in src and "Sm90BlockwiseScaleConfig<1, 128, 128" in src
    if cfg.kind == "mm_fp8_tensor":
        assert "alpha_ptr = alpha_ptr" in src
    if cfg.kind.startswith("mm"):
        wrapper = {"mm_fp8_block": "ksb::OverlappedBlockScaled", "mm_fp8_tensor": "ksb::OverlappedPerTensor"}
        mainloop = f"{wrapper[cfg.kind]}<BuiltMainloop>" if cfg.overlap_promotion else "BuiltMainloop"
        assert f"using CollectiveMainloop = {mainloop};" in src
        assert ("namespace ksb {" in src) == cfg.overlap_promotion
        scheduler = "StreamKScheduler" if cfg.split_k > 1 else "PersistentScheduler"
        assert f"CollectiveEpilogue,\n{' ' * 56}cutlass::gemm::{scheduler}>;" in src
        assert (f"args.scheduler.splits = {cfg.split_k};" in src) == (cfg.split_k > 1)
        assert ("DecompositionMode::SplitK" in src) == (cfg.split_k > 1)


# -- argument translation, checked against the reference ---------------------------------------------------
def _run_emulated(job: gemm.Launch, m: int, n: int) -> torch.Tensor:
    job.d.fill_(float("nan"))  # poison: every output element must be written
    emulate(job)
    return operands.finish_output(job.d if job.d.shape[0] == m else job.d[:m], n)


def _declared(op: str) -> list:
    """The small conformance cases inside the CUTLASS kernel's declared dtypes and scale modes."""
    out = []
    for case in gemm_cases.cases(op, CPU, "small"):
        a, b = case.args[:2]
        if op == "gemm.mm_fp8":
            mode = scale_mode_of(case.args[2], case.args[3], a.shape[0], b.shape[1], a.shape[1])
            if mode not in ("tensor", "block"):
                continue
        elif a.dtype not in gemm.HALF:
            continue
        out.append(case)
    return out


@pytest.mark.parametrize("case", _declared("gemm.mm"), ids=lambda c: c.id)
def test_mm_translation_matches_reference(case) -> None:
    a, b = case.args
    job = gemm.prepare_mm(a, b)
    assert job.m == a.shape[0] and job.k % 8 == 0 and job.n % 8 == 0
    got = _run_emulated(job, a.shape[0], b.shape[1])
    assert got.is_contiguous()
    assert_close(got, ref.mm(a, b), atol=tolerance(a.dtype)[0], rtol=tolerance(a.dtype)[1], what=case.id)


def test_mm_passes_aligned_operands_without_copies() -> None:
    a = torch.randn(64, 32, dtype=BF16)
    b = torch.randn(48, 32, dtype=BF16).t()  # (32, 48) column-major
    job = gemm.prepare_mm(a, b)
    assert job.a.tensor.data_ptr() == a.data_ptr() and job.a.layout == "row" and job.a.ld == 32
    assert job.b.tensor.data_ptr() == b.data_ptr() and job.b.layout == "col" and job.b.ld == 32
    assert job.cfg.layout_a == "row" and job.cfg.layout_b == "col"


def test_mm_pads_odd_extents_with_zeros() -> None:
    a = torch.randn(5, 13, dtype=F16)  # K = 13: not a multiple of 8
    b = torch.randn(13, 11, dtype=F16)  # N = 11
    job = gemm.prepare_mm(a, b)
    assert (job.k, job.n) == (16, 16) and job.a.layout == "row" and job.b.layout == "row"
    assert torch.count_nonzero(job.a.tensor[:, 13:]) == 0 and torch.count_nonzero(job.b.tensor[13:]) == 0
    got = _run_emulated(job, 5, 11)
    assert got.shape == (5, 11)
    assert_close(got, ref.mm(a, b), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("case", _declared("gemm.mm_fp8"), ids=lambda c: c.id)
def test_mm_fp8_translation_matches_reference(case) -> None:
    a, b, sa, sb = case.args
    mode = scale_mode_of(sa, sb, a.shape[0], b.shape[1], a.shape[1])
    out = case.kwargs["out_dtype"]
    if mode == "tensor":
        sa, sb = sa.reshape(()), sb.reshape(())
    job = gemm.prepare_mm_fp8(a, b, sa, sb, mode, out)
    assert job.a.layout == "row" and job.b.layout == "col"
    if mode == "block":
        assert job.m % 4 == 0
    got = _run_emulated(job, a.shape[0], b.shape[1])
    want = ref.mm_fp8(a, b, sa, sb, mode, out)
    assert_close(got, want, atol=case.tol[0], rtol=case.tol[1], what=case.id)


def test_block_scales_of_a_are_copied_only_when_tma_needs_it() -> None:
    """SFA is M-major (K/128, M) and TMA-loaded: scales already stored so are passed as they are; row-major ones
    get one transposing copy; an M that is not a multiple of 4 (or a misaligned view) gets a zero-padded copy."""
    m, k, n = 64, 256, 128
    qa, qb = torch.ones(m, k, dtype=FP8), torch.ones(n, k, dtype=FP8).t()
    sb = torch.rand(k // 128, n // 128)
    m_major = torch.rand(k // 128, m)  # the layout DeepGEMM-style quantisers write
    job = gemm.prepare_mm_fp8(qa, qb, m_major.t(), sb, "block", BF16)
    assert job.extra[0].data_ptr() == m_major.data_ptr()
    row_major = torch.rand(m, k // 128)
    job = gemm.prepare_mm_fp8(qa, qb, row_major, sb, "block", BF16)
    assert torch.equal(job.extra[0], row_major.t()) and job.extra[0].is_contiguous()
    shifted = torch.rand(k // 128 * m + 1)[1:].view(k // 128, m)  # 4 bytes past an aligned address
    job = gemm.prepare_mm_fp8(qa, qb, shifted.t(), sb, "block", BF16)
    assert job.extra[0].data_ptr() % 16 == 0 and torch.equal(job.extra[0], shifted)
    odd = torch.rand(m - 3, k // 128)
    job = gemm.prepare_mm_fp8(qa[: m - 3], qb, odd, sb, "block", BF16)
    assert job.extra[0].shape == (k // 128, m) and torch.equal(job.extra[0][:, : m - 3], odd.t())
    assert torch.count_nonzero(job.extra[0][:, m - 3:]) == 0


@pytest.mark.parametrize("case", _declared("gemm.grouped_mm"), ids=lambda c: c.id)
def test_grouped_translation_matches_reference(case) -> None:
    a, b, offsets = case.args
    job = gemm.prepare_grouped(a, b, offsets)
    assert job.groups == b.shape[0] and job.extra[0].dtype == torch.int32
    got = _run_emulated(job, a.shape[0], b.shape[2])
    assert_close(got, ref.grouped_mm(a, b, offsets), atol=tolerance(a.dtype)[0], rtol=tolerance(a.dtype)[1],
                 what=case.id)


def test_grouped_keeps_column_major_experts_in_place() -> None:
    a = torch.randn(24, 32, dtype=BF16)
    b = torch.randn(3, 16, 32, dtype=BF16).transpose(1, 2)  # (G, K=32, N=16), each slice column-major
    job = gemm.prepare_grouped(a, b, torch.tensor([0, 8, 8, 24], dtype=torch.int32))
    assert job.b.tensor.data_ptr() == b.data_ptr() and job.b.layout == "col" and job.cfg.layout_b == "col"


# -- the build cache without compiling ---------------------------------------------------------------------
def test_spill_bytes_add_up_over_the_kernels_of_a_build_log() -> None:
    log = ("ptxas info    : Compiling entry function 'fill_groups' for 'sm_90a'\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Compiling entry function 'gemm' for 'sm_90a'\n"
           "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n")
    assert build.spill_bytes(log) == 20
    assert build.spill_bytes("") == 0


def test_cache_key_changes_with_the_toolchain(monkeypatch, tmp_path: Path) -> None:
    if toolchain.missing_nvcc() or toolchain.missing_headers():
        pytest.skip(f"needs nvcc and CUTLASS headers: {toolchain.missing_nvcc() or toolchain.missing_headers()}")
    monkeypatch.setenv("KSB_CUTLASS_CACHE", str(tmp_path))
    cfg = configs.mm_config("bf16", "row", "row", 4096, 4096)
    art = build.artifact(cfg)
    assert art.so.parent == tmp_path and art.so.name.startswith(cfg.name) and not art.built
    key = build.cache_key(emit.emit(cfg))
    monkeypatch.setattr(toolchain, "nvcc", lambda: toolchain.Nvcc("/x/nvcc", (12, 8), "V12.8.93"))
    assert build.cache_key(emit.emit(cfg)) != key
    kernel = _kernels()["mm"]
    assert kernel.needs_build(_problem()) is True


# -- the benchmark script runs end to end (tiny shapes; every CUTLASS row reports its error) ------------------
def test_benchmark_smoke() -> None:
    import importlib.util

    path = Path(__file__).parents[1] / "benchmarks" / "gemm.py"
    spec = importlib.util.spec_from_file_location("cutlass_bench_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.bench_gemm("cpu", mod.SMOKE)
    assert rows and all(("tflop_s" in r) or ("error" in r) or ("seconds" in r) or ("ratio" in r) for r in rows)
    torch_rows = [r for r in rows if r["impl"] == "torch.mm (cuBLAS)"]
    assert torch_rows and all("tflop_s" in r and r["rel_err"] < 1e-2 for r in torch_rows), torch_rows
    assert all("error" in r for r in rows if r["impl"] == "cutlass" and r["workload"] != "build")
    in_turn = [r for r in rows if r["config"].startswith("in turn")]
    assert len(in_turn) == 7 and all("error" in r for r in in_turn)  # each pair has a CUTLASS side


# -- the C ABI: emitted signatures, ctypes declarations and Python arguments agree ---------------------------
@pytest.mark.parametrize("cfg", [configs.mm_config("bf16", "row", "row", 64, 64), configs.fp8_block_config("bf16", 64),
                                 configs.fp8_block_config("bf16", 128, "coop_sk2"), configs.fp8_tensor_config("bf16", 64),
                                 configs.grouped_config("bf16", "row")], ids=lambda c: c.name)
def test_c_signatures_match_ctypes_declarations(cfg: configs.GemmConfig) -> None:
    import re

    fn = emit.entry_point(cfg.kind)
    src = emit.emit(cfg)
    params = re.search(rf'extern "C" int {fn}\((.*?)\)', src, re.S).group(1)
    assert len(params.split(",")) == len(build._SIGNATURES[fn])
    workspace = re.search(r'extern "C" size_t ksb_workspace\((.*?)\) \{(.*?)\n\}', src, re.S)
    assert len(workspace.group(1).split(",")) == len(build._WORKSPACE_SIGNATURE)
    if cfg.kind != "grouped_mm":  # sized for the call's swizzle (a stream-K workspace grows with it), not swizzle 1
        assert re.search(r"make_args\([^;]*\bswizzle\b", workspace.group(2)), workspace.group(2)


def test_launch_arguments_match_ctypes_declarations() -> None:
    a, b = torch.randn(16, 32, dtype=BF16), torch.randn(32, 16, dtype=BF16)
    jobs = [gemm.prepare_mm(a, b), gemm.prepare_grouped(a, b[None].expand(2, 32, 16).contiguous(),
                                                        torch.tensor([0, 8, 16], dtype=torch.int32))]
    qa, qb = a.to(FP8), b.t().contiguous().t().to(FP8)
    jobs.append(gemm.prepare_mm_fp8(qa, qb, torch.ones(()), torch.ones(()), "tensor", BF16))
    jobs.append(gemm.prepare_mm_fp8(qa, qb, torch.ones(16, 1), torch.ones(1, 1), "block", BF16))
    for job in jobs:
        # the C call appends (sm_count, device, workspace, stream)
        assert len(job.args()) + 4 == len(build._SIGNATURES[job.fn]), job.fn


def test_scheduler_swizzle_per_kind_and_override(monkeypatch) -> None:
    """fp8 GEMMs (block-scaled: measured faster; per-tensor: the same tile) rasterise with swizzle 8, the others
    with 1; the variable wins."""
    monkeypatch.delenv("KSB_CUTLASS_SWIZZLE", raising=False)
    qa, qb = torch.ones(16, 32, dtype=FP8), torch.ones(16, 32, dtype=FP8).t()
    block = gemm.prepare_mm_fp8(qa, qb, torch.ones(16, 1), torch.ones(1, 1), "block", BF16)
    tensor = gemm.prepare_mm_fp8(qa, qb, torch.ones(()), torch.ones(()), "tensor", BF16)
    mm = gemm.prepare_mm(torch.ones(16, 32, dtype=BF16), torch.ones(32, 16, dtype=BF16))
    assert (block.args()[-1], tensor.args()[-1], mm.args()[-1]) == (8, 8, 1)
    monkeypatch.setenv("KSB_CUTLASS_SWIZZLE", "2")
    assert (block.args()[-1], tensor.args()[-1], mm.args()[-1]) == (2, 2, 2)


@pytest.mark.parametrize("mode", ["block", "tensor"])
@pytest.mark.parametrize(("n", "tile"), [(2112, (64, 128, 128)), (7168, (128, 128, 128))])
def test_fp8_call_picks_its_tile_by_output_columns(mode: str, n: int, tile: tuple[int, int, int]) -> None:
    """A call's configuration sees N, in both scale modes: at 256 rows, 2112 columns make too few 128x128 tiles to
    fill the SMs (64-row tiles), 7168 enough (128-row tiles); ranking and ``switchboard build`` name the same
    configuration."""
    from kernel_switchboard.ops.gemm import mm_fp8_call

    qa, qb = torch.ones(256, 128, dtype=FP8), torch.ones(n, 128, dtype=FP8).t()
    sa, sb = (torch.ones(256, 1), torch.ones(1, -(-n // 128))) if mode == "block" else (torch.tensor(1.0),) * 2
    job = gemm.prepare_mm_fp8(qa, qb, sa, sb, mode, BF16)
    assert job.cfg.tile == tile and job.cfg.cluster == (1, 1, 1)
    assert gemm._fp8_config_of_problem(mm_fp8_call(qa, qb, sa, sb)[0]) == job.cfg


class _FakeLibrary:
    """Stands in for a loaded configuration: records each call of its C entry points."""

    def __init__(self, workspace: int) -> None:
        self.workspace, self.calls, self.workspace_queries = workspace, [], 0

    def ksb_workspace(self, *args: int) -> int:
        self.workspace_queries += 1
        return self.workspace

    def ksb_gemm_block(self, *args: object) -> int:
        self.calls.append(args)
        return 0


@pytest.mark.parametrize("current", [0, 1])
def test_launch_passes_sm_count_device_workspace_and_stream_and_asks_the_workspace_once_per_shape(
        monkeypatch, current: int) -> None:
    """The host work of an eager call (what bounds a small GEMM outside a CUDA graph): the C entry point gets the job's
    arguments, then the SM count, the device index, the workspace and the device's current stream; the workspace
    size is asked of the library once per shape and swizzle; the device is switched only when the operands are not
    on the current one."""
    lib = _FakeLibrary(workspace=256)
    switched = []

    class _Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> None:
            switched.append(self.index)

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(build, "load", lambda cfg: lib)
    monkeypatch.setattr(gemm, "_sm_count", lambda index: 132)
    monkeypatch.setattr(gemm.torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(gemm.torch.cuda, "device", _Device)
    monkeypatch.setattr(gemm.torch._C, "_cuda_getCurrentRawStream", lambda index: 7000 + index, raising=False)
    workspace = torch.empty(256, dtype=torch.uint8)
    monkeypatch.setattr(gemm, "_workspace", lambda nbytes, device: workspace if nbytes == 256 else None)
    gemm._workspace_bytes.cache_clear()

    class _Output:  # the output buffer says where the call runs: the second GPU
        device = torch.device("cuda", 1)

        def data_ptr(self) -> int:
            return 4096

        def stride(self, dim: int) -> int:
            return 32

    qa, qb = torch.ones(16, 256, dtype=FP8), torch.ones(32, 256, dtype=FP8).t()
    job = gemm.prepare_mm_fp8(qa, qb, torch.ones(16, 2), torch.ones(2, 1), "block", BF16)._replace(d=_Output())
    for _ in range(3):
        gemm.launch(job)
    assert len(lib.calls) == 3 and lib.workspace_queries == 1
    assert lib.calls[0] == (*job.args(), 132, 1, workspace.data_ptr(), 7001)
    assert switched == ([] if current == 1 else [1, 1, 1])


def test_dense_attention_refused_by_torch_raises_a_clear_error() -> None:
    """torch has no memory-efficient attention on a CPU: the wrapper names the kernel, shapes and a way out."""
    from torch.nn.attention import SDPBackend

    from kernel_switchboard.ops.attention import DenseParams
    from kernel_switchboard_cutlass.attention import sdpa_dense

    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(KernelUnavailableError, match=r"sdpa_efficient: .*q \(1, 2, 4, 16\).*backend='reference'"):
        sdpa_dense(q, q, q, None, DenseParams(0.25, False), backends=[SDPBackend.EFFICIENT_ATTENTION])


def test_dense_attention_wrapper_on_random_shapes_and_broadcast_biases() -> None:
    from kernel_switchboard.ops.attention import DenseParams
    from kernel_switchboard.testing.cases.attention_dense import dense_random_cases
    from kernel_switchboard_cutlass.attention import sdpa_dense

    for q, k, v, bias, causal in dense_random_cases(40, 1, (torch.float32,), 16):
        got = sdpa_dense(q, k, v, bias, DenseParams(0.25, causal), backends=None)
        want = ksb.attention.dense(q, k, v, bias, causal=causal, sm_scale=0.25, backend="reference")
        assert_close(got, want, atol=1e-4, rtol=1e-4, what=f"q {tuple(q.shape)} k {tuple(k.shape)} causal {causal} "
                                                           f"bias {None if bias is None else tuple(bias.shape)}")


#: ``cutlass:sdpa_efficient`` on the H200, ``switchboard bench --preset dense``, ms
DENSE_H200_MS = {"encoder 8x1024 mask": 0.500, "encoder 8x1024 bias": 0.479, "1x4096 causal + bias": 2.200,
                 "cross-attention 77x1024": 0.077}


def test_dense_cost_stays_within_a_third_of_the_h200_times() -> None:
    from kernel_switchboard.testing.cases.attention_dense import cost_ratios
    from kernel_switchboard_cutlass.attention import dense_cost

    ratios = cost_ratios(dense_cost, DENSE_H200_MS)
    assert all(0.75 <= r <= 1.33 for r in ratios.values()), ratios
