"""Speculative decoding: a draft model proposes ``n`` tokens, the target verifies them in one pass,
and ``sampling.chain_speculative`` decides what is kept.

One round for every active request:

1. the draft feeds the tokens it has not seen (the last committed ones) and then its own proposals,
   one decode step at a time, drawing ``d_1..d_n`` from its distributions ``q_1..q_n``;
2. the target feeds its unseen tokens plus ``d_1..d_n`` in one prefill-style step and returns the
   logits of the last ``n + 1`` positions, ``p_1..p_{n+1}``;
3. ``chain_speculative(q, d, p)`` accepts a prefix of the drafts and draws one more token (the
   correction at the first rejection, or the bonus after ``n`` acceptances);
4. both caches are truncated back to the tokens that are now committed (pages past them are freed).

Distributions are ``softmax(logits / temperature)``; ``temperature == 0`` uses one-hot argmax
distributions, so the output is exactly the target's greedy continuation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_switchboard.dispatch import use
from kernel_switchboard.errors import fail

from . import calls
from .cache import BlockTables, build_batch
from .sampling import probs


@dataclass
class SpecStats:
    """Totals over the rounds run: drafts proposed, drafts emitted, tokens produced."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.emitted / self.proposed if self.proposed else 0.0


@dataclass
class _Seq:
    rid: int
    tokens: list[int]
    prompt_len: int
    max_new: int
    draft_drafts: list[int] = field(default_factory=list)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class SpeculativeDecoder:
    """Target + draft models (same vocabulary), each with its own paged cache.

    ``num_draft``: tokens proposed per round; ``temperature``: 0 = greedy; ``generator`` seeds
    the draft draws and the verification.
    """

    def __init__(self, target: Any, draft: Any, *, num_draft: int = 4, num_pages: int = 256, page_size: int = 16,
                 temperature: float = 0.0, generator: torch.Generator | None = None,
                 backends: Sequence[str] = ()) -> None:
        if target.spec.vocab_size != draft.spec.vocab_size:
            raise fail("draft.spec.vocab_size", draft.spec.vocab_size, f"the target's ({target.spec.vocab_size})")
        if not (isinstance(num_draft, int) and num_draft >= 1):
            raise fail("num_draft", num_draft, "an int >= 1")
        if not (isinstance(temperature, (int, float)) and temperature >= 0):
            raise fail("temperature", temperature, "a float >= 0 (0 = greedy)")
        self.target, self.draft = target, draft
        self.num_draft, self.temperature, self.generator = num_draft, float(temperature), generator
        self.backends = tuple(backends)
        self.t_tables = BlockTables(num_pages, page_size, target.device)
        self.d_tables = BlockTables(num_pages, page_size, draft.device)
        self.t_cache = target.new_cache(num_pages, page_size)
        self.d_cache = draft.new_cache(num_pages, page_size)
        self.stats = SpecStats()

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """``max_new_tokens`` tokens for each prompt (rounds overshooting the limit are cut)."""
        seqs = [_Seq(i, [int(t) for t in p], len(p), max_new_tokens) for i, p in enumerate(prompts)]
        active = list(seqs)
        with torch.no_grad(), use(*self.backends):
            while active:
                self.round(active)
                for s in [s for s in active if s.generated >= s.max_new]:
                    self.t_tables.free(s.rid)
                    self.d_tables.free(s.rid)
                    active.remove(s)
        return [s.tokens[s.prompt_len: s.prompt_len + s.max_new] for s in seqs]

    # -- one round ---------------------------------------------------------------------------------
    def round(self, seqs: list[_Seq]) -> None:
        """Propose, verify and commit once for every sequence."""
        n = self.num_draft
        rids = [s.rid for s in seqs]
        draft_ids, draft_probs = self._propose(seqs)
        # target: unseen committed tokens + the n drafts, logits of the last n + 1 positions
        t_new = [s.tokens[self.t_tables.length(s.rid):] + draft_ids[i] for i, s in enumerate(seqs)]
        for rid, toks in zip(rids, t_new):
            self.t_tables.extend(rid, len(toks))
        batch = build_batch(self.t_tables, rids, t_new, [n + 1] * len(seqs))
        t_logits = self.target.forward(batch, self.t_cache).view(len(seqs), n + 1, -1)
        target_probs = probs(t_logits, self.temperature)
        d_ids = torch.tensor(draft_ids, dtype=torch.int64, device=t_logits.device)
        out, accepted, emitted = calls.chain_speculative(draft_probs.to(t_logits.device), d_ids, target_probs,
                                                         self.generator)
        out_rows = out.tolist()
        # a row of the chain with invalid distributions emits nothing (every token -1); a valid one emits at least one
        calls.check_sampled([row[0] for row in out_rows], "speculative verification")
        for i, s in enumerate(seqs):
            new = [t for t in out_rows[i] if t >= 0]
            committed = len(s.tokens)
            s.tokens.extend(new)
            # KV is valid for the committed tokens and the drafts that were kept
            self.t_tables.truncate(s.rid, committed + len(new) - 1)
            self.d_tables.truncate(s.rid, min(self.d_tables.length(s.rid), committed + len(new) - 1))
        self.stats.rounds += 1
        self.stats.proposed += n * len(seqs)
        self.stats.accepted += int(accepted.sum())
        self.stats.emitted += int(emitted.sum())
        self.stats.tokens += sum(len([t for t in row if t >= 0]) for row in out_rows)

    def _propose(self, seqs: list[_Seq]) -> tuple[list[list[int]], torch.Tensor]:
        """Draft tokens (B, n) as lists and their distributions (B, n, V) float32."""
        rids = [s.rid for s in seqs]
        feed = [s.tokens[self.d_tables.length(s.rid):] for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        dists = []
        for _ in range(self.num_draft):
            for rid, toks in zip(rids, feed):
                self.d_tables.extend(rid, len(toks))
            logits = self.draft.forward(build_batch(self.d_tables, rids, feed, ["last"] * len(seqs)), self.d_cache)
            q = probs(logits, self.temperature)
            if self.temperature == 0:
                tok = torch.argmax(logits, dim=-1)
            else:
                tok = calls.top_k_top_p(logits.float(), None, None, self.temperature, self.generator)
            dists.append(q)
            toks_host = calls.check_sampled(tok.tolist(), "draft sampling")
            for i, t in enumerate(toks_host):
                drafts[i].append(int(t))
            feed = [[int(t)] for t in toks_host]
        return drafts, torch.stack(dists, dim=1)
