"""The normalized architecture description that every estimator reads.

A :class:`ModelConfig` is built from a Hugging Face ``config.json``
(:func:`gpuplan.models.hf.from_hf_config`) or from a shipped preset
(:func:`gpuplan.models.presets.load_model`). It names every architectural choice
that changes parameter count, activation memory or FLOPs, so estimators never
branch on ``model_type``.

Conventions:

* Counts carry the ``num_`` prefix; widths are in elements, not bytes.
* A field that does not apply to a family is ``0`` / ``False`` / ``()`` (for
  example ``vocab_size`` of a CNN); the validator checks that the fields a
  family needs are set.
* "Layer" means one repeated block (a transformer block); for a CNN see
  :attr:`ModelConfig.num_layers`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Family = Literal["decoder", "encoder", "cnn", "vit"]
MlpKind = Literal["gated", "standard"]
NormKind = Literal["rmsnorm", "layernorm", "batchnorm"]
Positional = Literal["rope", "learned", "alibi", "none"]
NormPosition = Literal["pre", "post"]
CnnLayerKind = Literal["conv", "batchnorm", "relu", "maxpool", "global_avgpool", "linear", "add"]


class CnnLayer(BaseModel):
    """One node of a CNN graph, in execution order (as torchvision's ``named_modules``).

    Spatial sizes are not stored: :func:`gpuplan.models.vision.layer_stats` derives
    them for any input image size from kernel, stride and padding.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Dotted module name, torchvision style (``layer1.0.conv1``).")
    kind: CnnLayerKind = Field(description="Operation of this node.")
    inputs: tuple[str, ...] = Field(
        default=(),
        description=(
            "Names of the nodes whose outputs feed this one; empty means the previous node "
            "(the input image for the first node). An ``add`` lists its two operands."
        ),
    )
    in_channels: int = Field(ge=1, description="Input channels (input features for ``linear``).")
    out_channels: int = Field(ge=1, description="Output channels (output features for ``linear``).")
    kernel_size: int = Field(default=1, ge=1, description="Square kernel side (conv, maxpool).")
    stride: int = Field(default=1, ge=1, description="Stride (conv, maxpool).")
    padding: int = Field(default=0, ge=0, description="Zero padding on each side (conv, maxpool).")
    groups: int = Field(default=1, ge=1, description="Convolution groups (1 = dense convolution).")
    bias: bool = Field(default=False, description="Whether a conv or linear node has a bias.")


class ModelConfig(BaseModel):
    """Architecture of one model, normalized across Hugging Face families and vision models.

    Build it with :func:`gpuplan.models.from_hf_config` or
    :func:`gpuplan.models.load_model`; change it with ``model_copy(update=...)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # identity
    id: str = Field(description="Preset id or the name the config was loaded under.")
    family: Family = Field(
        description="decoder (causal LM), encoder (BERT-style), cnn (ResNet) or vit."
    )
    model_type: str = Field(description="Hugging Face ``model_type`` (``llama``, ``resnet``, ...).")

    # transformer shape
    hidden_size: int = Field(
        ge=1, description="Residual-stream width d_model (CNN: channels of the last stage)."
    )
    num_layers: int = Field(
        ge=1,
        description=(
            "Transformer blocks; for a CNN the weighted layers on the main path "
            "(convolutions + linear, without projection shortcuts: 50 for ResNet-50)."
        ),
    )
    num_attention_heads: int = Field(ge=0, description="Query heads per layer (0 for a CNN).")
    num_kv_heads: int = Field(
        ge=0, description="Key/value heads per layer: = heads for MHA, 1 for MQA, else GQA."
    )
    head_dim: int = Field(
        ge=0, description="Width of one attention head; q width is heads x head_dim."
    )
    intermediate_size: int = Field(
        ge=0, description="Hidden width of the dense MLP (of one expert for MoE, see moe_*)."
    )
    vocab_size: int = Field(ge=0, description="Rows of the token-embedding table (0 for vision).")
    embedding_dim: int = Field(
        ge=0,
        description=(
            "Width of the token-embedding table; equals hidden_size except where a projection "
            "sits between them (OPT-350m's word_embed_proj_dim)."
        ),
    )
    max_position_embeddings: int = Field(
        ge=0,
        description=(
            "Longest sequence the model was configured for, in tokens (ViT: patches + class "
            "token); 0 when the config states none (ALiBi models without a limit)."
        ),
    )
    position_embedding_rows: int = Field(
        ge=0,
        description=(
            "Rows of a learned absolute position table (0 for rope/alibi); OPT adds 2 offset "
            "rows, RoBERTa's 514 already includes them."
        ),
    )
    type_vocab_size: int = Field(
        default=0, ge=0, description="Rows of the token-type (segment) table: BERT 2, RoBERTa 1."
    )
    tie_word_embeddings: bool = Field(
        description="Output projection shares the token-embedding weights (no separate lm_head)."
    )

    # block structure
    mlp: MlpKind = Field(
        description="gated: three matrices (SwiGLU/GeGLU); standard: two (up, down)."
    )
    activation: str = Field(
        description="MLP activation as HF names it: silu, gelu, gelu_new, gelu_pytorch_tanh, relu."
    )
    norm: NormKind = Field(description="Normalization layer kind.")
    norm_bias: bool = Field(
        description="LayerNorms carry a bias (False for RMSNorm and MPT's bias-free LayerNorm)."
    )
    norm_position: NormPosition = Field(
        description="pre: norm before each sub-layer (GPT-2 on); post: after the residual (BERT)."
    )
    norms_per_layer: int = Field(
        ge=0, description="Norm modules per block: 2 usually, 1 for GPT-J/Phi/Falcon-7B, 4 Gemma 2."
    )
    final_norm: bool = Field(description="A norm after the last block (absent in post-LN BERT).")
    embedding_norm: bool = Field(
        description="A norm right after the embeddings (BERT, BLOOM's word_embeddings_layernorm)."
    )
    qk_norm: bool = Field(
        default=False,
        description="Per-head norms on queries and keys (Qwen3, Phi with qk_layernorm).",
    )
    qkv_bias: bool = Field(description="Query/key/value projections have biases.")
    attention_out_bias: bool = Field(description="Attention output projection has a bias.")
    mlp_bias: bool = Field(description="MLP projections have biases.")
    lm_head_bias: bool = Field(default=False, description="The LM head has a bias (Phi, GPT-J).")
    attention_softcapping: float | None = Field(
        default=None,
        gt=0,
        description="Attention scores are soft-capped, cap * tanh(scores / cap) (Gemma 2's "
        "attn_logit_softcapping): PyTorch's SDPA kernels cannot, so engines that honour it run "
        "the attention eagerly.",
    )
    final_logit_softcapping: float | None = Field(
        default=None, gt=0, description="The logits are soft-capped the same way (Gemma 2)."
    )
    positional: Positional = Field(description="Position encoding: rope, learned, alibi or none.")
    rotary_dim: int = Field(
        default=0,
        ge=0,
        description="Channels per head that RoPE rotates (head_dim x partial factor; 0: no rope).",
    )
    parallel_attention: bool = Field(
        description="Attention and MLP read the same input and are summed (GPT-J, NeoX, Phi...)."
    )
    sliding_window: int | None = Field(
        default=None,
        description=(
            "Sliding-window attention span in tokens; None = full causal attention. "
            "Gemma 2 applies it on alternate layers only."
        ),
    )
    pooler: bool = Field(
        default=False, description="BERT-style pooler (dense + tanh on the first token)."
    )

    # regularisation (changes saved activations: dropout keeps a mask)
    attention_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on attention probabilities in training."
    )
    hidden_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on residual-branch outputs in training."
    )

    # mixture of experts
    num_experts: int = Field(
        default=1, ge=1, description="Routed experts per MoE layer (1 = dense)."
    )
    num_experts_per_token: int = Field(
        default=1, ge=1, description="Experts each token is routed to (top-k)."
    )
    moe_intermediate_size: int = Field(
        default=0, ge=0, description="Hidden width of one routed expert's MLP (0 if dense)."
    )
    num_shared_experts: int = Field(
        default=0, ge=0, description="Always-active shared experts per MoE layer."
    )
    shared_expert_intermediate_size: int = Field(
        default=0, ge=0, description="Hidden width of one shared expert's MLP."
    )

    # vision
    image_size: int = Field(
        default=0, ge=0, description="Input image side in pixels the model is defined for."
    )
    patch_size: int = Field(default=0, ge=0, description="ViT patch side in pixels.")
    num_channels: int = Field(default=0, ge=0, description="Input image channels (3 for RGB).")
    num_classes: int = Field(default=0, ge=0, description="Classifier outputs (0: no classifier).")
    cnn_layers: tuple[CnnLayer, ...] = Field(
        default=(), description="CNN graph in execution order (family cnn only)."
    )

    # provenance
    checkpoint_dtype: str | None = Field(
        default=None, description="dtype of the published weights (HF torch_dtype), if stated."
    )

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.num_experts > 1

    @property
    def is_vision(self) -> bool:
        """Whether the model takes images (cnn or vit)."""
        return self.family in ("cnn", "vit")

    @model_validator(mode="after")
    def _check_family(self) -> ModelConfig:
        if self.family == "cnn":
            if not self.cnn_layers:
                raise ValueError("cnn_layers: a cnn model needs its layer list")
            if self.image_size <= 0 or self.num_channels <= 0:
                raise ValueError("image_size and num_channels must be set for a cnn model")
            return self
        if self.cnn_layers:
            raise ValueError(f"cnn_layers: only a cnn model has a layer list, not {self.family}")
        if self.num_attention_heads <= 0 or self.head_dim <= 0:
            raise ValueError("num_attention_heads and head_dim must be positive for a transformer")
        if self.num_kv_heads <= 0 or self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim ({self.rotary_dim}) exceeds head_dim ({self.head_dim})")
        if self.num_experts_per_token > self.num_experts:
            raise ValueError(
                f"num_experts_per_token ({self.num_experts_per_token}) exceeds "
                f"num_experts ({self.num_experts})"
            )
        if self.is_moe and self.moe_intermediate_size <= 0:
            raise ValueError("moe_intermediate_size must be set for a mixture-of-experts model")
        if self.family == "vit":
            if min(self.image_size, self.patch_size, self.num_channels) <= 0:
                raise ValueError("image_size, patch_size and num_channels must be set for a vit")
            if self.image_size % self.patch_size:
                raise ValueError(
                    f"image_size ({self.image_size}) is not a multiple of "
                    f"patch_size ({self.patch_size})"
                )
        elif self.vocab_size <= 0 or self.embedding_dim <= 0:
            raise ValueError("vocab_size and embedding_dim must be positive for a text model")
        return self
