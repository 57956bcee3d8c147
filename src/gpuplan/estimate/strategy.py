"""Parallel strategies: how a job is laid out on N GPUs, and the candidates to try."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One layout: sharding stage, tensor/pipeline/data parallel degrees, micro-batch.

    ``dp * tp * pp`` is the GPU count. ``grad_accum`` micro-batches make one
    optimizer step on each data-parallel rank.
    """

    sharding: str = "none"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    vp: int = 1
    """Virtual pipeline stages per GPU (interleaved schedule)."""
    micro_batch_size: int = 1
    grad_accum: int = 1
    activation_checkpointing: str = "none"
    offload: str = "none"
    shard_ranks: int = 0
    """Ranks the sharded state is split over; 0 = every data-parallel rank (``hsdp``: the
    data-parallel ranks within one node)."""

    @property
    def shard_degree(self) -> int:
        """Data-parallel ranks that share one copy of the sharded state."""
        return min(self.dp, self.shard_ranks) if self.shard_ranks else self.dp

    @property
    def gpus(self) -> int:
        """GPUs used."""
        return self.tp * self.pp * self.dp

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
        }

    def label(self) -> str:
        """Short human label, e.g. ``zero3 dp8 mb4 ckpt=full``."""
        parts = [self.sharding]
        parts += [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"pp{self.pp}" + (f"v{self.vp}" if self.vp > 1 else "")] if self.pp > 1 else []
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


def candidate_layouts(
    gpus: int,
    *,
    heads: int,
    layers: int,
    gpus_per_node: int = 8,
    shardings: tuple[str, ...] = ("none", "zero1", "zero2", "zero3"),
) -> Iterator[tuple[str, int, int, int]]:
    """(sharding, tp, pp, dp) layouts for ``gpus`` GPUs.

    Tensor parallelism stays inside a node and must divide the attention heads;
    pipeline stages must divide the layers. Sharding only matters with dp > 1.
    """
    for tp in divisors(gpus):
        if tp > gpus_per_node or heads % tp:
            continue
        for pp in divisors(gpus // tp):
            if layers % pp:
                continue
            dp = gpus // (tp * pp)
            for sharding in shardings if dp > 1 else ("none",):
                yield sharding, tp, pp, dp
