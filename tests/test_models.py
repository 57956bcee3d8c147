"""Model presets, Hugging Face config parsing, exact parameter counts, ``gpuplan models``.

Reference tests here check *parameter counting* against published counts (exact
integers where the source gives one) and vision MACs against torchvision's
``_ops``; they do not check any time or memory prediction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from gpuplan.errors import SpecError, UnknownNameError
from gpuplan.models import (
    SUPPORTED_MODEL_TYPES,
    ModelConfig,
    count_parameters,
    forward_macs_per_image,
    from_hf_config,
    layer_stats,
    list_presets,
    load_model,
    preset_info,
)

REQUIRED_PRESETS = (
    "bert-base",
    "bert-large",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "phi-1.5",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "mpt-7b",
    "mpt-30b",
    "gpt3-175b",
    "resnet-50",
    "vit-b-16",
)

# Exact published counts, written out independently of presets.yaml so that an edit
# of the data file cannot silently move both sides (sources in presets.yaml).
EXACT = {
    "llama-3-8b": 8_030_261_248,
    "llama-2-7b": 6_738_415_616,
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_482_240,
    "bert-large": 335_141_888,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "llama-3.1-405b": 405_853_388_800,
    "qwen2.5-72b": 72_706_203_648,
    "resnet-50": 25_557_032,
    "vit-b-16": 86_567_656,
}

DATA = Path(__file__).resolve().parents[1] / "src" / "gpuplan" / "models" / "data"


# ---------------------------------------------------------------- presets


def test_every_required_preset_is_shipped() -> None:
    ids = [p.id for p in list_presets()]
    assert set(REQUIRED_PRESETS) <= set(ids)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("preset", [p.id for p in list_presets()])
def test_computed_count_matches_published(preset: str) -> None:
    info = preset_info(preset)
    total = count_parameters(load_model(preset)).total
    if isinstance(info.published_params, int):
        assert total == info.published_params
    else:
        error_pct = abs(total - info.published_params) / info.published_params * 100
        assert error_pct <= info.tolerance_pct
    assert info.matches(total)
    assert info.params_source.startswith("https://")


@pytest.mark.parametrize(("preset", "expected"), sorted(EXACT.items()))
def test_exact_counts_from_the_brief(preset: str, expected: int) -> None:
    assert count_parameters(load_model(preset)).total == expected
    assert preset_info(preset).published_params == expected


WIDER_TOLERANCE = ("mpt-7b", "falcon-180b", "opt-2.7b", "opt-6.7b", "opt-13b", "llama-7b")
WIDER_TOLERANCE += ("codellama-34b",)
"""Presets whose only published figure rounds further than 0.5 %: mpt-7b's and falcon-180b's
cards, OPT's GPT-3 size-class labels, the LLaMA paper's truncated 6.7B and Code Llama's "34B"
(each explained in its presets.yaml notes)."""


def test_rounded_figures_are_within_half_a_percent_except_mpt_7b() -> None:
    for info in list_presets():
        if not info.published_exact and info.id not in WIDER_TOLERANCE:
            assert info.tolerance_pct <= 0.5, info.id
        if info.tolerance_pct > 0.5:
            assert info.id in WIDER_TOLERANCE and info.notes, info.id


def test_gpt3_matches_the_papers_175b() -> None:
    total = count_parameters(load_model("gpt3-175b")).total
    assert total == 174_604_259_328  # 12 L d^2 + 13 L d + (V + 2048) d + 2 d
    assert abs(total - 175.0e9) / 175.0e9 < 0.005


def test_mixtral_active_parameters_are_the_published_12_9b() -> None:
    counts = count_parameters(load_model("mixtral-8x7b"))
    assert counts.active_per_token == 12_879_925_248
    assert round(counts.active_per_token / 1e9, 1) == 12.9
    assert counts.router == 32 * 4096 * 8
    assert counts.mlp_dense == 0


def test_breakdown_sums_to_total() -> None:
    for info in list_presets():
        counts = count_parameters(load_model(info.id))
        parts = counts.as_dict()
        total = parts.pop("total")
        parts.pop("active_per_token")
        assert sum(parts.values()) == total, info.id


def test_tied_and_untied_heads() -> None:
    assert count_parameters(load_model("llama-3.2-1b")).lm_head == 0
    assert count_parameters(load_model("llama-3-8b")).lm_head == 128256 * 4096
    assert count_parameters(load_model("phi-1.5")).lm_head == 51200 * 2048 + 51200


def test_every_data_file_is_indexed_and_loads() -> None:
    files = {p.name for p in DATA.glob("*.json")}
    indexed = {p.config_file for p in list_presets()}
    assert files == indexed
    for info in list_presets():
        json.loads((DATA / info.config_file).read_text())


# ---------------------------------------------------------------- lookup


def test_lookup_is_case_insensitive_and_accepts_aliases_and_repos() -> None:
    assert load_model("LLaMA-3-8B").id == "llama-3-8b"
    assert load_model("bert-base-uncased").id == "bert-base"
    assert load_model("meta-llama/Meta-Llama-3-8B").id == "llama-3-8b"


def test_presets_are_cached() -> None:
    assert load_model("gpt2") is load_model("GPT2")


def test_unknown_preset_suggests_close_ids() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_model("llama3-8b")
    assert "llama-3-8b" in info.value.suggestions
    assert "did you mean" in str(info.value)
    assert "model:" in str(info.value)


def test_load_model_from_config_file_and_directory(tmp_path: Path) -> None:
    folder = tmp_path / "my-gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_gpt2_tiny()))
    by_file = load_model(str(folder / "config.json"))
    by_dir = load_model(str(folder))
    assert by_file.id == by_dir.id == "my-gpt2"
    assert count_parameters(by_file).total == 108_544


def test_missing_file_and_bad_json_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_model(str(tmp_path / "absent.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model(str(bad))


# ---------------------------------------------------------------- HF parsing

H, HEADS, KV, INTER, LAYERS, VOCAB = 64, 4, 2, 128, 2, 100


def _llama_tiny(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 32,
        **extra,
    }


def _gpt2_tiny() -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "n_embd": H,
        "n_head": HEADS,
        "n_layer": LAYERS,
        "n_positions": 32,
        "vocab_size": VOCAB,
    }


# Per layer of the tiny Llama: q 64x64, k/v 64x32, o 64x64; SwiGLU 3x64x128; two RMSNorms.
LLAMA_LAYER = (H * H + 2 * H * 32 + H * H) + 3 * H * INTER + 2 * H
LLAMA_TOTAL = VOCAB * H + LAYERS * LLAMA_LAYER + H + VOCAB * H
GPT_LAYER = 2 * 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H)

CASES: dict[str, tuple[dict[str, Any], int]] = {
    "llama": (_llama_tiny(), LLAMA_TOTAL),
    "mistral": ({**_llama_tiny(), "model_type": "mistral", "sliding_window": 16}, LLAMA_TOTAL),
    "phi3": ({**_llama_tiny(), "model_type": "phi3", "sliding_window": 15}, LLAMA_TOTAL),
    "qwen2": ({**_llama_tiny(), "model_type": "qwen2"}, LLAMA_TOTAL + LAYERS * (H + 2 * 32)),
    "qwen3": (
        {**_llama_tiny(), "model_type": "qwen3", "head_dim": 32},
        VOCAB * H * 2
        + H
        + LAYERS * ((H * 128 + 2 * H * 64 + 128 * H) + 2 * 32 + 3 * H * INTER + 2 * H),
    ),
    "qwen3_moe": (
        {
            **_llama_tiny(),
            "model_type": "qwen3_moe",
            "head_dim": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
        },
        # attention as qwen3's; a router (H x 4) and four SwiGLU experts of width 24
        VOCAB * H * 2
        + H
        + LAYERS * ((H * 128 + 2 * H * 64 + 128 * H) + 2 * 32 + H * 4 + 4 * 3 * H * 24 + 2 * H),
    ),
    "gemma2": (
        {**_llama_tiny(), "model_type": "gemma2", "head_dim": 32},
        VOCAB * H + H + LAYERS * ((H * 128 + 2 * H * 64 + 128 * H) + 3 * H * INTER + 4 * H),
    ),
    "mixtral": (
        {
            **_llama_tiny(),
            "model_type": "mixtral",
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        2 * VOCAB * H + H + LAYERS * (12_288 + 4 * 3 * H * INTER + H * 4 + 2 * H),
    ),
    "phi": (
        {
            "model_type": "phi",
            "hidden_size": H,
            "intermediate_size": INTER,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "vocab_size": VOCAB,
            "max_position_embeddings": 32,
        },
        VOCAB * H
        + 2 * H
        + (VOCAB * H + VOCAB)
        + LAYERS * (2 * H + 4 * (H * H + H) + (H * INTER + INTER) + (INTER * H + H)),
    ),
    "gpt2": (_gpt2_tiny(), VOCAB * H + 32 * H + LAYERS * GPT_LAYER + 2 * H),
    "gptj": (
        {
            "model_type": "gptj",
            "n_embd": H,
            "n_head": HEADS,
            "n_layer": LAYERS,
            "rotary_dim": 8,
            "n_positions": 32,
            "vocab_size": VOCAB,
        },
        VOCAB * H
        + 2 * H
        + (VOCAB * H + VOCAB)
        + LAYERS * (2 * H + 4 * H * H + (H * 4 * H + 4 * H) + (4 * H * H + H)),
    ),
    "gpt_neox": (
        {
            "model_type": "gpt_neox",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "intermediate_size": 4 * H,
            "vocab_size": VOCAB,
            "max_position_embeddings": 32,
            "rotary_pct": 0.25,
        },
        2 * VOCAB * H + 2 * H + LAYERS * GPT_LAYER,
    ),
    "opt": (
        {
            "model_type": "opt",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "ffn_dim": 4 * H,
            "vocab_size": VOCAB,
            "max_position_embeddings": 32,
        },
        VOCAB * H + 34 * H + LAYERS * GPT_LAYER + 2 * H,
    ),
    "bloom": (
        {
            "model_type": "bloom",
            "hidden_size": H,
            "n_head": HEADS,
            "n_layer": LAYERS,
            "vocab_size": VOCAB,
        },
        VOCAB * H + 2 * H + LAYERS * GPT_LAYER + 2 * H,
    ),
    "falcon": (
        {
            "model_type": "falcon",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "vocab_size": VOCAB,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
            "new_decoder_architecture": False,
        },
        VOCAB * H + 2 * H + LAYERS * (2 * H + H * (H + 2 * 16) + H * H + 2 * H * 4 * H),
    ),
    "mpt": (
        {
            "model_type": "mpt",
            "d_model": H,
            "n_heads": HEADS,
            "n_layers": LAYERS,
            "expansion_ratio": 4,
            "max_seq_len": 32,
            "vocab_size": VOCAB,
            "no_bias": True,
            "learned_pos_emb": True,
            "attn_config": {"alibi": True},
        },
        VOCAB * H + H + LAYERS * (2 * H + 4 * H * H + 2 * 4 * H * H),
    ),
    "bert": (
        {
            "model_type": "bert",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "intermediate_size": 4 * H,
            "vocab_size": VOCAB,
            "max_position_embeddings": 32,
            "type_vocab_size": 2,
        },
        (VOCAB + 32 + 2) * H + 2 * H + LAYERS * GPT_LAYER + (H * H + H),
    ),
    "roberta": (
        {
            "model_type": "roberta",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "intermediate_size": 4 * H,
            "vocab_size": VOCAB,
            "max_position_embeddings": 34,
            "type_vocab_size": 1,
        },
        (VOCAB + 34 + 1) * H + 2 * H + LAYERS * GPT_LAYER + (H * H + H),
    ),
    "vit": (
        {
            "model_type": "vit",
            "hidden_size": H,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "intermediate_size": 4 * H,
            "image_size": 32,
            "patch_size": 8,
            "num_channels": 3,
            "num_labels": 10,
        },
        (3 * 8 * 8 * H + H) + H + 17 * H + LAYERS * GPT_LAYER + 2 * H + (H * 10 + 10),
    ),
    "resnet": (
        {
            "model_type": "resnet",
            "embedding_size": 8,
            "hidden_sizes": [8, 16],
            "depths": [1, 1],
            "layer_type": "basic",
            "num_channels": 3,
            "num_labels": 10,
            "image_size": 32,
        },
        # stem conv+bn; block 8->8 (2 conv+bn); block 8->16 stride 2 (+1x1 shortcut); fc
        (3 * 8 * 49 + 16)
        + 2 * (8 * 8 * 9 + 16)
        + (8 * 16 * 9 + 32 + 16 * 16 * 9 + 32 + 8 * 16 + 32)
        + (16 * 10 + 10),
    ),
}


def test_every_supported_model_type_has_a_parsing_case() -> None:
    assert set(CASES) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_hf_parsing_counts_tiny_configs(model_type: str) -> None:
    data, expected = CASES[model_type]
    cfg = from_hf_config(data, id=f"tiny-{model_type}")
    assert cfg.model_type == model_type
    assert count_parameters(cfg).total == expected


def test_parsed_fields_follow_each_family() -> None:
    mistral = from_hf_config(CASES["mistral"][0], id="m")
    assert (mistral.num_kv_heads, mistral.head_dim, mistral.sliding_window) == (2, 16, 16)
    assert from_hf_config(CASES["qwen2"][0], id="q").sliding_window is None
    falcon = from_hf_config(CASES["falcon"][0], id="f")
    assert (falcon.num_kv_heads, falcon.norms_per_layer, falcon.parallel_attention) == (1, 1, True)
    neox = from_hf_config(CASES["gpt_neox"][0], id="n")
    assert (neox.rotary_dim, neox.parallel_attention, neox.tie_word_embeddings) == (4, True, False)
    phi = from_hf_config(CASES["phi"][0], id="p")
    assert (phi.rotary_dim, phi.lm_head_bias, phi.activation) == (8, True, "gelu_new")
    gpt2 = from_hf_config(_gpt2_tiny(), id="g")
    assert (gpt2.intermediate_size, gpt2.tie_word_embeddings) == (256, True)
    assert gpt2.positional == "learned"
    mpt = from_hf_config(CASES["mpt"][0], id="mpt")
    assert (mpt.positional, mpt.position_embedding_rows, mpt.norm_bias) == ("alibi", 0, False)
    bert = from_hf_config(CASES["bert"][0], id="b")
    assert (bert.family, bert.norm_position, bert.final_norm, bert.pooler) == (
        "encoder",
        "post",
        False,
        True,
    )
    gemma = from_hf_config(CASES["gemma2"][0], id="g2")
    assert (gemma.tie_word_embeddings, gemma.activation) == (True, "gelu_pytorch_tanh")


def test_falcon_new_architecture_and_legacy_keys() -> None:
    new = {
        "model_type": "falcon",
        "hidden_size": H,
        "num_attention_heads": HEADS,
        "num_kv_heads": 2,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "new_decoder_architecture": True,
    }
    cfg = from_hf_config(new, id="f40")
    assert (cfg.num_kv_heads, cfg.norms_per_layer) == (2, 2)
    layer = 4 * H + H * (H + 2 * 2 * 16) + H * H + 2 * H * 4 * H
    assert count_parameters(cfg).total == VOCAB * H + 2 * H + LAYERS * layer
    legacy = {
        "model_type": "RefinedWebModel",
        "hidden_size": H,
        "n_head": HEADS,
        "n_layer": LAYERS,
        "vocab_size": VOCAB,
        "multi_query": True,
        "parallel_attn": True,
    }
    assert count_parameters(from_hf_config(legacy, id="rw")).total == CASES["falcon"][1]


def test_opt_350m_projection_and_post_layernorm() -> None:
    data = {**CASES["opt"][0], "word_embed_proj_dim": 32, "do_layer_norm_before": False}
    cfg = from_hf_config(data, id="opt-350m-tiny")
    assert (cfg.embedding_dim, cfg.final_norm, cfg.norm_position) == (32, False, "post")
    assert count_parameters(cfg).total == VOCAB * 32 + 2 * 32 * H + 34 * H + LAYERS * GPT_LAYER


def test_unknown_model_type_lists_the_allowed_ones() -> None:
    with pytest.raises(SpecError) as info:
        from_hf_config({**_llama_tiny(), "model_type": "t5"}, id="x")
    message = str(info.value)
    assert "model_type" in message
    assert "'t5'" in message
    assert "llama" in message
    assert "mpt" in message


def test_missing_model_type_is_named() -> None:
    with pytest.raises(SpecError, match="model_type"):
        from_hf_config({"hidden_size": 8}, id="x")


@pytest.mark.parametrize(
    ("model_type", "key"),
    [
        ("llama", "num_attention_heads"),
        ("gpt2", "n_embd"),
        ("mpt", "d_model"),
        ("opt", "ffn_dim"),
        ("bert", "intermediate_size"),
        ("resnet", "depths"),
    ],
)
def test_missing_key_is_named(model_type: str, key: str) -> None:
    data = dict(CASES[model_type][0])
    del data[key]
    with pytest.raises(SpecError, match=f"missing key '{key}'"):
        from_hf_config(data, id="x")


def test_wrong_type_is_named() -> None:
    with pytest.raises(SpecError, match="'hidden_size'"):
        from_hf_config(_llama_tiny(hidden_size="64"), id="x")
    with pytest.raises(SpecError, match="'tie_word_embeddings'"):
        from_hf_config(_llama_tiny(tie_word_embeddings="yes"), id="x")


def test_inconsistent_values_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="num_kv_heads"):
        from_hf_config(_llama_tiny(num_key_value_heads=3), id="x")
    with pytest.raises(SpecError, match="head_dim"):
        from_hf_config(_llama_tiny(hidden_size=66), id="x")


def test_model_config_is_frozen_and_strict() -> None:
    cfg = load_model("gpt2")
    with pytest.raises(ValidationError):
        cfg.hidden_size = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({**cfg.model_dump(), "colour": "blue"})
    bigger = cfg.model_copy(update={"num_layers": 24})
    assert count_parameters(bigger).total > count_parameters(cfg).total


# ---------------------------------------------------------------- vision


def test_resnet50_macs_match_torchvision() -> None:
    cfg = load_model("resnet-50")
    macs = forward_macs_per_image(cfg)
    assert macs == 4_089_184_256
    assert abs(macs / 1e9 - 4.089) < 0.001  # torchvision ResNet50_Weights _ops
    assert cfg.num_layers == 50


@pytest.mark.parametrize(
    ("preset", "ops", "layers"),
    [
        ("resnet-18", 1.814, 18),
        ("resnet-34", 3.664, 34),
        ("resnet-101", 7.801, 101),
        ("resnet-152", 11.514, 152),
    ],
)
def test_resnet_depths_match_torchvision(preset: str, ops: float, layers: int) -> None:
    """Basic-block (18, 34) and deeper bottleneck (101, 152) ResNets from their Hugging Face
    configs: torchvision's ``_ops`` (GMACs at 224 x 224); the parameter counts are checked
    with every preset's published figure."""
    cfg = load_model(preset)
    assert abs(forward_macs_per_image(cfg) / 1e9 - ops) < 0.001
    assert cfg.num_layers == layers


def test_resnet50_layer_graph() -> None:
    stats = {s.name: s for s in layer_stats(load_model("resnet-50"))}
    assert stats["conv1"].output_shape == (64, 112, 112)
    assert stats["maxpool"].output_shape == (64, 56, 56)
    assert stats["layer1.0.downsample.0"].output_shape == (256, 56, 56)
    assert stats["layer4.2.add"].output_shape == (2048, 7, 7)
    assert stats["fc"].output_elements_per_image == 1000
    assert stats["layer2.0.conv2"].output_shape == (128, 28, 28)  # v1.5: stride on the 3x3
    assert sum(s.params for s in stats.values()) == 25_557_032
    assert all(s.forward_flops_per_image == 2 * s.forward_macs_per_image for s in stats.values())


def test_resnet_stats_scale_with_image_size() -> None:
    cfg = load_model("resnet-50")
    small = forward_macs_per_image(cfg, image_size=112)
    assert small < forward_macs_per_image(cfg) / 3
    tiny = from_hf_config(CASES["resnet"][0], id="tiny")
    assert tiny.num_layers == 6
    assert (
        forward_macs_per_image(tiny)
        == 16 * 16 * 8 * 3 * 49
        + 2 * 8 * 8 * 8 * 8 * 9
        + (4 * 4 * 16 * 8 * 9 + 4 * 4 * 16 * 16 * 9 + 4 * 4 * 16 * 8)
        + 160
    )


def test_vit_b16_macs_match_torchvision() -> None:
    cfg = load_model("vit-b-16")
    macs = forward_macs_per_image(cfg)
    assert abs(macs / 1e9 - 17.564) < 0.001  # torchvision ViT_B_16_Weights _ops
    stats = layer_stats(cfg)
    assert sum(s.params for s in stats) == 86_567_656
    assert cfg.max_position_embeddings == 197
    bigger = layer_stats(cfg, image_size=384)
    assert sum(s.params for s in bigger) == 86_567_656
    scores = next(s for s in bigger if s.name == "encoder.0.attn.scores")
    assert scores.output_shape == (12, 577, 577)


def test_layer_stats_rejects_text_models_and_bad_sizes() -> None:
    with pytest.raises(SpecError, match="cnn or vit"):
        layer_stats(load_model("gpt2"))
    with pytest.raises(SpecError, match="multiple of the patch size"):
        layer_stats(load_model("vit-b-16"), image_size=225)


# ---------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    try:
        from gpuplan.cli.app import app
    except ImportError:  # another command module not written yet
        from gpuplan.cli import models_cmd

        app = typer.Typer()
        models_cmd.register(app)

        @app.callback()
        def _root() -> None:
            """Test root."""

    return app


def test_cli_models_json_lists_every_preset() -> None:
    result = CliRunner().invoke(_app(), ["models", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    ids = [r["id"] for r in rows]
    assert set(REQUIRED_PRESETS) <= set(ids)
    for row in rows:
        assert row["params"] == count_parameters(load_model(row["id"])).total
        assert row["params_match_published"], row["id"]
        assert row["num_layers"] > 0
        assert row["hidden_size"] > 0


def test_cli_models_table_family_filter_and_detail() -> None:
    runner = CliRunner()
    table = runner.invoke(_app(), ["models"], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert table.exit_code == 0
    assert "llama-3.1-405b" in table.stdout
    vision = runner.invoke(_app(), ["models", "--family", "vit", "--json"], catch_exceptions=False)
    assert [r["id"] for r in json.loads(vision.stdout)] == ["vit-b-16"]
    detail = runner.invoke(_app(), ["models", "mixtral-8x7b", "--json"], catch_exceptions=False)
    body = json.loads(detail.stdout)
    assert body["params"]["total"] == 46_702_792_704
    assert body["config"]["num_experts"] == 8
    assert body["preset"]["hf_repo"] == "mistralai/Mixtral-8x7B-v0.1"


def test_cli_models_help_documents_every_option() -> None:
    result = CliRunner().invoke(_app(), ["models", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("List the model presets", "--json", "--family", "preset id"):
        assert text in result.stdout


@pytest.mark.parametrize(("key", "value"), [("decoder_sparse_step", 2), ("mlp_only_layers", [0])])
def test_qwen3_moe_with_dense_layers_is_refused_by_name(key: str, value: object) -> None:
    """Dense layers among sparse ones are not representable: an error naming the key."""
    cfg = {
        **_llama_tiny(),
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        key: value,
    }
    with pytest.raises(SpecError, match=key):
        from_hf_config(cfg, id="tiny-qwen3-moe")
