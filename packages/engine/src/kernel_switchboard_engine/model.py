"""What every engine model shares: its weights, spec, device and dtype."""

from __future__ import annotations

from typing import Any

import torch


class PagedModel:
    """Base of the engine's models. ``weights`` has ``spec`` and an ``embed`` (vocab, hidden) tensor."""

    family = ""

    def __init__(self, weights: Any) -> None:
        self.w = weights
        self.spec = weights.spec

    @property
    def device(self) -> torch.device:
        return self.w.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.w.embed.dtype
