"""What each op's kernels must return: the shape, dtype and device of every output, from the ``run`` arguments.

Dispatch checks the results of kernels from third-party backends against these (the built-in backends are
held to the same contract by their conformance tests): a kernel that returns a wrong shape, dtype or device
raises :class:`~kernel_switchboard.errors.KernelResultError` naming the kernel, instead of handing the caller
a wrong tensor. The check compares metadata only: no host synchronisation, no data read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .errors import KernelResultError


class Out(NamedTuple):
    """One expected output: ``None`` in a field leaves it unchecked."""

    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    device: torch.device | None


#: what ``run`` returns: one :class:`Out`, a tuple of them (``None`` = that element is not checked), or
#: ``None`` when the op writes in place and its return value is not used
Expected = Out | tuple[Out | None, ...] | None


def _like(t: torch.Tensor, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None) -> Out:
    return Out(tuple(t.shape) if shape is None else shape, t.dtype if dtype is None else dtype, t.device)


def _lse(p: Any, shape: tuple[int, ...], device: torch.device) -> Out | None:
    return Out(shape, torch.float32, device) if getattr(p, "return_lse", False) else None


def _decode(q: Any, cache: Any, table: Any, p: Any) -> Expected:
    b, h = q.shape[:2]
    return _like(q, (b, h, cache.head_dim_v)), _lse(p, (b, h), q.device)


def _prefill(q: Any, qo_indptr: Any, cache: Any, table: Any, p: Any) -> Expected:
    t, h = q.shape[:2]
    return _like(q, (t, h, cache.head_dim_v), _attn_out_dtype(q)), _lse(p, (t, h), q.device)


def _attn_out_dtype(q: Any) -> torch.dtype:
    """An attention output's dtype: q's, bfloat16 for float8_e4m3fn queries."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype  # type: ignore[no-any-return]


def _pod(q_prefill: Any, qo_indptr: Any, q_decode: Any, cache: Any, prefill_table: Any, decode_table: Any,
         p: Any) -> Expected:
    (t, h), b = q_prefill.shape[:2], q_decode.shape[0]
    return (_like(q_prefill, (t, h, cache.head_dim_v)), _like(q_decode, (b, h, cache.head_dim_v)),
            _lse(p, (t, h), q_prefill.device), _lse(p, (b, h), q_decode.device))


def _ragged(q: Any, k: Any, v: Any, qo_indptr: Any, kv_indptr: Any, p: Any) -> Expected:
    t, h = q.shape[:2]
    return _like(q, (t, h, v.shape[-1])), _lse(p, (t, h), q.device)


def _mla(q_nope: Any, q_pe: Any, ckv_pages: Any, kpe_pages: Any, table: Any, p: Any) -> Expected:
    return _like(q_nope), _lse(p, tuple(q_nope.shape[:2]), q_nope.device)


def _mla_prefill(q_nope: Any, q_pe: Any, qo_indptr: Any, ckv_pages: Any, kpe_pages: Any, table: Any,
                 p: Any) -> Expected:
    return _like(q_nope), _lse(p, tuple(q_nope.shape[:2]), q_nope.device)


def _merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> Expected:
    return _like(out_a), _like(lse_a, dtype=torch.float32)


def _dense(q: Any, k: Any, v: Any, attn_bias: Any, p: Any) -> Expected:
    return _like(q, (*q.shape[:3], v.shape[-1]))


def _gated(x: Any) -> Expected:
    return _like(x, (x.shape[0], x.shape[1] // 2))


def _route(router_logits: Any, top_k: int, *_: Any) -> Expected:
    shape = (router_logits.shape[0], top_k)
    return Out(shape, torch.float32, router_logits.device), Out(shape, torch.int32, router_logits.device)


def _rope(q: Any, k: Any, *_: Any) -> Expected:
    return _like(q), _like(k)


def _top_k_top_p(x: Any, top_k: Any, top_p: Any, min_p: Any, is_logits: Any, temperature: Any, generator: Any,
                 deterministic: Any, out: Any, invalid_token: Any) -> Expected:
    return Out((x.shape[0],), out.dtype, x.device)  # the tokens, written into ``out`` (int32 or int64)


def _chain(draft_probs: Any, draft_token_ids: Any, *_: Any) -> Expected:
    b, n = draft_token_ids.shape
    dev = draft_probs.device
    return Out((b, n + 1), torch.int64, dev), Out((b,), torch.int32, dev), Out((b,), torch.int32, dev)


#: op -> expected outputs, called with the kernel's ``run`` arguments
RESULTS: dict[str, Callable[..., Expected]] = {
    "activation.silu_and_mul": _gated,
    "activation.gelu_and_mul": _gated,
    "activation.gelu_tanh_and_mul": _gated,
    "attention.decode": _decode,
    "attention.prefill": _prefill,
    "attention.prefill_ragged": _ragged,
    "attention.mla_decode": _mla,
    "attention.mla_prefill": _mla_prefill,
    "attention.pod": _pod,
    "attention.merge_states": _merge,
    "attention.dense": _dense,
    "comm.all_reduce": lambda x, group: _like(x),
    "comm.all_reduce_fused_rms_norm": lambda x, residual, weight, eps, group: (_like(x), _like(x)),
    "gemm.mm": lambda a, b: _like(a, (a.shape[0], b.shape[1])),
    "gemm.mm_fp8": lambda a, b, scale_a, scale_b, mode, out_dtype: _like(a, (a.shape[0], b.shape[1]), out_dtype),
    "gemm.grouped_mm": lambda a, b, offsets: _like(a, (a.shape[0], b.shape[2])),
    "moe.route": _route,
    "moe.fused_moe": lambda x, *_: _like(x),
    "norm.rms_norm": lambda x, *_: _like(x),
    "norm.layer_norm": lambda x, *_: _like(x),
    "rope.apply": _rope,
    "rope.apply_cos_sin_cache": _rope,
    "sampling.top_k_top_p": _top_k_top_p,
    "sampling.renorm": lambda probs, *_: _like(probs, dtype=torch.float32),
    "sampling.chain_speculative": _chain,
}


def check_result(kernel_id: str, op: str, args: tuple[Any, ...], result: Any) -> None:
    """Raise :class:`KernelResultError` unless ``result`` matches what ``op``'s kernels must return."""
    spec = RESULTS.get(op)
    if spec is None:
        return
    expected = spec(*args)
    if expected is None:
        return
    if isinstance(expected, Out):
        _check_one(kernel_id, op, "its result", result, expected)
        return
    if not isinstance(result, (tuple, list)) or len(result) != len(expected):
        raise KernelResultError(f"kernel {kernel_id} ({op}) returned {_describe(result)}, expected a tuple of "
                                f"{len(expected)} outputs")
    for i, (got, want) in enumerate(zip(result, expected)):
        if want is not None:
            _check_one(kernel_id, op, f"output {i}", got, want)


def _check_one(kernel_id: str, op: str, what: str, got: Any, want: Out) -> None:
    if not isinstance(got, torch.Tensor):
        raise KernelResultError(f"kernel {kernel_id} ({op}) returned {_describe(got)} as {what}, expected a tensor")
    for field, value, expected in (("shape", tuple(got.shape), want.shape), ("dtype", got.dtype, want.dtype),
                                   ("device", got.device, want.device)):
        if expected is not None and value != expected:
            raise KernelResultError(f"kernel {kernel_id} ({op}) returned {what} with {field} {value}, expected "
                                    f"{expected}")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
