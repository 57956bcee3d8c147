"""Extra activation memory of the interleaved 1F1B pipeline schedule.

With ``vp`` model chunks per GPU, Megatron-core's interleaved schedule
(``forward_backward_pipelining_with_interleaving``) runs
``2 (pp - 1) + (vp - 1) pp`` warm-up chunk forwards on the first stage before
its first backward, each over ``layers / (pp vp)`` layers. Against plain 1F1B
(``pp`` micro-batches of ``layers / pp`` layers) the first stage holds
``1 + (pp - 1) / (pp vp)`` times the activations (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", MLSys 2023,
Section 4.2.3). The warm-up is capped at the step's ``m vp`` chunk forwards:
with ``m == pp`` micro-batches Megatron runs every forward before the first
backward (``all_warmup_microbatches`` in earlier releases; the current
``get_pp_rank_microbatches``, read at Megatron-LM d98e8a64, reaches the same through its
warm-up count ``(pp - rank - 1) 2 + (vp - 1) pp``, capped at ``m vp``), so the first stage
holds ``m`` whole micro-batches, as plain 1F1B does, and interleaving costs no extra memory.
The memory estimator models plain 1F1B; this adds the difference, so a
search cannot take interleaving's smaller bubble for free.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuplan.catalog.schema import GpuSpec
from gpuplan.estimate.memory import (
    PAGED_DETAIL,
    RESERVE_DETAIL,
    MemoryEstimate,
    MemoryJob,
    estimate_memory,
    reserve_note,
    restate_reserve,
    squeezed_reserve,
)
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.strategy import Strategy

LABEL = "activations: interleaved 1F1B warm-up (extra chunks in flight)"


def interleave_factor(st: Strategy) -> float:
    """Extra share of the saved activations the interleaved schedule keeps (0 without it).

    Megatron-core ``schedules.py``, ``forward_backward_pipelining_with_interleaving``: the
    first stage runs ``2 (pp - 1) + (vp - 1) pp`` warm-up chunk forwards, or all ``m vp`` of
    the step when that is fewer, and holds one more before its first backward. Plain 1F1B
    holds ``min(pp, m)`` micro-batches of ``vp`` chunks each.
    """
    if st.pp <= 1 or st.vp <= 1 or st.grad_accum < st.pp:
        return 0.0
    chunks = st.pp * st.vp
    in_flight = min(chunks + st.pp - 1, st.grad_accum * st.vp)
    return in_flight / chunks - 1


def with_interleaving(mem: MemoryEstimate, st: Strategy) -> MemoryEstimate:
    """``mem`` plus the interleaved schedule's extra activations (``mem`` itself without vp).

    The extra is charged on the step's activations as the estimate itemises them
    (saved plus the loss gradient, a slight over-count) and added to the peak
    whichever phase it falls in: conservative where the optimizer step peaks.
    """
    factor = interleave_factor(st)
    if factor == 0.0:
        if st.pp > 1 and st.vp > 1 and st.grad_accum == st.pp:
            note = (
                f"interleaved pipeline (vp={st.vp}) with as many micro-batches as stages "
                f"({st.pp}): Megatron runs every forward before the first backward, so the "
                "first stage keeps what 1F1B keeps"
            )
            return dataclasses.replace(mem, assumptions=(*mem.assumptions, note))
        return mem
    acts = mem.breakdown.get("activations", 0.0) or mem.details.get(
        "activations: saved for backward", 0.0
    )
    extra = acts * factor
    if extra <= 0:
        return mem
    usable = mem.capacity_bytes * (1 - mem.safety_margin)
    allocated = mem.peak_allocated_bytes + extra
    # CUDA context and NCCL buffers (a paged optimizer's resident state yields room, below)
    outside = mem.device_used_bytes - mem.peak_reserved_bytes - mem.evictable_bytes
    reserve = squeezed_reserve(mem.steady_reserve_bytes, allocated, outside, usable)
    used = allocated + reserve + outside
    fits = used <= usable
    evictable = min(mem.evictable_bytes, max(0.0, usable - used))
    used += evictable
    breakdown = dict(mem.breakdown)
    breakdown["activations"] = breakdown.get("activations", 0.0) + extra
    details = {**mem.details, LABEL: extra, RESERVE_DETAIL: reserve}
    if mem.evictable_bytes:
        breakdown["optimizer"] -= mem.evictable_bytes - evictable
        details[PAGED_DETAIL] = evictable
    breakdown["overhead"] = used - sum(v for k, v in breakdown.items() if k != "overhead")
    return dataclasses.replace(
        mem,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=allocated + reserve,
        device_used_bytes=used,
        fits=fits,
        headroom_bytes=usable - (used - evictable),
        breakdown=breakdown,
        details=details,
        evictable_bytes=evictable,
        assumptions=restate_reserve(
            (
                *mem.assumptions,
                f"interleaved pipeline (vp={st.vp}): the first stage keeps {1 + factor:.2f}x "
                "the 1F1B activations, min(pp*vp + pp - 1, m*vp) / (pp*vp) chunks (Megatron-core "
                "warm-up; 1 + (pp-1)/(pp*vp) from 2 pp micro-batches, Korthikanti et al. 2023)",
            ),
            reserve_note(mem.steady_reserve_bytes, reserve, used, usable),
        ),
    )


def scheduled_memory(
    shape: Shape, job: MemoryJob, st: Strategy, gpu: GpuSpec, **kwargs: Any
) -> MemoryEstimate:
    """The memory estimate of ``st`` as its pipeline schedule runs it: plain 1F1B's, plus the
    interleaved warm-up's extra activations where ``vp`` > 1 (what ``fit`` reports).
    ``kwargs`` go to :func:`estimate_memory`."""
    if st.vp <= 1:
        return estimate_memory(shape, job, st, gpu, **kwargs)
    plain = estimate_memory(shape, job, dataclasses.replace(st, vp=1), gpu, **kwargs)
    return with_interleaving(plain, st)
