"""Registration of the FlashAttention backend: FA4, FA3, FA2 and torch's SDPA flash backend.

Each provider is probed when the hook runs (first dispatch), never at import. A provider that is
missing, outside its version window or without a suitable GPU keeps its kernels listed,
unavailable, with the reason and its install command; kernel names carry the provider and its
version (``fa4@4.0.0b36:decode``). The backend is unavailable only when no provider can run.
"""

from __future__ import annotations

from kernel_switchboard import Backend, Kernel, hookimpl

from . import __version__, fa4, fa23, torch_flash
from .providers import FA2, FA3, FA4, PROVIDERS, TORCH_FLASH, Provider, unavailable, version

INSTALL = 'pip install "kernel-switchboard[fa]"'


def probe() -> dict[str, tuple[str | None, str | None]]:
    """provider key -> (installed version or None, reason it cannot run or None)."""
    out = {}
    for provider in PROVIDERS:
        try:
            reason = unavailable(provider)
        except Exception as exc:  # a broken install must not break discovery
            reason = f"probing {provider.module} failed: {type(exc).__name__}: {str(exc)[:200]}"
        out[provider.key] = (version(provider), reason)
    return out


def kernels(found: dict[str, tuple[str | None, str | None]]) -> list[Kernel]:
    out = fa4.kernels(*found[FA4.key])
    for provider in (FA3, FA2):
        out.extend(fa23.kernels(provider, *found[provider.key]))
    out.extend(torch_flash.kernels(*found[TORCH_FLASH.key]))
    return out


def _reason(found: dict[str, tuple[str | None, str | None]]) -> str | None:
    if any(reason is None for _, reason in found.values()):
        return None
    parts = [f"{p.key}: {found[p.key][1]}" for p in PROVIDERS]
    return "no FlashAttention provider can run here (" + "; ".join(parts) + ")"


@hookimpl
def ksb_backend() -> Backend:
    found = probe()
    providers: dict[str, str | None] = {_label(p): found[p.key][0] for p in PROVIDERS}
    return Backend("fa", __version__, kernels(found), unavailable=_reason(found), install=INSTALL, providers=providers)


def _label(p: Provider) -> str:
    return f"{p.key} ({p.distribution})"
