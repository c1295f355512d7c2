"""Kernel Switchboard for Hugging Face transformers.

Importing this package registers ``attn_implementation="ksb"``:

    import kernel_switchboard_transformers  # noqa: F401  (registers "ksb")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="ksb")

- ``"ksb"`` in transformers' ``AttentionInterface`` (:func:`.attention.attention_forward`) and its mask builder in
  ``AttentionMaskInterface`` (:func:`.masks.ksb_mask`);
- ``"paged|ksb"``, the paged implementation that continuous batching (``generate_batch``) switches a ``"ksb"``
  model to, on the transformers releases whose continuous batching takes it and whose paged cache it reads (5.16-5.17):
  :mod:`.paged`.

RMSNorm and gated-activation layers are not swapped: see the README (transformers routes them through the
``kernels`` package and Hub repositories).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .attention import NAME, attention_forward
from .masks import ksb_mask
from .paged import PAGED_NAME, paged_attention_forward
from .registration import register

register()

__all__ = ["NAME", "PAGED_NAME", "__version__", "attention_forward", "ksb_mask", "paged_attention_forward", "register"]
