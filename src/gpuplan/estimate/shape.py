"""The architecture facts the estimators need, in one flat immutable record.

:class:`Shape` is derived from a :class:`gpuplan.models.config.ModelConfig` by
:func:`shape_of`; estimators read only this, so the model layer can grow
without touching them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpuplan.models.config import ModelConfig

Family = Literal["decoder", "encoder", "vit", "cnn"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Linear:
    """One weight matrix per layer (``count`` copies, e.g. MoE experts).

    ``role`` is canonical: q, k, v, qkv (fused), o, gate, up, gate_up (fused), down,
    fc1, fc2, router.
    """

    role: str
    in_features: int
    out_features: int
    count: int = 1
    bias: bool = False

    @property
    def params(self) -> int:
        """Weight (and bias) elements of all copies."""
        return self.count * (
            self.in_features * self.out_features + (self.out_features if self.bias else 0)
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConvLayer:
    """One conv/linear stage of a CNN with its per-sample output size at the reference resolution."""

    name: str
    kind: str
    params: int
    output_elements: int
    forward_flops: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """Architecture facts for the estimators (element counts, not bytes)."""

    model_id: str
    family: Family
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated: bool
    activation: str
    norm: Literal["rmsnorm", "layernorm"]
    rope: bool
    parallel_attention: bool
    num_experts: int
    experts_per_token: int
    attn_dropout: float
    hidden_dropout: float
    params_total: int
    params_per_layer: int
    params_embedding: int
    params_head: int
    params_final_norm: int
    linears: tuple[Linear, ...]
    tied_embeddings: bool
    fixed_tokens: int | None = None
    """Tokens per sample fixed by the architecture (ViT patches + class token)."""
    image_size: int | None = None
    cnn_layers: tuple[ConvLayer, ...] = ()
    attention_softcapping: bool = False
    """The attention scores are soft-capped (Gemma 2): SDPA's kernels cannot do it."""
    final_softcapping: bool = False
    """The logits are soft-capped: one more vocabulary-wide tensor saved (tanh's output)."""

    def __hash__(self) -> int:
        # Every cached estimator step is keyed on the shape; the generated hash walks all its
        # fields (the layer and CNN tuples included) on each lookup, 2 us a call. Equal shapes
        # agree on these fields, so this stays consistent with the generated __eq__.
        return hash((self.model_id, self.hidden, self.layers, self.params_total, self.fixed_tokens))

    @property
    def params_linear_per_layer(self) -> int:
        """Elements of the per-layer weight matrices (what NF4 quantizes)."""
        return sum(lin.params for lin in self.linears)

    @property
    def is_text(self) -> bool:
        """Whether samples are token sequences (seq_len applies)."""
        return self.family in ("decoder", "encoder")


_FUSED_QKV = frozenset({"gpt2", "gpt_neox", "bloom", "falcon", "mpt", "phi3"})
_FUSED_GATE_UP = frozenset({"phi3"})


def _linears(cfg: ModelConfig) -> tuple[Linear, ...]:
    h = cfg.hidden_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    out: list[Linear] = []
    if cfg.model_type in _FUSED_QKV:
        out.append(Linear(role="qkv", in_features=h, out_features=q + 2 * kv, bias=cfg.qkv_bias))
    else:
        out += [
            Linear(role="q", in_features=h, out_features=q, bias=cfg.qkv_bias),
            Linear(role="k", in_features=h, out_features=kv, bias=cfg.qkv_bias),
            Linear(role="v", in_features=h, out_features=kv, bias=cfg.qkv_bias),
        ]
    out.append(Linear(role="o", in_features=q, out_features=h, bias=cfg.attention_out_bias))
    experts = cfg.num_experts if cfg.is_moe else 1
    f = cfg.moe_intermediate_size if cfg.is_moe else cfg.intermediate_size
    if cfg.is_moe:
        out.append(Linear(role="router", in_features=h, out_features=cfg.num_experts))
    if cfg.mlp == "gated":
        if cfg.model_type in _FUSED_GATE_UP:
            out.append(
                Linear(
                    role="gate_up",
                    in_features=h,
                    out_features=2 * f,
                    count=experts,
                    bias=cfg.mlp_bias,
                )
            )
        else:
            out += [
                Linear(
                    role="gate", in_features=h, out_features=f, count=experts, bias=cfg.mlp_bias
                ),
                Linear(role="up", in_features=h, out_features=f, count=experts, bias=cfg.mlp_bias),
            ]
        out.append(
            Linear(role="down", in_features=f, out_features=h, count=experts, bias=cfg.mlp_bias)
        )
    else:
        out += [
            Linear(role="fc1", in_features=h, out_features=f, count=experts, bias=cfg.mlp_bias),
            Linear(role="fc2", in_features=f, out_features=h, count=experts, bias=cfg.mlp_bias),
        ]
    return tuple(out)


def shape_of(cfg: ModelConfig) -> Shape:
    """Derive the estimator's :class:`Shape` from a model config."""
    from gpuplan.models.params import count_parameters

    counts = count_parameters(cfg)
    attn_drop = float(getattr(cfg, "attention_dropout", 0.0))
    hid_drop = float(getattr(cfg, "hidden_dropout", 0.0))
    if cfg.family == "cnn":
        from gpuplan.models.vision import layer_stats

        stats = layer_stats(cfg, image_size=cfg.image_size)
        convs = tuple(
            ConvLayer(
                name=s.name,
                kind=s.kind,
                params=s.params,
                output_elements=s.output_elements_per_image,
                forward_flops=float(s.forward_flops_per_image),
            )
            for s in stats
        )
        return Shape(
            model_id=cfg.id,
            family="cnn",
            model_type=cfg.model_type,
            hidden=cfg.hidden_size,
            layers=cfg.num_layers,
            heads=1,
            kv_heads=1,
            head_dim=1,
            ffn=0,
            vocab=0,
            gated=False,
            activation="relu",
            norm="layernorm",
            rope=False,
            parallel_attention=False,
            num_experts=1,
            experts_per_token=1,
            attn_dropout=0.0,
            hidden_dropout=0.0,
            params_total=counts.total,
            params_per_layer=counts.total // cfg.num_layers,
            params_embedding=0,
            params_head=counts.head,
            params_final_norm=0,
            linears=(),
            tied_embeddings=False,
            image_size=cfg.image_size,
            cnn_layers=convs,
        )
    layers = cfg.num_layers
    per_layer_total = counts.attention + counts.mlp_dense + counts.mlp_experts + counts.router
    final_norm = (
        cfg.hidden_size * (2 if cfg.norm_bias and cfg.norm != "rmsnorm" else 1)
        if cfg.final_norm
        else 0
    )
    per_layer = (per_layer_total + counts.norms - final_norm) // layers
    fixed = None
    if cfg.family == "vit":
        fixed = (cfg.image_size // cfg.patch_size) ** 2 + 1
    return Shape(
        model_id=cfg.id,
        family=cfg.family,
        model_type=cfg.model_type,
        hidden=cfg.hidden_size,
        layers=layers,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        ffn=cfg.moe_intermediate_size if cfg.is_moe else cfg.intermediate_size,
        vocab=cfg.vocab_size,
        gated=cfg.mlp == "gated",
        activation=cfg.activation,
        norm="rmsnorm" if cfg.norm == "rmsnorm" else "layernorm",
        rope=cfg.positional == "rope",
        parallel_attention=cfg.parallel_attention,
        num_experts=cfg.num_experts,
        experts_per_token=cfg.num_experts_per_token,
        attn_dropout=attn_drop,
        hidden_dropout=hid_drop,
        params_total=counts.total,
        params_per_layer=per_layer,
        params_embedding=counts.embeddings,
        params_head=counts.lm_head + counts.head,
        params_final_norm=final_norm,
        linears=_linears(cfg),
        tied_embeddings=cfg.tie_word_embeddings,
        attention_softcapping=cfg.attention_softcapping is not None,
        final_softcapping=cfg.final_logit_softcapping is not None,
        fixed_tokens=fixed,
        image_size=cfg.image_size or None,
    )
