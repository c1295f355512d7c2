"""Per-request sampling parameters and the batched draw through ``sampling.top_k_top_p``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernel_switchboard.errors import fail

from . import calls


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates. ``temperature == 0`` is greedy (argmax, as ``generate(do_sample=False)``)."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise fail("max_new_tokens", self.max_new_tokens, "an int >= 1")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise fail("temperature", self.temperature, "a float >= 0 (0 = greedy)")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise fail("top_k", self.top_k, "None or an int >= 1")
        if self.top_p is not None and not (isinstance(self.top_p, float) and 0 < self.top_p <= 1):
            raise fail("top_p", self.top_p, "None or a float in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], generator: torch.Generator | None = None
           ) -> torch.Tensor:
    """One token per row of logits (B, V): argmax for greedy rows, ``sampling.top_k_top_p`` for the others.

    Returns (B,) int64 on logits' device.
    """
    out = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    dev = logits.device
    chosen = [params[i] for i in rows]
    x = logits if len(rows) == len(params) else logits[torch.tensor(rows, device=dev)]
    temperature = torch.tensor([p.temperature for p in chosen], dtype=torch.float32, device=dev)
    top_k = None
    if any(p.top_k for p in chosen):
        top_k = torch.tensor([p.top_k or 0 for p in chosen], dtype=torch.int32, device=dev)
    top_p = None
    if any(p.top_p is not None and p.top_p < 1 for p in chosen):
        top_p = torch.tensor([p.top_p or 1.0 for p in chosen], dtype=torch.float32, device=dev)
    drawn = calls.top_k_top_p(x.float(), top_k, top_p, temperature, generator)
    if len(rows) == len(params):
        return drawn
    out[torch.tensor(rows, device=dev)] = drawn
    return out


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution a request samples from, float32 (..., V): one-hot argmax when greedy.

    Speculative decoding verifies drafts against these (greedy acceptance = exact argmax match).
    """
    if temperature == 0:
        idx = torch.argmax(logits, dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, idx, 1.0)
    return torch.softmax(logits.float() / temperature, dim=-1)
