"""Read a Hugging Face ``config.json`` into a :class:`ModelConfig`.

One parser per ``model_type``, in the explicit registry :data:`PARSERS`. Each
reads the family's own key names (``n_embd`` for GPT-2, ``d_model`` for MPT,
``ffn_dim`` for OPT...) and, where a key is absent, uses the default of the
family's ``transformers`` config class, because ``save_pretrained`` omits keys
equal to ``PretrainedConfig`` defaults (``tie_word_embeddings`` for GPT-2). Shape
keys that every saved config carries are required; a missing one is a
:class:`SpecError` naming it.

Nothing here imports ``transformers``; the implementation details that decide
parameter counts (which projections have biases, norms per block) are written
down per family from the ``modeling_*.py`` sources.

Size: this module is over the 500-line soft limit on purpose. It is 20 short,
independent parsers beside the registry that lists them; splitting them across
files would make none shorter and would separate each from the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from gpuplan.errors import SpecError
from gpuplan.models.config import ModelConfig
from gpuplan.models.vision import resnet_layers


class _Missing:
    """Sentinel type: the key has no default and is required."""


_MISSING = _Missing()


class _Keys:
    """Typed access to config keys with errors that name the key."""

    def __init__(self, data: Mapping[str, Any], model_type: str) -> None:
        self.data = data
        self.model_type = model_type

    def _error(self, name: str, problem: str) -> SpecError:
        return SpecError(
            f"config.json ({self.model_type}): {problem} {name!r}",
            hint="pass the model's own config.json, as saved by transformers",
        )

    def _lookup(self, names: tuple[str, ...], default: object) -> tuple[str, object]:
        for name in names:
            value = self.data.get(name)
            if value is not None:
                return name, value
        if isinstance(default, _Missing):
            raise self._error(names[0], "missing key")
        return names[0], default

    def integer(self, *names: str, default: int | _Missing = _MISSING) -> int:
        """The first of ``names`` that is set, as a non-negative int."""
        name, value = self._lookup(names, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._error(name, f"expected a non-negative integer, got {value!r} for")
        return value

    def number(self, *names: str, default: float | _Missing = _MISSING) -> float:
        """The first of ``names`` that is set, as a float."""
        name, value = self._lookup(names, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._error(name, f"expected a number, got {value!r} for")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        """Key ``name`` as a bool."""
        _, value = self._lookup((name,), default)
        if not isinstance(value, bool):
            raise self._error(name, f"expected true or false, got {value!r} for")
        return value

    def text(self, *names: str, default: str | _Missing = _MISSING) -> str:
        """The first of ``names`` that is set, as a string."""
        name, value = self._lookup(names, default)
        if not isinstance(value, str):
            raise self._error(name, f"expected a string, got {value!r} for")
        return value

    def int_list(self, name: str) -> list[int]:
        """Key ``name`` as a non-empty list of positive integers."""
        _, value = self._lookup((name,), _MISSING)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            raise self._error(name, f"expected a list of positive integers, got {value!r} for")
        return value

    def mapping(self, name: str) -> _Keys:
        """A nested object (MPT's ``attn_config``), empty when absent."""
        value = self.data.get(name) or {}
        if not isinstance(value, Mapping):
            raise self._error(name, f"expected an object, got {value!r} for")
        return _Keys(value, f"{self.model_type}.{name}")

    def num_labels(self) -> int:
        """Classifier outputs: ``num_labels`` or the size of ``id2label``."""
        if "num_labels" in self.data:
            return self.integer("num_labels")
        labels = self.data.get("id2label")
        if isinstance(labels, Mapping) and labels:
            return len(labels)
        raise self._error("num_labels", "missing key (or id2label)")

    def dtype(self) -> str | None:
        """The checkpoint dtype (``torch_dtype``, or ``dtype`` in newer configs)."""
        value = self.data.get("torch_dtype", self.data.get("dtype"))
        return value if isinstance(value, str) else None


def _head_dim(k: _Keys, hidden: int, heads: int) -> int:
    explicit = k.integer("head_dim", default=0)
    if explicit:
        return explicit
    if heads == 0 or hidden % heads:
        raise k._error(
            "head_dim", f"hidden size {hidden} is not divisible by {heads} heads; missing key"
        )
    return hidden // heads


def _rope_decoder(k: _Keys, *, tie: bool, act: str = "silu") -> dict[str, Any]:
    """Fields shared by the Llama-style families (pre-RMSNorm, gated MLP, RoPE)."""
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads")
    head_dim = _head_dim(k, hidden, heads)
    bias = k.flag("attention_bias", False)
    return {
        "family": "decoder",
        "hidden_size": hidden,
        "num_layers": k.integer("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_kv_heads": k.integer("num_key_value_heads", default=heads),
        "head_dim": head_dim,
        "intermediate_size": k.integer("intermediate_size"),
        "vocab_size": k.integer("vocab_size"),
        "embedding_dim": hidden,
        "max_position_embeddings": k.integer("max_position_embeddings"),
        "position_embedding_rows": 0,
        "tie_word_embeddings": k.flag("tie_word_embeddings", tie),
        "mlp": "gated",
        "activation": k.text("hidden_act", default=act),
        "norm": "rmsnorm",
        "norm_bias": False,
        "norm_position": "pre",
        "norms_per_layer": 2,
        "final_norm": True,
        "embedding_norm": False,
        "qkv_bias": bias,
        "attention_out_bias": bias,
        "mlp_bias": k.flag("mlp_bias", False),
        "positional": "rope",
        "rotary_dim": int(head_dim * k.number("partial_rotary_factor", default=1.0)),
        "parallel_attention": False,
    }


def _window(k: _Keys, *, gated_by: str | None = None) -> int | None:
    if gated_by is not None and not k.flag(gated_by, False):
        return None
    window = k.integer("sliding_window", default=0)
    return window or None


def _llama(k: _Keys) -> dict[str, Any]:
    return _rope_decoder(k, tie=False)


def _mistral(k: _Keys) -> dict[str, Any]:
    return {**_rope_decoder(k, tie=False), "sliding_window": _window(k)}


def _mixtral(k: _Keys) -> dict[str, Any]:
    fields = _rope_decoder(k, tie=False)
    return {
        **fields,
        "sliding_window": _window(k),
        "num_experts": k.integer("num_local_experts"),
        "num_experts_per_token": k.integer("num_experts_per_tok"),
        "moe_intermediate_size": fields["intermediate_size"],
    }


def _qwen2(k: _Keys) -> dict[str, Any]:
    # Qwen2Attention: q/k/v with bias, o_proj without (hard-coded, no config key).
    return {
        **_rope_decoder(k, tie=False),
        "qkv_bias": True,
        "attention_out_bias": False,
        "sliding_window": _window(k, gated_by="use_sliding_window"),
    }


def _qwen3(k: _Keys) -> dict[str, Any]:
    # Qwen3Attention adds RMSNorm(head_dim) on queries and keys.
    return {
        **_rope_decoder(k, tie=False),
        "qk_norm": True,
        "sliding_window": _window(k, gated_by="use_sliding_window"),
    }


def _qwen3_moe(k: _Keys) -> dict[str, Any]:
    # Qwen3MoeSparseMoeBlock: a router and num_experts SwiGLU experts of moe_intermediate_size,
    # no shared expert; layers listed in mlp_only_layers (or off decoder_sparse_step) are dense.
    if k.integer("decoder_sparse_step", default=1) != 1:
        raise k._error("decoder_sparse_step", "only 1 (every layer sparse) is supported for")
    if k.data.get("mlp_only_layers"):
        raise k._error("mlp_only_layers", "dense layers among sparse ones are not supported for")
    return {
        **_qwen3(k),
        "num_experts": k.integer("num_experts"),
        "num_experts_per_token": k.integer("num_experts_per_tok"),
        "moe_intermediate_size": k.integer("moe_intermediate_size"),
    }


def _gemma2(k: _Keys) -> dict[str, Any]:
    # Gemma2DecoderLayer: input, post-attention, pre-feedforward, post-feedforward norms;
    # tanh soft-capping of the attention scores and of the final logits (0 or null: none).
    fields = _rope_decoder(k, tie=True, act="gelu_pytorch_tanh")
    act = k.text("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    attn_cap = k.number("attn_logit_softcapping", default=0.0)
    final_cap = k.number("final_logit_softcapping", default=0.0)
    for name, cap in (("attn_logit_softcapping", attn_cap), ("final_logit_softcapping", final_cap)):
        if cap < 0:
            raise k._error(name, f"expected a positive cap (or null), got {cap!r} for")
    return {
        **fields,
        "activation": act,
        "norms_per_layer": 4,
        "sliding_window": _window(k),
        "attention_softcapping": attn_cap or None,
        "final_logit_softcapping": final_cap or None,
    }


def _phi3(k: _Keys) -> dict[str, Any]:
    # Phi3: fused qkv_proj and gate_up_proj, no biases; same counts as the unfused form.
    return {**_rope_decoder(k, tie=False), "sliding_window": _window(k)}


def _phi(k: _Keys) -> dict[str, Any]:
    # PhiDecoderLayer: one LayerNorm, attention and MLP in parallel, biases everywhere,
    # lm_head with bias; optional LayerNorm(head_dim) on q and k.
    fields = _rope_decoder(k, tie=False, act="gelu_new")
    head_dim = fields["head_dim"]
    return {
        **fields,
        "mlp": "standard",
        "norm": "layernorm",
        "norm_bias": True,
        "norms_per_layer": 1,
        "qkv_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "lm_head_bias": True,
        "qk_norm": k.flag("qk_layernorm", False),
        "rotary_dim": int(head_dim * k.number("partial_rotary_factor", default=0.5)),
        "parallel_attention": True,
    }


def _layernorm_decoder(**fields: Any) -> dict[str, Any]:
    """Fields shared by the GPT-2-style families (LayerNorm with bias, standard MLP)."""
    base: dict[str, Any] = {
        "family": "decoder",
        "mlp": "standard",
        "norm": "layernorm",
        "norm_bias": True,
        "norm_position": "pre",
        "norms_per_layer": 2,
        "final_norm": True,
        "embedding_norm": False,
        "qkv_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "positional": "learned",
        "parallel_attention": False,
    }
    base.update(fields)
    base.setdefault("embedding_dim", base["hidden_size"])
    return base


def _gpt2(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("n_embd", "hidden_size")
    heads = k.integer("n_head", "num_attention_heads")
    positions = k.integer("n_positions", "max_position_embeddings")
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("n_layer", "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=k.integer("n_inner", default=4 * hidden),
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=positions,
        position_embedding_rows=positions,
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        activation=k.text("activation_function", default="gelu_new"),
    )


def _gptj(k: _Keys) -> dict[str, Any]:
    # GPTJBlock: ln_1 only, parallel attention + MLP; q/k/v/out without bias; lm_head with bias.
    hidden = k.integer("n_embd", "hidden_size")
    heads = k.integer("n_head", "num_attention_heads")
    head_dim = _head_dim(k, hidden, heads)
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("n_layer", "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=k.integer("n_inner", default=4 * hidden),
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=k.integer("n_positions", "max_position_embeddings"),
        position_embedding_rows=0,
        tie_word_embeddings=k.flag("tie_word_embeddings", False),
        activation=k.text("activation_function", default="gelu_new"),
        norms_per_layer=1,
        qkv_bias=False,
        attention_out_bias=False,
        lm_head_bias=True,
        positional="rope",
        rotary_dim=k.integer("rotary_dim", default=head_dim),
        parallel_attention=True,
    )


def _gpt_neox(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads")
    head_dim = _head_dim(k, hidden, heads)
    bias = k.flag("attention_bias", True)
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=k.integer("intermediate_size"),
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=k.integer("max_position_embeddings"),
        position_embedding_rows=0,
        tie_word_embeddings=k.flag("tie_word_embeddings", False),
        activation=k.text("hidden_act", default="gelu"),
        qkv_bias=bias,
        attention_out_bias=bias,
        positional="rope",
        rotary_dim=int(head_dim * k.number("rotary_pct", "partial_rotary_factor", default=0.25)),
        parallel_attention=k.flag("use_parallel_residual", True),
    )


def _opt(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads")
    positions = k.integer("max_position_embeddings")
    if not k.flag("layer_norm_elementwise_affine", True):
        raise k._error("layer_norm_elementwise_affine", "unsupported value false for")
    pre = k.flag("do_layer_norm_before", True)
    bias = k.flag("enable_bias", True)
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=k.integer("ffn_dim"),
        vocab_size=k.integer("vocab_size"),
        embedding_dim=k.integer("word_embed_proj_dim", default=hidden),
        max_position_embeddings=positions,
        position_embedding_rows=positions + 2,  # OPTLearnedPositionalEmbedding offset
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        activation=k.text("activation_function", default="relu"),
        norm_position="pre" if pre else "post",
        final_norm=pre and not k.flag("_remove_final_layer_norm", False),
        qkv_bias=bias,
        attention_out_bias=bias,
        mlp_bias=bias,
    )


def _bloom(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("hidden_size", "n_embed")
    heads = k.integer("n_head", "num_attention_heads")
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("n_layer", "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=4 * hidden,
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=k.integer("seq_length", default=0),
        position_embedding_rows=0,
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        activation="bloom_gelu",  # tanh approximation, a custom autograd function
        embedding_norm=True,  # word_embeddings_layernorm
        positional="alibi",
    )


def _falcon(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads", "n_head")
    head_dim = _head_dim(k, hidden, heads)
    new_arch = k.flag("new_decoder_architecture", k.model_type == "RefinedWeb")
    if new_arch:
        kv = k.integer("num_kv_heads", "n_head_kv", default=heads)
    else:
        kv = 1 if k.flag("multi_query", True) else heads
    parallel = k.flag("parallel_attn", True)
    bias = k.flag("bias", False)
    alibi = k.flag("alibi", False)
    # FalconDecoderLayer: ln_attn + ln_mlp when new_decoder_architecture and
    # num_ln_in_parallel_attn == 2 (its default there); else input_layernorm
    # (+ post_attention_layernorm when not parallel).
    two_ln = new_arch and k.integer("num_ln_in_parallel_attn", default=2) == 2
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers", "n_layer"),
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=k.integer("ffn_hidden_size", default=4 * hidden),
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=k.integer("max_position_embeddings", default=2048),
        position_embedding_rows=0,
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        activation=k.text("activation", default="gelu"),
        norms_per_layer=2 if two_ln or not parallel else 1,
        qkv_bias=bias,
        attention_out_bias=bias,
        mlp_bias=bias,
        positional="alibi" if alibi else "rope",
        rotary_dim=0 if alibi else head_dim,
        parallel_attention=parallel,
    )


def _mpt(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("d_model")
    heads = k.integer("n_heads")
    attn = k.mapping("attn_config")
    ffn = k.mapping("ffn_config")
    attn_type = attn.text("attn_type", default="multihead_attention")
    kv = {
        "multiquery_attention": 1,
        "grouped_query_attention": attn.integer("kv_n_heads", default=heads),
    }
    bias = not k.flag("no_bias", True)
    alibi = attn.flag("alibi", False)
    rope = attn.flag("rope", False)
    # MPTConfig turns learned_pos_emb off when alibi or rope is on.
    learned = k.flag("learned_pos_emb", True) and not (alibi or rope)
    seq = k.integer("max_seq_len")
    ffn_hidden = ffn.integer(
        "ffn_hidden_size", default=int(k.number("expansion_ratio", default=4) * hidden)
    )
    return _layernorm_decoder(
        hidden_size=hidden,
        num_layers=k.integer("n_layers"),
        num_attention_heads=heads,
        num_kv_heads=kv.get(attn_type, heads),
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=ffn_hidden,
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=seq,
        position_embedding_rows=seq if learned else 0,
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        mlp="gated" if ffn.text("ffn_type", default="mptmlp") == "mptglu" else "standard",
        activation="gelu",
        norm_bias=bias,
        qkv_bias=bias,
        attention_out_bias=bias,
        mlp_bias=bias,
        qk_norm=attn.flag("qk_ln", False),
        positional="alibi" if alibi else "rope" if rope else "learned" if learned else "none",
        rotary_dim=_head_dim(k, hidden, heads) if rope else 0,
    )


def _bert(k: _Keys) -> dict[str, Any]:
    # BertModel / RobertaModel with the pooler: post-LN blocks, embedding LayerNorm.
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads")
    kind = k.text("position_embedding_type", default="absolute")
    if kind != "absolute":
        raise k._error("position_embedding_type", f"unsupported value {kind!r} for")
    positions = k.integer("max_position_embeddings")
    return _layernorm_decoder(
        family="encoder",
        hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=k.integer("intermediate_size"),
        vocab_size=k.integer("vocab_size"),
        max_position_embeddings=positions,
        position_embedding_rows=positions,
        type_vocab_size=k.integer("type_vocab_size", default=2),
        tie_word_embeddings=k.flag("tie_word_embeddings", True),
        activation=k.text("hidden_act", default="gelu"),
        norm_position="post",
        final_norm=False,
        embedding_norm=True,
        pooler=True,
    )


def _vit(k: _Keys) -> dict[str, Any]:
    # ViTForImageClassification (= torchvision VisionTransformer): no pooler.
    hidden = k.integer("hidden_size")
    heads = k.integer("num_attention_heads")
    image = k.integer("image_size")
    patch = k.integer("patch_size")
    tokens = (image // patch) ** 2 + 1 if patch else 0
    return _layernorm_decoder(
        family="vit",
        hidden_size=hidden,
        num_layers=k.integer("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=_head_dim(k, hidden, heads),
        intermediate_size=k.integer("intermediate_size"),
        vocab_size=0,
        embedding_dim=0,
        max_position_embeddings=tokens,
        position_embedding_rows=tokens,
        tie_word_embeddings=False,
        activation=k.text("hidden_act", default="gelu"),
        qkv_bias=k.flag("qkv_bias", True),
        image_size=image,
        patch_size=patch,
        num_channels=k.integer("num_channels", default=3),
        num_classes=k.num_labels(),
    )


def _resnet(k: _Keys) -> dict[str, Any]:
    hidden_sizes = k.int_list("hidden_sizes")
    depths = k.int_list("depths")
    channels = k.integer("num_channels", default=3)
    layers, weighted = resnet_layers(
        num_channels=channels,
        embedding_size=k.integer("embedding_size", default=64),
        hidden_sizes=hidden_sizes,
        depths=depths,
        layer_type=k.text("layer_type", default="bottleneck"),
        num_classes=k.num_labels(),
        downsample_in_first_stage=k.flag("downsample_in_first_stage", False),
        downsample_in_bottleneck=k.flag("downsample_in_bottleneck", False),
    )
    return {
        "family": "cnn",
        "hidden_size": hidden_sizes[-1],
        "num_layers": weighted,
        "num_attention_heads": 0,
        "num_kv_heads": 0,
        "head_dim": 0,
        "intermediate_size": 0,
        "vocab_size": 0,
        "embedding_dim": 0,
        "max_position_embeddings": 0,
        "position_embedding_rows": 0,
        "tie_word_embeddings": False,
        "mlp": "standard",
        "activation": k.text("hidden_act", default="relu"),
        "norm": "batchnorm",
        "norm_bias": True,
        "norm_position": "post",
        "norms_per_layer": 0,
        "final_norm": False,
        "embedding_norm": False,
        "qkv_bias": False,
        "attention_out_bias": False,
        "mlp_bias": False,
        "positional": "none",
        "parallel_attention": False,
        "image_size": k.integer("image_size", default=224),
        "num_channels": channels,
        "num_classes": layers[-1].out_channels if layers[-1].kind == "linear" else 0,
        "cnn_layers": layers,
    }


PARSERS: Mapping[str, Callable[[_Keys], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma2": _gemma2,
    "phi": _phi,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
    "opt": _opt,
    "bloom": _bloom,
    "falcon": _falcon,
    "mpt": _mpt,
    "bert": _bert,
    "roberta": _bert,
    "vit": _vit,
    "resnet": _resnet,
}
"""Supported ``model_type`` values and their parsers."""

_LEGACY_TYPES = {"RefinedWebModel": "falcon", "RefinedWeb": "falcon"}

_DROPOUT_KEYS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], float]] = {
    # model_type: (attention-dropout keys, hidden-dropout keys, transformers' class default)
    "gpt2": (("attn_pdrop",), ("resid_pdrop",), 0.1),
    "bert": (("attention_probs_dropout_prob",), ("hidden_dropout_prob",), 0.1),
    "roberta": (("attention_probs_dropout_prob",), ("hidden_dropout_prob",), 0.1),
    "opt": (("attention_dropout",), ("dropout",), 0.0),
    "gptj": (("attn_pdrop",), ("resid_pdrop",), 0.0),
    "phi": (("attention_dropout",), ("resid_pdrop",), 0.0),
}
"""Where each family's config keeps its dropout rates; others use ``attention_dropout``
and ``hidden_dropout`` with a default of 0 (the transformers defaults for them)."""


def _dropouts(data: Mapping[str, Any], model_type: str) -> dict[str, float]:
    attn_keys, hid_keys, default = _DROPOUT_KEYS.get(
        model_type, (("attention_dropout",), ("hidden_dropout",), 0.0)
    )
    hid_default = 0.1 if model_type == "opt" else default

    def first(keys: tuple[str, ...], fallback: float) -> float:
        for key in keys:
            value = data.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return fallback

    return {
        "attention_dropout": first(attn_keys, default),
        "hidden_dropout": first(hid_keys, hid_default),
    }


def from_hf_config(data: Mapping[str, Any], *, id: str) -> ModelConfig:
    """Build a :class:`ModelConfig` from the contents of a Hugging Face ``config.json``.

    Args:
        data: the parsed JSON object.
        id: the name to give the model (a preset id or the file's name).

    Returns:
        The normalized architecture.

    Raises:
        SpecError: the ``model_type`` is not supported (the message lists the
            allowed ones), a required key is missing or has the wrong type (the
            message names the key), or the values are inconsistent.

    Example:
        >>> cfg = from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
        ...     "n_head": 12, "n_positions": 1024, "vocab_size": 50257}, id="gpt2")
        >>> (cfg.family, cfg.intermediate_size, cfg.tie_word_embeddings)
        ('decoder', 3072, True)
    """
    if not isinstance(data, Mapping):
        raise SpecError(f"config.json: expected a JSON object, got {type(data).__name__}")
    allowed = ", ".join(PARSERS)
    raw_type = data.get("model_type")
    if not isinstance(raw_type, str):
        raise SpecError(
            "config.json: missing key 'model_type'", hint=f"supported model_type values: {allowed}"
        )
    model_type = _LEGACY_TYPES.get(raw_type, raw_type)
    parser = PARSERS.get(model_type)
    if parser is None:
        raise SpecError(
            f"model_type: unsupported {raw_type!r}; allowed: {allowed}",
            hint="use a preset from `gpuplan models` or a config of a supported family",
        )
    keys = _Keys(data, raw_type)
    fields = parser(keys)
    try:
        return ModelConfig(
            id=id,
            model_type=model_type,
            checkpoint_dtype=keys.dtype(),
            **{**_dropouts(data, model_type), **fields},
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise SpecError(f"config.json ({raw_type}): {where}: {first['msg']}") from exc
