"""``switchboard doctor``: what is installed, what can run here, and for what cannot, the real cause and its fix.

Each backend gets a state: ``usable``; ``unusable`` (the machine lacks something: a CUDA build of torch, a GPU,
a vendor library); ``broken`` (its package is installed but fails to load, or its version differs from the
core's); ``disabled`` (by ``KSB_BACKENDS`` / ``KSB_DISABLE_BACKENDS``). When torch cannot use CUDA at all, that is
the cause named for every backend with no CPU kernel, whatever the backend's own first complaint: installing a
vendor library would not help. ``--strict`` and ``--require`` turn the report into a check (exit 1).

The JSON report (``--json``) is the environment a bug report needs: versions, GPUs, driver, every backend and
kernel with its reason, and the ``KSB_*`` settings.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

import torch

from . import __version__
from .availability import cuda_problem
from .device import fingerprint, package_version, pairs_without_peer_access
from .hookspecs import ENTRY_POINT_GROUP
from .registry import Backend, registry

#: libraries whose versions a bug report needs, beside every installed kernel-switchboard package
REPORTED_DISTRIBUTIONS = ("torch", "triton", "pluggy", "numpy", "transformers", "nvidia-cudnn-frontend", "flash-attn-4",
                          "flash-attn", "flash_attn_3", "nvidia-cutlass", "nvidia-cutlass-dsl", "flashinfer-python",
                          "tensorrt-llm", "vllm", "sglang")
#: environment variables that change what the switchboard does
REPORTED_VARIABLES = ("KSB_BACKENDS", "KSB_DISABLE_BACKENDS", "KSB_PREFER", "KSB_TUNE_CACHE", "TRITON_INTERPRET",
                      "CUDA_VISIBLE_DEVICES", "CUDA_HOME")


def installed_backends() -> dict[str, str]:
    """Backend entry-point name -> the distribution that installs it (``cudnn`` -> ``kernel-switchboard-cudnn``)."""
    out = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        out[ep.name] = dist.metadata["Name"] if dist is not None else ep.name
    return out


def _broken(backend: Backend) -> bool:
    reason = backend.unavailable or ""
    return reason.startswith(("import of ", f"plugin {backend.source} failed"))


def _gpu_only(backend: Backend) -> bool:
    """True when no kernel of the backend declares the CPU (so without CUDA nothing of it can run)."""
    return not any(k.capability.devices is None or "cpu" in k.capability.devices for k in backend.kernels)


def diagnose(backend: Backend, distribution: str | None, cuda: tuple[str, str] | None) -> dict[str, Any]:
    """State, cause and fix of one backend."""
    if distribution is not None and distribution.startswith("kernel-switchboard") and backend.version \
            and backend.version != __version__ and not _broken(backend):
        return {"state": "broken",
                "cause": f"{distribution} {backend.version} beside kernel-switchboard {__version__}: the packages are "
                         "released together and must have one version",
                "fix": f'pip install "{distribution}=={__version__}"'}
    if backend.available:
        return {"state": "usable", "cause": None, "fix": None}
    reason = backend.unavailable or ""
    if reason.startswith("disabled by "):
        return {"state": "disabled", "cause": reason, "fix": "unset KSB_BACKENDS / KSB_DISABLE_BACKENDS or name it there"}
    if _broken(backend):
        target = distribution or backend.name
        return {"state": "broken", "cause": reason,
                "fix": f'reinstall it beside this core: pip install --force-reinstall --no-deps "{target}=={__version__}"'}
    if cuda is not None and _gpu_only(backend):
        return {"state": "unusable", "cause": cuda[0], "fix": cuda[1]}
    return {"state": "unusable", "cause": reason, "fix": backend.install}


def report() -> dict[str, Any]:
    """Everything ``doctor`` knows, as plain data (the ``--json`` output)."""
    cuda = cuda_problem()
    count = torch.cuda.device_count() if cuda is None else 0
    dists = installed_backends()
    backends: dict[str, Any] = {}
    for name, b in registry.all_backends().items():
        dist = dists.get(b.source)
        backends[name] = {
            "version": b.version,
            "distribution": dist,
            "available": b.available,
            "reason": b.unavailable,
            "install": b.install,
            **diagnose(b, dist, cuda),
            "providers": b.providers,
            "kernels": [
                {"id": k.id, "op": k.op, "available": k.unavailable is None, "reason": k.unavailable, "install": k.install}
                for k in b.kernels
            ],
        }
    packages = {d: package_version(d) for d in sorted({*dists.values(), "kernel-switchboard", *REPORTED_DISTRIBUTIONS})}
    return {
        "environment": fingerprint(),
        "platform": platform.platform(),
        "python_executable": sys.executable,
        "packages": {d: v for d, v in packages.items() if v is not None},
        "variables": {v: os.environ[v] for v in REPORTED_VARIABLES if v in os.environ},
        "cuda": {"usable": cuda is None, "cause": cuda[0] if cuda else None, "fix": cuda[1] if cuda else None},
        "gpus": {"count": count, "peer_access_missing": pairs_without_peer_access(count)},
        "backends": backends,
    }


def requested(rep: dict[str, Any], strict: bool, require: list[str]) -> list[str]:
    """The backends a check covers: every installed backend package with ``strict``, plus the ``require`` names."""
    names = [n for n, b in rep["backends"].items() if strict and b["distribution"] is not None]
    return list(dict.fromkeys([*names, *require]))


def failures(rep: dict[str, Any], names: list[str]) -> list[tuple[str, str, str | None]]:
    """(backend, cause, fix) for each requested backend that is missing or not usable."""
    out: list[tuple[str, str, str | None]] = []
    for name in names:
        b = rep["backends"].get(name)
        if b is None:
            fix = f'pip install "kernel-switchboard[{name}]"' if name in ("triton", "cudnn", "fa", "cutlass", "trtllm") else None
            out.append((name, f"no backend named {name!r} is installed", fix))
        elif b["state"] != "usable":
            out.append((name, f"{b['state']}: {b['cause']}", b["fix"]))
    return out


def render(rep: dict[str, Any], verbose: bool) -> str:
    """The human report."""
    lines = ["environment"]
    lines += [f"  {key:<20} {value}" for key, value in rep["environment"].items()]
    cuda = rep["cuda"]
    if not cuda["usable"]:
        lines += ["cuda", f"  unusable: {cuda['cause']}", f"  fix:      {cuda['fix']}"]
    gpus = rep["gpus"]
    if gpus["count"] > 1:
        missing = gpus["peer_access_missing"]
        peers = f"no peer access {', '.join(missing)}" if missing else "peer access between every pair"
        lines.append(f"  {'gpus':<20} {gpus['count']} ({peers})")
    lines.append("backends")
    for name, b in rep["backends"].items():
        lines.append(f"  {name:<10} {b['version']:<8} {b['state']}: {len(b['kernels'])} kernels")
        shared = b["cause"] is not None and b["cause"] == cuda["cause"]
        if b["cause"]:
            lines.append(f"      cause:   {b['cause']}" + (" (fix under cuda above)" if shared else ""))
        if b["fix"] and not shared:
            lines.append(f"      fix:     {b['fix']}")
        if verbose and b["reason"] and b["reason"] != b["cause"]:
            lines.append(f"      then:    {b['reason']}")
        for prov, ver in b["providers"].items():
            lines.append(f"      provider {prov}: {ver or 'not installed'}")
        if verbose:
            for k in b["kernels"]:
                mark = "ok " if k["available"] else "-- "
                lines.append(f"      {mark}{k['id']:<45} {k['op']}{'' if k['available'] else '  (' + str(k['reason']) + ')'}")
    return "\n".join(lines)
