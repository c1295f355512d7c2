"""Model specs and weights in the engine's layout, taken from a Hugging Face ``transformers`` model.

Layout (all matrices are ``(in, out)``, contiguous, ready for ``gemm.mm(x, w)``):

- Dense decoders (Llama, Qwen2/3, Mistral, Mixtral, Gemma 2/3): ``w_qkv`` (hidden, (Hq + 2 Hkv) D) = [q | k | v]
  with its bias ``b_qkv`` when the model has one; ``w_o`` (Hq D, hidden); ``w_gate_up`` (hidden, 2 I) =
  [gate | up]; ``w_down`` (I, hidden); ``lm_head`` (hidden, vocab). Mixtral's experts as ``moe.experts`` takes
  them (below). Gemma's embedding table is stored already multiplied by its scale.
- DeepSeek-V3: MLA projections plus the absorbed per-head matrices ``w_uk`` (H, nope, R) and
  ``w_uv`` (H, R, v) cut from ``kv_b_proj``; MoE experts ``w13`` (E, 2I, hidden) rows [gate; up]
  and ``w2`` (E, hidden, I) exactly as ``moe.experts`` takes them; the router ``(hidden, E)`` float32.

Which config fields these read, and which values they refuse, is :mod:`.families`' business; nothing here
imports ``transformers``: the functions read attributes of the model object passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.ops.rope import LinearScaling, Llama3Scaling, YarnScaling

#: the scalings a rope may carry (``rope.apply`` takes Llama-3.1's; the others go through a cos/sin table)
RopeScaling = Llama3Scaling | LinearScaling | YarnScaling


# -- specs -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeSpec:
    """One rotary embedding: base ``theta``, optional scaling, GPT-J pairs when ``interleaved``."""

    theta: float
    scaling: RopeScaling | None = None
    interleaved: bool = False

    @property
    def needs_table(self) -> bool:
        """True when ``rope.apply`` cannot take the scaling: the model rotates through a cos/sin table."""
        return self.scaling is not None and not isinstance(self.scaling, Llama3Scaling)


@dataclass(frozen=True)
class LlamaSpec:
    """Shape and hyper-parameters of a dense decoder of the Llama lineage.

    The first fields describe a Llama; the rest switch on what the other families change: ``qkv_bias`` /
    ``o_bias`` (Qwen2, attention_bias), ``qk_norm`` (Qwen3, Gemma 3: RMSNorm over each head's dims before rope),
    ``gemma_norms`` ((1 + w) RMSNorm weights) and ``sandwich_norms`` (Gemma: a norm after attention and after the
    MLP too), ``activation`` ("silu" or "gelu_tanh" gates), ``embed_scale`` (Gemma: sqrt(hidden), folded into the
    stored table), ``attn_scale`` (softmax scale; None = head_dim ** -0.5), ``attn_soft_cap`` /
    ``final_soft_cap`` (tanh caps on attention scores / final logits), ``windows`` (one ``window_left`` per layer,
    -1 = full attention; empty = all full), ``local_rope`` (the rope of sliding-window layers when it differs:
    Gemma 3), ``num_experts`` / ``experts_per_tok`` (Mixtral's softmax top-k MoE instead of the dense MLP),
    ``max_position`` (rows of a cos/sin table).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    family: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    gemma_norms: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"
    embed_scale: float | None = None
    attn_scale: float | None = None
    attn_soft_cap: float | None = None
    final_soft_cap: float | None = None
    windows: tuple[int, ...] = ()
    local_rope: RopeSpec | None = None
    num_experts: int = 0
    experts_per_tok: int = 0
    max_position: int = 4096

    @property
    def sm_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    @property
    def rope(self) -> RopeSpec:
        """The rope of full-attention layers (of every layer unless ``local_rope`` is set)."""
        return RopeSpec(self.rope_theta, self.rope_scaling)

    def window(self, layer: int) -> int:
        """``window_left`` of ``layer`` (-1: full attention)."""
        return self.windows[layer] if self.windows else -1

    def layer_rope(self, layer: int) -> RopeSpec:
        return self.local_rope if self.local_rope is not None and self.window(layer) >= 0 else self.rope

    @property
    def distinct_windows(self) -> tuple[int, ...]:
        """The windows of the layers, each once, in first-use order: one attention plan per step for each."""
        return tuple(dict.fromkeys(self.window(i) for i in range(self.num_layers)))


@dataclass(frozen=True)
class DeepseekSpec:
    """Shape and hyper-parameters of a DeepSeek-V3-family model (MLA + MoE).

    ``rope_scaling``: YaRN for real checkpoints; ``attn_mscale``: the factor YaRN multiplies the softmax scale by
    (``mscale(factor, mscale_all_dim) ** 2``; 1 without YaRN); ``max_position``: rows of the cos/sin table.
    """

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
    rope_scaling: YarnScaling | None = None
    attn_mscale: float = 1.0
    max_position: int = 4096

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5 * self.attn_mscale

    @property
    def rope(self) -> RopeSpec:
        return RopeSpec(self.rope_theta, self.rope_scaling, self.rope_interleave)


# -- weights -----------------------------------------------------------------------------------------------
@dataclass
class DenseMLP:
    w_gate_up: torch.Tensor  # (hidden, 2I) [gate | up]
    w_down: torch.Tensor  # (I, hidden)


@dataclass
class MoEWeights:
    router: torch.Tensor  # (hidden, E): float32 for DeepSeek (its gate runs in float32), the model dtype for Mixtral
    correction_bias: torch.Tensor | None  # (E,) float32
    w13: torch.Tensor  # (E, 2I, hidden)
    w2: torch.Tensor  # (E, hidden, I)
    shared: DenseMLP | None


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    mlp_norm: torch.Tensor  # the norm before the MLP (Gemma: pre_feedforward_layernorm)
    mlp: DenseMLP | MoEWeights
    b_qkv: torch.Tensor | None = None
    b_o: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # (head_dim,)
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # sandwich norms (Gemma)
    post_mlp_norm: torch.Tensor | None = None


@dataclass
class LlamaWeights:
    spec: LlamaSpec
    embed: torch.Tensor  # (vocab, hidden), times embed_scale when the model has one
    layers: list[LlamaLayer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # (hidden, vocab)


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


def _t(w: torch.Tensor, device: Any, dtype: Any) -> torch.Tensor:
    """An nn.Linear weight (out, in) as a contiguous (in, out) matrix."""
    return w.detach().t().to(device=device, dtype=dtype).contiguous()


def _v(w: torch.Tensor, device: Any, dtype: Any) -> torch.Tensor:
    return w.detach().to(device=device, dtype=dtype).contiguous()


def _dense(mlp: Any, device: Any, dtype: Any) -> DenseMLP:
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)
    return DenseMLP(_t(gate_up, device, dtype), _t(mlp.down_proj.weight, device, dtype))


def _experts(experts: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 (E, 2I, H), w2 (E, H, I)) from fused 3-d parameters or a list of per-expert MLPs."""
    if hasattr(experts, "gate_up_proj"):
        return experts.gate_up_proj.detach(), experts.down_proj.detach()
    w13 = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight], dim=0) for e in experts])
    w2 = torch.stack([e.down_proj.weight for e in experts])
    return w13.detach(), w2.detach()


def _moe(mlp: Any, device: Any, dtype: Any, router_dtype: Any) -> MoEWeights:
    w13, w2 = _experts(mlp.experts)
    bias = getattr(mlp.gate, "e_score_correction_bias", None)
    shared = _dense(mlp.shared_experts, device, dtype) if getattr(mlp, "shared_experts", None) is not None else None
    return MoEWeights(_t(mlp.gate.weight, device, router_dtype),
                      None if bias is None else _v(bias, device, torch.float32),
                      _v(w13, device, dtype), _v(w2, device, dtype), shared)


def _bias(linears: list[Any], device: Any, dtype: Any) -> torch.Tensor | None:
    """The concatenated biases of these linear layers, or None when they have none."""
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise fail("model", "a fused projection with a bias on only some of its parts", "all or none biased")
    return _v(torch.cat(biases), device, dtype)


def llama_from_hf(model: Any, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> LlamaWeights:
    """Weights of a dense ``*ForCausalLM`` of a supported family (Llama, Qwen2/3, Mistral, Mixtral, Gemma 2/3) in
    the engine's layout; raises for a model type or config value the engine does not implement."""
    from .families import dense_spec

    spec = dense_spec(model.config)
    inner = model.model
    device = device if device is not None else inner.embed_tokens.weight.device
    dtype = dtype or inner.embed_tokens.weight.dtype
    layers = []
    for layer in inner.layers:
        att = layer.self_attn
        qkv = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], dim=0)
        sandwich = spec.sandwich_norms
        mlp: DenseMLP | MoEWeights = (_moe(layer.mlp, device, dtype, dtype) if spec.num_experts
                                      else _dense(layer.mlp, device, dtype))
        layers.append(LlamaLayer(
            attn_norm=_v(layer.input_layernorm.weight, device, dtype),
            w_qkv=_t(qkv, device, dtype),
            w_o=_t(att.o_proj.weight, device, dtype),
            mlp_norm=_v((layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm).weight,
                        device, dtype),
            mlp=mlp,
            b_qkv=_bias([att.q_proj, att.k_proj, att.v_proj], device, dtype),
            b_o=_bias([att.o_proj], device, dtype),
            q_norm=_v(att.q_norm.weight, device, dtype) if spec.qk_norm else None,
            k_norm=_v(att.k_norm.weight, device, dtype) if spec.qk_norm else None,
            post_attn_norm=_v(layer.post_attention_layernorm.weight, device, dtype) if sandwich else None,
            post_mlp_norm=_v(layer.post_feedforward_layernorm.weight, device, dtype) if sandwich else None))
        if (layers[-1].b_qkv is not None) != spec.qkv_bias or (layers[-1].b_o is not None) != spec.o_bias:
            raise fail("model", f"layer biases unlike its config (qkv {spec.qkv_bias}, o {spec.o_bias})",
                       "a model built from its config")
    embed = inner.embed_tokens.weight.detach()
    if spec.embed_scale is not None:  # the scale as transformers applies it: rounded to the table's dtype first
        embed = embed.to(dtype) * torch.tensor(spec.embed_scale, dtype=dtype)
    return LlamaWeights(spec, _v(embed, device, dtype), layers, _v(inner.norm.weight, device, dtype),
                        _t(model.lm_head.weight, device, dtype))


def absorbed_mla(kv_b: torch.Tensor, num_heads: int, nope: int, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_uk (H, nope, R), w_uv (H, R, v))`` from ``kv_b_proj.weight`` (H (nope + v), R), rows per head [k_nope; v]."""
    kv_b = kv_b.view(num_heads, nope + v_dim, kv_b.shape[-1])
    return kv_b[:, :nope, :], kv_b[:, nope:, :].transpose(1, 2)


def deepseek_from_hf(model: Any, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> DeepseekWeights:
    """Weights of a ``DeepseekV3ForCausalLM`` in the engine's layout (absorbed MLA matrices included)."""
    from .families import deepseek_spec

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
        mlp = (_moe(layer.mlp, device, dtype, torch.float32) if i >= spec.first_k_dense_replace
               else _dense(layer.mlp, device, dtype))
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
    if not (isinstance(num_layers, int) and 1 <= num_layers <= weights.spec.num_layers):
        raise fail("num_layers", num_layers, f"an int in [1, {weights.spec.num_layers}]")
    spec: Any = replace(weights.spec, num_layers=num_layers)
    if isinstance(spec, LlamaSpec) and spec.windows:
        spec = replace(spec, windows=spec.windows[:num_layers])
    layers: Any = weights.layers[:num_layers]
    return replace(weights, spec=spec, layers=layers)  # type: ignore[arg-type]
