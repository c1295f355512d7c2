"""Custom attention variants: hooks spliced into the attention kernels, no fork needed.

A :class:`Variant` carries up to three hooks, each written twice: as a ``@triton.jit`` function
(spliced into the Triton decode / prefill kernels, which take the hooks as ``tl.constexpr``
arguments, so Triton compiles and caches one kernel per variant on first use) and as a torch
function of the same math (evaluated by the reference kernels, so every variant is testable
against the reference). Extra parameters are passed per call as ``variant_args=(...)``: tensors
(per head, per request, tables) reach the Triton hooks as pointers, numbers as scalars; both
reach a hook as one tuple ``args`` (``args[0]``, ``args[1]``, ...).

Order of operations per score, for query position ``q_pos`` and KV position ``kv_pos`` (the
conventions of :mod:`kernel_switchboard.ops.attention`)::

    s = q.k * sm_scale                      # natural-log units, float32
    s = cap * tanh(s / cap)                 # if logits_soft_cap
    s = score_mod(s, q_pos, kv_pos, head, batch, args)
    keep = length/causal/window masks & mask_mod(q_pos, kv_pos, head, batch, args)
    softmax=True:  w = exp(s - m) on kept scores, acc = sum w v, l = sum w, m = row max
    softmax=False: w = s on kept scores (0 elsewhere), acc = sum w v, l = sum w, m = 0
    out = output_mod(acc, l, m, head, batch, args) if output_mod else (acc / l if softmax else acc)
    lse = m + log(l)                        # before output_mod; rows with l = 0 get out 0, lse -inf

A mask_mod can only remove scores that the built-in masks keep (use ``causal=False`` for masks
that look ahead, e.g. a bidirectional prefix).

Shapes the hooks see (they broadcast, so the same expression works in both):

- Triton: ``s`` (M, N) float32; ``q_pos``, ``head`` (M, 1) int32; ``kv_pos`` (1, N) int32;
  ``batch`` an int32 scalar; ``acc`` (M, Dv) float32; ``l``, ``m`` (M, 1) float32 (``m`` in natural
  units; an empty row has ``l`` 0 and ``m`` about -7e29). Tensors in ``args`` are pointers:
  ``tl.load(args[0] + head)``.
- torch: ``s`` (B, H, M, L); ``q_pos`` (B, 1, M, 1); ``kv_pos`` (1, 1, 1, L); ``head``
  (1, H, 1, 1); ``batch`` (B, 1, 1, 1) int64; ``acc`` (B, H, M, Dv); ``l``, ``m`` (B, H, M, 1)
  (an empty row has ``m`` 0); float64 or float32. Tensors in ``args`` are the tensors: ``args[0][head]``.

A variant that has an ``output_mod`` or ``softmax=False`` runs decode in one KV split (its
state cannot be merged across splits by LSE).
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable
from typing import Any

import torch

from .errors import fail

_HOOKS = ("score_mod", "mask_mod", "output_mod")


def _hook_id(fn: Any) -> str:
    """A stable identity of one hook: its qualified name and a hash of its source when it has one."""
    src: Any = getattr(fn, "src", None)  # triton JITFunction
    if src is None:
        src = getattr(getattr(fn, "__code__", None), "co_code", b"")
    digest = hashlib.sha1(src.encode() if isinstance(src, str) else bytes(src or b"")).hexdigest()[:8]
    inner = getattr(fn, "fn", fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}#{digest}"


class Variant:
    """A custom attention variant (see the module docstring for the exact semantics).

    ``score_mod`` / ``mask_mod`` / ``output_mod``: ``@triton.jit`` hooks (any may be None);
    ``torch_score_mod`` / ``torch_mask_mod`` / ``torch_output_mod``: the same math in torch, one
    for each hook given; ``params``: the names of the call-time ``variant_args``; ``softmax``:
    False replaces the softmax by the modified scores used directly as weights (sigmoid attention).
    """

    __slots__ = ("key", "mask_mod", "name", "output_mod", "params", "score_mod", "softmax", "torch_mask_mod",
                 "torch_output_mod", "torch_score_mod")

    def __init__(self, name: str, *, score_mod: Any = None, mask_mod: Any = None, output_mod: Any = None,
                 params: tuple[str, ...] = (), softmax: bool = True, torch_score_mod: Callable[..., Any] | None = None,
                 torch_mask_mod: Callable[..., Any] | None = None,
                 torch_output_mod: Callable[..., Any] | None = None) -> None:
        if not (isinstance(name, str) and name.isidentifier()):
            raise fail("name", name, "an identifier-like str naming the variant")
        if isinstance(params, str) or not all(isinstance(p, str) for p in params):
            raise fail("params", params, "a tuple of parameter names (str)")
        pairs = (("score_mod", score_mod, torch_score_mod), ("mask_mod", mask_mod, torch_mask_mod),
                 ("output_mod", output_mod, torch_output_mod))
        for hook, kernel_fn, torch_fn in pairs:
            if (kernel_fn is None) != (torch_fn is None):
                raise fail(f"torch_{hook}" if torch_fn is None else hook, None,
                           f"both {hook} (a @triton.jit function) and torch_{hook} (its torch definition), or neither")
            if torch_fn is not None and not callable(torch_fn):
                raise fail(f"torch_{hook}", torch_fn, "a callable")
        if score_mod is None and mask_mod is None and output_mod is None and softmax:
            raise fail("Variant", name, "at least one hook (score_mod, mask_mod, output_mod) or softmax=False")
        self.name, self.params, self.softmax = name, tuple(params), bool(softmax)
        self.score_mod, self.mask_mod, self.output_mod = score_mod, mask_mod, output_mod
        self.torch_score_mod, self.torch_mask_mod, self.torch_output_mod = torch_score_mod, torch_mask_mod, torch_output_mod
        hooks = ",".join(f"{h}={_hook_id(f)}" for h, f, _ in pairs if f is not None)
        #: hashable, process-stable identity: part of the problem signature (selection and autotune caches)
        self.key = f"{name}[{hooks}{',' if hooks else ''}softmax={self.softmax}]"

    @property
    def needs_single_split(self) -> bool:
        """True when the per-split state cannot be merged by LSE (output_mod or no softmax)."""
        return self.output_mod is not None or not self.softmax

    def check_args(self, args: Any, device: torch.device) -> tuple[Any, ...]:
        """Validated call-time parameters: one tensor (on ``device``) or number per name in ``params``."""
        if args is None:
            args = ()
        if not isinstance(args, (tuple, list)) or len(args) != len(self.params):
            raise fail("variant_args", args, f"a tuple of {len(self.params)} values {self.params} for variant {self.name!r}")
        for name, value in zip(self.params, args):
            if isinstance(value, torch.Tensor):
                if value.device != device:
                    raise fail(f"variant_args[{name}].device", value.device, f"the device of q ({device})")
                if not value.is_contiguous():
                    raise fail(f"variant_args[{name}]", "non-contiguous", "a contiguous tensor")
            elif not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise fail(f"variant_args[{name}]", value, "a tensor or a number")
        return tuple(args)

    def __repr__(self) -> str:
        return f"Variant({self.key})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variant) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


class BoundVariant:
    """A variant with this call's parameters (what ``AttnParams.variant`` holds)."""

    __slots__ = ("args", "variant")

    def __init__(self, variant: Variant, args: tuple[Any, ...]) -> None:
        self.variant, self.args = variant, args

    def __repr__(self) -> str:
        return f"BoundVariant({self.variant.key}, {len(self.args)} args)"


def bind(variant: Any, args: Any, device: torch.device) -> BoundVariant | None:
    """Validate ``variant`` / ``variant_args`` of a public call; None when no variant is used."""
    if variant is None:
        if args not in (None, ()):
            raise fail("variant_args", args, "None (no variant given)")
        return None
    if not isinstance(variant, Variant):
        raise fail("variant", variant, "a kernel_switchboard.Variant or None")
    return BoundVariant(variant, variant.check_args(args, device))
