"""Random weights straight from a spec, without ``transformers`` (GPU machines without it, the demo's
fallback), and the shape presets the demo uses. Statistics as :func:`tiny.randomize`: projections
N(0, 1/fan_in), norms 1 + N(0, 0.01), embeddings N(0, 1), a decisive router."""

from __future__ import annotations

import math

import torch

from kernel_switchboard.ops.rope import Llama3Scaling, YarnScaling

from .weights import (
    DeepseekSpec,
    DeepseekWeights,
    DenseMLP,
    LlamaLayer,
    LlamaSpec,
    LlamaWeights,
    MLALayer,
    MoEWeights,
    absorbed_mla,
)

LLAMA_PRESETS = {
    "tiny": LlamaSpec(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, rms_eps=1e-5, rope_theta=10000.0,
                      rope_scaling=Llama3Scaling(8.0, 1.0, 4.0, 64)),
    "small": LlamaSpec(vocab_size=4096, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
                       intermediate_size=1408, rms_eps=1e-5, rope_theta=500000.0,
                       rope_scaling=Llama3Scaling(8.0, 1.0, 4.0, 1024)),
}

#: DeepSeek-V3's checkpoints: YaRN x40 over 4096 positions, cos/sin unscaled (mscale = mscale_all_dim), the softmax
#: scale times mscale(40, 1) ** 2
DEEPSEEK_YARN = YarnScaling(40.0, 4096, 32.0, 1.0, mscale=1.0, mscale_all_dim=1.0)
DEEPSEEK_MSCALE = YarnScaling.mscale_of(40.0, 1.0) ** 2

DEEPSEEK_PRESETS = {
    "tiny": DeepseekSpec(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, q_lora_rank=32, kv_lora_rank=32,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128,
                         moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                         num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
                         routed_scaling_factor=2.5, rms_eps=1e-6, rope_theta=10000.0, rope_interleave=True,
                         rope_scaling=DEEPSEEK_YARN, attn_mscale=DEEPSEEK_MSCALE, max_position=163840),
    "small": DeepseekSpec(vocab_size=4096, hidden_size=512, num_layers=4, num_heads=4, q_lora_rank=128,
                          kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                          intermediate_size=1408, moe_intermediate_size=256, first_k_dense_replace=1,
                          n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
                          norm_topk_prob=True, routed_scaling_factor=2.5, rms_eps=1e-6, rope_theta=10000.0,
                          rope_interleave=True, rope_scaling=DEEPSEEK_YARN, attn_mscale=DEEPSEEK_MSCALE,
                          max_position=163840),
}


class _Draw:
    def __init__(self, seed: int, device: torch.device | str, dtype: torch.dtype) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.device, self.dtype = device, dtype

    def __call__(self, *shape: int, std: float = 1.0, mean: float = 0.0, dtype: torch.dtype | None = None
                 ) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen) * std + mean
        return t.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def linear(self, fan_in: int, fan_out: int) -> torch.Tensor:
        """An (in, out) projection."""
        return self(fan_in, fan_out, std=1.0 / math.sqrt(fan_in))

    def norm(self, n: int) -> torch.Tensor:
        return self(n, std=0.1, mean=1.0)

    def mlp(self, hidden: int, inter: int) -> DenseMLP:
        return DenseMLP(self.linear(hidden, 2 * inter), self.linear(inter, hidden))


def random_llama(spec: LlamaSpec, seed: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> LlamaWeights:
    d = _Draw(seed, device, dtype)
    h, hd = spec.hidden_size, spec.head_dim
    layers = [LlamaLayer(d.norm(h), d.linear(h, (spec.num_heads + 2 * spec.num_kv_heads) * hd),
                         d.linear(spec.num_heads * hd, h), d.norm(h), d.mlp(h, spec.intermediate_size))
              for _ in range(spec.num_layers)]
    return LlamaWeights(spec, d(spec.vocab_size, h), layers, d.norm(h), d.linear(h, spec.vocab_size))


def random_deepseek(spec: DeepseekSpec, seed: int = 0, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> DeepseekWeights:
    d = _Draw(seed, device, dtype)
    h, nh, r = spec.hidden_size, spec.num_heads, spec.kv_lora_rank
    nope, dr, dv = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    layers = []
    for i in range(spec.num_layers):
        kv_b = d(nh * (nope + dv), r, std=1.0 / math.sqrt(r))  # nn.Linear layout (out, in)
        w_uk, w_uv = absorbed_mla(kv_b, nh, nope, dv)
        lora = spec.q_lora_rank
        mlp: DenseMLP | MoEWeights
        if i < spec.first_k_dense_replace:
            mlp = d.mlp(h, spec.intermediate_size)
        else:
            e, inter = spec.n_routed_experts, spec.moe_intermediate_size
            shared = d.mlp(h, inter * spec.n_shared_experts) if spec.n_shared_experts else None
            mlp = MoEWeights(d(h, e, std=4.0 / math.sqrt(h), dtype=torch.float32), d(e, std=0.1, dtype=torch.float32),
                             d(e, 2 * inter, h, std=1.0 / math.sqrt(h)), d(e, h, inter, std=1.0 / math.sqrt(inter)),
                             shared)
        layers.append(MLALayer(
            attn_norm=d.norm(h),
            w_q=None if lora else d.linear(h, nh * (nope + dr)),
            w_q_a=d.linear(h, lora) if lora else None,
            q_a_norm=d.norm(lora) if lora else None,
            w_q_b=d.linear(lora, nh * (nope + dr)) if lora else None,
            w_kv_a=d.linear(h, r + dr), kv_a_norm=d.norm(r),
            w_kv_b=kv_b.t().contiguous(), w_uk=w_uk.contiguous(), w_uv=w_uv.contiguous(),
            w_o=d.linear(nh * dv, h), mlp_norm=d.norm(h), mlp=mlp))
    return DeepseekWeights(spec, d(spec.vocab_size, h), layers, d.norm(h), d.linear(h, spec.vocab_size))
