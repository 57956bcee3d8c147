"""Which SDPA backend ``attention: auto`` runs: grouped K/V handed to SDPA with ``enable_gqa``
in fp32 take its math backend (gpuplan.estimate.fit.gqa_math_attention), analytic and traced."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuplan.estimate.fit import gqa_math_attention, memory_job, spec_shape
from gpuplan.validation import row_spec

REPO = Path(__file__).resolve().parents[1]
BASE = "{model: %s, method: full, precision: %s, optimizer: adamw, micro_batch_size: 4, seq_len: 1024%s}"


def _job(model: str = "llama-3.2-1b", precision: str = "fp32", extra: str = ""):  # type: ignore[no-untyped-def]
    spec = row_spec(BASE % (model, precision, extra), "t", REPO)
    return memory_job(spec, spec_shape(spec)), spec


@pytest.mark.parametrize(
    ("model", "precision", "extra", "math"),
    [
        ("llama-3.2-1b", "fp32", "", True),  # 8 K/V heads for 32 query heads
        ("llama-3.2-1b", "tf32", "", True),  # TF32 matmuls, fp32 tensors
        ("llama-3.2-1b", "fp32", ", framework: deepspeed", True),  # the same HF model
        ("llama-3.2-1b", "bf16-mixed", "", False),  # FlashAttention takes enable_gqa
        ("llama-3.2-1b", "fp32", ", framework: litgpt", False),  # repeats K/V itself
        ("llama-3.2-1b", "fp32", ", mean_seq_len: 400", False),  # padded: a mask, K/V repeated
        ("llama-3.2-1b", "fp32", ", mean_seq_len: 400, packing: true", True),  # packed: no mask
        ("llama-3.2-1b", "fp32", ", attention: fused", False),  # stated kernels stand
        ("gpt2", "fp32", "", False),  # no grouped K/V
    ],
)
def test_gqa_in_fp32_runs_sdpas_math_backend(
    model: str, precision: str, extra: str, math: bool
) -> None:
    job, spec = _job(model, precision, extra)
    assert gqa_math_attention(spec, spec_shape(spec)) is math
    assert job.gqa_math_attention is math
    if math:
        assert not job.fused_attention and not job.attention_auto


def test_the_analytic_estimate_says_why_attention_is_eager() -> None:
    from gpuplan.estimate.fit import fit
    from gpuplan.validation import _catalog

    _, spec = _job()
    notes = fit(spec, _catalog().gpu("H200")).memory.assumptions
    assert any("SDPA's math backend" in n and "enable_gqa" in n for n in notes)


def test_traced_fp32_gqa_matches_the_h200_row() -> None:
    """Llama 3.2 1B in fp32 on an H200 (validation/memory.csv): traced through the fused
    kernels it was 18% low; through SDPA's math backend, as CUDA runs it, within 3%."""
    pytest.importorskip("transformers")
    from gpuplan.estimate.fit import fit
    from gpuplan.trace import trace_fit
    from gpuplan.validation import _catalog

    rid = "h200-memcheck-20261204-llama-3.2-1b-full-fp32-adamw-mb4-s1024-allocated"
    with (REPO / "validation" / "memory.csv").open(encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == rid)
    spec = row_spec(row["spec"].replace("attention: eager", "attention: auto"), rid, REPO)
    analytic = fit(spec, _catalog().gpu(row["gpu"]), 1)
    traced = trace_fit(spec, analytic)
    assert traced.memory.peak_allocated_bytes == pytest.approx(float(row["measured"]), rel=0.03)


def test_trace_runs_eager_attention_when_the_spec_says_so(tmp_path: Path) -> None:
    """transformers' single-GPU guide row, BERT-large with eager attention on a V100: traced
    through the fused kernels it was 31% low (no probabilities kept); traced as the spec says,
    within 5%."""
    pytest.importorskip("transformers")
    from gpuplan.validation import predict_memory_traced, run_table

    (tmp_path / "validation").mkdir()
    lines = (REPO / "validation" / "memory.csv").read_text(encoding="utf-8").splitlines()
    row = next(ln for ln in lines if ln.startswith("hf-1gpu-bertlarge-vanilla,"))
    assert "attention: eager" in row
    table = tmp_path / "validation" / "memory.csv"
    table.write_text(f"{lines[0]}\n{row}\n", encoding="utf-8")
    (result,) = run_table(table, predict_memory_traced).rows
    assert result.error is not None and abs(result.error) < 0.05
