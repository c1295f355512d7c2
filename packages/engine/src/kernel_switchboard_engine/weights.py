"""Model specs and weights in the engine's layout, taken from a Hugging Face ``transformers`` model.

Layout (all matrices are ``(in, out)``, contiguous, ready for ``gemm.mm(x, w)``):

- Llama: ``w_qkv`` (hidden, (Hq + 2 Hkv) D) = [q | k | v]; ``w_o`` (Hq D, hidden);
  ``w_gate_up`` (hidden, 2 I) = [gate | up]; ``w_down`` (I, hidden); ``lm_head`` (hidden, vocab).
- DeepSeek-V3: MLA projections plus the absorbed per-head matrices ``w_uk`` (H, nope, R) and
  ``w_uv`` (H, R, v) cut from ``kv_b_proj``; MoE experts ``w13`` (E, 2I, hidden) rows [gate; up]
  and ``w2`` (E, hidden, I) exactly as ``moe.experts`` takes them; the router ``(hidden, E)`` float32.

Nothing here imports ``transformers``: the functions read attributes of the model object passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.rope import Llama3Scaling


# -- specs -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaSpec:
    """Shape and hyper-parameters of a Llama-family model."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    rope_scaling: Llama3Scaling | None

    @property
    def sm_scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass(frozen=True)
class DeepseekSpec:
    """Shape and hyper-parameters of a DeepSeek-V3-family model (MLA + MoE)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int | None
    topk_group: int | None
    norm_topk_prob: bool
    routed_scaling_factor: float
    rms_eps: float
    rope_theta: float
    rope_interleave: bool

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5


# -- weights -----------------------------------------------------------------------------------------------
@dataclass
class DenseMLP:
    w_gate_up: torch.Tensor  # (hidden, 2I) [gate | up]
    w_down: torch.Tensor  # (I, hidden)


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    mlp_norm: torch.Tensor
    mlp: DenseMLP


@dataclass
class LlamaWeights:
    spec: LlamaSpec
    embed: torch.Tensor  # (vocab, hidden)
    layers: list[LlamaLayer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # (hidden, vocab)


@dataclass
class MoEWeights:
    router: torch.Tensor  # (hidden, E) float32
    correction_bias: torch.Tensor | None  # (E,) float32
    w13: torch.Tensor  # (E, 2I, hidden)
    w2: torch.Tensor  # (E, hidden, I)
    shared: DenseMLP | None


@dataclass
class MLALayer:
    attn_norm: torch.Tensor
    w_q: torch.Tensor | None  # (hidden, H (nope + rope)) when q_lora_rank is None
    w_q_a: torch.Tensor | None  # (hidden, q_lora_rank)
    q_a_norm: torch.Tensor | None
    w_q_b: torch.Tensor | None  # (q_lora_rank, H (nope + rope))
    w_kv_a: torch.Tensor  # (hidden, R + rope)
    kv_a_norm: torch.Tensor  # (R,)
    w_kv_b: torch.Tensor  # (R, H (nope + v)) for the non-absorbed prefill
    w_uk: torch.Tensor  # (H, nope, R): q_nope -> latent (absorbed decode)
    w_uv: torch.Tensor  # (H, R, v): latent output -> v (absorbed decode)
    w_o: torch.Tensor  # (H v, hidden)
    mlp_norm: torch.Tensor
    mlp: DenseMLP | MoEWeights


@dataclass
class DeepseekWeights:
    spec: DeepseekSpec
    embed: torch.Tensor
    layers: list[MLALayer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


# -- reading a transformers model ---------------------------------------------------------------------------
#: eps of the DeepSeek-V3 q_a / kv_a norms (transformers builds them with the RMSNorm default)
MLA_NORM_EPS = 1e-6


def _rope_params(cfg: Any) -> dict[str, Any]:
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    out = {"rope_type": "default", "rope_theta": getattr(cfg, "rope_theta", 10000.0)}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    out.update(scaling)
    out["rope_type"] = out.get("rope_type", out.get("type", "default"))
    return out


def _check_cfg(cfg: Any, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise fail(f"config.{name}", getattr(cfg, name, None), allowed)


def llama_spec(cfg: Any) -> LlamaSpec:
    """:class:`LlamaSpec` of a ``transformers.LlamaConfig`` (raises for features the engine lacks)."""
    _check_cfg(cfg, "hidden_act", cfg.hidden_act == "silu", "'silu' (SwiGLU)")
    _check_cfg(cfg, "attention_bias", not getattr(cfg, "attention_bias", False), "False")
    _check_cfg(cfg, "mlp_bias", not getattr(cfg, "mlp_bias", False), "False")
    rope = _rope_params(cfg)
    _check_cfg(cfg, "rope_parameters", rope["rope_type"] in ("default", "llama3"), "rope_type 'default' or 'llama3'")
    _check_cfg(cfg, "rope_parameters", rope.get("partial_rotary_factor", 1.0) == 1.0, "partial_rotary_factor 1.0")
    scaling = None
    if rope["rope_type"] == "llama3":
        scaling = Llama3Scaling(float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                                int(rope["original_max_position_embeddings"]))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return LlamaSpec(cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                     cfg.num_key_value_heads or cfg.num_attention_heads, head_dim, cfg.intermediate_size,
                     float(cfg.rms_norm_eps), float(rope["rope_theta"]), scaling)


def deepseek_spec(cfg: Any) -> DeepseekSpec:
    """:class:`DeepseekSpec` of a ``transformers.DeepseekV3Config``."""
    _check_cfg(cfg, "hidden_act", cfg.hidden_act == "silu", "'silu' (SwiGLU)")
    _check_cfg(cfg, "attention_bias", not getattr(cfg, "attention_bias", False), "False")
    rope = _rope_params(cfg)
    _check_cfg(cfg, "rope_parameters", rope["rope_type"] == "default",
               "rope_type 'default' (YaRN is not wired into the engine)")
    n_group = cfg.n_group if cfg.n_group and cfg.n_group > 1 else None
    return DeepseekSpec(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
        intermediate_size=cfg.intermediate_size, moe_intermediate_size=cfg.moe_intermediate_size,
        first_k_dense_replace=cfg.first_k_dense_replace or 0, n_routed_experts=cfg.n_routed_experts,
        n_shared_experts=cfg.n_shared_experts or 0, num_experts_per_tok=cfg.num_experts_per_tok,
        n_group=n_group, topk_group=cfg.topk_group if n_group else None, norm_topk_prob=bool(cfg.norm_topk_prob),
        routed_scaling_factor=float(cfg.routed_scaling_factor), rms_eps=float(cfg.rms_norm_eps),
        rope_theta=float(rope["rope_theta"]), rope_interleave=bool(getattr(cfg, "rope_interleave", True)))


def _t(w: torch.Tensor, device: Any, dtype: Any) -> torch.Tensor:
    """An nn.Linear weight (out, in) as a contiguous (in, out) matrix."""
    return w.detach().t().to(device=device, dtype=dtype).contiguous()


def _v(w: torch.Tensor, device: Any, dtype: Any) -> torch.Tensor:
    return w.detach().to(device=device, dtype=dtype).contiguous()


def _dense(mlp: Any, device: Any, dtype: Any) -> DenseMLP:
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)
    return DenseMLP(_t(gate_up, device, dtype), _t(mlp.down_proj.weight, device, dtype))


def llama_from_hf(model: Any, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> LlamaWeights:
    """Weights of a ``LlamaForCausalLM`` (or any model with its module names) in the engine's layout."""
    spec = llama_spec(model.config)
    inner = model.model
    device = device if device is not None else inner.embed_tokens.weight.device
    dtype = dtype or inner.embed_tokens.weight.dtype
    layers = []
    for layer in inner.layers:
        att = layer.self_attn
        qkv = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], dim=0)
        layers.append(LlamaLayer(_v(layer.input_layernorm.weight, device, dtype), _t(qkv, device, dtype),
                                 _t(att.o_proj.weight, device, dtype),
                                 _v(layer.post_attention_layernorm.weight, device, dtype),
                                 _dense(layer.mlp, device, dtype)))
    return LlamaWeights(spec, _v(inner.embed_tokens.weight, device, dtype), layers,
                        _v(inner.norm.weight, device, dtype), _t(model.lm_head.weight, device, dtype))


def _experts(experts: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 (E, 2I, H), w2 (E, H, I)) from fused 3-d parameters or a list of per-expert MLPs."""
    if hasattr(experts, "gate_up_proj"):
        return experts.gate_up_proj.detach(), experts.down_proj.detach()
    w13 = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight], dim=0) for e in experts])
    w2 = torch.stack([e.down_proj.weight for e in experts])
    return w13.detach(), w2.detach()


def _moe(mlp: Any, device: Any, dtype: Any) -> MoEWeights:
    w13, w2 = _experts(mlp.experts)
    bias = getattr(mlp.gate, "e_score_correction_bias", None)
    shared = _dense(mlp.shared_experts, device, dtype) if getattr(mlp, "shared_experts", None) is not None else None
    return MoEWeights(_t(mlp.gate.weight, device, torch.float32),
                      None if bias is None else _v(bias, device, torch.float32),
                      _v(w13, device, dtype), _v(w2, device, dtype), shared)


def absorbed_mla(kv_b: torch.Tensor, num_heads: int, nope: int, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_uk (H, nope, R), w_uv (H, R, v))`` from ``kv_b_proj.weight`` (H (nope + v), R), rows per head [k_nope; v]."""
    kv_b = kv_b.view(num_heads, nope + v_dim, kv_b.shape[-1])
    return kv_b[:, :nope, :], kv_b[:, nope:, :].transpose(1, 2)


def deepseek_from_hf(model: Any, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> DeepseekWeights:
    """Weights of a ``DeepseekV3ForCausalLM`` in the engine's layout (absorbed MLA matrices included)."""
    spec = deepseek_spec(model.config)
    inner = model.model
    device = device if device is not None else inner.embed_tokens.weight.device
    dtype = dtype or inner.embed_tokens.weight.dtype
    h, nope, vd = spec.num_heads, spec.qk_nope_head_dim, spec.v_head_dim
    layers = []
    for i, layer in enumerate(inner.layers):
        att = layer.self_attn
        w_uk, w_uv = absorbed_mla(att.kv_b_proj.weight.detach(), h, nope, vd)
        lora = spec.q_lora_rank is not None
        mlp = _moe(layer.mlp, device, dtype) if i >= spec.first_k_dense_replace else _dense(layer.mlp, device, dtype)
        layers.append(MLALayer(
            attn_norm=_v(layer.input_layernorm.weight, device, dtype),
            w_q=None if lora else _t(att.q_proj.weight, device, dtype),
            w_q_a=_t(att.q_a_proj.weight, device, dtype) if lora else None,
            q_a_norm=_v(att.q_a_layernorm.weight, device, dtype) if lora else None,
            w_q_b=_t(att.q_b_proj.weight, device, dtype) if lora else None,
            w_kv_a=_t(att.kv_a_proj_with_mqa.weight, device, dtype),
            kv_a_norm=_v(att.kv_a_layernorm.weight, device, dtype),
            w_kv_b=_t(att.kv_b_proj.weight, device, dtype),
            w_uk=_v(w_uk, device, dtype),
            w_uv=_v(w_uv, device, dtype),
            w_o=_t(att.o_proj.weight, device, dtype),
            mlp_norm=_v(layer.post_attention_layernorm.weight, device, dtype),
            mlp=mlp))
    return DeepseekWeights(spec, _v(inner.embed_tokens.weight, device, dtype), layers,
                           _v(inner.norm.weight, device, dtype), _t(model.lm_head.weight, device, dtype))


def truncate_layers(weights: LlamaWeights | DeepseekWeights, num_layers: int) -> Any:
    """The same model keeping only its first ``num_layers`` layers (shares the tensors): a cheap,
    correlated draft model for speculative decoding."""
    from dataclasses import replace

    if not (isinstance(num_layers, int) and 1 <= num_layers <= weights.spec.num_layers):
        raise fail("num_layers", num_layers, f"an int in [1, {weights.spec.num_layers}]")
    spec: Any = replace(weights.spec, num_layers=num_layers)
    layers: Any = weights.layers[:num_layers]
    return replace(weights, spec=spec, layers=layers)  # type: ignore[arg-type]
