"""Hugging Face's Trainer frees the model output before backward (spec ``hf_trainer``):
``Trainer.compute_loss`` returns the loss alone, so the 16-bit logits a loop that keeps
``outputs`` holds through backward are gone at the backward peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec


def _fit(model: str, seq: int, mb: int, **extra: object):  # type: ignore[no-untyped-def]
    spec = parse_spec(
        {"model": model, "precision": "bf16-mixed", "seq_len": seq, "micro_batch_size": mb, **extra}
    )
    return spec, fit(spec, load_catalog(use_user=False).gpu("H100-SXM"), 1)


def test_the_trainer_frees_the_16bit_logits() -> None:
    _, loop = _fit("llama-3.2-1b", 2048, 2)
    _, trainer = _fit("llama-3.2-1b", 2048, 2, hf_trainer=True)
    logits = 2 * 2 * 2048 * 128256  # bytes: micro-batch x tokens x vocabulary, 16 bits
    saved = loop.memory.peak_allocated_bytes - trainer.memory.peak_allocated_bytes
    assert saved == pytest.approx(logits, rel=1e-9)
    assert any(a.startswith("Hugging Face Trainer:") for a in trainer.memory.assumptions)


def test_an_encoder_has_no_logits_to_free() -> None:
    _, loop = _fit("bert-base", 512, 8)
    _, trainer = _fit("bert-base", 512, 8, hf_trainer=True)
    assert loop.memory.peak_allocated_bytes == trainer.memory.peak_allocated_bytes


def test_the_tracer_frees_them_too() -> None:
    """The traced step drops the output before backward as the Trainer does: on GPT-2 the
    traced peak falls by exactly the 16-bit logits, as the analytic one does."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpuplan.trace import trace_fit

    peaks = {}
    for on in (False, True):
        spec, analytic = _fit("gpt2", 512, 4, hf_trainer=on)
        peaks[on] = trace_fit(spec, analytic).memory.peak_allocated_bytes
    assert peaks[False] - peaks[True] == pytest.approx(2 * 4 * 512 * 50257, rel=1e-6)


def test_hf_trainer_needs_hugging_face_model_code(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "job.yaml"
    spec.write_text("model: llama-3.2-1b\nframework: torchtune\nhf_trainer: true\n")
    result = cli("estimate", str(spec), "--gpu", "H100-SXM", "--json")
    assert result.exit_code == 2
    assert "hf_trainer" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2
