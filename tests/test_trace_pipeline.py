"""Traced pipeline stages: the first and the last stage traced apart, as the analytic model
sizes them (gpuplan.estimate.pipeline), each within 10% of its analytic peak.

The first stage holds the embedding and no final norm or head, and runs the warm-up's
micro-batches forward before its first backward; the last receives hidden states, holds the
LM head (an untied copy) and the loss, and one micro-batch reaches the head. Micro-batches in
flight are traced at 1 and 2 and grown linearly (interleaving makes the count fractional).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gpuplan.catalog.loader import load_catalog  # noqa: E402
from gpuplan.estimate.fit import fit, model_shape  # noqa: E402
from gpuplan.estimate.pipeline import in_flight  # noqa: E402
from gpuplan.spec import parse_spec  # noqa: E402
from gpuplan.trace import trace_fit, trace_memory  # noqa: E402
from gpuplan.trace.run import RankSlice  # noqa: E402


def _spec(**parallelism: object) -> object:
    return parse_spec(
        {
            "model": "llama-3.1-8b",
            "precision": "bf16-mixed",
            "seq_len": 2048,
            "micro_batch_size": 1,
            "global_batch_size": 16,
            # the tracer runs Transformers' model code (unstated, a pipeline-parallel spec reads
            # as Megatron-Core's: gpuplan.estimate.fit.engine_spec)
            "framework": "hf",
            # the trace shards no sequence: compare like with like
            "parallelism": {"tp": 2, "sequence_parallel": False, **parallelism},
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize("vp", [1, 2])
def test_each_stage_agrees_with_its_analytic_peak(vp: int) -> None:
    """pp 4 with 16 micro-batches: the first stage holds 4 in flight (5.5 interleaved over 2
    chunks), the last 1 (2.5); Llama 3.1 8B has untied embeddings of 128K x 4096."""
    spec = _spec(pp=4, vp=vp)
    analytic = fit(spec, load_catalog(use_user=False).gpu("H100-SXM"), 8)
    assert (analytic.strategy.pp, analytic.strategy.vp) == (4, vp)
    traced = trace_fit(spec, analytic)
    a = {p.stage: p.peak_allocated_bytes for p in analytic.memory.pipeline_stages}
    t = {p.stage: p.peak_allocated_bytes for p in traced.memory.pipeline_stages}
    assert set(t) == {"first", "last"}
    for stage in ("first", "last"):
        assert abs(a[stage] - t[stage]) / t[stage] <= 0.10, (
            stage,
            a[stage] / 2**30,
            t[stage] / 2**30,
        )
    # the estimate is the stage that peaks higher, and says which
    worst = max(traced.memory.pipeline_stages, key=lambda p: p.device_used_bytes)
    assert traced.memory.pipeline_stage == worst.stage == "first"
    assert traced.memory.device_used_bytes == pytest.approx(worst.device_used_bytes)
    assert traced.memory.basis == "traced"
    notes = " ".join(traced.memory.assumptions)
    assert "pipeline stage first: 8 layers with the embedding, no final norm or head" in notes
    assert "traced pipeline: the first stage peaks higher" in notes


@pytest.mark.slow
def test_micro_batches_in_flight_grow_the_trace_linearly() -> None:
    """Each micro-batch in flight adds the same activations: traced at 1, 2 and 3 whole
    micro-batches the forward and backward peaks step evenly, and 3 grown from 1 and 2 is
    the peak traced with 3. Regression: the edge snapshots of forward and backward (the latest
    of several calls) grew faster than the peaks and became the extrapolated peak."""
    spec = _spec(pp=4)
    peaks = [
        trace_memory(
            spec, RankSlice(tp=2, stage_layers=8, stage="first", in_flight=k), grads_persist=True
        )
        for k in (1, 2, 3)
    ]
    one, two, three = (p.peak_bytes for p in peaks)
    assert two - one == pytest.approx(three - two, rel=0.02)
    assert two - one > 0
    grown = trace_memory(
        spec, RankSlice(tp=2, stage_layers=8, stage="first", in_flight=3.0), grads_persist=True
    )
    assert grown.in_flight_traced == (1, 2)
    assert grown.peak_bytes == pytest.approx(three, rel=0.01)


@pytest.mark.slow
def test_last_stage_holds_the_head_and_not_the_embedding() -> None:
    """Llama 3.2 1B ties its embeddings; the last stage keeps its own copy as the head
    (Megatron's share_embeddings_and_output_weights) and the first no head: per TP rank each
    holds one 128K x 2048 / 2 matrix, so their parameters differ only by the final norm."""
    spec = parse_spec(
        {
            "model": "llama-3.2-1b",
            "precision": "bf16-true",
            "seq_len": 1024,
            "micro_batch_size": 1,
            "global_batch_size": 4,
            "parallelism": {"tp": 2, "pp": 2, "sequence_parallel": False},
            "framework": "hf",
        }
    )
    analytic = fit(spec, load_catalog(use_user=False).gpu("H100-SXM"), 4)
    st = analytic.strategy
    first, last = (
        trace_memory(
            spec,
            RankSlice(tp=2, stage_layers=8, stage=stage, in_flight=in_flight(st, stage)),
            grads_persist=True,
        )
        for stage in ("first", "last")
    )
    params = [r.phases["optimizer step"]["param"] for r in (first, last)]
    assert params[0] == pytest.approx(params[1], rel=0.001)
    shape = model_shape("llama-3.2-1b")
    layers = 8 * shape.params_per_layer / 2  # norms are replicated, not split: a little less
    matrix = shape.vocab * shape.hidden / 2
    assert params[0] == pytest.approx((layers + matrix) * 2, rel=0.01)
