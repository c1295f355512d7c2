"""``kernel_switchboard.flashinfer`` sampling: each sampler's draws follow the filtered distribution defined here
(total-variation bound over many draws), ids come back in FlashInfer's dtypes, and the deterministic functions
(renorms, top-k mask, softmax) match exactly."""

from __future__ import annotations

import pytest
import torch
from fi_oracle import close

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

DRAWS = 6000
#: total-variation bound for DRAWS draws over a handful of tokens (its expected value is ~0.01)
TV = 0.04
PROBS = torch.tensor([0.30, 0.22, 0.16, 0.12, 0.09, 0.06, 0.03, 0.02])


def _keep_top_p(p: torch.Tensor, top_p: float) -> torch.Tensor:
    order = p.argsort(descending=True)
    before = torch.cumsum(p[order], 0) - p[order]
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order] = before < top_p
    return keep


def _keep_top_k(p: torch.Tensor, k: int) -> torch.Tensor:
    return p >= p.topk(k).values[-1]


def _renormed(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    q = torch.where(keep, p, torch.zeros_like(p))
    return q / q.sum()


def _tv(tokens: torch.Tensor, want: torch.Tensor) -> float:
    counts = torch.bincount(tokens.long(), minlength=want.numel()).double()
    return 0.5 * float((counts / counts.sum() - want.double()).abs().sum())


def _rows(p: torch.Tensor) -> torch.Tensor:
    return p[None].expand(DRAWS, -1).contiguous()


CASES = [
    ("top_p_sampling_from_probs", {"top_p": 0.6}, lambda p: _renormed(p, _keep_top_p(p, 0.6))),
    ("top_k_sampling_from_probs", {"top_k": 3}, lambda p: _renormed(p, _keep_top_k(p, 3))),
    ("min_p_sampling_from_probs", {"min_p": 0.3}, lambda p: _renormed(p, p >= 0.3 * p.max())),
    ("top_k_top_p_sampling_from_probs", {"top_k": 5, "top_p": 0.7},
     lambda p: (lambda q: _renormed(q, _keep_top_p(q, 0.7)))(_renormed(p, _keep_top_k(p, 5)))),
    ("top_k_top_p_sampling_from_probs", {"top_k": 5, "top_p": 0.7, "filter_apply_order": "joint"},
     lambda p: _renormed(p, _keep_top_k(p, 5) & _keep_top_p(p, 0.7))),
    ("sampling_from_probs", {}, lambda p: p),
]


@pytest.mark.parametrize(("name", "kwargs", "want"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_probs_samplers_follow_the_filtered_distribution(name: str, kwargs: dict, want: object) -> None:
    g = torch.Generator().manual_seed(1)
    tokens = getattr(flashinfer, name)(_rows(PROBS), generator=g, **kwargs)
    assert tokens.dtype == torch.int32 and tokens.shape == (DRAWS,)
    target = want(PROBS)  # type: ignore[operator]
    assert not bool((target[tokens.long()] == 0).any()), "a filtered-out token was drawn"
    assert _tv(tokens, target) < TV


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_logits_samplers(order: str) -> None:
    logits = torch.log(PROBS) * 1.7 + 0.3
    p = torch.softmax(logits.double(), -1)
    g = torch.Generator().manual_seed(2)
    tokens = flashinfer.top_k_top_p_sampling_from_logits(_rows(logits), 4, 0.8, filter_apply_order=order, generator=g)
    if order == "joint":
        want = _renormed(p, _keep_top_k(p, 4) & _keep_top_p(p, 0.8))
    else:
        q = _renormed(p, _keep_top_k(p, 4))
        want = _renormed(q, _keep_top_p(q, 0.8))
    assert tokens.dtype == torch.int32
    assert _tv(tokens, want) < TV
    plain = flashinfer.sampling_from_logits(_rows(logits), generator=g)
    assert _tv(plain, p) < TV


def test_per_row_parameters_indices_and_valid() -> None:
    probs = torch.stack((PROBS, PROBS.flip(0), torch.zeros(8)))
    indices = torch.tensor([0, 1, 0, 2], dtype=torch.int64)
    top_p = torch.tensor([1.0, 0.3, 0.3, 1.0])
    tokens, valid = flashinfer.top_p_sampling_from_probs(probs, top_p, indices=indices, return_valid=True,
                                                         generator=torch.Generator().manual_seed(0))
    assert tokens.dtype == torch.int64  # the dtype of indices
    assert valid.tolist() == [True, True, True, False] and int(tokens[3]) == 0
    assert int(tokens[1]) == 7 and int(tokens[2]) in (0, 1)  # the nucleus of 0.3: the first one or two tokens


def test_seed_and_offset() -> None:
    a = flashinfer.sampling_from_probs(_rows(PROBS)[:64], seed=7, offset=0)
    b = flashinfer.sampling_from_probs(_rows(PROBS)[:64], seed=7, offset=0)
    c = flashinfer.sampling_from_probs(_rows(PROBS)[:64], seed=7, offset=64)
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(InvalidArgumentError, match="seed"):
        flashinfer.sampling_from_probs(PROBS[None], seed=torch.tensor([7]))


@pytest.mark.parametrize("name, call", [
    ("probs", lambda x: flashinfer.sampling_from_probs(x)),
    ("probs", lambda x: flashinfer.top_k_top_p_sampling_from_probs(x, 2, 0.5)),
    ("logits", lambda x: flashinfer.top_k_top_p_sampling_from_logits(x, 2, 0.5)),
    ("probs", lambda x: flashinfer.top_p_renorm_probs(x, 0.5)),
    ("logits", lambda x: flashinfer.top_k_mask_logits(x, 2)),
    ("logits", lambda x: flashinfer.softmax(x)),
])
def test_a_distribution_of_the_wrong_dtype_is_refused_by_its_argument_name(name: str, call: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^{name}\.dtype=torch\.int32 is invalid"):
        call(torch.ones(2, 8, dtype=torch.int32))  # type: ignore[operator]


def test_softmax_temperature_per_row_is_checked() -> None:
    logits = torch.randn(2, 8)
    with pytest.raises(InvalidArgumentError, match=r"^temperature\.shape=\(2, 1\) is invalid"):
        flashinfer.softmax(logits, torch.ones(2, 1))
    with pytest.raises(InvalidArgumentError, match=r"^temperature\.shape=\(3,\) is invalid"):
        flashinfer.softmax(logits, torch.ones(3))
    out = flashinfer.softmax(logits, torch.tensor([0.5, 0.0]))
    assert torch.allclose(out[0], torch.softmax(logits[0] / 0.5, -1)) and out[1].isnan().all()


def test_renorms_mask_and_softmax() -> None:
    probs = torch.stack((PROBS, PROBS.flip(0)))
    close(flashinfer.top_p_renorm_probs(probs, 0.5),
          torch.stack([_renormed(p, _keep_top_p(p, 0.5)) for p in probs.double()]), torch.float32)
    close(flashinfer.top_k_renorm_probs(probs, torch.tensor([2, 3], dtype=torch.int32)),
          torch.stack([_renormed(p, _keep_top_k(p, k)) for p, k in zip(probs.double(), (2, 3))]), torch.float32)
    logits = torch.randn(3, 50)
    masked = flashinfer.top_k_mask_logits(logits, 5)
    assert masked.dtype == logits.dtype
    for row, m in zip(logits, masked):
        keep = row >= row.topk(5).values[-1]
        assert torch.equal(torch.isinf(m), ~keep) and torch.equal(m[keep], row[keep])
    per_row = flashinfer.top_k_mask_logits(logits, torch.tensor([1, 0, 50], dtype=torch.int32))
    assert int(torch.isfinite(per_row[0]).sum()) == 1 and bool(torch.isfinite(per_row[1:]).all())
    temp = torch.tensor([0.5, 1.0, 2.0])
    close(flashinfer.softmax(logits, temp), torch.softmax(logits.double() / temp.double()[:, None], -1), torch.float32)
    close(flashinfer.softmax(logits), torch.softmax(logits.double(), -1), torch.float32)


def test_chain_speculative_sampling() -> None:
    """Drafts the target agrees with are all accepted and a bonus token follows; counts add into the given tensors."""
    b, n, v = 3, 2, 8
    target = torch.softmax(torch.randn(b, n + 1, v), -1)
    draft = target[:, :n].clone()
    draft_ids = torch.multinomial(draft.reshape(-1, v), 1).view(b, n).to(torch.int32)
    accepted = torch.full((b,), 10, dtype=torch.int32)
    emitted = torch.zeros(b, dtype=torch.int32)
    out, acc, _ = flashinfer.chain_speculative_sampling(draft, draft_ids, target, accepted, emitted,
                                                        generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.int32 and out.shape == (b, n + 1)
    assert torch.equal(out[:, :n], draft_ids) and bool((out[:, n] >= 0).all())
    assert acc is accepted and accepted.tolist() == [12, 12, 12] and emitted.tolist() == [2, 2, 2]
    # a draft the target gives no probability is always rejected: the replacement comes from the target
    target2 = target.clone()
    target2[:, 0] = 0
    target2[:, 0, 3] = 1
    draft2 = torch.full((b, n, v), 1 / v)
    ids2 = torch.zeros(b, n, dtype=torch.int32)
    out2, _, emi2 = flashinfer.chain_speculative_sampling(draft2, ids2, target2,
                                                           generator=torch.Generator().manual_seed(0))
    assert out2[:, 0].tolist() == [3, 3, 3] and bool((out2[:, 1:] == -1).all()) and emi2.tolist() == [0, 0, 0]
