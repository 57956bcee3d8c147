"""Gemma 2's soft-capped attention and logits, and LitGPT's separate LM head."""

from __future__ import annotations

import json
import pathlib

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import SpecError
from gpuplan.estimate.compute import EAGER_SCORE_PASSES, SOFTCAP_PASSES
from gpuplan.estimate.fit import fit, memory_job, model_shape, spec_shape
from gpuplan.estimate.speed import _score_passes
from gpuplan.estimate.strategy import Strategy
from gpuplan.models import from_hf_config, load_model
from gpuplan.spec import parse_spec

SAVED = "activations: saved for backward"


@pytest.fixture(scope="module")
def a10g() -> GpuSpec:
    return load_catalog(use_user=False).gpu("A10G")


def _gemma(framework: str, attention: str = "auto", method: str = "lora") -> dict[str, object]:
    return {
        "model": "gemma-2-9b",
        "method": method,
        "precision": "bf16-true",
        "seq_len": 512,
        "micro_batch_size": 1,
        "framework": framework,
        "attention": attention,
    }


def test_the_preset_carries_gemma_2s_caps() -> None:
    cfg = load_model("gemma-2-9b")
    assert (cfg.attention_softcapping, cfg.final_logit_softcapping) == (50.0, 30.0)
    shape = model_shape("gemma-2-9b")
    assert shape.attention_softcapping and shape.final_softcapping
    assert not model_shape("llama-3-8b").attention_softcapping


def test_a_null_or_zero_cap_is_no_cap_and_a_string_is_an_error() -> None:
    preset = load_model("gemma-2-2b")
    assert preset.attention_softcapping == 50.0
    path = pathlib.Path(__file__).resolve().parents[1] / "src/gpuplan/models/data"
    raw = json.loads((path / "gemma-2-2b.json").read_text(encoding="utf-8"))
    raw = {**raw, "attn_logit_softcapping": None, "final_logit_softcapping": 0}
    cfg = from_hf_config(raw, id="g")
    assert cfg.attention_softcapping is None and cfg.final_logit_softcapping is None
    with pytest.raises(SpecError, match="attn_logit_softcapping"):
        from_hf_config({**raw, "attn_logit_softcapping": "fifty"}, id="g")
    with pytest.raises(SpecError, match="positive cap.*attn_logit_softcapping"):
        from_hf_config({**raw, "attn_logit_softcapping": -5}, id="g")


def test_litgpt_runs_capped_attention_eagerly_and_keeps_tanh_and_fp32_softmax(
    a10g: GpuSpec,
) -> None:
    """LitGPT's ``scaled_dot_product_attention`` ("with softcapping we cannot use SDPA") keeps
    tanh's output, the fp32 softmax output and its bf16 cast per score; under ``auto``
    transformers loads SDPA (it drops the cap) and the estimate stays fused."""
    lit = fit(parse_spec(_gemma("litgpt")), a10g, 1).memory
    names = {i.name: i.bytes_per_token for i in lit.activation_items}
    heads, seq = 16, 512
    assert names["attn soft-cap tanh output (s^2)"] == 2 * heads * seq
    assert names["attn softmax output (s^2)"] == (4 + 2) * heads * seq
    assert any("eager attention" in a for a in lit.assumptions)
    hf = fit(parse_spec(_gemma("hf")), a10g, 1).memory
    assert not any("soft-cap" in i.name for i in hf.activation_items)
    assert any("fused attention" in a for a in hf.assumptions)
    # named eager, transformers' Gemma2Attention keeps the same
    hf_eager = fit(parse_spec(_gemma("hf", "eager")), a10g, 1).memory
    assert any(i.name == "attn soft-cap tanh output (s^2)" for i in hf_eager.activation_items)
    # a named fused kernel (flash-attn >= 2.6 caps in the kernel) is taken at its word
    lit_fused = fit(parse_spec(_gemma("litgpt", "fused")), a10g, 1).memory
    assert lit_fused.details[SAVED] < lit.details[SAVED]


def test_litgpt_unties_the_word_embeddings() -> None:
    """LitGPT's GPT has its own lm_head; tied checkpoints are loaded into both weights."""
    tied = model_shape("gemma-2-9b")
    assert tied.tied_embeddings
    lit = spec_shape(parse_spec(_gemma("litgpt")))
    assert not lit.tied_embeddings
    assert lit.params_head == tied.params_head + tied.vocab * tied.hidden
    assert lit.params_total == tied.params_total + tied.vocab * tied.hidden
    assert spec_shape(parse_spec(_gemma("hf"))) == tied


def test_the_capped_logits_keep_tanhs_output() -> None:
    from gpuplan.estimate.activations import Numerics, Trainable, head_items

    num = Numerics(act_bytes=2, autocast=False)
    capped = head_items(model_shape("gemma-2-9b"), num, Trainable(full=False))
    cap = next(i for i in capped if i.name == "logits soft-cap tanh output")
    assert cap.bytes_per_token == 2 * 256000
    plain = head_items(model_shape("llama-3-8b"), num, Trainable(full=False))
    assert not any("soft-cap" in i.name for i in plain)


def test_eager_capped_scores_cost_more_passes() -> None:
    st = Strategy()
    spec = parse_spec(_gemma("litgpt"))
    shape = spec_shape(spec)
    job = memory_job(spec, shape)
    assert not job.fused_attention
    assert _score_passes(job, shape, st, 512) == EAGER_SCORE_PASSES + SOFTCAP_PASSES
    plain = model_shape("llama-3-8b")
    assert _score_passes(job, plain, st, 512) == EAGER_SCORE_PASSES
