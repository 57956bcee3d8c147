"""Per-layer time of Korthikanti et al.'s 22B model under five recompute / sequence-parallel
settings (arXiv:2205.05198, Table 4: forward plus backward of one transformer layer, TP 8 on
A100 80GB, micro batch 4 x 2048 tokens). The ratios to the baseline test the mechanisms
(sequence parallelism splitting the norm and dropout work, selective and full recompute),
whatever the fitted GEMM level."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]
MEASURED_MS = {  # Table 4: forward + backward, ms
    ("none", False): 7.7 + 11.9,
    ("none", True): 7.2 + 11.8,
    ("full", False): 7.7 + 19.5,
    ("selective", False): 7.7 + 13.2,
    ("selective", True): 7.2 + 13.1,
}
LAYER_PARTS = (
    "gemm",
    "attention",
    "elementwise",
    "kernel launches",
    "recompute",
    "tp comm exposed",
)


def _layer_s(checkpointing: str, sequence_parallel: bool) -> float:
    gpu = load_catalog(use_user=False).gpu("A100-80GB")
    spec = parse_spec(
        {
            "model": str(REPO / "validation" / "training_configs" / "megatron-gpt-22b.json"),
            "precision": "fp16-mixed",
            "micro_batch_size": 4,
            "global_batch_size": 4,
            "seq_len": 2048,
            "attention": "eager",
            "framework": "megatron",
            "activation_checkpointing": checkpointing,
            "parallelism": {"tp": 8, "sequence_parallel": sequence_parallel},
        }
    )
    t = configure(spec, gpu, 8, default_topology(gpu, 8), require_fit=False).time
    return sum(t.parts[k] for k in LAYER_PARTS) / 48


@pytest.mark.parametrize("setting", [k for k in MEASURED_MS if k != ("none", False)])
def test_layer_time_ratios_to_the_baseline(setting: tuple[str, bool]) -> None:
    base = _layer_s("none", False)
    predicted = _layer_s(*setting) / base
    measured = MEASURED_MS[setting] / MEASURED_MS[("none", False)]
    assert predicted == pytest.approx(measured, abs=0.06)
