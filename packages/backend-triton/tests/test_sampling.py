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
    # 32-token chunks (32-wide slices: 15 of them over 480 tokens) and a 16-slot workspace. Rows: the slice-maxima
    # bound gathers few enough weights (k 5); it gathers more than the workspace (k 15: the pivot search from the
    # bound); k above the slice count (30: the search from 0); top-k off (k 0); 480 equal weights (ties, k 3)
    monkeypatch.setattr(sampling, "SORT", sort)
    x = _zipf_rows(5, 480, seed=11)
    x[4] = 1 / 480
    k = torch.tensor([5, 15, 30, 0, 3], dtype=torch.int32)
    first = sampling.top_k_threshold(x.to(DEVICE), k.to(DEVICE), False, None)
    stats, weights, cols = first.stats.cpu(), first.weights.cpu(), first.cols.cpu()
    for row in range(5):
        w, kk = x[row], int(k[row])
        tau = float(torch.sort(w, descending=True).values[kk - 1]) if kk else 0.0
        assert stats[1, row].item() == tau, (row, stats[1, row].item(), tau)
        assert_close(stats[2, row], w[w >= tau].sum(), atol=0, rtol=1e-5)
        assert stats[3, row].item() == w.max().item()
    # the top-k set is left, in column order, only where the compaction gathered it (row 0)
    assert stats[5].tolist() == [5, -1, -1, -1, -1]
    members = (x[0] >= stats[1, 0]).nonzero().flatten()
    assert cols[0, :5].tolist() == members.tolist()
    assert torch.equal(weights[0, :5], x[0, members])


@pytest.mark.parametrize("search_chunk", [1024, 256])
def test_the_compaction_reads_the_hot_slices_several_per_step(monkeypatch: pytest.MonkeyPatch,
                                                              search_chunk: int) -> None:
    # 8000 tokens in 256-wide slices (the last one ragged, holding row 0's largest weight), the slice maxima taken
    # over 1024-token chunks: the compaction reads only the slices whose maximum reaches the bound, in column order,
    # search_chunk // 256 of them per step
    monkeypatch.setattr(sampling, "MAX_BLOCK", 1024)
    monkeypatch.setattr(sampling, "MAX_SCRATCH", 64)
    monkeypatch.setattr(sampling, "SEARCH_WALK", (search_chunk, 1, 16))
    monkeypatch.setattr(sampling, "TOP_K_WALK_BLOCK", 1024)
    sampling._config.cache_clear()
    try:
        x = _zipf_rows(3, 8000, seed=13)
        x[0, 7999] = 0.5
        k = torch.tensor([3, 8, 20], dtype=torch.int32)
        first = sampling.top_k_threshold(x.to(DEVICE), k.to(DEVICE), False, None)
    finally:
        sampling._config.cache_clear()
    stats, weights, cols = first.stats.cpu(), first.weights.cpu(), first.cols.cpu()
    for row in range(3):
        want = torch.sort(x[row], descending=True).values[int(k[row]) - 1]
        assert stats[1, row].item() == want.item()
        members = (x[row] >= want).nonzero().flatten()
        assert int(stats[5, row]) == members.numel()
        assert cols[row, :members.numel()].tolist() == members.tolist()
        assert torch.equal(weights[row, :members.numel()], x[row, members])


@pytest.mark.parametrize(("kw", "logits", "sort"), [
    ({"top_k": 6}, False, False),
    ({"top_k": 5, "top_p": 0.7}, False, True),
    ({"top_k": 6, "top_p": 0.8, "min_p": 0.05, "temperature": 0.7}, True, False),
    ({"top_k": 6, "top_p": 0.6}, True, True),
    ({"top_k": 4, "min_p": 0.1}, True, False),
])
def test_a_small_top_k_set_is_drawn_from_without_walking_the_row(tiny_blocks: None, monkeypatch: pytest.MonkeyPatch,
                                                                 kw: dict[str, object], logits: bool,
                                                                 sort: bool) -> None:
    # 480 tokens in 32-token chunks: the slice-maxima bound gathers the top-k set into the 16-slot workspace, and the
    # sampling kernel applies top-p / min-p to that set alone (sort: the GPU's nucleus search, else pairwise ranks;
    # fewer draws there, as the interpreter's sort costs about 20 ms a row)
    monkeypatch.setattr(sampling, "SORT", sort)
    x = _zipf_rows(2, 480, seed=5 + int(logits), logits=logits)
    first = sampling.top_k_threshold(x.to(DEVICE), kw["top_k"], logits, kw.get("temperature"))
    assert (first.stats[5] >= 0).all(), "the set was not left: this test would not reach the set draw"
    kw = dict(kw, is_logits=logits)
    _fits(x, _counts(x, replicas=100 if sort else 300, calls=2, **kw), **kw)


def test_a_set_row_with_bad_entries_gets_the_sentinel(tiny_blocks: None) -> None:
    # the sampling kernel does not walk a row whose top-k set it was handed: the threshold kernel checks the entries
    x = _zipf_rows(3, 480, seed=9)
    x[1, 400] = float("nan")
    x[2, 7] = -0.5
    tok = ksb.sampling.top_k_top_p(x.to(DEVICE), 4, 0.9, backend="triton").cpu()
    assert tok[0] >= 0
    assert tok[1:].tolist() == [-1, -1]


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


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_out_and_invalid_token_are_written_by_the_kernel(dtype: torch.dtype) -> None:
    x = _with_invalid_rows(300, False).to(DEVICE)
    gen = torch.Generator(device=DEVICE)
    want = ksb.sampling.top_k_top_p(x, 25, 0.8, generator=gen.manual_seed(3), backend="triton")
    out = torch.full((8,), 55, dtype=dtype, device=DEVICE)
    got = ksb.sampling.top_k_top_p(x, 25, 0.8, generator=gen.manual_seed(3), out=out, invalid_token=0,
                                   backend="triton")
    assert got is out and want[1:4].tolist() == [-1] * 3
    assert got.tolist() == torch.where(want < 0, 0, want).tolist()


def test_column_strided_input_is_accepted() -> None:
    x = _zipf_rows(3, 40, seed=9).to(DEVICE)
    xt = x.t().contiguous().t()  # same values, column-major
    assert_close(ksb.sampling.renorm(xt, 5, 0.9, backend="triton"), ksb.sampling.renorm(x, 5, 0.9, backend="reference"),
                 atol=1e-6, rtol=1e-5)
    tok = ksb.sampling.top_k_top_p(xt, 5, 0.9, backend="triton").cpu()
    keep = ksb.sampling.renorm(x, 5, 0.9, backend="reference").cpu() > 0
    assert bool(keep.gather(1, tok[:, None]).all())


def _with_invalid_rows(vocab: int, logits: bool) -> torch.Tensor:
    """8 Zipf rows of which rows 1-4 are invalid, the bad entry in a late chunk (the whole row must be walked)."""
    x = _zipf_rows(8, vocab, seed=21, logits=logits)
    last = vocab - 3
    x[1, last] = float("nan")
    x[2, last] = float("inf")
    x[3] = float("-inf") if logits else 0.0
    x[4, vocab // 2] = float("-inf") if logits else -0.5  # logits: a masked token, so row 4 stays valid
    return x


#: filters per path: top-k search (its own launch) or not, min-p, per-row parameters with an out-of-range entry
_INVALID_PATHS = [{}, {"top_p": 0.7}, {"min_p": 0.05}, {"top_k": 25, "top_p": 0.8},
                  {"top_k": torch.tensor([5, 0, 7, 9, 3, -1, 4, 40])},
                  {"top_p": torch.tensor([0.9, 0.5, 0.5, 0.8, 0.7, 0.6, float("nan"), 1.0])},
                  {"top_k": 30, "min_p": torch.tensor([0.01, 0.1, 0.0, 0.2, 1.5, 0.05, 0.0, 0.3])}]


@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("kw", _INVALID_PATHS)
def test_invalid_rows_get_the_sentinel_on_every_path(tiny_blocks: None, kw: dict[str, object], logits: bool) -> None:
    x = _with_invalid_rows(300, logits)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if logits:
        args["temperature"] = torch.tensor([0.7, 1.0, 1.0, 1.0, 1.3, 0.9, 1.1, 0.0], device=DEVICE)  # row 7: t = 0
    tok = ksb.sampling.top_k_top_p(x.to(DEVICE), args.pop("top_k", None), args.pop("top_p", None), is_logits=logits,
                                   backend="triton", **args).cpu()
    t = args.get("temperature")
    canon = {k: (v.to(torch.int32) if k == "top_k" and isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    want = ksb.sampling.invalid_rows(x, logits, canon.get("top_k"), canon.get("top_p"), canon.get("min_p"),
                                     t.cpu() if t is not None else None)
    assert bool(want[1:4].all()) and not bool(want[0]) and (logits or bool(want[4])) and (bool(want[7]) or not logits)
    assert torch.equal(tok == ksb.sampling.INVALID, want), (tok, want)
    assert bool(((tok[~want] >= 0) & (tok[~want] < 300)).all())
    ok = ~want
    target = target_distribution(x[ok], *(v[ok] if isinstance(v, torch.Tensor) else v for v in
                                          (canon.get("top_k"), canon.get("top_p"), canon.get("min_p"))),
                                 is_logits=logits, temperature=t.cpu()[ok] if t is not None else None)
    assert bool((target.gather(1, tok[ok][:, None]) > 0).all()), "a valid row sampled a filtered-out token"


@pytest.mark.parametrize("kw", [{}, {"top_p": 0.6}, {"top_k": torch.tensor([5, 0, 7, 9, 3, -1, 4, 40]), "top_p": 0.9},
                                {"min_p": torch.tensor([0.01, 0.1, 0.0, 0.2, 1.5, 0.05, 0.0, 0.3])},
                                {"top_k": 6}])  # top-k alone: the entries are checked in the search's first walk
def test_renorm_invalid_rows_are_nan_as_the_reference(tiny_blocks: None, kw: dict[str, object]) -> None:
    x = _with_invalid_rows(300, False)
    args = tuple(kw.get(k) for k in ("top_k", "top_p", "min_p"))
    got = ksb.sampling.renorm(x.to(DEVICE), *(v.to(DEVICE) if isinstance(v, torch.Tensor) else v for v in args),
                              backend="triton").cpu()
    want = ksb.sampling.renorm(x, *args, backend="reference")
    assert bool(want[1:4].isnan().all()) and not bool(want[0].isnan().any())
    assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("blocks", ["one chunk", "many chunks"])
def test_chain_speculative_matches_the_reference_draw_for_draw(blocks: str, request: pytest.FixtureRequest) -> None:
    # the kernel consumes torch.rand like the reference: same seed, same tokens (barring float32 CDF ties);
    # rows 5-9 are invalid (bad entries at the first, last and bonus positions, a zero row, a draft id out of range)
    if blocks == "many chunks":
        request.getfixturevalue("tiny_blocks")
    g = torch.Generator().manual_seed(0)
    b, n, v = 64, 3, 40 if blocks == "one chunk" else 300
    draft = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    target = torch.softmax(torch.randn(b, n + 1, v, generator=g), -1)
    ids = torch.multinomial(draft.view(-1, v), 1, generator=g).view(b, n)
    draft[5, 0, v - 1] = float("nan")
    draft[6, n - 1, 2] = -0.1
    target[7, n, v - 2] = float("inf")
    target[8, 1] = 0.0
    ids[9, 2] = v
    gen = torch.Generator(device=DEVICE)
    out = []
    for backend in ("triton", "reference"):
        gen.manual_seed(3)
        out.append(ksb.sampling.chain_speculative(draft.to(DEVICE), ids.to(DEVICE), target.to(DEVICE), generator=gen,
                                                  backend=backend))
    for got, want in zip(out[0], out[1]):
        assert torch.equal(got.cpu(), want.cpu())
    tokens, accepted, emitted = (t.cpu() for t in out[0])
    assert bool((tokens[5:10] == -1).all()) and not bool(accepted[5:10].any()) and not bool(emitted[5:10].any())
    assert bool((tokens[:5, 0] >= 0).all()) and bool((tokens[10:, 0] >= 0).all())


@pytest.mark.gpu
def test_gpu_default_calls_do_not_synchronize() -> None:
    """The default path reads nothing back to the host: torch's sync debug mode raises on any synchronising call."""
    probs = torch.softmax(torch.randn(64, 32000, device="cuda"), -1)
    probs[3] = float("nan")
    draft = torch.softmax(torch.randn(64, 3, 32000, device="cuda"), -1)
    target = torch.softmax(torch.randn(64, 4, 32000, device="cuda"), -1)
    ids = torch.randint(0, 32000, (64, 3), device="cuda")
    top_k = torch.full((64,), 50, dtype=torch.int32, device="cuda")
    calls = [lambda: ksb.sampling.top_p(probs, 0.9, backend="triton"),
             lambda: ksb.sampling.top_k_top_p(probs, top_k, 0.9, backend="triton"),
             lambda: ksb.sampling.top_k_top_p(probs.log(), 50, 0.9, is_logits=True, temperature=0.7, backend="triton"),
             lambda: ksb.sampling.renorm(probs, 50, 0.9, backend="triton"),
             lambda: ksb.sampling.chain_speculative(draft, ids, target, backend="triton")]
    for call in calls:
        call()  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [call() for call in calls]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(results[0][3]) == -1 and int(results[1][3]) == -1 and bool(results[3][3].isnan().all())


@pytest.mark.gpu
def test_gpu_default_top_k_top_p_is_captured_in_a_cuda_graph() -> None:
    """Declared capturable: the default call records into a CUDA graph, and replays follow new data, invalid rows
    included (the sentinel is computed in the kernel, not decided on the host)."""
    probs = torch.softmax(torch.randn(32, 32000, device="cuda"), -1)
    ksb.sampling.top_k_top_p(probs, 50, 0.9, backend="triton")  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = ksb.sampling.top_k_top_p(probs, 50, 0.9, backend="triton")
    fresh = torch.softmax(torch.randn(32, 32000, device="cuda") * 3, -1)
    fresh[7] = float("nan")
    probs.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    keep = ksb.sampling.renorm(fresh, 50, 0.9, backend="reference") > 0
    ok = torch.ones(32, dtype=torch.bool, device="cuda")
    ok[7] = False
    assert int(tokens[7]) == -1
    assert bool(keep[ok].gather(1, tokens[ok][:, None]).all())


@pytest.mark.gpu
def test_gpu_seeds_follow_the_generator() -> None:
    """Outside capture the seed comes from the generator's (seed, offset) on the host: a reseeded generator (given,
    or torch's default) repeats its draws and successive calls differ; inside capture each replay draws afresh."""
    probs = torch.full((256, 1000), 1e-3, device="cuda")  # uniform rows: two different seeds give different rows

    def three(gen: torch.Generator | None) -> torch.Tensor:
        return torch.stack([ksb.sampling.top_p(probs, 1.0, generator=gen, backend="triton") for _ in range(3)])

    gen = torch.Generator(device="cuda")
    given = [three(gen.manual_seed(5)), three(gen.manual_seed(5))]
    torch.manual_seed(7)
    default = [three(None)]
    torch.manual_seed(7)
    default.append(three(None))
    for first, again in (given, default):
        assert torch.equal(first, again)
        assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = ksb.sampling.top_p(probs, 1.0, backend="triton")
    replays = []
    for _ in range(2):
        graph.replay()
        replays.append(tokens.clone())
    assert not torch.equal(replays[0], replays[1])
    assert bool(((replays[0] >= 0) & (replays[0] < 1000)).all())


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
