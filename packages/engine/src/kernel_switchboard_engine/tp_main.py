"""Run the tensor-parallel Llama (:mod:`.tp`) on N processes and check its greedy tokens against one process.

    torchrun --nproc-per-node 2 -m kernel_switchboard_engine.tp_main          # NCCL on 2 GPUs (gloo on CPU)
    python -m kernel_switchboard_engine.tp_main --nproc 4                     # spawns 4 local processes itself

Every rank draws the same random weights from a spec (``--preset``, or ``--weights`` a ``torch.save``d
:class:`LlamaWeights`), keeps its shard, and runs prefill + ``--steps`` greedy steps; rank 0 also runs the
unsharded :class:`LlamaModel` and reports whether the tokens are identical and the largest logit
difference. Exit status 1 when the tokens differ. NVLink multicast is off (:data:`.tp.SAFE_ENV`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_switchboard.ops.rope import Llama3Scaling

from .llama import LlamaModel
from .tp import SAFE_ENV, TPLlamaModel, greedy, init_distributed, rank_and_world
from .weights import LlamaSpec, LlamaWeights

#: split over 1, 2 or 4 ranks (heads 8 and KV heads 4; intermediate sizes divisible by 4)
TP_PRESETS = {
    "tiny": LlamaSpec(vocab_size=128, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8,
                      intermediate_size=128, rms_eps=1e-5, rope_theta=10000.0,
                      rope_scaling=Llama3Scaling(8.0, 1.0, 4.0, 64)),
    "small": LlamaSpec(vocab_size=4096, hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=8, head_dim=64,
                       intermediate_size=2816, rms_eps=1e-5, rope_theta=500000.0,
                       rope_scaling=Llama3Scaling(8.0, 1.0, 4.0, 1024)),
}


@dataclass
class TPJob:
    """What every rank runs: prompts, greedy steps, the weights (a saved file or a spec + seed), outputs."""

    prompts: list[list[int]]
    steps: int = 16
    weights: str | None = None  # path of a torch.save'd LlamaWeights; None: random weights of `spec`
    spec: LlamaSpec = field(default_factory=lambda: TP_PRESETS["tiny"])
    seed: int = 0
    dtype: str = "float32"
    page_size: int = 4
    compare: bool = True  # rank 0 also runs the unsharded model
    out: str | None = None  # a folder: rank<r>.pt with {"tokens", "logits", "ref_tokens", "ref_logits"}


def load_weights(job: TPJob, device: torch.device) -> LlamaWeights:
    """The full weights of ``job`` on ``device`` (every rank gets the same ones)."""
    dtype = getattr(torch, job.dtype)
    if job.weights is None:
        from .synthetic import random_llama

        w = random_llama(job.spec, seed=job.seed)  # float32 on the CPU: the same numbers on every machine
    else:
        w = torch.load(job.weights, weights_only=False)
    return LlamaWeights(**_to(w, device, dtype))


def _to(w: LlamaWeights, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Fields of ``w`` with every tensor moved to (device, dtype) (drawn on the CPU: same numbers everywhere)."""
    def mv(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device=device, dtype=dtype).contiguous()
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return type(x)(**{f.name: mv(getattr(x, f.name)) for f in dataclasses.fields(x)})
        if isinstance(x, list):
            return [mv(v) for v in x]
        return x
    return {f.name: mv(getattr(w, f.name)) for f in dataclasses.fields(w)}


def run_job(job: TPJob, device: torch.device) -> dict[str, Any]:
    """This rank's part of ``job`` (the process group is initialised); returns and optionally saves its results."""
    rank, world = rank_and_world()
    full = load_weights(job, device)
    tokens, logits = greedy(TPLlamaModel.from_full(full), job.prompts, job.steps, job.page_size)
    result: dict[str, Any] = {"rank": rank, "world": world, "tokens": tokens, "logits": torch.stack(logits).cpu()}
    if job.compare and rank == 0:
        ref_tokens, ref_logits = greedy(LlamaModel(full), job.prompts, job.steps, job.page_size)
        result.update(ref_tokens=ref_tokens, ref_logits=torch.stack(ref_logits).cpu())
    if job.out is not None:
        torch.save(result, os.path.join(job.out, f"rank{rank}.pt"))
    return result


# -- launching -------------------------------------------------------------------------------------------
def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world: int, port: int, backend: str | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **SAFE_ENV)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local processes talk over loopback only
    torch.set_num_threads(1)
    _in_group(fn, args, backend)


def _in_group(fn: Callable[..., Any], args: tuple[Any, ...], backend: str | None) -> None:
    """``fn(*args, device)`` as this process's rank of the group it joins (from the environment), left after."""
    device = init_distributed(backend)
    try:
        fn(*args, device)
    finally:
        torch.distributed.destroy_process_group()


def launch(fn: Callable[..., Any], nproc: int | None, *args: Any, backend: str | None = None) -> None:
    """``fn(*args, device)`` on ``nproc`` spawned local processes (:func:`spawn`), or, with ``nproc`` None or under a
    launcher that set ``RANK`` (torchrun), in this process as its rank."""
    if nproc is not None and "RANK" not in os.environ:
        spawn(fn, nproc, *args, backend=backend)
    else:
        _in_group(fn, args, backend)


def spawn(fn: Callable[..., Any], nproc: int, *args: Any, backend: str | None = None) -> None:
    """Run ``fn(*args, device)`` on ``nproc`` local processes (torch.multiprocessing spawn) in one process
    group on 127.0.0.1 (``backend`` None: NCCL with CUDA, else gloo). ``fn`` must be importable by name."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(nproc, free_port(), backend, fn, args), nprocs=nproc, join=True)


def _report(job: TPJob, device: torch.device) -> None:
    result = run_job(job, device)
    if result["rank"] != 0:
        return
    same = result["tokens"] == result["ref_tokens"]
    diff = (result["logits"] - result["ref_logits"]).abs().max().item()
    print(f"tp={result['world']} device={device} dtype={job.dtype} steps={job.steps} prompts={len(job.prompts)}")
    for i, (t, r) in enumerate(zip(result["tokens"], result["ref_tokens"])):
        print(f"  prompt {i}: tp {t}\n            1p {r}")
    print(f"tokens identical: {same}; max |logit diff| {diff:.3g}")
    if not same:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernel_switchboard_engine.tp_main", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=None, help="spawn this many local processes (without torchrun)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl with CUDA, else gloo")
    p.add_argument("--preset", choices=sorted(TP_PRESETS), default="tiny")
    p.add_argument("--weights", default=None, help="a torch.save'd LlamaWeights instead of random weights")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    spec = TP_PRESETS[a.preset]
    g = torch.Generator().manual_seed(a.seed + 1)
    prompts = [torch.randint(0, spec.vocab_size, (a.prompt_len + i,), generator=g).tolist() for i in range(a.batch)]
    job = TPJob(prompts, a.steps, a.weights, spec, a.seed, a.dtype)
    launch(_report, a.nproc, job, backend=a.backend)


if __name__ == "__main__":
    main()
