"""Shared checks of the engine's models against transformers' eager forward (float32, CPU, reference kernels)."""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard_engine.cache import BlockTables, build_batch

TOL = dict(rtol=1e-4, atol=1e-4)


@torch.no_grad()
def hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), vocab) logits of transformers' eager forward over the whole sequence."""
    return hf(torch.tensor([tokens])).logits[0]


def prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def prefill_matches(hf: torch.nn.Module, model: Any, seqs: list[list[int]]) -> tuple[BlockTables, Any]:
    """Prefill every prompt in one batch (pages of 4 tokens) and compare each prompt's logits with transformers';
    returns the block tables and the cache, holding the prompts."""
    tables = BlockTables(num_pages=32, page_size=4)
    cache = model.new_cache(32, 4)
    rids = list(range(len(seqs)))
    for r, p in zip(rids, seqs):
        tables.extend(r, len(p))
    logits = model.forward(build_batch(tables, rids, seqs, ["all"] * len(rids)), cache)
    off = 0
    for p in seqs:
        torch.testing.assert_close(logits[off: off + len(p)], hf_logits(hf, p), **TOL)
        off += len(p)
    return tables, cache


@torch.no_grad()
def decode_steps_match(hf: torch.nn.Module, model: Any, tables: BlockTables, cache: Any, seqs: list[list[int]],
                       steps: int, seed: int = 3) -> None:
    """``steps`` decode steps of random tokens after the prompts in ``seqs`` (extended in place), each request's
    logits compared with transformers' over its whole sequence."""
    rids = list(range(len(seqs)))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        new = torch.randint(0, 128, (len(rids),), generator=g).tolist()
        for r in rids:
            tables.extend(r, 1)
        batch = build_batch(tables, rids, [[t] for t in new], ["last"] * len(rids))
        assert batch.is_decode
        step = model.forward(batch, cache)
        for r in rids:
            seqs[r].append(new[r])
            torch.testing.assert_close(step[r], hf_logits(hf, seqs[r])[-1], **TOL)
