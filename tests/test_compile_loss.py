"""A compiled model with an eager loss (spec ``compile_loss``), and validation rows for GPU
variants the catalog lacks (``memory_total_mib``).

torchtitan compiles its transformer blocks and, since 2025, its loss
(``compile.components: ['model', 'loss']``). At 9dec370 (Dec 2024) ``train.py`` ran the loss
eagerly: ``cross_entropy(pred.flatten(0, 1).float(), ...)`` keeps the fp32 log-softmax and its
backward writes an fp32 gradient, whether or not the blocks are compiled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpuplan.estimate.fit as fit_module
from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import SpecError
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec, spec_json_schema
from gpuplan.validation import predict_memory, read_table, run_table

LOSS_GRAD = "activations: loss/logits gradients (start of backward)"
SAVED = "activations: saved for backward"
REPO = Path(__file__).resolve().parents[1]


def _spec(**kw: Any) -> Any:
    data: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "method": "full",
        "precision": "bf16-mixed",
        "optimizer": "adamw",
        "micro_batch_size": 2,
        "global_batch_size": 16,
        "seq_len": 8192,
        "activation_checkpointing": "selective-op",
        "parallelism": {"sharding": "fsdp"},
        "framework": "torchtitan",
    }
    data.update(kw)
    return parse_spec(data)


def _details(**kw: Any) -> dict[str, float]:
    gpu = load_catalog(use_user=False).gpu("H200")
    return dict(fit(_spec(**kw), gpu, 8).memory.details)


def test_compile_loss_defaults_to_compile() -> None:
    assert _details(compile=True) == _details(compile=True, compile_loss=True)
    assert _details() == _details(compile_loss=False)


def test_eager_loss_under_compiled_blocks_keeps_the_eager_loss_memory() -> None:
    eager = _details()
    compiled = _details(compile=True)
    mixed = _details(compile=True, compile_loss=False)
    # the loss's backward transient is the eager one (fp32 gradient and its cast) ...
    assert mixed[LOSS_GRAD] == pytest.approx(eager[LOSS_GRAD])
    assert mixed[LOSS_GRAD] > compiled[LOSS_GRAD] * 2
    # ... and so is what the loss keeps; the blocks keep what compiled blocks keep
    tokens, vocab = 2 * 8192, 128256
    loss_kept_eager = 4 * vocab * tokens  # the fp32 logits / log-softmax
    loss_kept_compiled = 2 * vocab * tokens  # the 16-bit logits the compiled loss saves
    blocks_eager = eager[SAVED] - loss_kept_eager
    blocks_compiled = compiled[SAVED] - loss_kept_compiled
    assert blocks_compiled < blocks_eager
    assert mixed[SAVED] == pytest.approx(blocks_compiled + loss_kept_eager)


def test_compile_loss_is_in_the_schema_and_the_assumptions() -> None:
    assert "compile_loss" in spec_json_schema()["properties"]
    gpu = load_catalog(use_user=False).gpu("H200")
    text = " ".join(fit(_spec(compile=True, compile_loss=False), gpu, 8).memory.assumptions)
    assert "with torch.compile (an eager loss)" in text


def test_compile_loss_must_be_a_boolean() -> None:
    with pytest.raises(SpecError, match="compile_loss"):
        _spec(compile_loss="sometimes")


def _row(**kw: str) -> dict[str, str]:
    row = {
        "id": "probe",
        "spec": "{model: llama-3.1-8b, method: lora, precision: bf16-mixed, micro_batch_size: 1, "
        "seq_len: 1024}",
        "gpu": "H100-SXM",
        "count": "1",
        "metric": "reserved",
        "measured": "20",
        "unit": "GiB",
    }
    row.update(kw)
    return row


def test_memory_total_mib_replaces_the_capacity_of_the_rows_gpu(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen = []
    real = fit_module.fit

    def spy(spec: Any, gpu: Any, count: int, **kw: Any) -> Any:
        seen.append(gpu)
        return real(spec, gpu, count, **kw)

    monkeypatch.setattr(fit_module, "fit", spy)
    predict_memory(_row(), REPO)
    predict_memory(_row(memory_total_mib="97871"), REPO)
    catalog_gpu, variant = seen
    assert catalog_gpu.capacity_bytes == 81559 * 2**20
    assert variant.capacity_bytes == 97871 * 2**20
    assert variant.architecture == catalog_gpu.architecture
    assert variant.peak_tflops_dense == catalog_gpu.peak_tflops_dense


def test_memory_total_mib_must_be_a_positive_number(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text(
        "id,status,spec,gpu,count,metric,measured,unit,memory_total_mib\n"
        'probe,ok,"{model: llama-3.1-8b, method: lora}",H100-SXM,1,reserved,20,GiB,lots\n'
    )
    with pytest.raises(SpecError, match="memory_total_mib"):
        run_table(table, predict_memory)


def test_torchtitan_december_2024_rows_read() -> None:
    """The Grand Teton rows carry the 96 GB variant's capacity in ``memory_total_mib``."""
    table = REPO / "validation" / "memory.csv"
    rows = [r for r in read_table(table) if r["id"].startswith("torchtitan-2412-")]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 11 and all(r["memory_total_mib"] == "97871" for r in ok)
