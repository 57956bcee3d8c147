"""What each pipeline stage holds in flight under Megatron-core's 1F1B schedules.

A stage keeps the activations of every micro-batch (or model chunk, when interleaved) whose
forward has run and whose backward has not. Megatron-core's ``get_pp_rank_microbatches``
(``megatron/core/pipeline_parallel/schedules.py``, read at Megatron-LM d98e8a64) gives the
warm-up forwards of pipeline rank ``r`` before its first backward:

* plain 1F1B (``forward_backward_pipelining_without_interleaving``): ``pp - r - 1``;
* interleaved over ``vp`` model chunks (``..._with_interleaving``):
  ``(pp - r - 1) 2 + (vp - 1) g`` chunk forwards, ``g`` the micro-batch group per virtual
  stage (``microbatch_group_size_per_vp_stage``, by default ``pp``);

both capped at the step's ``m vp`` forwards, when every forward runs before the first
backward. The steady 1F1B phase then runs one more forward before each backward, so the
peak is the warm-up plus one. The first stage (rank 0) holds the most; the last holds one
micro-batch without interleaving, and ``(vp - 1) pp + 1`` chunks with it, among them the one
micro-batch whose loss is computed. torch's ``ScheduleInterleaved1F1B`` (``_get_warmup_ops``,
torch 2.13) warms up the same way when the micro-batches are a multiple of ``pp``.
"""

from __future__ import annotations

from typing import Literal

from gpuplan.estimate.strategy import Strategy

PipelineStage = Literal["first", "last"]
PIPELINE_STAGES: tuple[PipelineStage, ...] = ("first", "last")


def warmup_chunks(st: Strategy, stage: PipelineStage) -> int:
    """Chunk forwards the stage runs before its first backward (whole micro-batches when
    ``vp`` is 1), capped at the step's ``m vp``."""
    rank = 0 if stage == "first" else st.pp - 1
    total = st.grad_accum * st.vp
    if st.vp <= 1:
        return min(st.pp - rank - 1, total)
    return min((st.pp - rank - 1) * 2 + (st.vp - 1) * st.pp, total)


def chunks_in_flight(st: Strategy, stage: PipelineStage) -> int:
    """Chunk forwards whose activations the stage holds at its peak."""
    if st.pp <= 1:
        return st.vp
    total = st.grad_accum * st.vp
    return min(warmup_chunks(st, stage) + 1, total)


def in_flight(st: Strategy, stage: PipelineStage) -> float:
    """Micro-batches of the whole stage's activations the stage holds at its peak (a chunk is
    ``1 / vp`` of the stage's layers, so this can be fractional when interleaved)."""
    if st.pp <= 1:
        return 1.0
    return chunks_in_flight(st, stage) / st.vp


def describe(st: Strategy) -> str:
    """One line on what the first and last stages hold, for the estimate's assumptions."""
    first, last = chunks_in_flight(st, "first"), chunks_in_flight(st, "last")
    if st.vp <= 1:
        return (
            f"1F1B over pp={st.pp} with {st.grad_accum} micro-batches: the first stage holds "
            f"{first} micro-batches in flight, the last {last} (Megatron-core "
            "get_pp_rank_microbatches: pp - rank - 1 warm-up forwards, plus one)"
        )
    return (
        f"interleaved 1F1B (pp={st.pp}, vp={st.vp}, {st.grad_accum} micro-batches, "
        f"{st.grad_accum * st.vp} chunk forwards a step): the first stage holds {first} chunks "
        f"in flight ({first / st.vp:.2f} micro-batches of its layers), the last {last} "
        f"({last / st.vp:.2f}); Megatron-core get_pp_rank_microbatches: "
        "(pp - rank - 1) 2 + (vp - 1) pp warm-up chunks, plus one, at most m vp"
    )
