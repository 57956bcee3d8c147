"""Pipeline parallelism: the first and the last stage sized apart (gpuplan.estimate.pipeline)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from typer.testing import CliRunner

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.cli.app import app
from gpuplan.estimate.fit import explicit_strategy, fit, memory_job, model_shape
from gpuplan.estimate.memory import estimate_memory, stage_params
from gpuplan.estimate.pipeline import (
    _schedule_peak,
    chunk_layers,
    chunks_in_flight,
    held_layers,
    in_flight,
    stage_layers,
)
from gpuplan.estimate.strategy import Strategy
from gpuplan.spec import parse_spec

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def h100() -> GpuSpec:
    return load_catalog(use_user=False).gpu("H100-SXM")


def _megatron_pp4() -> dict[str, object]:
    """Megatron-LM's ``gpt3_7b_tp1_pp4_memory_speed`` functional test (validation/memory.csv):
    4 stages of 8 one-layer chunks (vp 8), DP 2, 4 micro-batches a step."""
    return {
        "model": str(REPO / "validation/training_configs/megatron-gpt3-7b-memtest-tp1.json"),
        "precision": "bf16-mixed",
        "optimizer": "adamw",
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "seq_len": 8192,
        "attention": "fused",
        "framework": "megatron",
        "parallelism": {"sharding": "zero1", "tp": 1, "pp": 4, "vp": 8},
    }


def test_megatron_pp4_test_measures_the_stage_the_model_finds_highest(h100: GpuSpec) -> None:
    """The functional test logs ``mem-max-allocated-bytes`` from the last rank (Megatron's
    TensorBoard writer). The last rank warms up (vp - 1) pp = 28 chunks (29 in flight) and keeps
    the LM head and one micro-batch's loss; the first holds all 32 chunks but no head. The model
    finds the last stage the higher, so `fit`'s estimate is the measured rank's, and the
    validation row compares like with like."""
    m = fit(parse_spec(_megatron_pp4()), h100, 8).memory
    st = Strategy(sharding="zero1", tp=1, pp=4, dp=2, micro_batch_size=1, grad_accum=4, vp=8)
    assert (chunks_in_flight(st, "first"), chunks_in_flight(st, "last")) == (32, 29)
    assert m.pipeline_stage == "last"
    stages = {p.stage: p for p in m.pipeline_stages}
    assert stages["last"].peak_allocated_bytes > stages["first"].peak_allocated_bytes
    assert m.peak_allocated_bytes == stages["last"].peak_allocated_bytes
    # golden value on the DGX H100: 60.721 GB
    assert m.peak_allocated_bytes == pytest.approx(60.721e9, rel=0.03)


def test_stage_parameters_put_the_embedding_first_and_the_head_last() -> None:
    llama = model_shape("llama-3-8b")  # untied: embedding and LM head are separate
    st = Strategy(sharding="none", tp=1, pp=4, dp=1, micro_batch_size=1, grad_accum=4)
    first, last = stage_params(llama, st, "first"), stage_params(llama, st, "last")
    assert first.layer == last.layer
    assert first.other == llama.params_embedding
    assert last.other == llama.params_head + llama.params_final_norm
    # tied embeddings: the last stage keeps its own copy of the word embeddings as the output
    gpt2 = model_shape("gpt2")
    assert gpt2.tied_embeddings
    tied_last = stage_params(gpt2, st, "last")
    assert tied_last.other == gpt2.vocab * gpt2.hidden + gpt2.params_final_norm
    # without pipeline stages one rank holds both
    one = dataclasses.replace(st, pp=1)
    assert stage_params(llama, one).other == (
        llama.params_embedding + llama.params_head + llama.params_final_norm
    )


def test_plain_1f1b_last_stage_holds_one_micro_batch(h100: GpuSpec) -> None:
    """Without interleaving the last stage has no warm-up: one micro-batch of its layers in
    flight, against pp on the first; its loss and logits are its own."""
    spec = parse_spec(
        {
            "model": "llama-3-8b",
            "precision": "bf16-mixed",
            "seq_len": 4096,
            "global_batch_size": 32,
            "micro_batch_size": 1,
            "framework": "megatron",
            "parallelism": {"sharding": "zero1", "tp": 1, "pp": 4},
        }
    )
    shape = model_shape(spec.model)
    st = explicit_strategy(spec, 8, shape)
    assert (in_flight(st, "first"), in_flight(st, "last")) == (4, 1)
    m = estimate_memory(shape, memory_job(spec, shape), st, h100)
    stages = {p.stage: p for p in m.pipeline_stages}
    assert m.pipeline_stage == "first"
    assert stages["first"].device_used_bytes > stages["last"].device_used_bytes
    assert any(
        "the first stage holds 4 micro-batches in flight, the last 1" in a for a in m.assumptions
    )
    # the first stage's estimate carries no loss gradient: that is the last stage's
    assert m.details["activations: loss/logits gradients (start of backward)"] == 0


def test_fit_json_names_the_stages(tmp_path: pathlib.Path) -> None:
    spec = dict(_megatron_pp4())
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = CliRunner().invoke(app, ["fit", str(path), "--gpu", "H100-SXM", "--gpus", "8", "--json"])
    assert out.exit_code == 0, out.output
    mem = json.loads(out.output)["memory"]
    assert mem["pipeline_stage"] == "last"
    assert set(mem["pipeline_stages"]) == {"first", "last"}
    assert mem["pipeline_stages"]["last"]["peak_allocated_bytes"] == mem["peak_allocated_bytes"]
    # no pipeline: both fields are null
    spec["parallelism"] = {"sharding": "zero1", "tp": 1, "pp": 1}
    path.write_text(json.dumps(spec), encoding="utf-8")
    out = CliRunner().invoke(app, ["fit", str(path), "--gpu", "H100-SXM", "--gpus", "8", "--json"])
    assert out.exit_code == 0, out.output
    mem = json.loads(out.output)["memory"]
    assert mem["pipeline_stage"] is None and mem["pipeline_stages"] is None


def test_fit_table_names_each_stages_peak(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(_megatron_pp4()), encoding="utf-8")
    out = CliRunner().invoke(app, ["fit", str(path), "--gpu", "H100-SXM", "--gpus", "8"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "pipeline stages (device used): first" in text
    assert "the table is the last" in text


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
@pytest.mark.parametrize("vp", [2, 3, 8])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_the_schedule_walk_holds_what_the_warmup_formula_says_for_even_chunks(
    pp: int, vp: int, groups: int
) -> None:
    """With one layer a chunk, walking Megatron's schedule table finds the warm-up-plus-one
    peak of ``get_pp_rank_microbatches`` on the first and the last rank."""
    st = Strategy(pp=pp, vp=vp, grad_accum=groups * pp)
    assert _schedule_peak((1.0,) * vp, pp, 0, st.grad_accum) == chunks_in_flight(st, "first")
    assert _schedule_peak((1.0,) * vp, pp, pp - 1, st.grad_accum) == chunks_in_flight(st, "last")


def test_the_embedding_and_loss_count_as_layers_where_the_layers_need_it() -> None:
    """Llama 3 405B (126 layers) on 16 stages of 8 chunks, as Meta's paper describes it: the
    first chunk of the first stage holds only the embedding, the last chunk of the last stage
    only the loss. At the first backward, rank 0 has run 2 x 15 + 7 x 16 + 1 = 143 chunk
    forwards: all 16 micro-batches through chunks 1-7 (7 x 16 = 112 layer-micro-batches) and
    31 through the empty chunk 0, not 143 one-layer chunks."""
    st = Strategy(tp=8, pp=16, vp=8, dp=64, grad_accum=32)
    assert chunk_layers(126, st, "first") == (0.0,) + (1.0,) * 7
    assert chunk_layers(126, st, "last") == (1.0,) * 7 + (0.0,)
    assert stage_layers(126, st, "first") == stage_layers(126, st, "last") == 7
    assert chunks_in_flight(st, "first") == 143
    assert held_layers(126, st, "first") == 112
    # plain 1F1B on the same stages holds 16 micro-batches of the first stage's 7 layers
    plain = dataclasses.replace(st, vp=1)
    assert held_layers(126, plain, "first") == 16 * 7
    # an even split is what it was: layers x micro-batches in flight
    even = Strategy(pp=4, vp=5, grad_accum=8)
    assert held_layers(80, even, "first") == 20 * in_flight(even, "first")
    llama = model_shape("llama-3.1-405b")
    assert stage_params(llama, st, "first").layers == 7


def test_the_split_with_the_embedding_as_a_layer_is_sized_and_said(h100: GpuSpec) -> None:
    """Megatron-Bridge's llama31_405b layout (TP 8, PP 8, VP 8: 128 slots over 64 chunks of 2
    layers) keeps the first stage's activations to 127 layer-micro-batches, not the 142 of
    even two-layer chunks, and the estimate says how it split the layers."""
    spec = parse_spec(
        {
            "model": "llama-3.1-405b",
            "precision": "bf16-mixed",
            "seq_len": 8192,
            "global_batch_size": 512,
            "micro_batch_size": 1,
            "framework": "megatron",
            "parallelism": {"sharding": "zero1", "tp": 8, "pp": 8, "vp": 8, "cp": 2},
        }
    )
    shape = model_shape(spec.model)
    st = explicit_strategy(spec, 1024, shape)
    assert held_layers(126, st, "first") == 127
    m = estimate_memory(shape, memory_job(spec, shape), st, h100)
    stages = {p.stage: p for p in m.pipeline_stages}
    assert set(stages) == {"first", "last"}
    assert any(
        "the first stage holds 15 layers, 127 layer-micro-batches at its peak" in a
        for a in m.assumptions
    )
    # the same job on a model whose 128 layers split evenly holds more on its first stage
    even = dataclasses.replace(shape, layers=128)
    m128 = estimate_memory(even, memory_job(spec, even), st, h100)
    first128 = {p.stage: p for p in m128.pipeline_stages}["first"]
    assert stages["first"].peak_allocated_bytes < first128.peak_allocated_bytes
