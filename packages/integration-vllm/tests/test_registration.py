"""The plugin as vLLM loads it: the ``vllm.general_plugins`` entry point, the backends in ``AttentionBackendEnum``
(by name and in the CUSTOM slot), idempotence, and selection by name through vLLM's own attention config."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm", reason="the vLLM adapter's tests run against the real vLLM (nox -s tests-vllm)")

from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

import kernel_switchboard_vllm  # noqa: E402
from kernel_switchboard_vllm.attention import SwitchboardAttentionBackend  # noqa: E402
from kernel_switchboard_vllm.mla import SwitchboardMLABackend  # noqa: E402


def test_entry_point_is_what_vllm_loads() -> None:
    points = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
    assert points["kernel_switchboard"].value == "kernel_switchboard_vllm:register"
    assert points["kernel_switchboard"].load() is kernel_switchboard_vllm.register


def test_backends_are_registered_by_name_and_in_the_custom_slot() -> None:
    kernel_switchboard_vllm.register()
    kernel_switchboard_vllm.register()  # vLLM loads plugins in every process it starts: idempotent
    assert AttentionBackendEnum["KSB"].get_class() is SwitchboardAttentionBackend
    assert AttentionBackendEnum["KSB_MLA"].get_class() is SwitchboardMLABackend
    assert AttentionBackendEnum.CUSTOM.get_class() is SwitchboardAttentionBackend


def test_custom_slot_held_by_another_plugin_is_left_alone() -> None:
    from vllm.v1.attention.backends.registry import register_backend

    other = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
    register_backend(AttentionBackendEnum.CUSTOM, other)
    try:
        kernel_switchboard_vllm.register()
        assert AttentionBackendEnum.CUSTOM.get_path() == other
        assert AttentionBackendEnum["KSB"].get_class() is SwitchboardAttentionBackend
    finally:
        register_backend(AttentionBackendEnum.CUSTOM, kernel_switchboard_vllm.BACKEND_PATH)


def test_vllm_attention_config_accepts_the_names() -> None:
    from vllm.config import AttentionConfig

    assert AttentionConfig(backend="KSB").backend is AttentionBackendEnum["KSB"]
    assert AttentionConfig(backend="KSB_MLA").backend is AttentionBackendEnum["KSB_MLA"]
