"""Exact parameter counts computed from a :class:`ModelConfig`.

The count is what ``sum(p.numel() for p in model.parameters())`` returns for the
reference implementation: ``*ForCausalLM`` for decoders (tied weights counted
once), ``BertModel``/``RobertaModel`` with the pooler for encoders, the image
classifier (torchvision ``resnet50``/``vit_b_16``, HF ``*ForImageClassification``)
for vision. Buffers (rotary ``inv_freq``, causal masks, BatchNorm running
statistics) are not parameters and are not counted, although some checkpoints
store them (Llama-2's ``safetensors.total`` includes ``inv_freq``; GPT-2's
includes ``attn.bias``).

Every preset's result is tested for integer equality against its published count.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpuplan.models.config import ModelConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    """Parameter counts by component; every value is a number of elements.

    Attributes:
        embeddings: token, position, token-type tables, embedding norm and
            projections; for a ViT the patch convolution, class token and
            position table.
        attention: q/k/v/o weights and biases and q/k norms, all layers.
        mlp_dense: dense MLP weights and biases, all layers.
        mlp_experts: routed and shared expert MLPs, all layers (0 if dense).
        router: MoE router (gate) weights, all layers.
        norms: every norm's weight and bias (BatchNorm affine parameters for a CNN).
        conv: CNN convolution weights and biases.
        lm_head: the untied output projection (0 when tied to the embeddings).
        head: other heads: BERT pooler, image classifier.
        total: the sum of the above.
        active_per_token: parameters one token (or image) passes through: total
            minus the routed experts it is not sent to.
    """

    embeddings: int
    attention: int
    mlp_dense: int
    mlp_experts: int
    router: int
    norms: int
    conv: int
    lm_head: int
    head: int
    total: int
    active_per_token: int

    def as_dict(self) -> dict[str, int]:
        """Return the counts as a plain dict, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _norm(cfg: ModelConfig, width: int) -> int:
    """Parameters of one norm over ``width`` channels (weight, plus bias for LayerNorm)."""
    return width * (2 if cfg.norm_bias and cfg.norm != "rmsnorm" else 1)


def _mlp(cfg: ModelConfig, width: int) -> int:
    """Parameters of one MLP with hidden width ``width`` (dense or one expert)."""
    h = cfg.hidden_size
    if cfg.mlp == "gated":
        return 3 * h * width + ((2 * width + h) if cfg.mlp_bias else 0)
    return 2 * h * width + ((width + h) if cfg.mlp_bias else 0)


def _attention(cfg: ModelConfig) -> int:
    """Parameters of one attention block (q, k, v, o and optional q/k norms)."""
    h = cfg.hidden_size
    q_out = cfg.num_attention_heads * cfg.head_dim
    kv_out = cfg.num_kv_heads * cfg.head_dim
    total = h * q_out + 2 * h * kv_out + q_out * h
    if cfg.qkv_bias:
        total += q_out + 2 * kv_out
    if cfg.attention_out_bias:
        total += h
    if cfg.qk_norm:
        total += 2 * _norm(cfg, cfg.head_dim)
    return total


def _embeddings(cfg: ModelConfig) -> int:
    h = cfg.hidden_size
    if cfg.family == "vit":
        patches = (cfg.image_size // cfg.patch_size) ** 2
        patch_conv = cfg.num_channels * cfg.patch_size**2 * h + h
        return patch_conv + h + (patches + 1) * h  # conv, class token, positions
    total = cfg.vocab_size * cfg.embedding_dim
    if cfg.embedding_dim != h:
        total += 2 * cfg.embedding_dim * h  # OPT project_in / project_out, no bias
    total += (cfg.type_vocab_size + cfg.position_embedding_rows) * h
    if cfg.embedding_norm:
        total += _norm(cfg, h)
    return total


def _transformer(cfg: ModelConfig) -> ParamCounts:
    layers = cfg.num_layers
    h = cfg.hidden_size
    embeddings = _embeddings(cfg)
    attention = layers * _attention(cfg)
    if cfg.is_moe:
        mlp_dense = 0
        expert = _mlp(cfg, cfg.moe_intermediate_size)
        shared = cfg.num_shared_experts * _mlp(cfg, cfg.shared_expert_intermediate_size)
        mlp_experts = layers * (cfg.num_experts * expert + shared)
        router = layers * h * cfg.num_experts
        inactive = layers * (cfg.num_experts - cfg.num_experts_per_token) * expert
    else:
        mlp_dense = layers * _mlp(cfg, cfg.intermediate_size)
        mlp_experts = router = inactive = 0
    norms = layers * cfg.norms_per_layer * _norm(cfg, h)
    if cfg.final_norm:
        norms += _norm(cfg, h)
    lm_head = 0
    if cfg.family == "decoder":
        if not cfg.tie_word_embeddings:
            lm_head = cfg.vocab_size * cfg.embedding_dim
        if cfg.lm_head_bias:
            lm_head += cfg.vocab_size
    head = h * h + h if cfg.pooler else 0
    if cfg.num_classes:
        head += h * cfg.num_classes + cfg.num_classes
    total = embeddings + attention + mlp_dense + mlp_experts + router + norms + lm_head + head
    return ParamCounts(
        embeddings=embeddings,
        attention=attention,
        mlp_dense=mlp_dense,
        mlp_experts=mlp_experts,
        router=router,
        norms=norms,
        conv=0,
        lm_head=lm_head,
        head=head,
        total=total,
        active_per_token=total - inactive,
    )


def _cnn(cfg: ModelConfig) -> ParamCounts:
    conv = norms = head = 0
    for layer in cfg.cnn_layers:
        bias = layer.out_channels if layer.bias else 0
        if layer.kind == "conv":
            per_out = layer.in_channels // layer.groups * layer.kernel_size**2
            conv += per_out * layer.out_channels + bias
        elif layer.kind == "batchnorm":
            norms += 2 * layer.out_channels
        elif layer.kind == "linear":
            head += layer.in_channels * layer.out_channels + bias
    total = conv + norms + head
    return ParamCounts(
        embeddings=0,
        attention=0,
        mlp_dense=0,
        mlp_experts=0,
        router=0,
        norms=norms,
        conv=conv,
        lm_head=0,
        head=head,
        total=total,
        active_per_token=total,
    )


def count_parameters(cfg: ModelConfig) -> ParamCounts:
    """Count the parameters of ``cfg`` exactly, by component.

    Args:
        cfg: the architecture.

    Returns:
        The counts; ``total`` equals the reference implementation's
        ``sum(p.numel() for p in model.parameters())`` (see the module docstring
        for which class is the reference per family).

    Example:
        >>> from gpuplan.models import load_model
        >>> count_parameters(load_model("llama-3-8b")).total
        8030261248
    """
    if cfg.family == "cnn":
        return _cnn(cfg)
    return _transformer(cfg)
