"""Continuous batching: every step mixes the running requests' decode tokens with prefill chunks.

Each :meth:`Engine.step`:

1. every running request that has caught up with its tokens feeds its last token (decode);
2. requests still prefilling feed their next chunk, and waiting requests are admitted (first come,
   first served) while the step's token budget and the free pages allow; an admitted request first
   shares the full pages of the longest common prefix with a live request (``prefix_sharing``);
3. a request that cannot get a page for its decode token preempts the most recently admitted
   request (its pages are freed, it goes back to the front of the queue and is recomputed later);
4. one forward pass runs the whole mix (``attention.prefill`` with one ``qo_indptr``); a step of
   decode tokens only goes through :class:`~kernel_switchboard_engine.graphs.DecodeRunner`
   (eager, ``torch.compile`` or CUDA graph);
5. requests whose tokens are all in the cache sample their next token; finished ones free their pages.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_switchboard.errors import fail

from . import calls
from .cache import BlockTables, OutOfPagesError, build_batch
from .graphs import DecodeRunner
from .sampling import SamplingParams, sample


@dataclass
class Request:
    """One generation request and its progress."""

    rid: int
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    #: tokens whose KV is in the cache
    computed: int = 0
    finished: bool = False
    finish_reason: str | None = None
    arrival: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class StepReport:
    """What one step did."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_requests: int = 0
    decode_requests: int = 0
    preempted: int = 0
    shared_tokens: int = 0
    finished: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mixed(self) -> bool:
        return self.prefill_requests > 0 and self.decode_requests > 0


class Engine:
    """A paged-KV continuous-batching engine over one model (:class:`LlamaModel` or :class:`DeepseekModel`).

    ``num_pages`` x ``page_size`` tokens of KV; ``max_step_tokens`` bounds the tokens of one step
    (prompts longer than the budget are prefilled in chunks); ``max_running`` bounds the batch.
    ``decode_mode``: ``"eager"``, ``"compile"`` or ``"cuda_graph"`` for decode-only steps.
    ``backends``: a preference list applied with ``ksb.use`` around every step.
    """

    def __init__(self, model: Any, *, num_pages: int = 256, page_size: int = 16, max_step_tokens: int = 256,
                 max_running: int = 32, prefix_sharing: bool = True, decode_mode: str = "eager",
                 max_pages_per_request: int | None = None, backends: Sequence[str] = (),
                 generator: torch.Generator | None = None) -> None:
        if not (isinstance(max_step_tokens, int) and max_step_tokens >= 1):
            raise fail("max_step_tokens", max_step_tokens, "an int >= 1")
        if not (isinstance(max_running, int) and max_running >= 1):
            raise fail("max_running", max_running, "an int >= 1")
        self.model = model
        self.tables = BlockTables(num_pages, page_size, model.device, reserved_pages=1)
        self.cache = model.new_cache(num_pages, page_size)
        self.max_step_tokens, self.max_running = max_step_tokens, max_running
        self.prefix_sharing = prefix_sharing
        self.backends = tuple(backends)
        self.generator = generator
        self.width = max_pages_per_request or num_pages - 1
        #: static-shape decode steps (compile / cuda_graph); eager decode steps use the exact page table
        self.decoder = None if decode_mode == "eager" else DecodeRunner(
            model, self.cache, self.tables, mode=decode_mode, max_batch=max_running, width=self.width)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self._ids = itertools.count()
        self.history: list[StepReport] = []

    # -- requests ----------------------------------------------------------------------------------
    def add(self, prompt: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a request; returns its id."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise fail("prompt", prompt, "at least one token")
        vocab = self.model.spec.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise fail("prompt", f"token ids in [{min(prompt)}, {max(prompt)}]", f"ids in [0, {vocab})")
        params = params or SamplingParams()
        need = -(-(len(prompt) + params.max_new_tokens) // self.tables.page_size)
        if need > self.width or need > self.tables.allocator.num_pages - 1:
            raise fail("prompt", f"{len(prompt)} tokens + max_new_tokens {params.max_new_tokens}",
                       f"at most {min(self.width, self.tables.allocator.num_pages - 1)} pages of "
                       f"{self.tables.page_size} tokens per request")
        rid = next(self._ids)
        self.waiting.append(Request(rid, prompt, params, arrival=rid))
        return rid

    def warmup(self) -> None:
        """Compile or capture the decode step for every batch size up front (``decode_mode`` compile / cuda_graph)."""
        from kernel_switchboard.dispatch import use

        if self.decoder is not None:
            with torch.no_grad(), use(*self.backends):
                self.decoder.warmup()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[list[int]]:
        """Run these prompts to completion; returns each one's generated tokens, in order."""
        plist: list[SamplingParams | None] = (list(params) if isinstance(params, (list, tuple))
                                              else [params] * len(prompts))  # type: ignore[list-item]
        rids = [self.add(p, sp) for p, sp in zip(prompts, plist)]
        while self.has_work():
            self.step()
        return [self.finished[r].output for r in rids]

    # -- one step ----------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Schedule and run one forward step; returns its report."""
        report = StepReport()
        start = time.perf_counter()
        work = self._schedule(report)
        if work:
            from kernel_switchboard.dispatch import use

            with torch.no_grad(), use(*self.backends):
                logits = self._forward(work)
            self._advance(work, logits, report)
        report.seconds = time.perf_counter() - start
        self.history.append(report)
        return report

    def _schedule(self, report: StepReport) -> list[tuple[Request, int]]:
        """(request, new tokens) of this step; pages are allocated here."""
        work: list[tuple[Request, int]] = []
        budget = self.max_step_tokens
        for req in sorted(self.running, key=lambda r: r.arrival):
            if req not in self.running or budget == 0:
                continue
            n = min(len(req.tokens) - req.computed, budget)
            while not self._try_extend(req, n):
                victim = max((r for r in self.running if r is not req), key=lambda r: r.arrival, default=None)
                if victim is None:
                    raise OutOfPagesError(f"request {req.rid} alone needs more pages than the cache has")
                self._preempt(victim, work)
                report.preempted += 1
            work.append((req, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            shared = self._share_prefix(req) if self.prefix_sharing and req.computed == 0 else 0
            n = min(len(req.tokens) - req.computed, budget)
            if not self._try_extend(req, n):
                if shared:
                    self.tables.free(req.rid)
                    req.computed = 0
                break
            report.shared_tokens += shared
            self.waiting.popleft()
            self.running.append(req)
            work.append((req, n))
            budget -= n
        for req, n in work:
            if n == 1 and req.computed == len(req.tokens) - 1 and req.computed > 0:
                report.decode_requests += 1
                report.decode_tokens += 1
            else:
                report.prefill_requests += 1
                report.prefill_tokens += n
        return work

    def _try_extend(self, req: Request, n: int) -> bool:
        try:
            self.tables.extend(req.rid, n)
        except OutOfPagesError:
            return False
        return True

    def _preempt(self, victim: Request, work: list[tuple[Request, int]]) -> None:
        self.tables.free(victim.rid)
        victim.computed = 0
        self.running.remove(victim)
        work[:] = [(r, n) for r, n in work if r is not victim]
        self.waiting.appendleft(victim)

    def _share_prefix(self, req: Request) -> int:
        """Share the full pages of the longest common prefix with a running request's cached tokens."""
        toks = req.tokens
        best, src = 0, None
        for other in self.running:
            limit = min(other.computed, len(toks) - 1)
            n = 0
            theirs = other.tokens
            while n < limit and theirs[n] == toks[n]:
                n += 1
            if n > best:
                best, src = n, other
        if src is None or best < self.tables.page_size:
            return 0
        req.computed = self.tables.fork(src.rid, req.rid, best)
        return req.computed

    def _forward(self, work: list[tuple[Request, int]]) -> torch.Tensor:
        reqs = [r for r, _ in work]
        chunks = [r.tokens[r.computed: r.computed + n] for r, n in work]
        if self.decoder is not None and all(n == 1 and r.computed > 0 for r, n in work):
            return self.decoder([r.rid for r in reqs], [c[0] for c in chunks])
        wants = ["last" if r.computed + n == len(r.tokens) else "none" for r, n in work]
        batch = build_batch(self.tables, [r.rid for r in reqs], chunks, wants)
        logits: torch.Tensor = self.model.forward(batch, self.cache)
        return logits

    def _advance(self, work: list[tuple[Request, int]], logits: torch.Tensor, report: StepReport) -> None:
        sampled = [r for r, n in work if r.computed + n == len(r.tokens)]
        for req, n in work:
            req.computed += n
        if not sampled:
            return
        tokens = calls.check_sampled(sample(logits, [r.params for r in sampled], self.generator).tolist(), "sampling")
        for req, tok in zip(sampled, tokens):
            req.output.append(int(tok))
            if tok in req.params.stop_token_ids:
                req.finish_reason = "stop"
            elif len(req.output) >= req.params.max_new_tokens:
                req.finish_reason = "length"
            if req.finish_reason:
                req.finished = True
                self.running.remove(req)
                self.tables.free(req.rid)
                self.finished[req.rid] = req
                report.finished.append(req.rid)
