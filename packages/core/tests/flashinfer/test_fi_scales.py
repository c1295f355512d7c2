"""``kernel_switchboard.flashinfer``: ``k_scale`` / ``v_scale`` given to the batch wrappers' ``run`` as tensors (per
tensor or per KV head) over fp8 pages, carried by the cache and read on the device at every run, against the float64
oracle; and the refusals where a tensor scale cannot be served."""

from __future__ import annotations

import pytest
import torch
from fi_oracle import Paged, attention, close, make_paged, qo_indptr, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

KV_HEADS = 2
LENS = [0, 5, 33, 70]
E4M3 = torch.float8_e4m3fn


def _scaled(paged: Paged, k_scale: torch.Tensor, v_scale: torch.Tensor) -> Paged:
    """What fp8 pages stored with scale 1 mean when read with these scales (() or (kv_heads,))."""
    ks, vs = k_scale.double().reshape(-1, 1), v_scale.double().reshape(-1, 1)
    return Paged(paged.k_pages, paged.v_pages, paged.indptr, paged.indices, paged.last_page_len,
                 [k.double() * ks for k in paged.keys], [v.double() * vs for v in paged.values], paged.layout)


def _decode_expected(paged: Paged, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    outs, lses = zip(*(attention(q[b:b + 1], paged.keys[b], paged.values[b], causal=True) for b in range(q.shape[0])))
    return torch.cat(outs), torch.cat(lses)


def _decode(layout: str = "NHD", kv_dtype: torch.dtype = E4M3) -> tuple[object, Paged, torch.Tensor]:
    paged = make_paged(LENS, 16, KV_HEADS, 64, dtype=kv_dtype, layout=layout)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32,
                 kv_data_type=kv_dtype)
    return wrapper, paged, torch.randn(len(LENS), 4, 64)


@pytest.mark.parametrize(("layout", "shape"), [("NHD", ()), ("HND", (1,)), ("NHD", (KV_HEADS,))])
def test_decode_tensor_scales(layout: str, shape: tuple[int, ...]) -> None:
    wrapper, paged, q = _decode(layout)
    ks = torch.tensor([0.5, 1.5][: shape[0] if shape else 1]).reshape(shape)
    vs = torch.tensor([2.0, 0.25][: shape[0] if shape else 1]).reshape(shape)
    kv = paged.combined() if shape == (KV_HEADS,) else (paged.k_pages, paged.v_pages)
    out, lse = wrapper.run(q, kv, k_scale=ks, v_scale=vs, return_lse=True)  # type: ignore[attr-defined]
    want_out, want_lse = _decode_expected(_scaled(paged, ks, vs), q)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    # a calibration updates the scales in place: the next run reads them, with the same switchboard plan
    plans = dict(wrapper._plans)  # type: ignore[attr-defined]
    ks.mul_(3.0)
    vs.mul_(0.5)
    out2, lse2 = wrapper.run(q, kv, k_scale=ks, v_scale=vs, return_lse=True)  # type: ignore[attr-defined]
    want_out, want_lse = _decode_expected(_scaled(paged, ks, vs), q)
    close(out2, want_out, torch.float32)
    close(lse2, want_lse, torch.float32)
    assert wrapper._plans == plans  # type: ignore[attr-defined]


def test_decode_tensor_and_float_scales_mix() -> None:
    """A tensor k_scale with a float v_scale (and the reverse) equal the float scales they stand for."""
    wrapper, paged, q = _decode()
    kv = (paged.k_pages, paged.v_pages)
    floats = wrapper.run(q, kv, k_scale=0.75, v_scale=1.25)  # type: ignore[attr-defined]
    close(floats, _decode_expected(_scaled(paged, torch.tensor(0.75), torch.tensor(1.25)), q)[0], torch.float32)
    for ks, vs in ((torch.tensor(0.75), 1.25), (0.75, torch.tensor([1.25]))):
        close(wrapper.run(q, kv, k_scale=ks, v_scale=vs), floats, torch.float32)  # type: ignore[attr-defined]


def test_paged_prefill_per_head_tensor_scales() -> None:
    qo_lens = [3, 0, 5]
    kv_lens = [7, 4, 5]
    paged = make_paged(kv_lens, 4, KV_HEADS, 64, dtype=E4M3, layout="HND")
    q = torch.randn(sum(qo_lens), 8, 64)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "HND")
    wrapper.plan(qo_indptr(qo_lens), paged.indptr, paged.indices, paged.last_page_len, 8, KV_HEADS, 64, 4,
                 causal=True, q_data_type=torch.float32, kv_data_type=E4M3)
    ks, vs = torch.tensor([0.25, 2.0]), torch.tensor([1.5, 0.5])
    out, lse = wrapper.run(q, paged.combined(), k_scale=ks, v_scale=vs, return_lse=True)
    scaled = _scaled(paged, ks, vs)
    want, at = [], 0
    for b, n in enumerate(qo_lens):
        want.append(attention(q[at:at + n], scaled.keys[b], scaled.values[b], causal=True))
        at += n
    close(out, torch.cat([w[0] for w in want]), torch.float32)
    close(lse, torch.cat([w[1] for w in want]), torch.float32)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"k_scale": torch.tensor(0.5, dtype=torch.bfloat16)}, "k_scale"),  # not float32
    ({"v_scale": torch.ones(3)}, "v_scale"),  # neither one scale nor one per KV head
    ({"k_scale": torch.ones(KV_HEADS, 2)[:, 0]}, "k_scale"),  # not contiguous
    ({"q_scale": torch.tensor(0.5)}, "q_scale"),  # q_scale folds into the softmax scale on the host
])
def test_tensor_scales_refused_by_name(kwargs: dict[str, torch.Tensor], name: str) -> None:
    wrapper, paged, q = _decode()
    with pytest.raises(InvalidArgumentError, match=name):
        wrapper.run(q, (paged.k_pages, paged.v_pages), **kwargs)  # type: ignore[attr-defined]


def test_tensor_scales_need_fp8_pages() -> None:
    """A 16-bit cache's scales fold into the softmax scale and the output on the host, as FlashInfer's: a tensor
    there would need a device read, and is refused by name."""
    wrapper, paged, q = _decode(kv_dtype=torch.float32)
    with pytest.raises(InvalidArgumentError, match="v_scale"):
        wrapper.run(q, (paged.k_pages, paged.v_pages), v_scale=torch.tensor(2.0))  # type: ignore[attr-defined]
