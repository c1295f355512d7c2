"""Check that the packages' vendor pins coexist with the inference engines' pins, and that each extra pulls only
what its backend imports. Run by ``nox -s pins`` (which builds the wheels first); needs network to PyPI.

    python tools/check_pins.py --find-links DIR_WITH_OUR_WHEELS

Each check is one ``pip install --dry-run --ignore-installed`` (the resolver alone: nothing is installed) for
Linux x86_64 and CPython 3.12, the platform the engines' CUDA wheels exist for, so it resolves the same on any
machine. ``--use-feature=fast-deps`` reads each wheel's metadata through HTTP range requests instead of
downloading multi-GB CUDA wheels. The checks run in parallel; the slowest takes about a minute.

Engine pins below are copied from the engines' published metadata (``Requires-Dist``), limited to the packages
our extras share with them; update them when a new engine release moves one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: engine release -> its pins on what kernel-switchboard[all] also installs
ENGINE_PINS: dict[str, list[str]] = {
    "vllm==0.33.0": ["torch==2.14.0", "flashinfer-python==0.7.2.post1", "nvidia-cudnn-frontend>=1.31.0",
                     "nvidia-cutlass-dsl[cu13]==4.8.0", "apache-tvm-ffi==0.1.11", "quack-kernels==0.6.5"],
    "vllm==0.32.0": ["torch==2.13.0", "flashinfer-python==0.7.0.post1", "nvidia-cudnn-frontend>=1.19.1",
                     "nvidia-cutlass-dsl[cu13]==4.8.0", "apache-tvm-ffi==0.1.11", "quack-kernels==0.6.5"],
    "sglang==0.5.23": ["torch==2.14.1", "flashinfer-python[cu13]==0.7.2", "flash-attn-4>=4.0.0b18",
                       "nvidia-cutlass-dsl[cu13]==4.8.0", "apache-tvm-ffi==0.1.11", "quack-kernels==0.6.5"],
}
#: extra -> distributions it must not add beyond what torch installs (its backend never imports them). [cudnn] adds the
#: CuTe DSL libraries for CUDA 12 and 13: nvidia-cudnn-frontend requires them from 1.29 on, and FlashInfer 0.7 and
#: vLLM 0.33 require frontend >= 1.31, so a window that coexists with the engines cannot avoid them.
FORBIDDEN: dict[str, set[str]] = {
    "cutlass": {"nvidia-cutlass", "cuda-python", "scipy", "networkx", "pydot", "treelib"},
    "triton": {"nvidia-cutlass-dsl", "flashinfer-python", "nvidia-cudnn-frontend"},
    "fa": {"flashinfer-python", "nvidia-cutlass"},
    "cudnn": {"flashinfer-python", "nvidia-cutlass", "flash-attn-4"},
    "trtllm": {"nvidia-cutlass", "flash-attn-4"},
}
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 35))]


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def resolve(requirements: list[str], find_links: str) -> tuple[dict[str, str] | None, str, float]:
    """(name -> version of everything pip would install, or None; pip's error output; seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--target", str(Path(tmp) / "target"), "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *(a for p in PLATFORMS for a in ("--platform", p)),
               "--use-feature=fast-deps", "--find-links", find_links, "--report", str(report), *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not report.is_file():
            errors = [line for line in proc.stderr.splitlines() if "fast-deps" not in line]
            return None, "\n".join(errors[-15:]), seconds
        installs = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}, "", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--find-links", required=True, help="folder holding the kernel-switchboard wheels")
    args = parser.parse_args(argv)
    checks: dict[str, list[str]] = {f"[all] + {engine}": ["kernel-switchboard[all]", *pins]
                                    for engine, pins in ENGINE_PINS.items()}
    checks["torch alone"] = ["torch"]
    checks.update({f"[{extra}]": [f"kernel-switchboard[{extra}]"] for extra in FORBIDDEN})
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        results = dict(zip(checks, pool.map(lambda reqs: resolve(reqs, args.find_links), checks.values())))
    failures = 0
    base = results["torch alone"][0] or {}
    for name, (resolved, error, seconds) in results.items():
        if resolved is None:
            failures += 1
            print(f"FAIL {name} ({seconds:.0f} s): pip cannot resolve {' '.join(checks[name])}\n{error}")
            continue
        added = sorted(set(resolved) - set(base))
        line = f"ok   {name} ({seconds:.0f} s): torch {resolved.get('torch')}"
        for dist in ("flashinfer-python", "nvidia-cudnn-frontend", "flash-attn-4", "nvidia-cutlass-dsl", "triton"):
            if dist in resolved:
                line += f", {dist} {resolved[dist]}"
        extra = name[1:-1] if name[1:-1] in FORBIDDEN else None
        if extra is not None:
            pulled = FORBIDDEN[extra] & set(added)  # what torch itself needs (networkx, ...) is not the extra's
            if pulled:
                failures += 1
                line = f"FAIL {name}: pulls {sorted(pulled)}, which its backend never imports"
            else:
                line += f"; beyond torch it adds {len(added)}: {', '.join(added)}"
        print(line)
    print(f"pins: {len(results) - failures} of {len(results)} resolutions as required")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
