"""The mask transformers builds for ``attn_implementation="ksb"``.

It is sdpa's 4-d boolean mask (True = attend), always materialised: sdpa's builder returns None for a plain causal
mask so that ``torch``'s ``is_causal`` (top-left aligned) can take over, and with a static cache that None also
stands for "ignore the unwritten slots", which a bottom-right aligned kernel cannot tell from "attend all". With the
mask always present, :mod:`._layout` reads the exact pattern from it (one analysis per forward pass, shared by the
layers). A bidirectional model's all-True mask may still be skipped (None = attend all, which is unambiguous).
"""

from __future__ import annotations

from typing import Any

from transformers.masking_utils import sdpa_mask


def ksb_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``sdpa_mask`` with the causal skip turned off (same arguments, same 4-d bool result)."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)
