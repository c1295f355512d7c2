"""``flashinfer.sampling`` over the switchboard's ``sampling`` ops.

Draws follow the same distribution as FlashInfer's, not the same random stream. Token ids come back as int32 (or
``indices``' dtype when given). An integer ``seed`` / ``offset`` pair seeds a generator for the call (the same pair
gives the same draw); tensor seeds are refused. ``filter_apply_order="joint"`` (top-k and top-p both on the
original distribution) is served as top-p renormalisation followed by top-k sampling, which keeps the same tokens.
``softmax`` and ``top_k_mask_logits`` are composed in torch; ``enable_pdl`` is a launch hint and changes nothing.
A row that cannot be sampled (probabilities NaN, infinite, negative or all zero; logits NaN, +inf or all -inf) gets
id 0, as FlashInfer gives its all-zero rows, and ``valid`` False with ``return_valid=True``; the check runs on the
device (``check_nan=True`` raises instead, after one host read).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import fail
from ..ops import sampling
from ..ops._common import FLOAT_DTYPES, check_tensor

_Param = Any  # a scalar or a (batch,) tensor, as FlashInfer takes them
_ORDERS = ("top_k_first", "joint")


def _generator(generator: torch.Generator | None, seed: Any, offset: Any, device: torch.device
               ) -> torch.Generator | None:
    if seed is None and offset is None:
        return generator
    if generator is not None:
        raise fail("seed", seed, "None when a generator is given")
    for name, value in (("seed", seed), ("offset", offset)):
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)):
            raise fail(name, type(value).__name__, "a Python int or None (tensor seeds are not served)")
    g = torch.Generator(device=device)
    g.manual_seed(((seed or 0) * 0x9E3779B97F4A7C15 + (offset or 0)) % (1 << 63))
    return g


def _rows(x: torch.Tensor, indices: torch.Tensor | None, name: str) -> tuple[torch.Tensor, torch.dtype]:
    """The distribution of each output (``x[indices]`` when given) and the dtype of the ids."""
    check_tensor(x, name, dims=2, dtypes=FLOAT_DTYPES)  # here, so that an error names the caller's argument
    if indices is None:
        return x, torch.int32
    if not (isinstance(indices, torch.Tensor) and indices.dim() == 1 and indices.dtype in (torch.int32, torch.int64)):
        raise fail("indices", type(indices).__name__ if not isinstance(indices, torch.Tensor) else indices.dtype,
                   "a (batch,) int32 or int64 tensor")
    return x.index_select(0, indices.to(x.device)), indices.dtype


def _draw(x: torch.Tensor, name: str, *, is_logits: bool = False, top_k: _Param = None, top_p: _Param = None,
          min_p: _Param = None, indices: torch.Tensor | None, deterministic: bool, generator: Any, check_nan: bool,
          seed: Any, offset: Any, return_valid: bool = False,
          joint: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One draw per output row. ``joint``: top-k and top-p both on the original distribution, as top-p
    renormalisation then top-k sampling (the nucleus and the top-k set are both prefixes of the same order, so the
    survivors are their intersection, drawn in proportion to the original probabilities)."""
    rows, id_dtype = _rows(x, indices, name)
    gen = _generator(generator, seed, offset, rows.device)
    pool = rows
    if joint:
        pool, top_p = sampling.renorm(rows, top_p=top_p, check_nan=bool(check_nan)), None
    # the kernel writes the ids in their dtype, an invalid row as id 0 (FlashInfer's answer) unless the flags are
    # asked for: then as the switchboard's -1, which tells them apart
    tokens = torch.empty(rows.shape[0], dtype=id_dtype, device=rows.device)
    sampling.top_k_top_p(pool, top_k, top_p, min_p=min_p, is_logits=is_logits, generator=gen,
                         deterministic=bool(deterministic), check_nan=bool(check_nan), out=tokens,
                         invalid_token=sampling.INVALID if return_valid else 0)
    if not return_valid:
        return tokens
    valid = tokens >= 0
    return tokens.clamp_min_(0), valid


def _order(filter_apply_order: Any) -> bool:
    """Whether ``filter_apply_order`` asks for the joint filter."""
    if filter_apply_order not in _ORDERS:
        raise fail("filter_apply_order", filter_apply_order, f"one of {_ORDERS}")
    return bool(filter_apply_order == "joint")


def sampling_from_probs(probs: torch.Tensor, indices: torch.Tensor | None = None, deterministic: bool = True,
                        generator: torch.Generator | None = None, check_nan: bool = False, seed: Any = None,
                        offset: Any = None, return_valid: bool = False) -> Any:
    """One token per row of ``probs`` (batch, vocab), drawn in proportion to its probability."""
    return _draw(probs, "probs", indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, return_valid=return_valid)


def sampling_from_logits(logits: torch.Tensor, indices: torch.Tensor | None = None, deterministic: bool = True,
                         generator: torch.Generator | None = None, check_nan: bool = False, seed: Any = None,
                         offset: Any = None) -> torch.Tensor:
    """One token per row of ``logits``, drawn from their softmax."""
    return _draw(logits, "logits", is_logits=True, indices=indices, deterministic=deterministic,  # type: ignore[return-value]
                 generator=generator, check_nan=check_nan, seed=seed, offset=offset)


def top_p_sampling_from_probs(probs: torch.Tensor, top_p: _Param, indices: torch.Tensor | None = None,
                              deterministic: bool = True, generator: torch.Generator | None = None,
                              check_nan: bool = False, seed: Any = None, offset: Any = None,
                              return_valid: bool = False) -> Any:
    """Nucleus sampling: a token whose more probable tokens hold less than ``top_p`` of the mass."""
    return _draw(probs, "probs", top_p=top_p, indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, return_valid=return_valid)


def top_k_sampling_from_probs(probs: torch.Tensor, top_k: _Param, indices: torch.Tensor | None = None,
                              deterministic: bool = True, generator: torch.Generator | None = None,
                              check_nan: bool = False, seed: Any = None, offset: Any = None,
                              return_valid: bool = False) -> Any:
    """Top-k sampling: one of the ``top_k`` most probable tokens (ties at the k-th kept together)."""
    return _draw(probs, "probs", top_k=top_k, indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, return_valid=return_valid)


def min_p_sampling_from_probs(probs: torch.Tensor, min_p: _Param, indices: torch.Tensor | None = None,
                              deterministic: bool = True, generator: torch.Generator | None = None,
                              check_nan: bool = False, seed: Any = None, offset: Any = None,
                              return_valid: bool = False) -> Any:
    """Min-p sampling: a token with probability at least ``min_p`` times the largest."""
    return _draw(probs, "probs", min_p=min_p, indices=indices, deterministic=deterministic, generator=generator,
                 check_nan=check_nan, seed=seed, offset=offset, return_valid=return_valid)


def top_k_top_p_sampling_from_probs(probs: torch.Tensor, top_k: _Param, top_p: _Param,
                                    indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
                                    deterministic: bool = True, generator: torch.Generator | None = None,
                                    check_nan: bool = False, seed: Any = None, offset: Any = None,
                                    return_valid: bool = False) -> Any:
    """Top-k then top-p on the renormalised survivors (``"top_k_first"``), or both on the original distribution
    (``"joint"``)."""
    return _draw(probs, "probs", top_k=top_k, top_p=top_p, indices=indices, deterministic=deterministic,
                 generator=generator, check_nan=check_nan, seed=seed, offset=offset, return_valid=return_valid,
                 joint=_order(filter_apply_order))


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, top_k: _Param, top_p: _Param,
                                     indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
                                     deterministic: bool = True, generator: torch.Generator | None = None,
                                     check_nan: bool = False, seed: Any = None, offset: Any = None) -> torch.Tensor:
    """:func:`top_k_top_p_sampling_from_probs` of ``softmax(logits)``."""
    if _order(filter_apply_order):
        return _draw(softmax(logits), "logits", top_k=top_k, top_p=top_p, indices=indices,  # type: ignore[return-value]
                     deterministic=deterministic, generator=generator, check_nan=check_nan, seed=seed, offset=offset,
                     joint=True)
    return _draw(logits, "logits", is_logits=True, top_k=top_k, top_p=top_p, indices=indices,  # type: ignore[return-value]
                 deterministic=deterministic, generator=generator, check_nan=check_nan, seed=seed, offset=offset)


def top_p_renorm_probs(probs: torch.Tensor, top_p: _Param, is_deterministic: bool = False) -> torch.Tensor:
    """``probs`` restricted to each row's top-p nucleus, renormalised."""
    return sampling.renorm(probs, top_p=top_p, check_nan=False).to(probs.dtype)


def top_k_renorm_probs(probs: torch.Tensor, top_k: _Param) -> torch.Tensor:
    """``probs`` restricted to each row's top-k tokens, renormalised."""
    return sampling.renorm(probs, top_k=top_k, check_nan=False).to(probs.dtype)


def top_k_mask_logits(logits: torch.Tensor, top_k: _Param) -> torch.Tensor:
    """``logits`` with every token below the row's k-th largest set to -inf (ties at the k-th kept; k of 0 or at
    least the vocabulary keeps the row). Composed in torch: a top-k (scalar k) or a sort (per-row k)."""
    check_tensor(logits, "logits", dims=2, dtypes=FLOAT_DTYPES)
    vocab = logits.shape[1]
    if isinstance(top_k, torch.Tensor):
        if not (top_k.shape == (logits.shape[0],) and top_k.dtype in (torch.int32, torch.int64)):
            raise fail("top_k", f"{tuple(top_k.shape)} {top_k.dtype}", f"an int or a ({logits.shape[0]},) int tensor")
        k = top_k.to(logits.device).long()
        ordered = logits.sort(dim=-1, descending=True).values
        kth = ordered.gather(-1, (k.clamp(1, vocab) - 1)[:, None])
        kth = torch.where(((k <= 0) | (k >= vocab))[:, None], torch.full_like(kth, float("-inf")), kth)
    elif isinstance(top_k, int) and not isinstance(top_k, bool):
        if top_k <= 0 or top_k >= vocab:
            return logits.clone()
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
    else:
        raise fail("top_k", type(top_k).__name__, "an int or a (batch,) int tensor")
    return logits.masked_fill(logits < kth, float("-inf"))


def softmax(logits: torch.Tensor, temperature: _Param = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """float32 ``softmax(logits / temperature)`` over the vocabulary; ``temperature`` a float or a (batch,) tensor
    (a row whose temperature is not positive comes back NaN: checked on the device, no host read). Composed in
    torch."""
    check_tensor(logits, "logits", dims=2, dtypes=FLOAT_DTYPES)
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        check_tensor(temperature, "temperature", dims=1, dtypes=FLOAT_DTYPES)
        if temperature.shape[0] != x.shape[0]:
            raise fail("temperature.shape", tuple(temperature.shape), f"({x.shape[0]},): one value per row of logits")
        t = temperature.to(x.device, torch.float32)[:, None]
        return torch.softmax(x / t, dim=-1).masked_fill_(~(t > 0), float("nan"))
    elif temperature is not None and temperature != 1.0:
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise fail("temperature", temperature, "a positive float, a (batch,) tensor or None")
        x = x / float(temperature)
    return torch.softmax(x, dim=-1)


def chain_speculative_sampling(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                               maybe_output_accepted_token_num: torch.Tensor | None = None,
                               maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
                               deterministic: bool = True, generator: torch.Generator | None = None, seed: Any = None,
                               offset: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chain speculative sampling: (output ids (B, n+1) int32 padded with -1, accepted (B,), emitted (B,)). Counts
    are added into ``maybe_output_*`` when given (and those tensors returned)."""
    gen = _generator(generator, seed, offset, draft_probs.device)
    tokens, accepted, emitted = sampling.chain_speculative(draft_probs, draft_token_ids, target_probs, generator=gen,
                                                           deterministic=bool(deterministic), check_nan=False)
    if maybe_output_accepted_token_num is not None:
        accepted = maybe_output_accepted_token_num.add_(accepted)
    if maybe_output_emitted_draft_token_num is not None:
        emitted = maybe_output_emitted_draft_token_num.add_(emitted)
    return tokens.to(torch.int32), accepted, emitted
