"""The layout search's verdicts (`check_memory`) are the explained estimate's numbers.

The search compares thousands of layouts on `check_memory` and explains only the one it
picks with `estimate_memory`; a verdict that disagreed with the estimate shown would pick a
layout the user is then told does not fit (or skip one that does).
"""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate import memory
from gpuplan.estimate.fit import explicit_strategy, memory_job, model_shape
from gpuplan.estimate.memory import check_memory, estimate_memory
from gpuplan.spec import parse_spec

CASES = [
    # (spec, gpus, GPU): single GPU, ZeRO/FSDP, TP, PP with and without interleaving, QLoRA
    # with a paged optimizer, a CNN, and layouts near the card's edge
    ({"model": "llama-3-8b", "seq_len": 4096, "method": "lora"}, 1, "A100-80GB"),
    ({"model": "llama-3-8b", "seq_len": 2048, "micro_batch_size": 4}, 8, "H100-SXM"),
    (
        {
            "model": "llama-3-8b",
            "seq_len": 2048,
            "method": "qlora",
            "optimizer": "adamw-8bit",
            "paged_optimizer": True,
            "micro_batch_size": 8,
        },
        1,
        "RTX-4090",
    ),
    ({"model": "resnet-50", "micro_batch_size": 256, "precision": "fp16-mixed"}, 1, "A10"),
    (
        {
            "model": "llama-3-70b",
            "seq_len": 4096,
            "framework": "megatron",
            "parallelism": {"sharding": "zero1", "tp": 8, "pp": 4},
        },
        64,
        "H100-SXM",
    ),
    (
        {
            "model": "llama-3-70b",
            "seq_len": 4096,
            "framework": "megatron",
            "parallelism": {"sharding": "zero1", "tp": 4, "pp": 8, "vp": 5},
        },
        64,
        "A100-40GB",
    ),
    (  # Lambda's BERT-base batch 96 on an RTX 4090: it fits as the allocator's cache shrinks
        {
            "model": "bert-base",
            "seq_len": 384,
            "precision": "fp16-mixed",
            "attention": "eager",
            "framework": "apex",
        },
        1,
        "RTX-4090",
    ),
    ({"model": "gpt2", "seq_len": 1024, "parallelism": {"sharding": "none", "pp": 2}}, 2, "T4"),
]

MICRO = (1, 2, 8, 32, 96)


@pytest.mark.parametrize(("raw", "gpus", "gpu_id"), CASES)
@pytest.mark.parametrize("micro", MICRO)
def test_check_agrees_with_the_explained_estimate(
    raw: dict[str, object], gpus: int, gpu_id: str, micro: int
) -> None:
    gpu = load_catalog(use_user=False).gpu(gpu_id)
    spec = parse_spec({"precision": "bf16-mixed", "global_batch_size": 256, **raw})
    shape = model_shape(spec.model)
    job = memory_job(spec, shape)
    st = dataclasses.replace(
        explicit_strategy(spec, gpus, shape),
        micro_batch_size=micro,
    )
    memory.clear_caches()  # the check first, from cold: it must not lean on the estimate's cache
    check = check_memory(shape, job, st, gpu)
    est = estimate_memory(shape, job, st, gpu)
    assert check.device_used_bytes == est.device_used_bytes
    assert check.capacity_bytes == est.capacity_bytes
    assert check.safety_margin == est.safety_margin
    assert check.fits == est.fits
    assert check.reserve_squeezed == est.reserve_squeezed


def test_the_cases_cover_both_verdicts_and_a_squeezed_reserve() -> None:
    """The agreement above is tested where it matters: fitting, not fitting, and fitting only
    as the allocator gives back its cache."""
    seen = set()
    for raw, gpus, gpu_id in CASES:
        gpu = load_catalog(use_user=False).gpu(gpu_id)
        spec = parse_spec({"precision": "bf16-mixed", "global_batch_size": 256, **raw})
        shape = model_shape(spec.model)
        job = memory_job(spec, shape)
        base = explicit_strategy(spec, gpus, shape)
        for micro in MICRO:
            st = dataclasses.replace(base, micro_batch_size=micro)
            check = check_memory(shape, job, st, gpu)
            seen.add("fits" if check.fits else "no")
            if check.fits and check.reserve_squeezed:
                seen.add("squeezed")
    assert seen == {"fits", "no", "squeezed"}
