"""GPU: a Llama-3-8B-shaped model with random weights in bfloat16 generates the same greedy tokens with
attn_implementation="ksb" as with "sdpa", and the tokens/s of both, measured in one process.

A random model's logits are nearly flat, so two correct bf16 attention kernels can pick different argmax tokens
where the top two nearly tie; after that the sequences go separate ways. Each row's tokens must therefore agree up to
its first difference, and at that step the two tokens must tie within the measured logit noise (twice the largest
prefill logit difference between the two implementations) in sdpa's own scores.

The model has Llama-3-8B's layer shape (hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocabulary 128256)
and ``KSB_GPU_LAYERS`` layers (default 4), to fit beside other work and start fast. Run it with ``-s`` to see the
figures:

    pytest -s -m gpu packages/integration-transformers/tests/test_gpu.py
"""

from __future__ import annotations

import os
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LAYERS = int(os.environ.get("KSB_GPU_LAYERS", "4"))
VOCAB = 128256


@pytest.fixture(scope="module")
def model():
    import transformers

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=LAYERS, num_attention_heads=32, num_key_value_heads=8,
                                      head_dim=128, rope_theta=500000.0, max_position_embeddings=8192,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        built = transformers.LlamaForCausalLM(config)
    return built.to(torch.bfloat16).eval()


def _generate(model, impl: str, ids: torch.Tensor, mask: torch.Tensor, new: int,
              scores: bool = False) -> tuple[torch.Tensor, float, tuple[torch.Tensor, ...]]:
    """(tokens, seconds, per-step logits when ``scores``) of one greedy generation, timed after the GPU is idle."""
    model.set_attn_implementation(impl)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0, eos_token_id=None, output_logits=scores, return_dict_in_generate=True)
    torch.cuda.synchronize()
    return out.sequences[:, ids.shape[1]:], time.perf_counter() - start, out.logits or ()


def _first_differences_are_ties(ours: torch.Tensor, theirs: torch.Tensor, their_logits: tuple[torch.Tensor, ...],
                                noise: float) -> tuple[int, list[str]]:
    """(identical rows, one line per row that differs at a step where the two tokens do not tie within ``noise``
    in ``their_logits``)."""
    identical, bad = 0, []
    for row in range(ours.shape[0]):
        differ = (ours[row] != theirs[row]).nonzero()
        if differ.numel() == 0:
            identical += 1
            continue
        step = int(differ[0])
        scores = their_logits[step][row].float()
        gap = float(scores[theirs[row, step]] - scores[ours[row, step]])
        if gap > noise:
            bad.append(f"row {row} step {step}: token {int(ours[row, step])} where sdpa's {int(theirs[row, step])} "
                       f"leads by {gap:.3f} > noise {noise:.3f}")
    return identical, bad


def _batch(batch: int, length: int, pads: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), device="cuda", generator=g)
    mask = torch.ones_like(ids)
    for b, n in enumerate(pads):
        ids[b, :n], mask[b, :n] = 0, 0
    return ids, mask


def test_greedy_tokens_match_sdpa_and_speed(model):
    import kernel_switchboard_transformers  # noqa: F401  (registers "ksb")

    ids, mask = _batch(4, 256, [0, 17, 64, 130], seed=1)  # left-padded: the gather path
    with torch.no_grad():
        logits = {}
        for impl in ("sdpa", "ksb"):
            model.set_attn_implementation(impl)
            logits[impl] = model(ids, attention_mask=mask).logits.float()[mask.bool()]
    diff = (logits["ksb"] - logits["sdpa"]).abs().max().item()
    err = diff / logits["sdpa"].abs().max().item()
    print(f"\nprefill logits, ksb vs sdpa: max |diff| / max |logit| = {err:.2e} (bf16, {LAYERS} layers)")
    assert err < 2e-2

    sdpa, _, sdpa_logits = _generate(model, "sdpa", ids, mask, 32, scores=True)
    ksb, _, _ = _generate(model, "ksb", ids, mask, 32)
    identical, bad = _first_differences_are_ties(ksb, sdpa, sdpa_logits, 2 * diff)
    print(f"greedy, left-padded batch of 4 x 32 new tokens: {identical}/4 rows identical; every other row first "
          f"differs where sdpa's two candidates tie within {2 * diff:.3f}" if not bad else "\n".join(bad))
    assert not bad
    tokens = {"sdpa": sdpa, "ksb": ksb}

    for batch, length, new in ((1, 512, 128), (16, 1024, 128)):
        ids, mask = _batch(batch, length, [], seed=2)
        rate = {}
        for impl in ("sdpa", "ksb"):
            _generate(model, impl, ids, mask, 4)  # warm-up: kernel compilation, allocator
            out, seconds, _ = _generate(model, impl, ids, mask, new)
            rate[impl] = batch * new / seconds
            tokens[impl] = out
        same = int((tokens["ksb"] == tokens["sdpa"]).all(1).sum())
        print(f"batch {batch:3d}, prompt {length}, {new} new tokens: sdpa {rate['sdpa']:8.1f} tok/s, "
              f"ksb {rate['ksb']:8.1f} tok/s ({rate['ksb'] / rate['sdpa']:.2f}x); {same}/{batch} rows identical")
