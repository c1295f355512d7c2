"""Which cuDNN SDPA graph option costs our ragged prefill its speed? (GPU experiment, issue 5.)

Builds the causal prefill graph of uniform batches (1x8192, 8x2048; Llama-3-8B heads, bf16) with each
combination of: ragged (THD offsets) or dense BSHD layout, padding mask (seq_len tensors) or none, and
top-left or bottom-right causal alignment; checks each output against torch SDPA and times it with CUDA
events next to torch SDPA's cuDNN backend.

    python3 tools/cudnn_prefill_variants.py [OUT.json]
"""

from __future__ import annotations

import itertools
import json
import sys

import cudnn
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernel_switchboard.bench import median_ms

HQ, HKV, D = 32, 8, 128


def build(batch: int, s: int, ragged: bool, padding: bool, top_left: bool, q: torch.Tensor, k: torch.Tensor,
          v: torch.Tensor, o: torch.Tensor) -> tuple:
    """One graph over packed (B*S, H, D) tensors; returns (graph, feeds, workspace)."""
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)

    def logical(t: torch.Tensor, name: str):  # (B*S, H, D) as (B, H, S, D)
        h = t.shape[1]
        return g.tensor(name=name, dim=[batch, h, s, D], stride=[s * h * D, D, h * D, 1],
                        data_type=cudnn.data_type.BFLOAT16)

    tq, tk, tv = logical(q, "q"), logical(k, "k"), logical(v, "v")
    ints = {}
    if ragged:
        for name, t, h in (("q_off", tq, HQ), ("k_off", tk, HKV), ("v_off", tv, HKV), ("o_off", None, HQ)):
            off = (torch.arange(batch + 1, device=q.device, dtype=torch.int32) * s * h * D).view(-1, 1, 1, 1)
            ints[name] = (g.tensor(name=name, dim=[batch + 1, 1, 1, 1], stride=[1, 1, 1, 1],
                                   data_type=cudnn.data_type.INT32), off)
            if t is not None:
                t.set_ragged_offset(ints[name][0])
    kwargs = dict(q=tq, k=tk, v=tv, attn_scale=D ** -0.5, generate_stats=False, name="sdpa")
    if padding:
        lens = torch.full((batch, 1, 1, 1), s, dtype=torch.int32, device=q.device)
        for name in ("seq_q", "seq_kv"):
            ints[name] = (g.tensor(name=name, dim=[batch, 1, 1, 1], stride=[1, 1, 1, 1],
                                   data_type=cudnn.data_type.INT32), lens)
        kwargs.update(use_padding_mask=True, seq_len_q=ints["seq_q"][0], seq_len_kv=ints["seq_kv"][0])
    align = cudnn.diagonal_alignment.TOP_LEFT if top_left else cudnn.diagonal_alignment.BOTTOM_RIGHT
    kwargs.update(diagonal_alignment=align, diagonal_band_right_bound=0)
    out, _ = g.sdpa(**kwargs)
    out.set_output(True).set_dim([batch, HQ, s, D]).set_stride([s * HQ * D, D, HQ * D, 1])
    out.set_data_type(cudnn.data_type.BFLOAT16)
    if ragged:
        out.set_ragged_offset(ints["o_off"][0])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    pack = {tq: q, tk: k, tv: v, out: o}
    pack.update({t: val for t, val in ints.values()})
    ws = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device=q.device)
    return g, pack, ws, handle


def shape_rows(batch: int, s: int, dev: torch.device) -> list[dict]:
    """torch SDPA (cuDNN) and every graph variant at one uniform batch shape."""
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch * s, HQ, D, device=dev, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch * s, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch * s, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
    flops = 4.0 * batch * s * s * D * HQ / 2

    def bhsd(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, s, t.shape[1], D).transpose(1, 2)

    def sdpa() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), is_causal=True,
                                                                enable_gqa=True)

    rows = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = sdpa()
        ms = median_ms(sdpa, rep_ms=200)
    rows.append({"shape": f"{batch}x{s}", "variant": "torch SDPA (cuDNN)", "ms": ms, "tflops": flops / ms / 1e9})
    print(rows[-1], flush=True)
    for ragged, padding, top_left in itertools.product((True, False), (True, False), (True, False)):
        name = (f"{'ragged' if ragged else 'dense'}, {'padding' if padding else 'no padding'}, "
                f"{'top-left' if top_left else 'bottom-right'}")
        row: dict = {"shape": f"{batch}x{s}", "variant": name}
        try:
            o = torch.full((batch * s, HQ, D), float("nan"), device=dev, dtype=torch.bfloat16)
            g, pack, ws, h = build(batch, s, ragged, padding, top_left, q, k, v, o)

            def run(g=g, pack=pack, ws=ws, h=h) -> None:
                g.execute(pack, ws, handle=h)

            run()
            torch.cuda.synchronize()
            row["max_err"] = float((bhsd(o).float() - ref.float()).abs().max())
            ms = median_ms(run, rep_ms=200)
            row.update(ms=ms, tflops=flops / ms / 1e9)
        except Exception as exc:  # noqa: BLE001 - one row per variant, failures included
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    dev = torch.device("cuda")
    rows = shape_rows(1, 8192, dev) + shape_rows(8, 2048, dev)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
