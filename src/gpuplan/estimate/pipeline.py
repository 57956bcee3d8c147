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

Which layers each chunk holds decides what those chunks weigh. Megatron-core splits the
layers evenly over the ``pp x vp`` chunks, or, when they do not divide but two more would,
counts the embedding and the loss as one layer each
(``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``,
``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``, read at
Megatron-LM d98e8a64): the first chunk of the first stage then builds one layer fewer and
holds the embedding, the last chunk of the last stage one fewer beside the loss. That is
Llama-3.1-405B's 126 layers on 64 or 128 chunks, as Megatron-Bridge's ``llama31_405b``
recipe sets and Meta's Llama 3 paper describes (Sec. 3.3.2: "the first model chunk on the
first stage has only the embedding"). A stage's peak is then the most layer-micro-batches
its chunks hold at once, which :func:`held_layers` finds by walking Megatron's schedule
table (``get_schedule_table``: groups of ``pp`` micro-batches, every chunk in turn forward,
the chunks in reverse backward).
"""

from __future__ import annotations

import functools
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


def counts_embedding_and_loss(layers: int, pp: int, vp: int = 1) -> bool:
    """Whether Megatron splits ``layers`` over ``pp x vp`` chunks only by counting the
    embedding and the loss as one layer each (``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split``): the layers do not divide, two more do.

    >>> counts_embedding_and_loss(126, 16, 8), counts_embedding_and_loss(80, 8, 5)
    (True, False)
    """
    chunks = pp * vp
    return pp > 1 and layers % chunks != 0 and (layers + 2) % chunks == 0


def chunk_layers(layers: int, st: Strategy, stage: PipelineStage) -> tuple[float, ...]:
    """Transformer layers in each of the stage's ``vp`` chunks, in schedule order.

    Even when ``pp x vp`` divides the layers; with the embedding and the loss counted as a
    layer each when only ``layers + 2`` divides (the first stage's first chunk and the last
    stage's last chunk one fewer); otherwise ``ceil(layers / pp)`` spread evenly, the worst
    stage's share.

    >>> chunk_layers(126, Strategy(pp=16, vp=8), "first")
    (0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    >>> chunk_layers(126, Strategy(pp=8), "last")
    (15.0,)
    >>> chunk_layers(80, Strategy(pp=4, vp=5), "first")
    (4.0, 4.0, 4.0, 4.0, 4.0)
    """
    chunks = st.pp * st.vp
    if st.pp == 1:
        return (float(layers),)
    if layers % chunks == 0:
        return (layers / chunks,) * st.vp
    if counts_embedding_and_loss(layers, st.pp, st.vp):
        slots = (layers + 2) // chunks
        own = [float(slots)] * st.vp
        own[0 if stage == "first" else -1] -= 1.0
        return tuple(own)
    return (-(-layers // st.pp) / st.vp,) * st.vp


def stage_layers(layers: int, st: Strategy, stage: PipelineStage) -> int:
    """Transformer layers the stage holds (:func:`chunk_layers`, summed)."""
    return round(sum(chunk_layers(layers, st, stage)))


def held_layers(layers: int, st: Strategy, stage: PipelineStage) -> float:
    """Layer-micro-batches whose activations the stage holds at its peak: the stage's
    layers times :func:`in_flight` when its chunks are even, else the most its chunks hold
    at once over Megatron's schedule."""
    own = chunk_layers(layers, st, stage)
    if st.pp <= 1 or len(set(own)) == 1:
        return sum(own) * in_flight(st, stage)
    rank = 0 if stage == "first" else st.pp - 1
    return _schedule_peak(own, st.pp, rank, st.grad_accum)


@functools.lru_cache(maxsize=256)
def _schedule_peak(own: tuple[float, ...], pp: int, rank: int, micro_batches: int) -> float:
    """The most layer-micro-batches rank ``rank`` holds at once under Megatron-core's
    interleaved 1F1B, its chunks holding ``own`` layers each.

    The forward order is ``get_schedule_table``'s: micro-batches in groups of ``pp`` (the
    last group takes the rest), each group through chunk 0, 1, ... in turn; the backward
    order takes the chunks in reverse. The rank runs its warm-up forwards
    (:func:`warmup_chunks`), then a forward before each backward, then the rest backward.
    """
    vp = len(own)
    order: list[int] = []
    for start in range(0, micro_batches, pp):
        group = min(pp, micro_batches - start)
        for chunk in range(vp):
            order += [chunk] * group
    total = len(order)
    warmup = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)
    held = peak = sum(own[c] for c in order[:warmup])
    for step in range(total):
        if warmup + step < total:
            held += own[order[warmup + step]]
            peak = max(peak, held)
        held -= own[vp - 1 - order[step]]
    return peak


def describe(st: Strategy, layers: int | None = None) -> str:
    """One line on what the first and last stages hold, for the estimate's assumptions
    (with ``layers``, also how they are split when the embedding and loss count as layers)."""
    first, last = chunks_in_flight(st, "first"), chunks_in_flight(st, "last")
    if st.vp <= 1:
        line = (
            f"1F1B over pp={st.pp} with {st.grad_accum} micro-batches: the first stage holds "
            f"{first} micro-batches in flight, the last {last} (Megatron-core "
            "get_pp_rank_microbatches: pp - rank - 1 warm-up forwards, plus one)"
        )
    else:
        line = (
            f"interleaved 1F1B (pp={st.pp}, vp={st.vp}, {st.grad_accum} micro-batches, "
            f"{st.grad_accum * st.vp} chunk forwards a step): the first stage holds {first} "
            f"chunks in flight ({first / st.vp:.2f} micro-batches of its layers), the last "
            f"{last} ({last / st.vp:.2f}); Megatron-core get_pp_rank_microbatches: "
            "(pp - rank - 1) 2 + (vp - 1) pp warm-up chunks, plus one, at most m vp"
        )
    if layers is None or not counts_embedding_and_loss(layers, st.pp, st.vp):
        return line
    return line + (
        f"; {layers} layers and the embedding and loss as one layer each over "
        f"{st.pp * st.vp} chunks (Megatron's account_for_embedding/loss_in_pipeline_split): "
        f"the first stage holds {stage_layers(layers, st, 'first')} layers, "
        f"{held_layers(layers, st, 'first'):.0f} layer-micro-batches at its peak, the last "
        f"{stage_layers(layers, st, 'last')}, {held_layers(layers, st, 'last'):.0f}"
    )
