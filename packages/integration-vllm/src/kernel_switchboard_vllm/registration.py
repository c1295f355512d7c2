"""Registration with vLLM: the attention backends in ``AttentionBackendEnum`` and, on request, the custom ops.

vLLM may load a general plugin several times in one process (and once in each process it starts), so every
step here is idempotent.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from . import BACKEND_NAME, BACKEND_PATH, MLA_BACKEND_NAME, MLA_BACKEND_PATH

logger = logging.getLogger(__name__)

#: environment variable naming the vLLM layers to run on the switchboard: a comma-separated subset of
#: :data:`CUSTOM_OPS`, or ``all``; unset or empty: none (the attention backend alone, chosen by name)
CUSTOM_OPS_ENV = "KSB_VLLM_CUSTOM_OPS"
#: the custom ops this adapter can replace, by the name of the vLLM layer class each one replaces
CUSTOM_OPS = {"rms_norm": "RMSNorm", "silu_and_mul": "SiluAndMul", "rope": "RotaryEmbedding"}


def register_backends() -> None:
    """Register ``KSB`` and ``KSB_MLA``, and point the ``CUSTOM`` slot at ``KSB`` unless another plugin holds it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name, path in ((BACKEND_NAME, BACKEND_PATH), (MLA_BACKEND_NAME, MLA_BACKEND_PATH)):
        if name not in AttentionBackendEnum.__members__:
            register_backend(name, path)
    custom = AttentionBackendEnum.CUSTOM
    if not custom.is_overridden():
        register_backend(custom, BACKEND_PATH)
    elif custom.get_path() != BACKEND_PATH:
        logger.info("vLLM's CUSTOM attention backend is %s; the switchboard stays selectable as %s",
                    custom.get_path(), BACKEND_NAME)


def requested_custom_ops(value: str | None = None) -> list[str]:
    """The custom ops named by ``value`` (default: the ``KSB_VLLM_CUSTOM_OPS`` environment variable)."""
    value = os.environ.get(CUSTOM_OPS_ENV, "") if value is None else value
    names = [n.strip() for n in value.split(",") if n.strip()]
    if names == ["all"]:
        return list(CUSTOM_OPS)
    unknown = [n for n in names if n not in CUSTOM_OPS]
    if unknown:
        from kernel_switchboard.errors import fail

        raise fail(CUSTOM_OPS_ENV, value, f"a comma-separated subset of {sorted(CUSTOM_OPS)}, or 'all'")
    return names


def register_custom_ops(value: str | None = None) -> list[str]:
    """Register the requested custom ops with vLLM's out-of-tree mechanism; returns the names now registered."""
    names = requested_custom_ops(value)
    if not names:
        return []
    from vllm.model_executor.custom_op import op_registry_oot

    from . import custom_ops

    classes: dict[str, Any] = {"rms_norm": custom_ops.SwitchboardRMSNorm, "silu_and_mul": custom_ops.SwitchboardSiluAndMul,
               "rope": custom_ops.SwitchboardRotaryEmbedding}
    done = []
    for name in names:
        layer = CUSTOM_OPS[name]
        if op_registry_oot.get(layer) is not classes[name]:
            if layer in op_registry_oot:
                logger.info("vLLM's %s is already replaced by %s; the switchboard's is not registered",
                            layer, op_registry_oot[layer].__name__)
                continue
            classes[name].register_as_oot()
        done.append(name)
    return done
