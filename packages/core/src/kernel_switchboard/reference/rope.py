"""Reference rope kernels (see :mod:`kernel_switchboard.ops.rope` for signatures).

No host synchronisation: both kernels can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY
from ._rows import rowwise


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, inplace: bool) -> torch.Tensor:
    """Turn the first ``2 * cos.shape[-1]`` dims of x (T, H, D); cos, sin (T, 1, rotary_dim/2) float32."""
    rot = 2 * cos.shape[-1]
    xr = x[..., :rot].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if inplace:
        x[..., :rot].copy_(turned)
        return x
    return torch.cat((turned.to(x.dtype), x[..., rot:]), dim=-1)


def apply(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool,
          inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    angles = (positions.float()[:, None] * inv_freq[None, :]).unsqueeze(1)  # (T, 1, rotary_dim/2)
    cos, sin = angles.cos(), angles.sin()
    return _rotate(q, cos, sin, interleaved, inplace), _rotate(k, cos, sin, interleaved, inplace)


def apply_cos_sin_cache(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                        interleaved: bool, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # a position outside the table (unchecked calls) reads row 0 and turns its token's rotated dims NaN
    inside = (positions >= 0) & (positions < cos_sin_cache.shape[0])
    rows = cos_sin_cache.index_select(0, torch.where(inside, positions, 0))
    rows = torch.where(inside[:, None], rows, float("nan")).unsqueeze(1)  # (T, 1, rotary_dim)
    cos, sin = rows.chunk(2, dim=-1)
    return _rotate(q, cos, sin, interleaved, inplace), _rotate(k, cos, sin, interleaved, inplace)


def _in_place(args: tuple[object, ...]) -> tuple[int, ...]:
    """q and k (arguments 0 and 1) are written when ``inplace`` (argument 5)."""
    return (0, 1) if args[5] else ()


KERNELS = [
    Kernel("rope.apply", "rope", "reference", INVARIANT_CAPTURABLE, rowwise(apply, rows=(0, 1, 2), mutated=_in_place),
           priority=PRIORITY),
    Kernel("rope.apply_cos_sin_cache", "rope_cos_sin_cache", "reference", INVARIANT_CAPTURABLE,
           rowwise(apply_cos_sin_cache, rows=(0, 1, 2), mutated=_in_place), priority=PRIORITY),
]
