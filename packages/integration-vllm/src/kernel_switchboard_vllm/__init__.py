"""Kernel Switchboard inside vLLM: an attention backend whose metadata builder plans the switchboard's attention
once per step, and whose implementation writes K/V by slot mapping and runs the plans; an MLA backend whose
decode runs on the switchboard; RMSNorm, SiluAndMul and RoPE as out-of-tree custom ops.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every process it starts. It
registers the backends as ``KSB`` and ``KSB_MLA`` (and in the ``CUSTOM`` slot when that is free) and the requested
custom ops, so ``--attention-backend KSB`` or ``LLM(..., attention_config={"backend": "CUSTOM"})`` selects the
switchboard (``LLM`` reads a backend name before vLLM loads plugins: call :func:`register` first to pass ``"KSB"``).
Importing this package does not import vLLM.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: the names the backends are registered under in vLLM's ``AttentionBackendEnum``
BACKEND_NAME = "KSB"
MLA_BACKEND_NAME = "KSB_MLA"
BACKEND_PATH = "kernel_switchboard_vllm.attention.SwitchboardAttentionBackend"
MLA_BACKEND_PATH = "kernel_switchboard_vllm.mla.SwitchboardMLABackend"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the attention backends and the custom ops (idempotent)."""
    from .registration import register_backends, register_custom_ops

    register_backends()
    register_custom_ops()


__all__ = ["BACKEND_NAME", "BACKEND_PATH", "MLA_BACKEND_NAME", "MLA_BACKEND_PATH", "__version__", "register"]
