"""The baselines outside the switchboard that ``switchboard bench`` times beside its kernels, when installed: torch
and cuBLAS, torch SDPA, and FlashInfer's own automatic choice."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


def externals(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Baselines outside the switchboard, when installed: torch / cuBLAS, torch SDPA, FlashInfer."""
    out: dict[str, Callable[[], Any]] = {}
    if op == "gemm.mm":
        a, b = args[0], args[1]
        out["torch.mm (cuBLAS)"] = lambda: torch.mm(a, b)
    elif op == "norm.rms_norm" and hasattr(torch.nn.functional, "rms_norm"):
        x, w = args[0], args[1]
        out["torch F.rms_norm"] = lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
    elif op == "attention.prefill_ragged" and args[0].is_cuda:
        q, k, v, qo = args[0], args[1], args[2], args[3]
        batch = qo.numel() - 1
        n = q.shape[0] // batch
        if bool((qo[1:] - qo[:-1] == n).all()):
            qd = q.view(batch, n, q.shape[1], -1).transpose(1, 2)
            kd = k.view(batch, n, k.shape[1], -1).transpose(1, 2)
            vd = v.view(batch, n, v.shape[1], -1).transpose(1, 2)
            causal = kwargs.get("causal", True)
            out["torch SDPA"] = lambda: torch.nn.functional.scaled_dot_product_attention(
                qd, kd, vd, is_causal=causal, enable_gqa=True)
    if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
        out.update(flashinfer_externals(op, args, kwargs))
    return out


def flashinfer_externals(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """FlashInfer's own automatic choice for an attention point (its default wrappers; decode also with tensor
    cores), planned once: the same mask, window and soft cap; none for custom variants."""
    import os

    if os.environ.get("KSB_BENCH_FLASHINFER", "1") == "0":  # its JIT costs 12-320 s per module on first use
        return {}
    if op not in ("attention.decode", "attention.prefill_ragged", "attention.mla_decode") or "variant" in kwargs:
        return {}
    try:
        flashinfer = importlib.import_module("flashinfer")
    except Exception:
        return {}
    out: dict[str, Callable[[], Any]] = {}
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=args[0].device)
    masking = {"window_left": kwargs.get("window_left", -1), "logits_soft_cap": kwargs.get("logits_soft_cap")}
    if op == "attention.prefill_ragged":  # its default backend: FA3 on sm_90
        q, k, v, qo_indptr, kv_indptr = args[:5]
        try:
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            w.plan(qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[2], v.shape[2],
                   causal=kwargs.get("causal", True), q_data_type=q.dtype, kv_data_type=k.dtype, **masking)
            out["flashinfer prefill"] = lambda: w.run(q, k, v)
        except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
            pass
    if op == "attention.mla_decode":  # its default backend: FA3 on sm_90
        qn, qp, ckv, kpe, table = args[:5]
        try:
            indptr, indices, _ = table.to_csr(ckv.shape[1])
            sm_scale = kwargs.get("sm_scale") or (ckv.shape[2] + kpe.shape[2]) ** -0.5
            new = qn.shape[1] if qn.dim() == 4 else 1  # new tokens per request, causal among themselves
            qn, qp = qn.reshape(-1, *qn.shape[-2:]), qp.reshape(-1, *qp.shape[-2:])
            qo_indptr = torch.arange(0, qn.shape[0] + 1, new, dtype=torch.int32, device=qn.device)
            w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
            w.plan(qo_indptr, indptr, indices, table.seq_lens, qn.shape[1], ckv.shape[2], kpe.shape[2], ckv.shape[1],
                   new > 1, sm_scale, qn.dtype, ckv.dtype)
            out["flashinfer mla"] = lambda: w.run(qn, qp, ckv, kpe)
        except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
            pass
    if op == "attention.decode":
        q, cache, table = args[0], args[1], args[2]
        indptr, indices, last = table.to_csr(cache.page_size)
        for name, tc in (("flashinfer decode", False), ("flashinfer decode (tensor cores)", True)):
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, cache.layout, use_tensor_cores=tc)
                w.plan(indptr, indices, last, q.shape[1], cache.num_kv_heads, cache.head_dim, cache.page_size,
                       q_data_type=q.dtype, kv_data_type=cache.dtype, **masking)
                kv = (cache.k_pages, cache.v_pages)
                out[name] = lambda w=w, kv=kv: w.run(q, kv)
            except Exception:  # noqa: BLE001 - a baseline that cannot run this point is left out
                pass
    return out
