"""vLLM layers on the switchboard: RMSNorm (with the fused residual add), SiluAndMul and the plain rotary embedding,
registered through vLLM's out-of-tree custom-op mechanism (``CustomOp.register_oot``).

Each class subclasses vLLM's layer, so weights load and modules build as before; every forward path (native,
CUDA, CPU) runs the switchboard op. A layer configured in a way the switchboard op does not cover (an RMSNorm
over a part of the hidden size) keeps vLLM's own forward, and says so once in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

import kernel_switchboard as ksb

logger = logging.getLogger(__name__)


class SwitchboardRMSNorm(RMSNorm):
    """vLLM's ``RMSNorm`` through ``ksb.norm.rms_norm`` / ``ksb.norm.fused_add_rms_norm``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vllm_forward = self.variance_size_override is not None
        if self._vllm_forward:
            logger.info("RMSNorm over %s of %s hidden units: vLLM's own kernel (the switchboard normalises the whole "
                        "row)", self.variance_size_override, self.hidden_size)

    @classmethod
    def register_as_oot(cls) -> None:
        RMSNorm.register_oot(cls)

    def _ksb(self, x: torch.Tensor, residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self._vllm_forward:
            return super().forward_native(x, residual)
        weight = self.weight.data
        if residual is None:
            return ksb.norm.rms_norm(x, weight, self.variance_epsilon)
        x, residual = x.contiguous(), residual.contiguous()
        ksb.norm.fused_add_rms_norm(x, residual, weight, self.variance_epsilon)
        return x, residual

    forward_native = forward_cuda = forward_cpu = forward_hip = forward_xpu = forward_oot = _ksb


class SwitchboardSiluAndMul(SiluAndMul):
    """vLLM's ``SiluAndMul`` through ``ksb.activation.silu_and_mul``."""

    @classmethod
    def register_as_oot(cls) -> None:
        SiluAndMul.register_oot(cls)

    def _ksb(self, x: torch.Tensor) -> torch.Tensor:
        return ksb.activation.silu_and_mul(x)

    forward_native = forward_cuda = forward_cpu = forward_hip = forward_xpu = forward_oot = _ksb  # type: ignore[assignment]


class SwitchboardRotaryEmbedding(RotaryEmbedding):
    """vLLM's plain ``RotaryEmbedding`` (no scaling: scaled variants are other classes and stay vLLM's) through
    ``ksb.rope.apply_cos_sin_cache`` on the layer's own ``cos_sin_cache``, in place as vLLM's kernel is."""

    @classmethod
    def register_as_oot(cls) -> None:
        RotaryEmbedding.register_oot(cls)

    def _table(self, device: torch.device) -> torch.Tensor:
        """The layer's cos/sin table in float32 on ``device`` (converted once; the switchboard computes in float32)."""
        table = getattr(self, "_ksb_table", None)
        if table is None or table.device != device:
            table = self.cos_sin_cache.to(device, torch.float32).contiguous()
            self._ksb_table = table
        return table

    def _ksb(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = positions.flatten()
        tokens = positions.shape[0]
        q = query.view(tokens, -1, self.head_size)
        k = key.view(tokens, -1, self.head_size) if key is not None else q[:, :1].clone()  # no key: rotate a copy
        ksb.rope.apply_cos_sin_cache(q, k, positions, self._table(query.device), interleaved=not self.is_neox_style,
                                     inplace=True, check_positions=False)  # as vLLM's kernel: no host read
        return query, key

    forward_native = forward_cuda = forward_cpu = forward_hip = forward_xpu = forward_oot = _ksb  # type: ignore[assignment]
