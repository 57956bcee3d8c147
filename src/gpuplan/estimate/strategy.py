"""Parallel strategies: how a job is laid out on N GPUs, and the candidates to try."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One layout: sharding stage, tensor/pipeline/data parallel degrees, micro-batch.

    ``dp * tp * pp * cp`` is the GPU count. ``grad_accum`` micro-batches make one
    optimizer step on each data-parallel rank. Context parallelism (``cp``) splits every
    sequence over ``cp`` ranks that share the weights like data-parallel ranks (Megatron-Core
    reduces gradients and shards the distributed optimizer over data x context parallel).
    """

    sharding: str = "none"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    vp: int = 1
    """Virtual pipeline stages per GPU (interleaved schedule)."""
    cp: int = 1
    """Context-parallel degree: each rank holds seq_len / cp tokens of every sequence."""
    ep: int = 1
    """Expert-parallel degree: each rank holds num_experts / ep of every MoE layer's experts;
    the ep ranks are part of the data x context parallel ranks (``replicas``)."""
    sequence_parallel: bool = True
    """With ``tp > 1``: activations outside the tensor-parallel region are split over the tp
    ranks (Megatron ``--sequence-parallel``); False keeps them whole on every rank."""
    micro_batch_size: int = 1
    grad_accum: int = 1
    activation_checkpointing: str = "none"
    offload: str = "none"
    shard_ranks: int = 0
    """Ranks the sharded state is split over; 0 = every data-parallel rank (``hsdp``: the
    data-parallel ranks within one node)."""

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights: data x context parallel (gradients are reduced,
        and sharded state split, over them)."""
        return self.dp * self.cp

    @property
    def shard_degree(self) -> int:
        """Data(-and-context)-parallel ranks that share one copy of the sharded state."""
        return min(self.replicas, self.shard_ranks) if self.shard_ranks else self.replicas

    @property
    def expert_replicas(self) -> int:
        """Ranks holding the same experts: ``replicas / ep`` (the expert-data-parallel group)."""
        return max(1, self.replicas // self.ep)

    @property
    def gpus(self) -> int:
        """GPUs used."""
        return self.tp * self.pp * self.cp * self.dp

    def as_contract(self) -> dict[str, object]:
        """The ``strategy`` object of ``gpuplan estimate --json`` (contract keys first)."""
        return {
            "sharding": self.sharding,
            "tp": self.tp,
            "pp": self.pp,
            "micro_batch_size": self.micro_batch_size,
            "activation_checkpointing": self.activation_checkpointing,
            "dp": self.dp,
            "vp": self.vp,
            "grad_accum": self.grad_accum,
            "offload": self.offload,
            "cp": self.cp,
            "sequence_parallel": self.sequence_parallel,
            "ep": self.ep,
        }

    def label(self) -> str:
        """Short human label, e.g. ``zero3 dp8 mb4 ckpt=full``."""
        parts = [self.sharding]
        parts += [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"pp{self.pp}" + (f"v{self.vp}" if self.vp > 1 else "")] if self.pp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += ["sp=off"] if self.tp > 1 and not self.sequence_parallel else []
        parts += [f"dp{self.dp}", f"mb{self.micro_batch_size}"]
        if self.grad_accum > 1:
            parts.append(f"ga{self.grad_accum}")
        if self.activation_checkpointing != "none":
            parts.append(f"ckpt={self.activation_checkpointing}")
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        return " ".join(parts)


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def grad_accum_for(global_batch: int | None, micro_batch: int, dp: int) -> int | None:
    """Micro-batches per step so that micro x dp x accum = global; None if impossible."""
    if global_batch is None:
        return 1
    per_rank = micro_batch * dp
    if global_batch % per_rank:
        return None
    return global_batch // per_rank


AUTO_SHARDINGS = tuple(s for s in SHARDINGS if s != "fsdp")
"""Sharding stages ``parallelism: auto`` tries (``fsdp`` is full sharding like ``zero3``)."""

PIPELINE_SHARDINGS_EXCLUDED = frozenset({"zero2"})
"""Sharding stages no engine runs under pipeline parallelism: DeepSpeed's ``PipelineEngine``
asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
deepspeed/runtime/pipe/engine.py) and Megatron's distributed optimizer is stage 1; FSDP with
pipeline stages (zero3) is what torchtitan runs, so it stays."""


def tp_degrees(gpus: int, *, heads: int, kv_heads: int, gpus_per_node: int) -> list[int]:
    """Tensor-parallel degrees for ``gpus`` GPUs.

    A TP group stays inside one node (``gpus_per_node`` is a multiple of it) and
    splits whole attention heads and whole key/value groups: Megatron-core divides
    ``num_attention_heads`` and ``num_query_groups`` by the TP size
    (megatron/core/transformer/attention.py, ``Attention.__init__``).

    >>> tp_degrees(64, heads=64, kv_heads=8, gpus_per_node=8)
    [1, 2, 4, 8]
    >>> tp_degrees(16, heads=232, kv_heads=8, gpus_per_node=8)
    [1, 2, 4, 8]
    """
    return [
        tp
        for tp in divisors(gpus)
        if tp <= gpus_per_node and gpus_per_node % tp == 0 and not heads % tp and not kv_heads % tp
    ]


def pipeline_splits(layers: int, pp: int) -> bool:
    """Whether ``layers`` split over ``pp`` stages the way Megatron-LM allows.

    Evenly (``layers % pp == 0``), or with the embedding and the loss counted as
    one layer each on the first and last stage (``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split``, megatron/training/arguments.py), so
    ``(layers + 2) % pp == 0``: Llama-3.1-405B's 126 layers on 8 or 16 stages. The
    estimators time the worst stage, a middle one of ``ceil(layers / pp)`` layers, and size
    the first and the last with one layer fewer (:func:`gpuplan.estimate.pipeline.chunk_layers`).

    >>> [pp for pp in (1, 2, 4, 8, 16) if pipeline_splits(126, pp)]
    [1, 2, 4, 8, 16]
    """
    if pp == 1:
        return True
    return pp <= layers and (layers % pp == 0 or (layers + 2) % pp == 0)


def vp_degrees(layers: int, pp: int) -> list[int]:
    """Virtual stages per GPU (interleaved 1F1B) for ``layers`` over ``pp`` stages.

    Interleaving needs pipeline stages and an even split: each of the ``pp x vp``
    model chunks holds ``layers / (pp x vp)`` whole layers (Megatron-LM asserts
    ``num_layers_per_pipeline_stage % num_layers_per_virtual_pipeline_stage == 0``), or
    ``(layers + 2) / (pp x vp)`` with the embedding and the loss counted as a layer each
    (:func:`pipeline_splits`; the chunks beside them hold one fewer, as Llama 3 405B's
    first chunk held only the embedding).

    >>> vp_degrees(80, 8)
    [1, 2, 5, 10]
    >>> vp_degrees(126, 8)
    [1, 2, 4, 8, 16]
    """
    if pp == 1:
        return [1]
    if layers % pp == 0:
        return divisors(layers // pp)
    if pp > 2 and (layers + 2) % pp == 0:
        return divisors((layers + 2) // pp)
    return [1]


def pipeline_micro_batches_ok(grad_accum: int, pp: int, vp: int, *, batch_given: bool) -> bool:
    """Whether ``grad_accum`` micro-batches per step make a sane pipeline schedule.

    1F1B keeps every stage busy only with at least ``pp`` micro-batches (the bubble
    is ``(pp - 1) / (vp x m + pp - 1)``); the interleaved schedule runs micro-batches
    in groups of ``pp`` (Megatron-core ``forward_backward_pipelining_with_interleaving``,
    ``microbatch_group_size_per_vp_stage`` defaults to ``pp``). Without a global batch
    in the spec there is no accumulation to choose, so plain 1F1B stays allowed (its
    bubble is timed as it is).
    """
    if pp == 1:
        return True
    if not batch_given:
        return vp == 1
    if grad_accum < pp:
        return False
    return vp == 1 or grad_accum % pp == 0


def candidate_layouts(
    gpus: int,
    *,
    heads: int,
    layers: int,
    kv_heads: int | None = None,
    gpus_per_node: int = 8,
    shardings: tuple[str, ...] = AUTO_SHARDINGS,
) -> Iterator[tuple[str, int, int, int]]:
    """(sharding, tp, pp, dp) layouts for ``gpus`` GPUs, simplest first.

    Tensor parallelism stays inside a node and splits whole heads and key/value
    groups (:func:`tp_degrees`); pipeline stages split the layers as Megatron-LM
    allows (:func:`pipeline_splits`). Sharding only matters with dp > 1, and
    ZeRO-2 does not combine with pipeline stages.
    """
    for tp in tp_degrees(
        gpus,
        heads=heads,
        kv_heads=heads if kv_heads is None else kv_heads,
        gpus_per_node=max(1, min(gpus_per_node, gpus)),
    ):
        for pp in divisors(gpus // tp):
            if not pipeline_splits(layers, pp):
                continue
            dp = gpus // (tp * pp)
            allowed = tuple(s for s in shardings if pp == 1 or s not in PIPELINE_SHARDINGS_EXCLUDED)
            for sharding in allowed if dp > 1 else ("none",):
                yield sharding, tp, pp, dp
