"""Triton samplers: the core's statistical conformance cases, plus multi-pass paths on small shapes.

The multi-chunk / multi-pass code paths (top-k threshold search that does not fit the workspace in
one pass, several candidate rounds) are reached on the CPU by shrinking the chunk and workspace
sizes, so the interpreter runs them on a few hundred tokens.
"""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, conformance_test
from kernel_switchboard.testing.cases.sampling import chi_square_pvalue, target_distribution
from kernel_switchboard_triton import sampling

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
SIGNIFICANCE = 1e-3

test_conformance = conformance_test("triton", ops=("sampling.top_k_top_p", "sampling.renorm",
                                                   "sampling.chain_speculative"))


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 32 tokens and a 16-slot workspace: every multi-pass path runs on small rows."""
    monkeypatch.setattr(sampling, "MAX_BLOCK", 32)
    monkeypatch.setattr(sampling, "MAX_SCRATCH", 16)
    sampling._config.cache_clear()
    yield
    sampling._config.cache_clear()


def _zipf_rows(rows: int, vocab: int, seed: int, logits: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rank = torch.argsort(torch.rand(rows, vocab, generator=g), dim=-1).float() + 1
    x = -1.1 * rank.log() + 0.05 * torch.randn(rows, vocab, generator=g)
    return x if logits else torch.softmax(x, -1)


def _counts(x: torch.Tensor, replicas: int, calls: int, **kw: object) -> torch.Tensor:
    rows, vocab = x.shape
    big = x.repeat_interleave(replicas, 0).to(DEVICE)
    counts = torch.zeros(rows, vocab, dtype=torch.float64)
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    for _ in range(calls):
        kwargs = {k: (v.repeat_interleave(replicas, 0).to(DEVICE) if isinstance(v, torch.Tensor) else v)
                  for k, v in kw.items()}
        tok = ksb.sampling.top_k_top_p(big, kwargs.pop("top_k", None), kwargs.pop("top_p", None), generator=gen,
                                       backend="triton", **kwargs).cpu().view(rows, replicas)
        assert bool(((tok >= 0) & (tok < vocab)).all())
        counts.scatter_add_(1, tok, torch.ones(tok.shape, dtype=torch.float64))
    return counts


def _fits(x: torch.Tensor, counts: torch.Tensor, **kw: object) -> None:
    target = target_distribution(x, kw.get("top_k"), kw.get("top_p"), kw.get("min_p"), bool(kw.get("is_logits")),
                                 kw.get("temperature"))
    bad = (counts > 0) & (target == 0)
    assert not bad.any(), f"filtered-out tokens sampled: {bad.nonzero()[:5].tolist()}"
    p = chi_square_pvalue(counts, target * counts.sum(-1, keepdim=True))
    assert p > SIGNIFICANCE, f"chi-square p = {p:.3g} (significance {SIGNIFICANCE})"


@pytest.mark.parametrize(("kw", "logits"), [
    ({"top_k": 40}, False),  # threshold search over several passes (16-slot workspace)
    ({"top_k": 25, "top_p": 0.8}, False),
    ({"top_p": 0.6}, True),  # rejection rounds from logits
    ({"top_k": 60, "top_p": 0.9, "min_p": 0.02, "temperature": 0.8}, True),
    ({"min_p": 0.05}, False),
])
def test_multi_pass_paths_fit_the_filtered_distribution(tiny_blocks: None, kw: dict[str, object], logits: bool) -> None:
    x = _zipf_rows(2, 300, seed=len(kw) + int(logits), logits=logits)
    kw = dict(kw, is_logits=logits)
    _fits(x, _counts(x, replicas=400, calls=2, **kw), **kw)


def test_per_row_parameters_with_k_off_for_one_row(tiny_blocks: None) -> None:
    x = _zipf_rows(3, 200, seed=11)
    kw = {"top_k": torch.tensor([0, 30, 5], dtype=torch.int32), "top_p": torch.tensor([0.7, 1.0, 0.95]),
          "min_p": torch.tensor([0.0, 0.01, 0.0])}
    _fits(x, _counts(x, replicas=400, calls=2, **kw), **kw)


@pytest.mark.parametrize("kw", [{"top_k": 40, "top_p": 0.85}, {"top_p": 0.5, "min_p": 0.01}, {"top_k": 1}])
def test_renorm_matches_reference_across_passes(tiny_blocks: None, kw: dict[str, object]) -> None:
    x = _zipf_rows(5, 300, seed=3).to(DEVICE)
    got = ksb.sampling.renorm(x, kw.get("top_k"), kw.get("top_p"), kw.get("min_p"), backend="triton")
    want = ksb.sampling.renorm(x, kw.get("top_k"), kw.get("top_p"), kw.get("min_p"), backend="reference")
    assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_the_gpu_finish_by_sorting_matches_too(tiny_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # the interpreter ranks the workspace pairwise; GPUs sort it (tl.sort): run that path on a few rows
    monkeypatch.setattr(sampling, "SORT", True)
    x = _zipf_rows(2, 120, seed=4).to(DEVICE)
    for args in ((20, 0.8, None), (None, 0.6, 0.01)):
        assert_close(ksb.sampling.renorm(x, *args, backend="triton"), ksb.sampling.renorm(x, *args, backend="reference"),
                     atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sort", [False, True])
def test_top_k_threshold_is_exact_on_every_path(tiny_blocks: None, monkeypatch: pytest.MonkeyPatch, sort: bool) -> None:
    # 32-token chunks (32-wide slices: 20 of them over 640 tokens) and a 16-slot workspace. Rows: the slice-maxima
    # bound gathers few enough weights (k 5); it gathers more than the workspace (k 15: the pivot search from the
    # bound); k above the slice count (30: the search from 0); top-k off (k 0); 640 equal weights (ties, k 3)
    monkeypatch.setattr(sampling, "SORT", sort)
    x = _zipf_rows(5, 640, seed=11)
    x[4] = 1 / 640
    k = torch.tensor([5, 15, 30, 0, 3], dtype=torch.int32)
    stats = sampling.top_k_threshold(x.to(DEVICE), k.to(DEVICE), False, None).cpu()
    for row in range(5):
        w, kk = x[row], int(k[row])
        tau = float(torch.sort(w, descending=True).values[kk - 1]) if kk else 0.0
        assert stats[1, row].item() == tau, (row, stats[1, row].item(), tau)
        assert_close(stats[2, row], w[w >= tau].sum(), atol=0, rtol=1e-5)
        assert stats[3, row].item() == w.max().item()


def test_ties_at_the_threshold_are_kept_together(tiny_blocks: None) -> None:
    # 40 tokens share the 3rd-largest weight: top-k=3 must keep all of them (more than the workspace holds)
    x = torch.full((1, 100), 1e-4)
    x[0, :2] = 0.3
    x[0, 50:90] = 0.01
    want = ksb.sampling.renorm(x, 3, None, None, backend="reference")
    assert_close(ksb.sampling.renorm(x.to(DEVICE), 3, None, None, backend="triton").cpu(), want, atol=1e-6, rtol=1e-5)


def test_seeded_runs_repeat_and_different_seeds_differ() -> None:
    x = _zipf_rows(64, 50, seed=5).to(DEVICE)
    gen = torch.Generator(device=DEVICE)
    draws = []
    for seed in (1, 1, 2):
        gen.manual_seed(seed)
        draws.append(ksb.sampling.top_k_top_p(x, 20, 0.9, generator=gen, deterministic=True, backend="triton"))
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


def test_column_strided_input_is_accepted() -> None:
    x = _zipf_rows(3, 40, seed=9).to(DEVICE)
    xt = x.t().contiguous().t()  # same values, column-major
    assert_close(ksb.sampling.renorm(xt, 5, 0.9, backend="triton"), ksb.sampling.renorm(x, 5, 0.9, backend="reference"),
                 atol=1e-6, rtol=1e-5)
    tok = ksb.sampling.top_k_top_p(xt, 5, 0.9, backend="triton").cpu()
    keep = ksb.sampling.renorm(x, 5, 0.9, backend="reference").cpu() > 0
    assert bool(keep.gather(1, tok[:, None]).all())


def test_bad_rows_still_give_in_range_tokens() -> None:
    x = torch.rand(4, 40)
    x[0] = float("nan")
    x[1] = 0.0
    x[2, 3] = float("inf")
    x[3] = -1.0
    for kw in ({}, {"top_p": 0.5}, {"top_k": 3, "top_p": 0.7, "min_p": 0.1}):
        tok = ksb.sampling.top_k_top_p(x.to(DEVICE), kw.get("top_k"), kw.get("top_p"), min_p=kw.get("min_p"),
                                       check_nan=False, backend="triton").cpu()
        assert bool(((tok >= 0) & (tok < 40)).all()), (kw, tok)


def test_chain_speculative_matches_the_reference_draw_for_draw() -> None:
    # the kernel consumes torch.rand like the reference: same seed, same tokens (barring float32 CDF ties)
    g = torch.Generator().manual_seed(0)
    b, n, v = 64, 3, 40
    draft = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    target = torch.softmax(torch.randn(b, n + 1, v, generator=g), -1)
    ids = torch.multinomial(draft.view(-1, v), 1, generator=g).view(b, n)
    gen = torch.Generator(device=DEVICE)
    out = []
    for backend in ("triton", "reference"):
        gen.manual_seed(3)
        out.append(ksb.sampling.chain_speculative(draft.to(DEVICE), ids.to(DEVICE), target.to(DEVICE), generator=gen,
                                                  backend=backend))
    for got, want in zip(out[0], out[1]):
        assert torch.equal(got.cpu(), want.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{"top_p": 0.9}, {"top_k": 50, "top_p": 0.9}, {"top_k": 2000}, {"min_p": 0.05},
                                {"top_k": 50, "top_p": 0.95, "min_p": 0.01, "temperature": 0.7, "is_logits": True}])
def test_gpu_llama3_vocab_statistics(kw: dict[str, object]) -> None:
    x = _zipf_rows(4, 128256, seed=1, logits=bool(kw.get("is_logits")))
    _fits(x, _counts(x, replicas=1024, calls=4, **kw), **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{"top_k": 50, "top_p": 0.9}, {"top_p": 0.6, "min_p": 0.02}, {"top_k": 5000}])
def test_gpu_renorm_large_vocab(kw: dict[str, object]) -> None:
    x = _zipf_rows(16, 128256, seed=2).to(DEVICE)
    args = (kw.get("top_k"), kw.get("top_p"), kw.get("min_p"))
    assert_close(ksb.sampling.renorm(x, *args, backend="triton"), ksb.sampling.renorm(x, *args, backend="reference"),
                 atol=1e-6, rtol=1e-4)
