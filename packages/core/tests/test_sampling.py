"""Sampling reference kernels against independent formulations, the statistical checks, and the sampling API."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases import sampling as cases

OPS = ("sampling.top_k_top_p", "sampling.renorm", "sampling.chain_speculative")
test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=OPS)

if torch.cuda.is_available():  # the large (model-sized) cases on the GPU; built only where a GPU is
    test_reference_conformance_gpu = conformance_test("reference", device="cuda", size="large", ops=OPS)


# -- independent formulations --------------------------------------------------------------------
def _enumerated(p: list[float], top_k: int | None, top_p: float | None, min_p: float | None) -> list[float]:
    """Filtered distribution of one row by brute force: ranks by counting, top-p by enumerating subsets."""
    v = len(p)
    keep = [x > 0 for x in p]
    if top_k:
        keep = [k and sum(q > x for q in p) < top_k for k, x in zip(keep, p)]
    if top_p is not None:
        alive = [i for i in range(v) if keep[i]]
        mass = sum(p[i] for i in alive)
        best: tuple[int, float, tuple[int, ...]] | None = None
        for r in range(1, len(alive) + 1):
            for sub in itertools.combinations(alive, r):
                m = sum(p[i] for i in sub)
                if m >= top_p * mass and (best is None or (r, -m) < (best[0], -best[1])):
                    best = (r, m, sub)
            if best is not None:
                break
        assert best is not None
        keep = [i in best[2] for i in range(v)]
    if min_p is not None:
        top = max(p)
        keep = [k and x >= min_p * top for k, x in zip(keep, p)]
    w = [x if k else 0.0 for x, k in zip(p, keep)]
    return [x / sum(w) for x in w]


def _vllm_style(p: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """The usual sort-ascending formulation (vLLM's apply_top_k_top_p), float64."""
    p = p.double()
    asc, idx = p.sort(-1)
    if top_k:
        asc = asc.masked_fill(torch.arange(p.shape[-1]) < p.shape[-1] - top_k, 0.0)
    if top_p is not None:
        q = asc / asc.sum(-1, keepdim=True)
        below = q.cumsum(-1) <= 1 - top_p
        below[:, -1] = False
        asc = asc.masked_fill(below, 0.0)
    out = torch.zeros_like(p).scatter(-1, idx, asc)
    return out / out.sum(-1, keepdim=True)


def _random_rows(n: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, v, generator=g) * 1.5, -1)


@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(None, 0.6, None), (3, None, None), (4, 0.7, None),
                                                       (None, None, 0.2), (5, 0.9, 0.1), (1, 0.5, 0.5)])
def test_renorm_matches_enumeration(top_k: int | None, top_p: float | None, min_p: float | None) -> None:
    probs = _random_rows(12, 7, seed=1)
    got = ksb.sampling.renorm(probs, top_k, top_p, min_p)
    want = torch.tensor([_enumerated(row, top_k, top_p, min_p) for row in probs.double().tolist()], dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cases.target_distribution(probs, top_k, top_p, min_p), want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.9), (20, None), (50, 0.8)])
def test_renorm_matches_sort_formulation(top_k: int | None, top_p: float | None) -> None:
    probs = _random_rows(16, 300, seed=2)
    torch.testing.assert_close(ksb.sampling.renorm(probs, top_k, top_p).double(), _vllm_style(probs, top_k, top_p),
                               atol=1e-6, rtol=1e-5)


def test_per_row_params_equal_row_by_row_calls() -> None:
    probs = _random_rows(5, 40, seed=3)
    k = torch.tensor([0, 3, 7, 40, 1])
    p = torch.tensor([0.5, 1.0, 0.8, 0.3, 0.9], dtype=torch.float64)
    m = torch.tensor([0.0, 0.1, 0.05, 0.2, 0.0])
    got = ksb.sampling.renorm(probs, k, p, m)
    for i in range(5):
        want = ksb.sampling.renorm(probs[i:i + 1], int(k[i]), float(p[i]), float(m[i]))
        torch.testing.assert_close(got[i:i + 1], want)


def test_temperature_and_masked_logits() -> None:
    logits = torch.randn(6, 30)
    logits[:, :10] = float("-inf")  # masked tokens
    t = torch.tensor([0.5, 1.0, 2.0, 0.7, 1.3, 0.9])
    tokens = ksb.sampling.top_k_top_p(logits, 5, 0.9, is_logits=True, temperature=t)
    assert bool((tokens >= 10).all())
    expect = cases.target_distribution(logits, 5, 0.9, None, True, t)
    assert bool((expect.gather(1, tokens[:, None]) > 0).all())
    greedy = ksb.sampling.top_k(logits, 1, is_logits=True, temperature=0.3)
    assert torch.equal(greedy, logits.argmax(-1))


# -- statistics ----------------------------------------------------------------------------------
def test_sampler_check_accepts_the_reference_and_rejects_biased_samplers() -> None:
    probs = _random_rows(3, 12, seed=4).repeat_interleave(2000, 0)
    target = cases.target_distribution(probs[::2000], 6, 0.8)
    check = cases.sampler_check(target, 2000, 2)
    check(lambda backend=None: ksb.sampling.top_k_top_p(probs, 6, 0.8))  # passes
    with pytest.raises(AssertionError, match="filtered-out"):  # ignores top-p
        check(lambda backend=None: ksb.sampling.top_k_top_p(probs, 6, None))
    tilted = probs * torch.linspace(1.0, 1.3, 12)  # same support, distribution off by up to 30%
    with pytest.raises(AssertionError, match="chi-square"):
        check(lambda backend=None: ksb.sampling.top_k_top_p(tilted, 6, 0.8))


def test_chi_square_pvalue_behaves() -> None:
    expected = torch.tensor([[250.0, 250.0, 500.0]])
    assert cases.chi_square_pvalue(expected.clone(), expected) == pytest.approx(1.0)
    assert cases.chi_square_pvalue(torch.tensor([[300.0, 200.0, 500.0]]), expected) < 1e-3


def test_generator_reproducible_and_deterministic() -> None:
    probs = _random_rows(64, 50, seed=5)
    g = torch.Generator()
    a = ksb.sampling.top_p(probs, 0.9, generator=g.manual_seed(7), deterministic=True)
    b = ksb.sampling.top_p(probs, 0.9, generator=g.manual_seed(7), deterministic=True)
    c = ksb.sampling.top_p(probs, 0.9, generator=g.manual_seed(8), deterministic=True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    problem = ksb.explain("sampling.top_p", probs, 0.9, generator=g, deterministic=True).problem
    assert {"generator", "deterministic"} <= problem.features


def test_conveniences_call_the_same_op() -> None:
    probs = _random_rows(4, 20, seed=6)
    g = torch.Generator()
    assert torch.equal(ksb.sampling.min_p(probs, 0.3, generator=g.manual_seed(1)),
                       ksb.sampling.top_k_top_p(probs, None, None, min_p=0.3, generator=g.manual_seed(1)))
    assert torch.equal(ksb.sampling.sample(probs, generator=g.manual_seed(2)),
                       ksb.sampling.top_k_top_p(probs, generator=g.manual_seed(2)))


# -- invalid rows --------------------------------------------------------------------------------
def _bad_probs() -> tuple[torch.Tensor, torch.Tensor]:
    """(clean rows, the same rows with rows 1-5 made invalid in each way probabilities can be)."""
    clean = _random_rows(8, 16, seed=7)
    bad = clean.clone()
    bad[1, 4] = float("nan")
    bad[2, 5] = float("inf")
    bad[3, 6] = float("-inf")
    bad[4, 7] = -1e-3
    bad[5] = 0.0
    return clean, bad


@pytest.mark.parametrize("kwargs", [{}, {"top_k": 3}, {"top_p": 0.5}, {"top_k": 3, "top_p": 0.5, "min_p": 0.1}])
def test_invalid_rows_get_the_sentinel_and_leave_the_others_alone(kwargs: dict[str, object]) -> None:
    clean, bad = _bad_probs()
    g = torch.Generator()
    tokens = ksb.sampling.top_k_top_p(bad, **kwargs, generator=g.manual_seed(5))
    want = ksb.sampling.top_k_top_p(clean, **kwargs, generator=g.manual_seed(5))
    assert tokens.tolist() == [want[0].item(), -1, -1, -1, -1, -1, *want[6:].tolist()]
    assert ksb.sampling.INVALID == -1
    renormed = ksb.sampling.renorm(bad, kwargs.get("top_k"), kwargs.get("top_p"), kwargs.get("min_p"))
    assert bool(renormed[1:6].isnan().all())
    torch.testing.assert_close(renormed[[0, 6, 7]], ksb.sampling.renorm(clean[[0, 6, 7]], kwargs.get("top_k"),
                                                                       kwargs.get("top_p"), kwargs.get("min_p")))


def test_invalid_logit_rows_and_parameters() -> None:
    logits = torch.randn(9, 16, generator=torch.Generator().manual_seed(3))
    logits[1, 2] = float("nan")
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    logits[4, :15] = float("-inf")  # one finite logit: valid, and that token is certain
    temperature = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, -1.0, float("inf"), float("nan")])
    tokens = ksb.sampling.top_k_top_p(logits, is_logits=True, temperature=temperature)
    assert tokens[1:4].tolist() == [-1, -1, -1] and int(tokens[4]) == 15 and tokens[5:].tolist() == [-1] * 4
    assert 0 <= int(tokens[0]) < 16
    probs = _random_rows(4, 16, seed=8)
    for name, values in (("top_k", torch.tensor([2, -1, -5, -(2**40)])), ("top_p", torch.tensor([0.5, 0.0, 1.5, -1.0])),
                         ("min_p", torch.tensor([0.1, -0.1, 1.5, float("nan")]))):
        tokens = ksb.sampling.top_k_top_p(probs, **{name: values})
        assert tokens[1:].tolist() == [-1, -1, -1] and int(tokens[0]) >= 0, name
        assert bool(ksb.sampling.renorm(probs, **{name: values})[1:].isnan().all()), name


def test_chain_invalid_rows_get_the_sentinel_and_leave_the_others_alone() -> None:
    g = torch.Generator().manual_seed(4)
    b, n, v = 8, 3, 12
    draft = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    target = torch.softmax(torch.randn(b, n + 1, v, generator=g), -1)
    ids = torch.multinomial(draft.view(-1, v), 1, generator=g).view(b, n)
    bad_d, bad_t, bad_ids = draft.clone(), target.clone(), ids.clone()
    bad_d[1, 2, 0] = float("nan")
    bad_t[2, n, 5] = -0.5  # the bonus position counts, reached or not
    bad_t[3, 0] = 0.0
    bad_ids[4, 1] = v
    bad_ids[5, 0] = -1
    got = ksb.sampling.chain_speculative(bad_d, bad_ids, bad_t, generator=g.manual_seed(1))
    want = ksb.sampling.chain_speculative(draft, ids, target, generator=g.manual_seed(1))
    ok = torch.tensor([True, False, False, False, False, False, True, True])
    for t, w in zip(got, want):
        assert torch.equal(t[ok], w[ok])
    assert bool((got[0][~ok] == -1).all()) and not bool(got[1][~ok].any()) and not bool(got[2][~ok].any())
    assert torch.equal(ksb.sampling.speculative_invalid_rows(bad_d, bad_ids, bad_t), ~ok)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_out_and_invalid_token_are_what_the_kernel_writes(dtype: torch.dtype) -> None:
    """``out`` receives the same draw as the default call, in its dtype, with ``invalid_token`` on the invalid rows;
    the call returns ``out`` itself, eagerly and under torch.compile."""
    _, bad = _bad_probs()
    g = torch.Generator()
    want = ksb.sampling.top_k_top_p(bad, 3, 0.5, generator=g.manual_seed(5))
    out = torch.full((8,), 123, dtype=dtype)
    got = ksb.sampling.top_k_top_p(bad, 3, 0.5, generator=g.manual_seed(5), out=out, invalid_token=0)
    assert got is out and got.dtype == dtype
    assert got.tolist() == torch.where(want < 0, 0, want).tolist() and want[1:6].tolist() == [-1] * 5
    assert ksb.sampling.top_p(bad, 0.9, out=out, invalid_token=-7)[1:6].tolist() == [-7] * 5

    logits = bad.log()

    def f(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return ksb.sampling.top_k_top_p(x, 1, None, is_logits=True, out=buf, invalid_token=9)

    buf = torch.zeros(8, dtype=dtype)
    compiled = torch.compile(f, fullgraph=True)(logits, buf)
    assert compiled.dtype == dtype and compiled.tolist() == f(logits, torch.zeros(8, dtype=dtype)).tolist()
    assert buf.tolist() == compiled.tolist() and compiled[1:6].tolist() == [9] * 5


def test_out_and_invalid_token_refused_by_name() -> None:
    probs = _random_rows(4, 16, seed=9)
    err = ksb.InvalidArgumentError
    for kwargs, match in (({"out": torch.zeros(4)}, r"^out\.dtype="), ({"out": torch.zeros(5, dtype=torch.int64)},
                          r"^out\.shape=\(5,\)"), ({"out": torch.zeros(4, 2, dtype=torch.int64)[:, 0]}, r"^out\.stride="),
                          ({"out": [0, 0, 0, 0]}, r"^out='list'"), ({"invalid_token": True}, r"^invalid_token=True"),
                          ({"invalid_token": 2**31}, r"^invalid_token=2147483648"), ({"invalid_token": 0.0}, "invalid_token")):
        with pytest.raises(err, match=match):
            ksb.sampling.top_p(probs, 0.9, **kwargs)


def test_flashinfer_layer_gives_invalid_rows_id_zero() -> None:
    """FlashInfer's contract for a row it cannot sample: id 0 (valid False); the layer maps the sentinel to it."""
    from kernel_switchboard import flashinfer

    _, bad = _bad_probs()
    g = torch.Generator().manual_seed(6)
    tokens, valid = flashinfer.top_p_sampling_from_probs(bad, 0.9, return_valid=True, generator=g)
    assert tokens.dtype == torch.int32 and valid.tolist() == [True] + [False] * 5 + [True, True]
    assert tokens[1:6].tolist() == [0] * 5 and bool((tokens >= 0).all())
    ids = flashinfer.top_k_top_p_sampling_from_probs(bad, 3, 0.5, indices=torch.arange(8), filter_apply_order="joint")
    assert ids.dtype == torch.int64 and ids[1:6].tolist() == [0] * 5
    with pytest.raises(ksb.InvalidArgumentError, match=r"bad data in row 1"):
        flashinfer.sampling_from_probs(bad, check_nan=True)


def _checked_raises(fn: object, *args: object, **kwargs: object) -> bool:
    try:
        fn(*args, check_nan=True, **kwargs)  # type: ignore[operator]
    except ksb.InvalidArgumentError:
        return True
    return False


def test_check_nan_raises_exactly_where_the_default_gives_sentinels() -> None:
    """One definition: ``check_nan=True`` refuses a call iff the default call answers some row with the sentinel."""
    clean, bad = _bad_probs()
    for i in range(8):
        x = clean.clone()
        x[i] = bad[i]
        for kwargs in ({}, {"top_p": torch.full((8,), 0.7)}):
            sentinel = bool((ksb.sampling.top_k_top_p(x, **kwargs) < 0).any())
            assert sentinel == _checked_raises(ksb.sampling.top_k_top_p, x, **kwargs) == (1 <= i <= 5)
            assert sentinel == bool(ksb.sampling.renorm(x, **kwargs).isnan().any())
    top_p = torch.tensor([0.5] * 7 + [0.0])
    assert bool((ksb.sampling.top_p(clean, top_p) < 0).any()) and _checked_raises(ksb.sampling.top_p, clean, top_p)


class _HostReads(TorchDispatchMode):
    """Records the aten calls that read a tensor's data back to the host (a synchronisation on a GPU)."""

    READS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        boolean_index = name == "aten::index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                      for i in (args[1] if len(args) > 1 else ()) if i is not None)
        if name in self.READS or boolean_index:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _host_reads(monkeypatch: pytest.MonkeyPatch, fn: Any) -> list[str]:
    with _HostReads() as mode:
        for method in ("tolist", "numpy", "item"):
            original = getattr(torch.Tensor, method)

            def read(self: torch.Tensor, *a: Any, _m: str = method, _f: Any = original, **k: Any) -> Any:
                mode.reads.append(f"Tensor.{_m}")
                return _f(self, *a, **k)

            monkeypatch.setattr(torch.Tensor, method, read)
        try:
            fn()
        finally:
            monkeypatch.undo()
    return mode.reads


def test_default_calls_read_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default path of every sampling op, invalid rows included, makes no device-to-host read (checked on the
    CPU through the dispatcher); ``check_nan=True`` does, which shows the detector sees one."""
    clean, bad = _bad_probs()
    logits = bad.log()
    d = torch.softmax(torch.randn(8, 2, 16), -1)
    t = torch.softmax(torch.randn(8, 3, 16), -1)
    ids = torch.randint(0, 16, (8, 2))
    ids[3, 1] = 99
    k_rows = torch.tensor([3, 0, -1, 5, 2, 2, 7, 1])
    p_rows = torch.full((8,), 0.8)
    calls = {
        "top_k_top_p": lambda: ksb.sampling.top_k_top_p(bad, k_rows, p_rows, min_p=0.05),
        "top_k": lambda: ksb.sampling.top_k(bad, 3),
        "top_p": lambda: ksb.sampling.top_p(bad, 0.9),
        "min_p": lambda: ksb.sampling.min_p(bad, 0.1),
        "sample": lambda: ksb.sampling.sample(logits, is_logits=True, temperature=torch.full((8,), 0.7)),
        "renorm": lambda: ksb.sampling.renorm(bad, k_rows, 0.9),
        "chain_speculative": lambda: ksb.sampling.chain_speculative(d, ids, t),
    }
    for name, call in calls.items():
        assert _host_reads(monkeypatch, call) == [], name
    assert _host_reads(monkeypatch, lambda: ksb.sampling.top_p(clean, 0.9, check_nan=True)) != []
    assert _host_reads(monkeypatch, lambda: clean.sum().item()) == ["Tensor.item", "aten::_local_scalar_dense"]


# -- chain speculative ---------------------------------------------------------------------------
def test_speculative_law_marginal_is_the_target() -> None:
    """Σ_d p_draft(d) · P(first token = t | d) = p_target(t): the rule's defining property, exactly."""
    g = torch.Generator().manual_seed(8)
    v, n = 9, 2
    draft = torch.softmax(torch.randn(1, n, v, generator=g), -1)
    target = torch.softmax(torch.randn(1, n + 1, v, generator=g), -1)
    ids = torch.stack([torch.tensor([d, 0]) for d in range(v)])  # every first draft token
    joint, _, _ = cases.speculative_law(draft.expand(v, n, v), ids, target.expand(v, n + 1, v))
    first = joint[:, 0] + torch.stack([joint[d, 1:, :].sum() * torch.eye(v, dtype=torch.float64)[d] for d in range(v)])
    marginal = (draft[0, 0].double().unsqueeze(-1) * first).sum(0)
    torch.testing.assert_close(marginal, target[0, 0].double(), atol=1e-12, rtol=1e-9)


def test_chain_first_token_follows_target_with_fresh_drafts() -> None:
    g = torch.Generator().manual_seed(9)
    v, n, reps = 10, 3, 3000
    draft = torch.softmax(torch.randn(1, n, v, generator=g) * 1.5, -1).expand(reps, n, v).contiguous()
    target = torch.softmax(torch.randn(1, n + 1, v, generator=g) * 1.5, -1).expand(reps, n + 1, v).contiguous()
    counts = torch.zeros(1, v, dtype=torch.float64)
    for _ in range(3):
        ids = torch.multinomial(draft.view(-1, v), 1, generator=g).view(reps, n)
        tokens, _, _ = ksb.sampling.chain_speculative(draft, ids, target, generator=g)
        counts[0] += torch.bincount(tokens[:, 0], minlength=v).double()
    assert cases.chi_square_pvalue(counts, target[:1, 0].double() * counts.sum()) > 1e-3


def test_chain_corner_cases_exact() -> None:
    g = torch.Generator().manual_seed(10)
    b, n, v = 50, 4, 12
    draft = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    ids = torch.multinomial(draft.view(-1, v), 1, generator=g).view(b, n)
    target = torch.softmax(torch.randn(b, n + 1, v, generator=g), -1)
    same = target.clone()
    same[:, :n] = draft
    tokens, accepted, emitted = ksb.sampling.chain_speculative(draft, ids, same, generator=g)
    assert torch.equal(tokens[:, :n], ids) and bool((accepted == n).all()) and bool((emitted == n).all())
    none = target.clone()
    none[:, :n].scatter_(-1, ids.unsqueeze(-1), 0.0)
    tokens, accepted, emitted = ksb.sampling.chain_speculative(draft, ids.to(torch.int32), none, generator=g)
    assert bool((accepted == 0).all()) and bool((emitted == 0).all()) and bool((tokens[:, 1:] == -1).all())
    assert bool((tokens[:, 0] != ids[:, 0]).all())  # the rejected draft token has no target mass


# -- bad inputs ----------------------------------------------------------------------------------
def test_bad_inputs_name_the_argument() -> None:
    probs = _random_rows(4, 16, seed=11)
    bad = probs.clone()
    bad[2, 3] = float("nan")
    err = ksb.InvalidArgumentError
    with pytest.raises(err, match=r"^x='bad data in row 2 \(1 of 4 rows bad\)' is invalid: expected probabilities"):
        ksb.sampling.top_k_top_p(bad, 3, check_nan=True)
    with pytest.raises(err, match=r"^x="):
        ksb.sampling.top_p(probs - 0.5, 0.9, check_nan=True)
    with pytest.raises(err, match=r"^x="):
        ksb.sampling.top_p(torch.full((2, 5), float("inf")), 0.9, is_logits=True, check_nan=True)
    with pytest.raises(err, match=r"^probs="):
        ksb.sampling.renorm(bad, top_p=0.5, check_nan=True)
    with pytest.raises(err, match=r"^top_k="):
        ksb.sampling.renorm(probs, torch.tensor([1, 2, -3, 4]), check_nan=True)
    with pytest.raises(err, match=r"^temperature="):
        ksb.sampling.sample(probs, is_logits=True, temperature=torch.tensor([1.0, 0.0, 1.0, 1.0]), check_nan=True)
    for kwargs, name in (({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
                         ({"top_k": 2.5}, "top_k"), ({"min_p": 2.0}, "min_p"), ({"top_p": float("nan")}, "top_p"),
                         ({"temperature": 0.5}, "temperature"), ({"top_p": torch.tensor([0.5, 0.5])}, r"top_p\.shape"),
                         ({"top_k": torch.tensor([1.0, 2, 3, 4])}, r"top_k\.dtype"),
                         ({"top_p": torch.tensor([0.5, 0.5, 2.0, 0.5])}, "top_p"),
                         ({"generator": 3}, "generator")):
        with pytest.raises(err, match=rf"^{name}"):
            ksb.sampling.top_k_top_p(probs, **kwargs, check_nan=True)
    with pytest.raises(err, match=r"^temperature"):
        ksb.sampling.top_k_top_p(probs, is_logits=True, temperature=0.0)
    with pytest.raises(err, match=r"^x\.shape"):
        ksb.sampling.top_k_top_p(probs[0], 3)
    with pytest.raises(err, match=r"^x\.dtype"):
        ksb.sampling.top_k_top_p(probs.double(), 3)


def test_chain_bad_inputs_name_the_argument() -> None:
    d = torch.softmax(torch.randn(2, 3, 8), -1)
    t = torch.softmax(torch.randn(2, 4, 8), -1)
    ids = torch.randint(0, 8, (2, 3))
    err = ksb.InvalidArgumentError
    with pytest.raises(err, match=r"^target_probs\.shape"):
        ksb.sampling.chain_speculative(d, ids, t[:, :3])
    with pytest.raises(err, match=r"^target_probs\.dtype"):
        ksb.sampling.chain_speculative(d, ids, t.half())
    with pytest.raises(err, match=r"^draft_token_ids\.shape"):
        ksb.sampling.chain_speculative(d, ids[:, :2], t)
    with pytest.raises(err, match=r"^draft_token_ids\.dtype"):
        ksb.sampling.chain_speculative(d, ids.float(), t)
    with pytest.raises(err, match=r"^draft_token_ids="):
        ksb.sampling.chain_speculative(d, ids + 8, t, check_nan=True)
    bad = t.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(err, match=r"^target_probs='bad data in row 1 \(1 of 2 rows bad\)'"):
        ksb.sampling.chain_speculative(d, ids, bad, check_nan=True)


# -- torch.compile and custom ops ----------------------------------------------------------------
def test_torch_compile_fullgraph_traces_sampling_ops() -> None:
    logits = torch.randn(6, 32)
    probs = torch.softmax(logits, -1)
    k_rows = torch.tensor([1, 1, 1, 1, 1, 1])

    def f(logits: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        greedy = ksb.sampling.top_k_top_p(logits, k_rows, 0.9, is_logits=True, temperature=0.8)
        return greedy + 1, ksb.sampling.renorm(probs, 5, 0.8) * 2

    got, want = torch.compile(f, fullgraph=True)(logits, probs), f(logits, probs)
    torch.testing.assert_close(got, want)
    assert torch.equal(want[0] - 1, logits.argmax(-1))


def test_opcheck_sampling_ops() -> None:
    probs = _random_rows(4, 16, seed=12)
    torch.library.opcheck(torch.ops.ksb.top_k_top_p.default,
                          (probs, 1, None, 0.9, None, 0.0, torch.zeros(4), 1.0, None, False, False, True, None))
    torch.library.opcheck(torch.ops.ksb.renorm.default, (probs, 3, None, 1.0, torch.full((4,), 0.7), 0.0, None, True, None))
    d = torch.softmax(torch.randn(4, 2, 16), -1)
    t = torch.cat([d, torch.eye(16)[:4].unsqueeze(1)], dim=1)  # accept all, bonus token is certain
    ids = d.argmax(-1)
    torch.library.opcheck(torch.ops.ksb.chain_speculative.default, (d, ids, t, False, True, None))


@pytest.mark.gpu
def test_reference_on_gpu_matches_cpu() -> None:
    probs = _random_rows(32, 1000, seed=13)
    torch.testing.assert_close(ksb.sampling.renorm(probs.cuda(), 50, 0.9, 0.01).cpu(), ksb.sampling.renorm(probs, 50, 0.9, 0.01))
    g = torch.Generator(device="cuda")
    a = ksb.sampling.top_k_top_p(probs.cuda(), 50, 0.9, generator=g.manual_seed(3), deterministic=True)
    b = ksb.sampling.top_k_top_p(probs.cuda(), 50, 0.9, generator=g.manual_seed(3), deterministic=True)
    assert torch.equal(a, b)
    assert bool((cases.target_distribution(probs, 50, 0.9).gather(1, a.cpu()[:, None]) > 0).all())


def test_speculative_check_rejects_wrong_rules() -> None:
    case = next(c for c in cases.cases("sampling.chain_speculative", torch.device("cpu"), "small") if c.id == "fp32-random")
    draft, ids, target = case.args
    case.check(lambda backend=None: ksb.sampling.chain_speculative(draft, ids, target))  # the reference passes

    def resample_from_target(backend: object = None) -> tuple[torch.Tensor, ...]:
        tokens, accepted, emitted = ksb.sampling.chain_speculative(draft, ids, target)
        rows = torch.arange(tokens.shape[0])
        last = torch.multinomial(target[rows, emitted.long()], 1).squeeze(-1)  # ignores the residual rule
        return tokens.scatter(1, emitted.long()[:, None], last[:, None]), accepted, emitted

    with pytest.raises(AssertionError, match=r"impossible|speculative law"):
        case.check(resample_from_target)

    def prefix_as_accepted(backend: object = None) -> tuple[torch.Tensor, ...]:
        tokens, _, emitted = ksb.sampling.chain_speculative(draft, ids, target)
        return tokens, emitted, emitted

    with pytest.raises(AssertionError, match="accepted total"):
        case.check(prefix_as_accepted)


def test_invalid_row_checks_reject_kernels_that_sample_invalid_rows() -> None:
    """The conformance cases with invalid rows fail a kernel that answers them with a token, or that answers a valid
    row with the sentinel."""
    case = next(c for c in cases.cases("sampling.top_k_top_p", torch.device("cpu"), "small")
                if c.id == "probs-fp16-topp-invalid-rows")
    assert case.check is not None
    case.check(lambda backend=None: ksb.sampling.top_k_top_p(*case.args, **case.kwargs))  # the reference passes
    with pytest.raises(AssertionError, match="invalid rows must give token -1"):
        case.check(lambda backend=None: ksb.sampling.top_k_top_p(*case.args, **case.kwargs).clamp_min(0))
    with pytest.raises(AssertionError, match="out of range"):
        case.check(lambda backend=None: torch.full((case.args[0].shape[0],), -1))
    chain = next(c for c in cases.cases("sampling.chain_speculative", torch.device("cpu"), "small")
                 if c.id == "fp32-invalid-rows")
    assert chain.check is not None
    chain.check(lambda backend=None: ksb.sampling.chain_speculative(*chain.args))

    def accepts_bad_rows(backend: object = None) -> tuple[torch.Tensor, ...]:
        tokens, accepted, emitted = ksb.sampling.chain_speculative(*chain.args)
        return tokens.clamp_min(0), accepted, emitted

    with pytest.raises(AssertionError, match="tokens all -1"):
        chain.check(accepts_bad_rows)


@pytest.mark.gpu
def test_reference_default_call_is_captured_in_a_cuda_graph() -> None:
    probs = _random_rows(16, 1000, seed=14).cuda()
    ksb.sampling.top_k_top_p(probs, 50, 0.9, backend="reference")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = ksb.sampling.top_k_top_p(probs, 50, 0.9, backend="reference")
    fresh = _random_rows(16, 1000, seed=15).cuda()
    fresh[3] = float("nan")
    probs.copy_(fresh)
    graph.replay()
    keep = ksb.sampling.renorm(fresh, 50, 0.9) > 0
    assert int(tokens[3]) == -1
    rows = torch.tensor([i for i in range(16) if i != 3], device="cuda")
    assert bool(keep[rows].gather(1, tokens[rows][:, None]).all())


@pytest.mark.parametrize("op", ["sampling.top_k_top_p", "sampling.renorm", "sampling.chain_speculative"])
def test_example_cases_run(op: str) -> None:
    cases.example(op, torch.device("cpu"), batch="8", vocab="500", draft="2", dtype="bf16").compare("reference")
