"""``flashinfer.rope`` over the switchboard's ``rope`` ops.

q (nnz, Hq, D) and k (nnz, Hk, D) turn by each token's position: ``pos_ids`` (nnz,), or, for the ragged forms,
``offsets[b] + i`` for token i of request b (``indptr`` packs the requests). ``interleave``: GPT-J pairs (2i, 2i+1),
else NeoX halves; ``rotary_dim`` (default D) leading dims turn. ``rope_scale`` divides every frequency (linear
position interpolation); the ``llama31`` forms use Llama 3.1's frequency bands. The ``cos_sin_cache`` forms take
vLLM's table (max_position, rotary_dim) float32, rows ``[cos | sin]``, and (nnz, H * head_size) or 3-d q / k; as
FlashInfer's, they read nothing back to check the positions: a token whose position lies outside the table comes out
NaN in its rotated dims.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import fail
from ..ops import rope
from ..ops.rope import Llama3Scaling


def _linear(rope_scale: Any) -> Llama3Scaling | None:
    """Linear position interpolation (every frequency divided by ``rope_scale``) as a Llama-3 scaling whose bands
    all lie in the divided range: every wavelength (>= 2*pi) exceeds ``original_max_position / low_freq_factor`` = 1."""
    if not (isinstance(rope_scale, (int, float)) and rope_scale > 0):
        raise fail("rope_scale", rope_scale, "a positive float")
    if rope_scale == 1:
        return None
    return Llama3Scaling(factor=float(rope_scale), low_freq_factor=1.0, high_freq_factor=2.0, original_max_position=1)


def _llama31(rope_scale: float, low_freq_factor: float, high_freq_factor: float, old_context_len: int) -> Llama3Scaling:
    return Llama3Scaling(factor=float(rope_scale), low_freq_factor=float(low_freq_factor),
                         high_freq_factor=float(high_freq_factor), original_max_position=int(old_context_len))


def _ragged_positions(q: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Position of each packed token: ``offsets[b] + i`` for token i of request b (on the device, no host read)."""
    if not (isinstance(indptr, torch.Tensor) and indptr.dim() == 1 and indptr.numel() >= 2):
        raise fail("indptr", type(indptr).__name__, "a 1-d (batch + 1,) tensor")
    if not (isinstance(offsets, torch.Tensor) and offsets.shape == (indptr.numel() - 1,)):
        raise fail("offsets", type(offsets).__name__ if not isinstance(offsets, torch.Tensor) else tuple(offsets.shape),
                   f"a ({indptr.numel() - 1},) tensor: one offset per request")
    ind = indptr.to(q.device).long()
    t = torch.arange(q.shape[0], dtype=torch.int64, device=q.device)
    row = torch.searchsorted(ind[1:], t, right=True).clamp(max=ind.numel() - 2)
    return offsets.to(q.device).long()[row] + (t - ind[row])


def _apply(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, rotary_dim: Any, interleave: bool,
           theta: float, scaling: Llama3Scaling | None, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return rope.apply(q, k, pos, theta=float(theta), rotary_dim=rotary_dim, interleaved=bool(interleave),
                      scaling=scaling, inplace=inplace)


def apply_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
               rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 1,
               rope_theta: float = 1e4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of ragged q / k."""
    return _apply(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave, rope_theta, _linear(rope_scale),
                  False)


def apply_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> None:
    """Rotate ragged q / k in place."""
    _apply(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave, rope_theta, _linear(rope_scale), True)


def apply_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor, rotary_dim: int | None = None,
                       interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q / k by ``pos_ids``."""
    return _apply(q, k, pos_ids, rotary_dim, interleave, rope_theta, _linear(rope_scale), False)


def apply_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 1, rope_theta: float = 1e4) -> None:
    """Rotate q / k in place by ``pos_ids``."""
    _apply(q, k, pos_ids, rotary_dim, interleave, rope_theta, _linear(rope_scale), True)


def apply_llama31_rope(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 8,
                       rope_theta: float = 5e5, low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of ragged q / k with Llama 3.1's frequency scaling."""
    return _apply(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave, rope_theta,
                  _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_inplace(q: torch.Tensor, k: torch.Tensor, indptr: torch.Tensor, offsets: torch.Tensor,
                               rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1, high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> None:
    """Rotate ragged q / k in place with Llama 3.1's frequency scaling."""
    _apply(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave, rope_theta,
           _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), True)


def apply_llama31_rope_pos_ids(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                               low_freq_factor: float = 1, high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q / k by ``pos_ids`` with Llama 3.1's frequency scaling."""
    return _apply(q, k, pos_ids, rotary_dim, interleave, rope_theta,
                  _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_pos_ids_inplace(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                                       rotary_dim: int | None = None, interleave: bool = False, rope_scale: float = 8,
                                       rope_theta: float = 5e5, low_freq_factor: float = 1,
                                       high_freq_factor: float = 4, old_context_len: int = 8192) -> None:
    """Rotate q / k in place by ``pos_ids`` with Llama 3.1's frequency scaling."""
    _apply(q, k, pos_ids, rotary_dim, interleave, rope_theta,
           _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), True)


def _heads(t: Any, name: str, head_size: int) -> torch.Tensor:
    if not (isinstance(t, torch.Tensor) and t.dim() in (2, 3) and t.shape[-1] % head_size == 0):
        raise fail(name, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__,
                   f"(nnz, heads * {head_size}) or (nnz, heads, {head_size})")
    return t.view(t.shape[0], -1, head_size)


def apply_rope_with_cos_sin_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                                  cos_sin_cache: torch.Tensor, is_neox: bool = True
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of query / key (their shapes) from the precomputed table."""
    q_out, k_out = rope.apply_cos_sin_cache(_heads(query, "query", head_size), _heads(key, "key", head_size), positions,
                                            cos_sin_cache, interleaved=not is_neox, check_positions=False)
    return q_out.view(query.shape), k_out.view(key.shape)


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                          head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """Rotate query / key in place from the precomputed table."""
    rope.apply_cos_sin_cache(_heads(query, "query", head_size), _heads(key, "key", head_size), positions,
                             cos_sin_cache, interleaved=not is_neox, inplace=True, check_positions=False)
