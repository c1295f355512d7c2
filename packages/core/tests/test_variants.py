"""Custom attention variants on the reference kernels: each shipped variant against an independent
dense formulation, the API's validation, and the variant's place in the problem signature."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import InvalidArgumentError
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.attention import AttnSpec, indptr, paged_kv

lib = pytest.importorskip("kernel_switchboard.variants_lib")  # the hooks are Triton functions

HQ, HKV, D = 4, 2, 16
KV_LENS = (9, 0, 14)
Q_LENS = (4, 0, 14)


def _ragged(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(Q_LENS), HQ, D, generator=g).to(dtype)
    k = torch.randn(sum(KV_LENS), HKV, D, generator=g).to(dtype)
    v = torch.randn(sum(KV_LENS), HKV, D, generator=g).to(dtype)
    return q, k, v, indptr(Q_LENS, "cpu"), indptr(KV_LENS, "cpu")


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, bias=None, keep=None, sinks=None,
           sigmoid_bias: float | None = None) -> torch.Tensor:
    """Request by request, head by head, in float64: the textbook definition of each variant."""
    out = torch.zeros(q.shape[0], HQ, D, dtype=torch.float64)
    q0 = k0 = 0
    for b, (nq, nk) in enumerate(zip(Q_LENS, KV_LENS)):
        for h in range(HQ):
            qb = q[q0:q0 + nq, h].double()
            kb, vb = k[k0:k0 + nk, h // (HQ // HKV)].double(), v[k0:k0 + nk, h // (HQ // HKV)].double()
            for i in range(nq):
                pos = nk - nq + i
                s = kb @ qb[i] / math.sqrt(D)
                allowed = [(j <= pos or not causal) for j in range(nk)]
                for j in range(nk):
                    if bias is not None:
                        s[j] += bias(b, h, pos, j)
                    if keep is not None:
                        allowed[j] = allowed[j] and keep(b, h, pos, j)
                mask = torch.tensor(allowed, dtype=torch.bool)
                if not mask.any():
                    continue
                if sigmoid_bias is not None:
                    w = torch.sigmoid(s + sigmoid_bias) * mask
                    out[q0 + i, h] = w @ vb
                    continue
                logits = s[mask]
                if sinks is not None:
                    logits = torch.cat((logits, torch.tensor([float(sinks[h])], dtype=torch.float64)))
                p = torch.softmax(logits, 0)[: int(mask.sum())]
                out[q0 + i, h] = p @ vb[mask]
        q0, k0 = q0 + nq, k0 + nk
    return out.float()


def _run(variant, args, *, causal: bool = True, **kw):
    q, k, v, qo, kvi = _ragged()
    return ksb.attention.prefill_ragged(q, k, v, qo, kvi, causal=causal, variant=variant, variant_args=args,
                                        backend="reference", **kw)


def test_alibi_matches_dense():
    slopes = lib.alibi_slopes(HQ)
    want = _dense(*_ragged()[:3], causal=True, bias=lambda b, h, i, j: float(slopes[h]) * (j - i))
    assert_close(_run(lib.ALIBI, (slopes,)), want, atol=1e-5, rtol=1e-5)


def test_soft_cap_and_window_equal_the_builtin_options():
    q, k, v, qo, kvi = _ragged()
    for variant, args, kw in ((lib.SOFT_CAP, (2.5,), {"logits_soft_cap": 2.5}),
                              (lib.SLIDING_WINDOW, (3,), {"window_left": 3})):
        got = _run(variant, args)
        want = ksb.attention.prefill_ragged(q, k, v, qo, kvi, backend="reference", **kw)
        assert_close(got, want, atol=1e-6, rtol=1e-6)
    dense = _dense(q, k, v, causal=True, keep=lambda b, h, i, j: j >= i - 3)
    assert_close(_run(lib.SLIDING_WINDOW, (3,)), dense, atol=1e-5, rtol=1e-5)


def test_sinks_match_dense():
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    want = _dense(*_ragged()[:3], causal=True, sinks=sinks)
    got, lse = _run(lib.SINKS, (sinks,), return_lse=True)
    assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain, plain_lse = _run(None, None, return_lse=True)
    assert not torch.allclose(got, plain)  # the sink takes probability mass
    assert_close(lse, plain_lse, atol=1e-6, rtol=1e-6)  # the documented lse is the one before output_mod


def test_sigmoid_matches_dense():
    want = _dense(*_ragged()[:3], causal=True, sigmoid_bias=-1.5)
    assert_close(_run(lib.SIGMOID, (-1.5,)), want, atol=1e-5, rtol=1e-5)


def test_prefix_lm_matches_dense():
    prefix = torch.tensor([5, 0, 6], dtype=torch.int32)
    want = _dense(*_ragged()[:3], causal=False, keep=lambda b, h, i, j: j <= i or j < int(prefix[b]))
    assert_close(_run(lib.PREFIX_LM, (prefix,), causal=False), want, atol=1e-5, rtol=1e-5)


def test_rel_pos_bias_matches_dense():
    table = torch.randn(HQ, 5, generator=torch.Generator().manual_seed(3))
    want = _dense(*_ragged()[:3], causal=True, bias=lambda b, h, i, j: float(table[h, min(max(i - j, 0), 4)]))
    assert_close(_run(lib.REL_POS_BIAS, (table, 4)), want, atol=1e-5, rtol=1e-5)


def test_paged_decode_and_prefill_agree_with_ragged():
    """The same variant through decode, paged prefill and ragged prefill of the same data."""
    spec = AttnSpec(torch.float32, "HND", 4, HQ, HKV, D, kv_lens=(7, 12))
    cache, table = paged_kv(torch.Generator().manual_seed(1), spec, "cpu")
    slopes = lib.alibi_slopes(HQ)
    q = torch.randn(2, HQ, D, generator=torch.Generator().manual_seed(2))
    dec = ksb.attention.decode(q, cache, table, variant=lib.ALIBI, variant_args=(slopes,), backend="reference")
    pre = ksb.attention.prefill(q, indptr((1, 1), "cpu"), cache, table, variant=lib.ALIBI, variant_args=(slopes,),
                                backend="reference")
    assert_close(dec, pre, atol=1e-6, rtol=1e-6)
    k_nhd, v_nhd = cache.nhd()
    ks = [k_nhd[table.block_table[b].long()].flatten(0, 1)[:n] for b, n in enumerate((7, 12))]
    vs = [v_nhd[table.block_table[b].long()].flatten(0, 1)[:n] for b, n in enumerate((7, 12))]
    rag = ksb.attention.prefill_ragged(q, torch.cat(ks), torch.cat(vs), indptr((1, 1), "cpu"), indptr((7, 12), "cpu"),
                                       variant=lib.ALIBI, variant_args=(slopes,), backend="reference")
    assert_close(dec, rag, atol=1e-6, rtol=1e-6)
    plan = ksb.attention.plan_decode(table, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=torch.float32,
                                     layout="HND", page_size=4, variant=lib.ALIBI, variant_args=(slopes,),
                                     backend="reference")
    assert_close(plan.run(q, cache), dec, atol=0, rtol=0)
    slopes.mul_(2)  # tensors in variant_args are read at every run
    assert not torch.allclose(plan.run(q, cache), dec)


def test_problem_keys_differ_per_variant():
    q, k, v, qo, kvi = _ragged()
    keys = set()
    for variant, args in ((None, None), (lib.ALIBI, (lib.alibi_slopes(HQ),)), (lib.SOFT_CAP, (2.0,)),
                          (lib.SINKS, (torch.zeros(HQ),))):
        sel = ksb.explain("attention.prefill_ragged", q, k, v, qo, kvi, variant=variant, variant_args=args)
        assert ("custom_variant" in sel.problem.features) == (variant is not None)
        assert sel.problem.variant == (None if variant is None else variant.key)
        keys.add(sel.problem)
    assert len(keys) == 4
    assert "alibi" in str(ksb.explain("attention.prefill_ragged", q, k, v, qo, kvi, variant=lib.ALIBI,
                                      variant_args=(lib.alibi_slopes(HQ),)))


def test_variant_key_is_stable_and_names_hooks():
    assert lib.ALIBI.key.startswith("alibi[score_mod=kernel_switchboard.variants_lib._alibi_score#")
    same = ksb.Variant("alibi", score_mod=lib.ALIBI.score_mod, torch_score_mod=lib.ALIBI.torch_score_mod,
                       params=("slopes",))
    assert same == lib.ALIBI and hash(same) == hash(lib.ALIBI)
    assert lib.SIGMOID.key.endswith("softmax=False]")


def test_new_variant_in_a_few_lines():
    """A per-request temperature, defined here: reference output equals scaling sm_scale per request."""
    import triton

    @triton.jit
    def temp_score(s, q_pos, kv_pos, head, batch, args):
        return s / triton.language.load(args[0] + batch)

    temperature = ksb.Variant("temperature", score_mod=temp_score, params=("temperature",),
                              torch_score_mod=lambda s, q_pos, kv_pos, head, batch, args: s / args[0][batch])
    q, k, v, qo, kvi = _ragged()
    temps = torch.tensor([0.5, 1.0, 2.0])
    got = ksb.attention.prefill_ragged(q, k, v, qo, kvi, variant=temperature, variant_args=(temps,),
                                       backend="reference")
    for b in (0, 2):
        rows = slice(int(qo[b]), int(qo[b + 1]))
        one = ksb.attention.prefill_ragged(q[rows], k[int(kvi[b]):int(kvi[b + 1])], v[int(kvi[b]):int(kvi[b + 1])],
                                           indptr((Q_LENS[b],), "cpu"), indptr((KV_LENS[b],), "cpu"),
                                           sm_scale=1 / math.sqrt(D) / float(temps[b]), backend="reference")
        assert_close(got[rows], one, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"variant": "alibi", "variant_args": ()}, "variant"),
    ({"variant": None, "variant_args": (1.0,)}, "variant_args"),
    ({"variant": lib.ALIBI, "variant_args": ()}, "variant_args"),
    ({"variant": lib.ALIBI, "variant_args": ("x",)}, "variant_args[slopes]"),
    ({"variant": lib.ALIBI, "variant_args": (torch.zeros(8, 2)[:, 0],)}, "variant_args[slopes]"),
])
def test_bad_variant_arguments(kwargs, name):
    q, k, v, qo, kvi = _ragged()
    with pytest.raises(InvalidArgumentError, match=name.replace("[", r"\[")):
        ksb.attention.prefill_ragged(q, k, v, qo, kvi, **kwargs)


def test_bad_variant_definitions():
    with pytest.raises(InvalidArgumentError, match="torch_score_mod"):
        ksb.Variant("x", score_mod=lib.ALIBI.score_mod)
    with pytest.raises(InvalidArgumentError, match="name"):
        ksb.Variant("not a name", softmax=False)
    with pytest.raises(InvalidArgumentError, match="Variant"):
        ksb.Variant("nothing")
    with pytest.raises(InvalidArgumentError, match="params"):
        ksb.Variant("x", softmax=False, params="slopes")


def test_variant_under_torch_compile():
    """Variant calls run eagerly inside a compiled function (a graph break, not a custom op)."""
    spec = AttnSpec(torch.float32, "NHD", 16, HQ, HKV, D, kv_lens=(13, 5))
    cache, table = paged_kv(torch.Generator().manual_seed(0), spec, "cpu")
    q = torch.randn(2, HQ, D, generator=torch.Generator().manual_seed(1))
    slopes = lib.alibi_slopes(HQ)

    def step(x):
        return ksb.attention.decode(x, cache, table, variant=lib.ALIBI, variant_args=(slopes,)) * 2

    assert_close(torch.compile(step, backend="eager")(q), step(q), atol=0, rtol=0)
