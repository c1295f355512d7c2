"""``switchboard demo``: a tiny random-weight model served end to end through the switchboard.

Builds a model of one supported family (``--model``: Llama by default, Qwen2, Qwen3, Mistral, Mixtral, Gemma 2,
Gemma 3, DeepSeek-V3) with ``transformers`` from a small random config that switches the family's features on,
takes its weights, and runs a handful of requests
through continuous batching over a paged KV cache (on the GPU when there is one, else the CPU).
Prints tokens/s and, for every op, which kernel served it and why (the dispatch record of a traced
warm-up run); optionally speculative decoding (``--speculative``) and a check against transformers
(``--check``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any

import torch

from kernel_switchboard.dispatch import Selection
from kernel_switchboard.errors import SwitchboardError

from .calls import OpTracer
from .sampling import SamplingParams
from .scheduler import Engine
from .tiny import FAMILIES

_WHY = {
    "explicit": "explicit choice (--backend / ksb.use)",
    "tuned": "autotune cache winner",
    "cost": "lowest cost estimate",
    "priority": "highest priority",
    "only": "the only eligible kernel",
}


def _int_from(low: int) -> Any:
    """An argparse ``type``: an int >= ``low``, refused before anything is built or run."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is invalid: expected an int >= {low}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchboard demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=tuple(FAMILIES), default="llama", help="model family (default llama)")
    p.add_argument("--size", choices=("tiny", "small"), default=None,
                   help="shape preset (default: tiny on the CPU, small on a GPU)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="default: float32 on the CPU, bfloat16 on a GPU")
    p.add_argument("--requests", type=_int_from(1), default=6, help="number of requests (default 6)")
    p.add_argument("--max-new-tokens", type=_int_from(1), default=32, help="tokens generated per request (default 32)")
    p.add_argument("--page-size", type=_int_from(1), default=16, help="KV page size in tokens (default 16)")
    p.add_argument("--decode-mode", choices=("auto", "eager", "compile", "cuda_graph"), default="auto",
                   help="decode-only steps: auto = cuda_graph on a GPU, eager on the CPU")
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="prefer this backend (repeatable, in order; others stay automatic)")
    p.add_argument("--speculative", type=_int_from(0), default=0, metavar="N",
                   help="also run speculative decoding with N draft tokens (draft = the target's first layer)")
    p.add_argument("--check", action="store_true", help="compare logits and greedy tokens with transformers")
    p.add_argument("--verbose", "-v", action="store_true", help="list every candidate kernel with its reasons")
    p.add_argument("--threads", type=_int_from(1), default=None,
                   help="CPU threads for torch (default: 1 for the tiny preset, whose matrices gain nothing from more)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """(transformers model or None, engine model, where the weights came from)."""
    from .deepseek import DeepseekModel
    from .families import from_hf
    from .llama import LlamaModel
    from .synthetic import DEEPSEEK_PRESETS, LLAMA_PRESETS, random_deepseek, random_llama
    from .tiny import hf_overrides, small_overrides, tiny_model

    presets: Any = {"llama": LLAMA_PRESETS, "deepseek": DEEPSEEK_PRESETS}.get(args.model)
    try:
        import transformers
    except ImportError:
        if args.check or presets is None:
            raise
        model: Any = (LlamaModel(random_llama(presets[args.size], args.seed, device, dtype)) if args.model == "llama"
                      else DeepseekModel(random_deepseek(presets[args.size], args.seed, device, dtype)))
        return None, model, ("random, drawn directly (transformers is not installed: "
                             'pip install "transformers>=5.23,<6" for the Hugging Face path)')
    if presets is not None:
        overrides = hf_overrides(presets[args.size])
    else:
        overrides = small_overrides(args.model) if args.size == "small" else {}
    hf = tiny_model(args.model, seed=args.seed, **overrides)
    source = f"transformers {transformers.__version__} {type(hf).__name__} (random init)"
    return hf, from_hf(hf, device=device, dtype=dtype), source


def _describe_spec(s: Any) -> str:
    """Heads and the family's switched-on features, for the demo's first line."""
    from .weights import DeepseekSpec

    if isinstance(s, DeepseekSpec):
        rope = f", YaRN x{s.rope_scaling.factor:g} (softmax mscale {s.attn_mscale:.3f})" if s.rope_scaling else ""
        return (f"{s.num_heads} heads, MLA latent {s.kv_lora_rank}+{s.qk_rope_head_dim}, {s.n_routed_experts} experts "
                f"(top-{s.num_experts_per_tok}, {s.n_group} groups) + {s.n_shared_experts} shared{rope}")
    bits = [f"{s.num_heads} heads / {s.num_kv_heads} kv heads of {s.head_dim}"]
    if s.qkv_bias or s.o_bias:
        bits.append("q/k/v bias" + (" + o bias" if s.o_bias else ""))
    if s.qk_norm:
        bits.append("q/k norms")
    if s.windows:
        bits.append(f"windows {'/'.join(str(w + 1) if w >= 0 else 'full' for w in s.windows)}")
    if s.attn_soft_cap or s.final_soft_cap:
        bits.append(f"soft-caps {s.attn_soft_cap} / {s.final_soft_cap}")
    if s.num_experts:
        bits.append(f"{s.num_experts} experts (softmax top-{s.experts_per_tok})")
    if s.gemma_norms:
        bits.append(f"(1 + w) sandwich norms, {s.activation} gates, softmax scale {s.sm_scale:.3f}")
    if s.rope_scaling is not None or s.local_rope is not None:
        bits.append(f"rope {type(s.rope_scaling).__name__ if s.rope_scaling else 'plain'}"
                    + (f" (local theta {s.local_rope.theta:g})" if s.local_rope else ""))
    return ", ".join(bits)


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of varied lengths; every third one shares a 24-token prefix with the first."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5 + (11 * i) % 37 for i in range(n)]
    prompts = [torch.randint(0, vocab, (m,), generator=g).tolist() for m in lengths]
    base = torch.randint(0, vocab, (24,), generator=g).tolist()
    prompts[0] = base + prompts[0]
    for i in range(3, n, 3):
        prompts[i] = base + prompts[i]
    return prompts


def _params(n: int, max_new: int) -> list[SamplingParams]:
    """Alternate greedy and sampled (temperature 0.8, top-k 50, top-p 0.95) requests."""
    sampled = SamplingParams(max_new_tokens=max_new, temperature=0.8, top_k=50, top_p=0.95)
    return [SamplingParams(max_new_tokens=max_new) if i % 2 == 0 else sampled for i in range(n)]


def _serve(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> None:
    """Half the requests arrive first, the rest after two steps (so steps mix prefill and decode)."""
    half = max(1, len(prompts) // 2)
    for p, sp in zip(prompts[:half], params[:half]):
        engine.add(p, sp)
    for _ in range(2):
        if engine.has_work():
            engine.step()
    for p, sp in zip(prompts[half:], params[half:]):
        engine.add(p, sp)
    while engine.has_work():
        engine.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _describe(sel: Selection, verbose: bool) -> list[str]:
    lines = [f"{sel.kernel.id}  ({_WHY.get(sel.source, sel.source)})"]
    hidden = 0
    for c in sel.candidates:
        if c.kernel is sel.kernel:
            continue
        if c.eligible:
            lines.append(f"    also eligible: {c.kernel.id}")
        elif c.kernel.unavailable is not None and not verbose:
            hidden += 1
        else:
            lines.append(f"    rejected {c.kernel.id}: {'; '.join(c.reasons)}")
    if hidden:
        lines.append(f"    ({hidden} kernel{'s' if hidden > 1 else ''} of unavailable backends not shown; -v lists them)")
    return lines


def _report_ops(tracer: OpTracer, verbose: bool) -> None:
    print("\nkernels (dispatch records of a traced warm-up run: one per distinct choice)")
    for op in sorted(tracer.records):
        rec = tracer.records[op]
        for i, sel in enumerate(rec.selections.values()):
            head, *rest = _describe(sel, verbose)
            label = op if i == 0 else ""
            print(f"  {label:<26} {head}   [{rec.calls} calls, {rec.seconds * 1e3:.1f} ms]" if i == 0 else
                  f"  {label:<26} {head}")
            for line in rest:
                print(f"  {'':<26} {line}")
        for err in rec.errors[:1]:
            print(f"  {op:<26} explain failed: {err}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``switchboard demo``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except SwitchboardError as exc:  # e.g. --backend X that cannot run a problem: say why, no traceback
        print(f"switchboard demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("switchboard demo: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    on_gpu = device.type == "cuda"
    from kernel_switchboard.registry import registry

    known = registry.all_backends()
    unknown = [b for b in args.backend if b.split(":")[0] not in known]
    if unknown:
        print(f"switchboard demo: unknown backend {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    args.size = args.size or ("small" if on_gpu else "tiny")
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_gpu else "float32"))
    threads = args.threads or (1 if args.size == "tiny" and not on_gpu else None)
    if threads:
        torch.set_num_threads(threads)
    mode = args.decode_mode if args.decode_mode != "auto" else ("cuda_graph" if on_gpu else "eager")
    if mode == "cuda_graph" and not on_gpu:
        print("switchboard demo: --decode-mode cuda_graph needs a GPU", file=sys.stderr)
        return 2
    try:
        hf, model, source = _build(args, device, dtype)
    except ImportError as exc:
        print(f"switchboard demo: --check and --model {args.model} need transformers: {exc}", file=sys.stderr)
        return 1

    note = ""
    if args.decode_mode == "auto" and mode == "cuda_graph":
        from .graphs import missing_capturable

        missing = missing_capturable(model)
        if missing:
            mode, note = "eager", f" (no CUDA graph: no available capturable kernel for {', '.join(missing)})"

    s = model.spec
    heads = _describe_spec(s)
    print(f"model   {args.model} ({args.size}): hidden {s.hidden_size}, {s.num_layers} layers, {heads}, vocab {s.vocab_size}")
    print(f"        weights: {source}")
    print(f"device  {device} ({torch.cuda.get_device_name(device) if on_gpu else 'cpu'}), {str(dtype)[6:]}, "
          f"decode steps: {mode}{note}" + (f", preferred backends: {', '.join(args.backend)}" if args.backend else ""))

    prompts = _prompts(args.requests, s.vocab_size, args.seed)
    params = _params(args.requests, args.max_new_tokens)
    longest = max(len(p) for p in prompts) + args.max_new_tokens
    pages = args.requests * (-(-longest // args.page_size)) + 2
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def engine(decode_mode: str) -> Engine:
        return Engine(model, num_pages=pages, page_size=args.page_size, max_step_tokens=128, max_running=args.requests,
                      decode_mode=decode_mode, backends=args.backend, generator=gen,
                      max_pages_per_request=-(-longest // args.page_size))

    # 1. traced warm-up: a few steps in eager mode, recording every dispatch decision
    tracer = OpTracer(sync=on_gpu)
    with tracer.active():
        _serve(engine("eager"), prompts[:3], [SamplingParams(max_new_tokens=3, temperature=0.8, top_p=0.95),
                                               SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=3)])
    # 2. timed run
    eng = engine(mode)
    if mode != "eager":  # compile / capture every batch size outside the timed region
        eng.warmup()
    _sync(device)
    start = time.perf_counter()
    _serve(eng, prompts, params)
    _sync(device)
    seconds = time.perf_counter() - start
    hist = eng.history
    generated = sum(len(r.output) for r in eng.finished.values())
    prefill = sum(r.prefill_tokens for r in hist)
    print(f"\nserved  {args.requests} requests, {prefill} prompt tokens + {generated} generated tokens in {seconds:.3f} s")
    print(f"        {generated / seconds:,.1f} generated tokens/s, {(prefill + generated) / seconds:,.1f} tokens/s total")
    print(f"        {len(hist)} steps: {sum(r.mixed for r in hist)} mixed prefill+decode, "
          f"{sum(r.prefill_requests == 0 for r in hist)} decode-only; {sum(r.shared_tokens for r in hist)} prompt tokens "
          f"read from shared prefix pages; {sum(r.preempted for r in hist)} preemptions; "
          f"{eng.tables.allocator.num_free} of {pages} pages free at the end")
    plans = eng.decoder.plans() if eng.decoder is not None else []
    if plans:
        sel = plans[0].selection
        print(f"        CUDA-graph decode attention: {sel.kernel.id} ({_WHY.get(sel.source, sel.source)})")
    _report_ops(tracer, args.verbose)
    if args.speculative:
        _speculative(model, prompts, args)
    if args.check:
        return _check(hf, model, prompts, device, dtype, args)
    return 0


def _speculative(model: Any, prompts: list[list[int]], args: argparse.Namespace) -> None:
    from .speculative import SpeculativeDecoder
    from .weights import truncate_layers

    draft = type(model)(truncate_layers(model.w, 1))
    longest = max(len(p) for p in prompts) + args.max_new_tokens + args.speculative + 1
    pages = len(prompts) * (-(-longest // args.page_size)) + 1
    dec = SpeculativeDecoder(model, draft, num_draft=args.speculative, num_pages=pages, page_size=args.page_size,
                             backends=args.backend)
    _sync(model.device)
    start = time.perf_counter()
    dec.generate(prompts, args.max_new_tokens)
    _sync(model.device)
    seconds = time.perf_counter() - start
    st = dec.stats
    print(f"\nspeculative decoding (greedy, {args.speculative} drafts/round, draft = first layer of the target): "
          f"{st.rounds} rounds, {st.emitted}/{st.proposed} drafts accepted ({st.acceptance_rate:.0%}), "
          f"{len(prompts) * args.max_new_tokens / seconds:,.1f} tokens/s")


def _check(hf: Any, model: Any, prompts: list[list[int]], device: torch.device, dtype: torch.dtype,
           args: argparse.Namespace) -> int:
    """The first prompt against transformers (float32 on the CPU): prefill logits, the logits of 16 decode steps fed
    transformers' greedy tokens, and the engine's own 16 greedy tokens. Exit status 3 past the tolerance: 1e-3 in
    float32 (and every token identical); in a 16-bit dtype the largest of 0.25, 2% of the largest logit and twice
    the error transformers itself makes in that dtype (random models whose MoE routing or soft-capped logits
    amplify rounding stay checkable). In a 16-bit MoE model a router whose top experts nearly tie picks a different
    expert under different rounding, which moves that token's logits far past any rounding tolerance: there, up to
    one position in eight may lie past the tolerance (the count is printed); every other position must not."""
    from .cache import BlockTables, build_batch
    from .tiny import hf_greedy

    prompt = prompts[0]
    ref = hf_greedy(hf, prompt, 16)
    with torch.no_grad():
        want = hf.float()(torch.tensor([prompt + ref])).logits[0]
        tables = BlockTables(64, args.page_size, device)
        cache = model.new_cache(64, args.page_size)
        tables.extend(0, len(prompt))
        got = [model.forward(build_batch(tables, [0], [prompt], ["all"]), cache).float().cpu()]
        for token in ref:
            tables.extend(0, 1)
            got.append(model.forward(build_batch(tables, [0], [[token]], ["last"]), cache).float().cpu())
    per_position = (torch.cat(got) - want).abs().amax(-1)  # prompt positions, then one per decode step
    prefill, decode = float(per_position[: len(prompt)].max()), float(per_position[len(prompt):].max())
    ours = Engine(model, num_pages=64, page_size=args.page_size, backends=args.backend).generate(
        [prompt], SamplingParams(max_new_tokens=16))[0]
    same = sum(a == b for a, b in zip(ours, ref))
    largest = float(want.abs().max())
    print(f"\ncheck   logits vs transformers (largest |logit| {largest:.1f}): prefill max |diff| {prefill:.2e}, "
          f"16 decode steps max |diff| {decode:.2e}; greedy tokens: {same}/16 identical")
    if dtype == torch.float32:
        return 0 if max(prefill, decode) < 1e-3 and same == 16 else 3
    with torch.no_grad():
        own = float((copy.deepcopy(hf).to(dtype)(torch.tensor([prompt + ref])).logits[0].float() - want).abs().max())
    tol = max(0.25, 0.02 * largest, 2 * own)
    past = int((per_position >= tol).sum())
    allowed = len(per_position) // 8 if _is_moe(hf.config) else 0
    print(f"        transformers' own {str(dtype)[6:]} error: {own:.2e}; tolerance {tol:.2e}; positions past it: "
          f"{past} of {len(per_position)}" + (f" (MoE routing near-ties: up to {allowed} allowed)" if allowed else ""))
    return 0 if past <= allowed else 3


def _is_moe(config: Any) -> bool:
    """Whether the model routes tokens to experts (Mixtral's num_local_experts, DeepSeek's n_routed_experts)."""
    return bool(getattr(config, "num_local_experts", 0) or getattr(config, "n_routed_experts", 0))


if __name__ == "__main__":
    raise SystemExit(main())
