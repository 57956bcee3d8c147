"""Out-of-memory facts a published table states, against the memory verdict.

lucadiliello/pytorch-apple-silicon-benchmarks' "Training" table (README at eb95c776; script
tests/transformers_sequence_classification.py) prints a time for the batch x sequence cells that
ran and ``-`` for those that "went out of memory", for ``bert-base-cased`` fine-tuned in fp32 with
Adam on a T4 (16 GB) and a V100 SXM2 16GB. The cells that ran are also speed rows of
validation/training.csv; the ``-`` cells are only a verdict, checked here: a false "fits" on them
is the failed run the verdict exists to prevent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec

MODEL = (
    Path(__file__).resolve().parents[1]
    / "validation"
    / "training_configs"
    / "bert-base-cased-eval-mode.json"
)

CELLS = [
    # (batch, sequence length, ran): the README's cells, the same on both GPUs
    (16, 128, True),
    (64, 128, True),
    (256, 128, False),
    (16, 512, True),
    (64, 512, False),
    (256, 512, False),
]


@pytest.mark.parametrize("gpu_id", ["T4", "V100-16GB"])
@pytest.mark.parametrize(("batch", "seq", "ran"), CELLS)
def test_the_verdict_matches_what_ran(gpu_id: str, batch: int, seq: int, ran: bool) -> None:
    spec = parse_spec(
        {
            "model": str(MODEL),
            "method": "full",
            "seq_len": seq,
            "attention": "eager",
            "precision": "fp32",
            "optimizer": "adamw",
            "optimizer_impl": "for-loop",
            "micro_batch_size": batch,
            "parallelism": {"sharding": "none"},
        }
    )
    memory = fit(spec, load_catalog(use_user=False).gpu(gpu_id), 1).memory
    assert memory.fits is ran, (
        f"{gpu_id} batch {batch} x {seq}: {memory.device_used_bytes / 2**30:.1f} GiB of "
        f"{memory.capacity_bytes / 2**30:.1f}"
    )
