"""PyTorch's caching allocator as the tracer replays it (gpuplan.trace.allocator), and what the
replay gives against the reserved memory measured on an H200 (validation/memory.csv)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuplan.trace import allocator as A

MIB = 2**20
REPO = Path(__file__).resolve().parents[1]


def test_sizes_round_to_512_bytes_and_segments_by_pool() -> None:
    assert A.round_size(1) == A.round_size(512) == 512
    assert A.round_size(513) == 1024
    assert A.segment_size(A.round_size(4096)) == 2 * MIB  # small pool
    assert A.segment_size(1 * MIB + 512) == 20 * MIB  # large, below 10 MiB
    assert A.segment_size(10 * MIB) == 10 * MIB
    assert A.segment_size(10 * MIB + 512) == 12 * MIB  # rounded to 2 MiB


def test_small_requests_share_a_2_mib_segment() -> None:
    a = A.CachingAllocator()
    blocks = [a.malloc(100_000) for _ in range(20)]  # 100,352 B each after rounding
    assert a.segments == 1 and a.reserved == 2 * MIB
    assert a.allocated == 20 * A.round_size(100_000)
    blocks.append(a.malloc(100_000))  # 21 x 100,352 B > 2 MiB
    assert a.segments == 2


def test_a_large_remainder_is_split_off_a_small_one_is_not() -> None:
    a = A.CachingAllocator()
    big = a.malloc(40 * MIB)
    a.free(big)
    part = a.malloc(30 * MIB)  # 10 MiB remain: split, free for the next request
    assert part.size == 30 * MIB and a.allocated == 30 * MIB
    rest = a.malloc(9 * MIB)
    assert a.segments == 1 and rest.size == 10 * MIB  # 1 MiB left: not split, counted
    assert a.allocated == 40 * MIB


def test_best_fit_and_merging_within_a_segment_only() -> None:
    a = A.CachingAllocator()
    x, y = a.malloc(64 * MIB), a.malloc(32 * MIB)  # two segments
    a.free(x)
    a.free(y)
    z = a.malloc(30 * MIB)  # the smaller free block that holds it: y's segment
    assert a.segments == 2 and z.addr == y.addr
    a.free(z)
    w = a.malloc(80 * MIB)  # 96 MiB free in all, but in two segments that do not merge
    assert a.segments == 3 and a.reserved == (64 + 32 + 80) * MIB
    a.free(w)
    u, v = a.malloc(20 * MIB), a.malloc(20 * MIB)  # both from the 32 MiB and 64 MiB segments
    a.free(u)
    a.free(v)
    assert a.malloc(64 * MIB).addr == x.addr  # x's segment merged back whole


def test_peaks_restart() -> None:
    a = A.CachingAllocator()
    a.free(a.malloc(100 * MIB))
    a.reset_peaks()
    assert a.peak_allocated == 0 and a.peak_reserved == 100 * MIB


def _measured(row_id: str) -> tuple[dict[str, str], float]:
    with (REPO / "validation" / "memory.csv").open(encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == row_id)
    return row, float(row["measured"])


@pytest.mark.parametrize(
    "row_id",
    [
        # full fine-tuning with checkpointing: the first optimizer step takes the blocks the
        # loss's fp32 logits copies freed, and each later step needs new segments for them
        "h200-memcheck-20261204-llama-3.2-1b-full-bf16-mixed-adamw-ckpt-mb4-s1024-reserved",
        "h200-memcheck-20261204-bert-base-full-bf16-mixed-adamw-ckpt-mb16-s512-reserved",
    ],
)
def test_the_replayed_allocator_holds_what_the_h200_reserved(row_id: str) -> None:
    """Traced, the reserve is the replayed allocator's and lands within 5% of the measured
    reserved peak (the analytic share of the allocated peak, 7%, was 11.8% and 7.4% short on
    these two rows on 2026-12-05: a false 'fits' near capacity)."""
    pytest.importorskip("transformers")
    from gpuplan.estimate.fit import fit
    from gpuplan.trace import trace_fit
    from gpuplan.validation import _catalog, row_spec

    row, measured = _measured(row_id)
    spec = row_spec(row["spec"], row_id, REPO)
    context = float(row["cuda_context_mib"]) * MIB if row["cuda_context_mib"] else None
    analytic = fit(spec, _catalog().gpu(row["gpu"]), 1, cuda_context_bytes=context)
    traced = trace_fit(spec, analytic)
    assert traced.memory.peak_reserved_bytes == pytest.approx(measured, rel=0.05)
    assert any("caching allocator" in a for a in traced.memory.assumptions)


@pytest.mark.parametrize(
    ("extra", "noted"),
    [
        ("method: full, activation_checkpointing: full", True),
        ("method: full, activation_checkpointing: none", False),
        ("method: lora, activation_checkpointing: full", False),
    ],
)
def test_the_analytic_estimate_warns_where_the_share_is_known_short(
    extra: str, noted: bool
) -> None:
    """Full fine-tuning with checkpointing on one PyTorch rank: the fitted share can be far
    short of what the allocator reserves, and the estimate says so and points at --trace."""
    from gpuplan.estimate.fit import fit
    from gpuplan.validation import _catalog, row_spec

    spec = row_spec(
        "{model: llama-3.2-1b, " + extra + ", precision: bf16-mixed, micro_batch_size: 4, "
        "seq_len: 1024}",
        "t",
        REPO,
    )
    notes = fit(spec, _catalog().gpu("H200")).memory.assumptions
    assert any("fit --trace" in n and "fragment" in n for n in notes) is noted
