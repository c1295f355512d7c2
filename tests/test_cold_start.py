"""Cold start: what a fresh process imports, lazy kernel entry points, metadata-only availability.

The import check runs in a fresh interpreter with every backend installed that this environment has (CI's
``cold-start`` session installs all five): ``import kernel_switchboard`` and a reference op must import no vendor
library (Triton, cuDNN's frontend, FlashAttention / the CuTe DSL, CUTLASS, FlashInfer, TensorRT-LLM) and no
``torch._dynamo``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from kernel_switchboard import Backend, Capability, Kernel, KernelUnavailableError, artefacts, hookimpl
from kernel_switchboard.availability import import_vendor, missing_module, module_installed
from kernel_switchboard.lazy import Launcher, resolve
from kernel_switchboard.registry import registry

#: top-level modules of the vendor libraries the backends wrap
VENDOR_MODULES = ("triton", "cudnn", "flash_attn", "flash_attn_interface", "cutlass", "cutlass_cppgen",
                  "cutlass_library", "flashinfer", "tensorrt_llm", "cuda")
BACKEND_DISTRIBUTIONS = ("kernel-switchboard-triton", "kernel-switchboard-cudnn", "kernel-switchboard-fa",
                         "kernel-switchboard-cutlass", "kernel-switchboard-trtllm")

_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import torch
    import kernel_switchboard as ksb

    after_import = sorted(sys.modules)
    x = torch.randn(8, 64)
    w = torch.rand(64) + 0.5
    sel = ksb.explain("norm.rms_norm", x, w)
    y = ksb.norm.rms_norm(x, w)
    out = ksb.activation.silu_and_mul(torch.randn(4, 32))
    backends = {name: b.available for name, b in ksb.registry.all_backends().items()}
    print(json.dumps({"chosen": sel.kernel.id, "backends": backends, "after_import": after_import,
                      "after_ops": sorted(sys.modules)}))
""")


def _fresh_process() -> dict[str, object]:
    env_script = [sys.executable, "-c", _FRESH_PROCESS]
    done = subprocess.run(env_script, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "KSB_TUNE_CACHE": "off"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fresh() -> dict[str, object]:
    return _fresh_process()


def _installed_backends() -> list[str]:
    out = []
    for dist in BACKEND_DISTRIBUTIONS:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        out.append(dist)
    return out


def _loaded(modules: object, top: str) -> list[str]:
    assert isinstance(modules, list)
    return [m for m in modules if m == top or m.startswith(top + ".")]


def test_every_installed_backend_was_discovered(fresh: dict[str, object]) -> None:
    """The check below means something only if the backends were really discovered in that process."""
    backends = fresh["backends"]
    assert isinstance(backends, dict)
    expected = {dist.rsplit("-", 1)[1] for dist in _installed_backends()}
    assert expected <= set(backends), (expected, backends)
    assert fresh["chosen"] == "reference:rms_norm"


@pytest.mark.parametrize("top", VENDOR_MODULES)
def test_import_and_a_reference_op_import_no_vendor_library(fresh: dict[str, object], top: str) -> None:
    assert _loaded(fresh["after_ops"], top) == []


def test_import_and_a_reference_op_import_no_dynamo(fresh: dict[str, object]) -> None:
    assert _loaded(fresh["after_ops"], "torch._dynamo") == []
    assert _loaded(fresh["after_ops"], "torch._inductor") == []


def test_import_and_a_reference_op_load_no_benchmarking(fresh: dict[str, object]) -> None:
    """The mechanism does not depend on its measurement: neither the bench subpackage nor matplotlib is loaded."""
    assert _loaded(fresh["after_ops"], "kernel_switchboard.bench") == []
    assert _loaded(fresh["after_ops"], "matplotlib") == []


def test_import_alone_loads_no_backend(fresh: dict[str, object]) -> None:
    """Backends are discovered at the first dispatch, never at ``import kernel_switchboard``."""
    assert [m for m in fresh["after_import"] if m.startswith("kernel_switchboard_")] == []  # type: ignore[union-attr]


# -- metadata-only availability --------------------------------------------------------------------------------
def test_module_installed_finds_submodules_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "ksb_probe_pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "inner" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_installed("ksb_probe_pkg") and module_installed("ksb_probe_pkg.inner")
    assert not module_installed("ksb_probe_pkg.missing") and not module_installed("ksb_probe_absent.inner")
    assert "ksb_probe_pkg" not in sys.modules and "ksb_probe_pkg.inner" not in sys.modules
    assert missing_module("ksb_probe_pkg.inner") is None
    with pytest.raises(KernelUnavailableError, match=r"import of 'ksb_probe_pkg' failed: RuntimeError: imported.*"
                                                     r"install: pip install probe"):
        import_vendor("ksb_probe_pkg", "pip install probe")


def test_a_module_blocked_in_sys_modules_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ksb_probe_blocked", None)  # how a test or a user blocks an import
    assert not module_installed("ksb_probe_blocked") and not module_installed("ksb_probe_blocked.inner")
    assert missing_module("ksb_probe_blocked") == "python module 'ksb_probe_blocked' is not installed"


# -- lazy entry points -----------------------------------------------------------------------------------------
def test_launcher_imports_on_first_call_and_binds_the_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ksb_lazy_kernels.py").write_text("CALLS = []\ndef double(x):\n    CALLS.append(x)\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    launcher = Launcher("ksb_lazy_kernels:double", install="pip install lazy")
    kernel = Kernel("test.lazy", "double", "lazytest", Capability(devices=frozenset({"cpu"})), launcher)

    class Plugin:
        @hookimpl
        def ksb_backend(self) -> Backend:
            return Backend("lazytest", "1", [kernel])

    plugin = Plugin()
    registry.register(plugin)
    try:
        (registered,) = registry.kernels("test.lazy")
        assert "ksb_lazy_kernels" not in sys.modules and not launcher.loaded
        assert registered.run(21) == 42
        assert launcher.loaded and "ksb_lazy_kernels" in sys.modules
        import ksb_lazy_kernels  # type: ignore[import-not-found]

        assert registered.run is ksb_lazy_kernels.double  # later calls skip the launcher
        assert resolve(launcher) is ksb_lazy_kernels.double and resolve(len) is len
    finally:
        registry.unregister(plugin)
        sys.modules.pop("ksb_lazy_kernels", None)


def test_launcher_that_cannot_load_names_the_target_and_the_install() -> None:
    with pytest.raises(KernelUnavailableError, match=r"ksb_absent_module:run could not be loaded: ModuleNotFoundError"
                                                     r".*install: pip install absent"):
        Launcher("ksb_absent_module:run", install="pip install absent")()
    with pytest.raises(KernelUnavailableError, match=r"json:nothing could not be loaded: AttributeError"):
        Launcher("json:nothing")()
    with pytest.raises(ValueError, match=r"expected 'package\.module:attribute'"):
        Launcher("json.dumps")


# -- the compiled-artefact directory and its key ---------------------------------------------------------------
ENV = {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "580.95.05",
       "cuda": "13.0", "python": "3.12", "machine": "x86_64", "torch": "2.11.0+cu130",
       "packages": {"kernel-switchboard": "0.1.0", "triton": "3.6.0", "flash-attn-4": "4.0.0b36"}}


@pytest.mark.parametrize("change", [{"gpu": "NVIDIA H200"}, {"compute_capability": "10.0"}, {"driver": "590.1"},
                                    {"cuda": "12.8"}, {"python": "3.11"}, {"torch": "2.12.0+cu130"},
                                    {"packages": {**ENV["packages"], "triton": "3.7.1"}},  # type: ignore[dict-item]
                                    {"packages": {**ENV["packages"], "kernel-switchboard": "0.2.0"}}])  # type: ignore[dict-item]
def test_a_cache_made_for_another_environment_is_ignored(tmp_path: Path, change: dict[str, object]) -> None:
    built_for = artefacts.directory(ENV, tmp_path)
    assert built_for is not None and artefacts.matches(built_for, ENV)
    (built_for / "triton").mkdir()
    other = {**ENV, **change}
    assert artefacts.key(other) != artefacts.key(ENV)
    here = artefacts.directory(other, tmp_path)
    assert here is not None and here != built_for and not (here / "triton").exists()
    assert not artefacts.matches(built_for, other)


def test_a_directory_whose_environment_file_disagrees_is_never_used(tmp_path: Path) -> None:
    """A directory copied under the right name from elsewhere (or edited) is ignored, not trusted by its name."""
    path = artefacts.directory(ENV, tmp_path)
    assert path is not None
    (path / artefacts.ENVIRONMENT_FILE).write_text(json.dumps({**ENV, "driver": "535.1"}))
    assert artefacts.directory(ENV, tmp_path) is None
    (path / artefacts.ENVIRONMENT_FILE).write_text("not json")
    assert artefacts.directory(ENV, tmp_path) is None and artefacts.directory(ENV, tmp_path, create=False) is None


def test_key_is_stable_and_names_the_gpu() -> None:
    assert artefacts.key(ENV) == artefacts.key(json.loads(json.dumps(ENV)))
    assert artefacts.key(ENV).startswith("nvidia-h100-80gb-hbm3-")


def test_no_gpu_or_caching_off_means_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_CACHE_DIR", "off")
    assert artefacts.root() is None and artefacts.directory(ENV) is None
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    assert artefacts.root() == tmp_path
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: None)  # a CPU: nothing compiles
    assert artefacts.directory() is None and artefacts.prepare_triton() is None


def test_prepare_points_triton_and_fa4_at_the_directory_unless_the_user_chose(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: ENV)
    for name in ("TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    expected = tmp_path / "compiled" / artefacts.key(ENV)
    assert artefacts.prepare_triton() == expected / "triton"
    assert Path(os.environ["TRITON_CACHE_DIR"]) == expected / "triton" and (expected / "triton").is_dir()
    assert artefacts.prepare_flash_attn_cute() == expected / "flash_attn_cute"
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert artefacts.prepare_triton() == tmp_path / "mine"  # the user's choice wins
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_records_round_trip_in_this_environment_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: ENV)
    assert artefacts.recorded("flashinfer-xqa/bf16") is None
    artefacts.record("flashinfer-xqa/bf16", {"path": "/x.so"})
    assert artefacts.recorded("flashinfer-xqa/bf16") == {"path": "/x.so"}
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: {**ENV, "gpu": "NVIDIA H200"})
    assert artefacts.recorded("flashinfer-xqa/bf16") is None
