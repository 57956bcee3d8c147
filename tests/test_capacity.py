"""Capacity as the device reports it: memory.total from cited captures, beside the datasheet."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate.fit import fit
from gpuplan.spec import parse_spec

SAMPLES = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "reference"
    / "nvidia-smi-samples"
    / "derived"
    / "query-gpu-9fields_all-captures.tsv"
)


def test_h100_capacity_is_the_driver_figure_beside_the_datasheet() -> None:
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    assert h100.memory_bytes == 80_000_000_000  # datasheet, kept
    assert h100.capacity_bytes == 81559 * 2**20  # nvidia-smi memory.total
    assert h100.capacity_basis == "device-reported"
    assert h100.memory_total_source and "nvidia-smi-samples" in h100.memory_total_source


@pytest.mark.parametrize(
    ("gpu_id", "name"), [("H100-SXM", "H100 80GB HBM3"), ("H200", "H200"), ("L40S", "L40S")]
)
def test_catalog_matches_the_shared_captures(gpu_id: str, name: str) -> None:
    if not SAMPLES.is_file():
        pytest.skip("../shared reference captures absent")
    totals = set()
    with SAMPLES.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            cells = row["csv_row_with_units"].split(", ")
            if cells[2] == f"NVIDIA {name}":
                totals.add(int(cells[6].removesuffix(" MiB")))
    assert totals == {load_catalog(use_user=False).gpu(gpu_id).memory_total_mib}


def test_a_job_measured_at_74_gib_on_an_h100_is_not_refused_by_construction() -> None:
    """Datasheet 74.5 GiB less 5% refused it; memory.total (79.6 GiB) less 5% does not."""
    h100 = load_catalog(use_user=False).gpu("H100-SXM")
    spec = parse_spec({"model": "llama-3-8b", "seq_len": 2048, "precision": "bf16-true"})
    m = fit(spec, h100, 1).memory
    used, old_margin = 74 * 2**30, 0.05  # the margin of before; today's default is 0
    assert used > h100.memory_bytes * (1 - old_margin)
    assert used < m.capacity_bytes * (1 - max(old_margin, m.safety_margin))
    assert m.capacity_bytes == h100.capacity_bytes
    assert m.capacity_basis == "device-reported"


def test_without_a_capture_the_datasheet_is_used_and_said() -> None:
    mi300 = load_catalog(use_user=False).gpu("MI300X")
    spec = parse_spec({"model": "llama-3-8b", "seq_len": 2048, "method": "lora"})
    m = fit(spec, mi300, 1).memory
    assert m.capacity_bytes == mi300.memory_bytes and m.capacity_basis == "datasheet"
    assert any("no nvidia-smi capture" in a for a in m.assumptions)


def test_memory_total_needs_a_source_and_a_plausible_size() -> None:
    h100 = load_catalog(use_user=False).gpu("H100-SXM").model_dump()
    with pytest.raises(ValueError, match="memory_total_source"):
        GpuSpec.model_validate({**h100, "memory_total_source": None})
    with pytest.raises(ValueError, match="memory_bytes"):
        GpuSpec.model_validate({**h100, "memory_total_mib": 8192})


def test_measured_matmul_needs_a_source_and_a_plausible_size() -> None:
    a100 = load_catalog(use_user=False).gpu("A100-80GB").model_dump()
    with pytest.raises(ValueError, match="matmul_measured_source"):
        GpuSpec.model_validate({**a100, "matmul_measured_source": None})
    with pytest.raises(ValueError, match="16-bit peak"):
        GpuSpec.model_validate({**a100, "matmul_tflops_measured": 31.2})  # an fp32 figure
    assert GpuSpec.model_validate(a100).matmul_fraction == pytest.approx(264.5 / 312)


def test_measured_fp32_matmul_needs_a_source_and_a_plausible_size() -> None:
    a100 = load_catalog(use_user=False).gpu("A100-80GB").model_dump()
    with pytest.raises(ValueError, match="fp32_matmul_measured_source"):
        GpuSpec.model_validate({**a100, "fp32_matmul_measured_source": None})
    with pytest.raises(ValueError, match="TF32 left on"):
        GpuSpec.model_validate({**a100, "fp32_matmul_tflops_measured": 140.0})  # a TF32 figure
    assert GpuSpec.model_validate(a100).fp32_matmul_fraction == pytest.approx(19.18 / 19.5)


def test_the_allocator_reserve_shrinks_to_what_the_device_leaves() -> None:
    """PyTorch frees cached blocks before raising OOM: the usual reserve is not a need."""
    from gpuplan.estimate.memory import squeezed_reserve

    gib = 2**30
    steady, context = 8 * gib, 0.5 * gib
    assert squeezed_reserve(steady, 70 * gib, context, 80 * gib) == steady  # room for all of it
    assert squeezed_reserve(steady, 75 * gib, context, 80 * gib) == pytest.approx(4.5 * gib)
    floor = squeezed_reserve(steady, 80 * gib, context, 80 * gib)
    assert floor == 256 * 2**20  # the fragmentation floor


def test_a_batch_that_fills_the_card_fits_with_a_squeezed_reserve() -> None:
    """BERT-base fp16 at batch 100 on an RTX 4090 (Lambda's batch 96 ran there): the usual
    reserve would not fit. Batch 96 itself needed the squeeze until the reserve went from 9% to
    7% on 2026-12-05; it now fits with the whole reserve, at 99.2% of the card."""
    spec = parse_spec(
        {
            "model": "bert-base",
            "method": "full",
            "seq_len": 384,
            "precision": "fp16-mixed",
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "micro_batch_size": 100,
            "attention": "eager",
            "framework": "apex",
        }
    )
    res = fit(spec, load_catalog(use_user=False).gpu("RTX-4090"))
    m = res.memory
    reserve = m.details["overhead: caching-allocator reserve"]
    assert m.fits
    assert m.device_used_bytes == pytest.approx(m.capacity_bytes)
    assert 256 * 2**20 <= reserve < 0.07 * m.peak_allocated_bytes
    assert any("frees its cached blocks" in a for a in m.assumptions)
    assert m.reserve_squeezed
    assert res.verdict == "tight"  # the upper bound does not fit


def test_the_layout_search_prefers_a_batch_that_leaves_the_allocator_its_cache() -> None:
    """Given a choice, parallelism auto takes the largest micro-batch that fits with the usual
    reserve, not one that fits only as the allocator gives its cache back."""
    from gpuplan.estimate.configure import configure, default_topology

    gpu = load_catalog(use_user=False).gpu("A100-80GB")
    spec = parse_spec(
        {
            "model": "bert-large",
            "seq_len": 384,
            "precision": "fp16-mixed",
            "micro_batch_size": 32,
            "attention": "eager",
            "framework": "apex",
            "parallelism": "auto",
        }
    )
    conf = configure(spec, gpu, 1, default_topology(gpu, 1))
    assert conf.fit.memory.fits and not conf.fit.memory.reserve_squeezed
