"""Registration of the switchboard's implementations in transformers' interfaces (idempotent)."""

from __future__ import annotations

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .attention import NAME, attention_forward
from .masks import ksb_mask
from .paged import PAGED_NAME, paged_attention_forward


def register() -> None:
    """Register ``"ksb"`` (attention and mask) and ``"paged|ksb"`` (continuous batching) with transformers.

    Called on import; calling it again re-registers the same functions (a no-op in effect)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ksb_mask)
    AttentionInterface.register(PAGED_NAME, paged_attention_forward)
