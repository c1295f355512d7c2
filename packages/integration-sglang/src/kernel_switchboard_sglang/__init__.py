"""Kernel Switchboard inside SGLang: the ``ksb`` attention backend, whose per-step metadata is a ``ksb.PageTable``
and one switchboard plan per distinct layer configuration, and whose forward writes K/V by slot
(``ksb.kv_cache.append_slots``) and runs the plans.

SGLang calls :func:`register` through the ``sglang.srt.plugins`` entry point in each process it starts; it adds
``ksb`` to the ``--attention-backend`` choices and to SGLang's attention-backend registry, so
``sglang.launch_server --attention-backend ksb`` (or ``Engine(attention_backend="ksb")``) selects the switchboard.
Importing this package does not import SGLang.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: the ``--attention-backend`` name
BACKEND_NAME = "ksb"


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: register the ``ksb`` attention backend (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)


def create_backend(model_runner: object) -> object:
    """SGLang's factory signature: the backend for ``model_runner`` (MHA / GQA models)."""
    from .backend import SwitchboardAttnBackend

    if getattr(model_runner, "use_mla_backend", False):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend serves MHA/GQA models; this model uses MLA")
    return SwitchboardAttnBackend(model_runner)


__all__ = ["BACKEND_NAME", "__version__", "create_backend", "register"]
