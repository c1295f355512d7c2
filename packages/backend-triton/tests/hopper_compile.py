"""Compile Triton attention kernels for sm_90 through their real launchers, on a machine without a GPU.

``python hopper_compile.py`` (without ``TRITON_INTERPRET``) makes a fake Triton driver active: it reports an H100 /
H200 target and turns every launch into a no-op, so each launch on CPU tensors compiles its kernel for sm_90
(ptxas included) with the launcher's real arguments and Hopper configuration. Prints one JSON line: per problem,
the error or the kernels it compiled (name, arch, shared memory bytes). The GPU runs them (``-m gpu``); this catches
what only the GPU compiler rejects, from CI.
"""

from __future__ import annotations

import json
import types
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

LAUNCHED: list[dict[str, Any]] = []


class _FakeHopperUtils:
    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        return 1, 1, 0, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}


class FakeHopper:
    """Just enough of Triton's CUDA driver for ``kernel[grid](...)`` to compile for sm_90 and not launch."""

    utils = _FakeHopperUtils()

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def launcher_cls(self, src: Any, metadata: Any) -> Any:
        LAUNCHED.append({"name": metadata.name, "arch": metadata.target.arch, "shared": metadata.shared})
        return lambda *args, **kwargs: None


def _params(case: Any, prefill: bool) -> types.SimpleNamespace:
    """The attention parameters the launchers read (what the op layer would pass), a custom variant bound."""
    from kernel_switchboard.variants import bind

    q, kw = case.args[0], case.kwargs
    window = kw.get("window_left")
    variant = kw.get("variant")
    bound = None if variant is None else bind(variant, kw.get("variant_args", ()), q.device)
    p = types.SimpleNamespace(sm_scale=q.shape[-1] ** -0.5, logits_soft_cap=kw.get("logits_soft_cap"),
                              window_left=-1 if window is None else window, return_lse=kw.get("return_lse", False),
                              variant=bound, causal=kw.get("causal", True))
    if prefill:
        qo = case.args[1]
        p.max_q_len = int((qo[1:] - qo[:-1]).max())
    else:
        p.max_kv_len = int(case.args[2].seq_lens.max())
    return p


def main() -> None:
    import random

    import kernel_switchboard_triton._attn_common as common
    import kernel_switchboard_triton._decode as decode
    import kernel_switchboard_triton._prefill as prefill
    from kernel_switchboard.testing.cases.attention import AttnSpec, _with_queries, decode_case, prefill_case

    driver.set_active(FakeHopper())
    for module in (common, decode, prefill):  # CPU tensors: the launchers must still choose Hopper's configuration
        for name, value in (("cc_major", lambda device: 9), ("sm_count", lambda device: 132)):
            if hasattr(module, name):
                setattr(module, name, value)
    rng = random.Random(0)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    specs = [AttnSpec(torch.bfloat16, "NHD", 16, 32, 8, 96, kv_lens=(300, 40), lse=True),
             AttnSpec(torch.float16, "HND", 16, 32, 8, 80, kv_lens=(300, 40), kv_dtype=e4m3),
             AttnSpec(torch.bfloat16, "NHD", 64, 32, 8, 128, kv_lens=(300, 40), kv_dtype=e5m2, lse=True),
             AttnSpec(torch.bfloat16, "HND", 16, 32, 8, 128, kv_lens=(300, 40), soft_cap=30.0)]
    results = []
    for spec in specs:
        for kind in ("decode", "prefill"):
            start = len(LAUNCHED)
            try:
                if kind == "decode":
                    case = decode_case(spec, "cpu", 0)
                    q, cache, table = case.args
                    decode.decode(q, cache, table, _params(case, False))
                else:
                    case = prefill_case(_with_queries(spec, rng, 64, mixed=True), "cpu", 0)
                    q, qo, cache, table = case.args
                    prefill.prefill(q, qo, cache, table, _params(case, True))
                results.append({"problem": spec.tag(kind), "kernels": LAUNCHED[start:]})
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
                results.append({"problem": spec.tag(kind), "error": repr(e)[:2000]})
    print(json.dumps(results))


def _as_hopper(*modules: Any) -> None:
    """The fake driver active, and the launchers' device queries answering as an H100 / H200 would."""
    driver.set_active(FakeHopper())
    for module in modules:
        for name, value in (("cc_major", lambda device: 9), ("sm_count", lambda device: 132)):
            if hasattr(module, name):
                setattr(module, name, value)


def main_beyond() -> None:
    """``python hopper_compile.py beyond``: the MLA prefill kernel, the POD kernel in both schedules and its
    co-resident configuration (whose shared memory must leave room for a second program on an SM), the batch-invariant
    decode (fixed splits, the ordered merge) and the prefill kernel on fp8 queries and pages (fp8 MMAs for both dots),
    with TMA page tiles and with pointer loads."""
    import kernel_switchboard_triton._attn_common as common
    import kernel_switchboard_triton._mla_prefill as mla_prefill
    import kernel_switchboard_triton._pod as pod
    import kernel_switchboard_triton._prefill as prefill
    from kernel_switchboard.testing.cases.attention import (
        AttnSpec,
        decode_case,
        mla_prefill_case,
        pod_case,
        prefill_case,
    )

    _as_hopper(common, prefill, pod, mla_prefill)
    results = []

    def run(name: str, call: Any) -> None:
        start = len(LAUNCHED)
        try:
            call()
            results.append({"problem": name, "kernels": LAUNCHED[start:]})
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            results.append({"problem": name, "error": repr(e)[:2000]})

    case = mla_prefill_case(torch.bfloat16, (300, 40), (100, 1), 128, 64, "cpu", lse=True)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    p = types.SimpleNamespace(sm_scale=0.07, causal=True, return_lse=True, max_q_len=100, batch_invariant=False)
    run("mla_prefill-bf16-h128-p64", lambda: mla_prefill.MLAPrefillRunner(None, table, p, qo_indptr=qo).run(
        q_nope, q_pe, ckv, kpe, None, None))
    spec = AttnSpec(torch.bfloat16, "NHD", 64, 32, 8, 128, kv_lens=(300,), q_lens=(300,), lse=True)
    case = pod_case(spec, (200, 1, 77), "cpu")
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    p = types.SimpleNamespace(sm_scale=0.08, logits_soft_cap=None, window_left=-1, causal=True, return_lse=True,
                              max_q_len=300, batch_invariant=False, variant=None)
    for schedule, co_resident in (("decode_first", False), ("interleave", False), ("interleave", True)):
        cfg = pod.pod_config(q.device, 128, 128, 4, 2048, schedule, co_resident)
        runner = pod.PODRunner(types.SimpleNamespace(head_dim=128, head_dim_v=128, group_size=4), prefill_table, p,
                               qo_indptr=qo, decode_table=decode_table, config=cfg)
        run(f"pod-{schedule}{'-co_resident' if co_resident else ''}",
            lambda runner=runner: runner.run(q, q_decode, cache, None, None, None, None))
    import kernel_switchboard_triton._decode as decode

    _as_hopper(decode)
    case = decode_case(AttnSpec(torch.bfloat16, "NHD", 16, 32, 8, 128, kv_lens=(5000, 40), lse=True), "cpu", 0)
    q, cache, table = case.args
    p = _params(case, False)
    p.batch_invariant = True
    run("decode-batch-invariant", lambda: decode.decode(q, cache, table, p))
    for page_size in (128, 16):  # TMA page tiles, pointer loads
        prefill.has_tma = (lambda device: True) if page_size == 128 else (lambda device: False)  # type: ignore[attr-defined]
        spec = AttnSpec(torch.bfloat16, "NHD", page_size, 32, 8, 128, kv_lens=(512, 40), q_lens=(512, 1), lse=True,
                        kv_dtype=torch.float8_e4m3fn, q_fp8=True)
        q, qo, cache, table = prefill_case(spec, "cpu").args
        p = _params(prefill_case(spec, "cpu"), True)
        p.q_scale = 0.25
        run(f"prefill-fp8-p{page_size}", lambda q=q, qo=qo, cache=cache, table=table, p=p: prefill.prefill(
            q, qo, cache, table, p))
    print(json.dumps(results))


if __name__ == "__main__":
    import sys

    main_beyond() if sys.argv[1:] == ["beyond"] else main()
