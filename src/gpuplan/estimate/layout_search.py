"""The layout search behind ``parallelism: auto``: the fastest layout that fits, found quickly.

The space is tensor parallelism (inside a node) x pipeline stages x interleaving
(vp) x data parallelism x sharding stage x activation checkpointing x
micro-batch, under the rules the engines enforce (:mod:`gpuplan.estimate.strategy`):
the spec's global batch is kept (``grad_accum = global / (micro x dp)``), a
pipeline gets at least ``pp`` micro-batches per step, TP splits whole heads and
key/value groups and stays inside a node.

Two bounds keep it fast (a plan over thousands of GPUs in well under a second):

* **time, before anything else**: a layout's step time per sample is at least
  its compute divided by ``1 - bubble``. Compute per sample depends only on TP,
  checkpointing and the micro-batch (a stage does ``ceil(layers / pp)`` layers
  and the head, so ``pp`` stages never do less than the whole model), and it does
  not grow with the micro-batch, so one timing per (tp, checkpointing,
  micro-batch) bounds every layout sharing them. Layouts are visited best bound
  first and the search stops when the next bound cannot beat the best found.
* **memory, before timing**: the smallest micro-batch of a layout is estimated
  first (memory grows with the micro-batch); a layout that does not fit even then
  is never timed. The largest micro-batch that fits is found by bisection.
  Each option's memory is a verdict (:func:`gpuplan.estimate.memory.check_memory`: the
  estimate's numbers without its breakdown and assumptions), cached per layout and
  micro-batch (an interleaved layout's own warm-up counts, per pipeline stage:
  :mod:`gpuplan.estimate.pipeline`); only the option chosen is explained.

Without stages the largest micro-batch that fits is the fastest; with stages a
smaller one shortens the bubble, so every micro-batch that fits is a candidate,
each skipped when its own bound (its compute over its own bubble; for ``vp > 1``
also its plain sibling's step with the bubble exchanged) cannot beat the best.
The bounds never change the answer: ``search(..., prune=False)`` visits
everything and the tests compare the two.

Ties go to the simpler layout (fewer stages, smaller TP, lighter sharding, no
recomputation). Pure and deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
from collections.abc import Callable, Sequence

from gpuplan.errors import SpecError
from gpuplan.estimate.memory import MemoryCheck, MemoryEstimate
from gpuplan.estimate.speed import TimeEstimate, autocast_cast_ratio
from gpuplan.estimate.strategy import (
    AUTO_SHARDINGS,
    Strategy,
    candidate_layouts,
    grad_accum_for,
    pipeline_micro_batches_ok,
    vp_degrees,
)

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Best = tuple[float, int, Strategy, TimeEstimate]
"""(seconds per sample, simplicity rank, strategy, time)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """What decides the candidate layouts (all plain values, so the space is cached)."""

    count: int
    gpus_per_node: int
    heads: int
    kv_heads: int
    layers: int
    global_batch: int | None
    micro_batch: int
    checkpointing: tuple[str, ...]
    offload: str
    shardings: tuple[str, ...] = AUTO_SHARDINGS
    """Sharding stages to try (those the framework implements)."""
    accumulation: bool = True
    """Whether micro-batches may accumulate (not with the optimizer step in backward)."""


def checkpointing_modes(spec_mode: str) -> tuple[str, ...]:
    """The spec's activation checkpointing, then full recomputation if that is heavier."""
    return ("full",) if spec_mode == "full" else (spec_mode, "full")


@functools.lru_cache(maxsize=256)
def layout_groups(space: SearchSpace) -> tuple[tuple[Strategy, ...], ...]:
    """Every layout to try, simplest first, each as its micro-batch options (ascending).

    Raises:
        SpecError: no layout can keep the global batch.
    """
    given = space.global_batch is not None
    mbs = sorted(set(MICRO_BATCHES) | {space.micro_batch})
    layouts = sorted(
        candidate_layouts(
            space.count,
            heads=space.heads,
            kv_heads=space.kv_heads,
            layers=space.layers,
            gpus_per_node=space.gpus_per_node,
            shardings=space.shardings,
        ),
        key=lambda lay: (lay[2], lay[1], lay[0] != "none", lay[0]),
    )
    out: list[tuple[Strategy, ...]] = []
    for sharding, tp, pp, dp in layouts:
        for ckpt in space.checkpointing:
            for vp in vp_degrees(space.layers, pp):
                group = []
                for mb in mbs:
                    ga = grad_accum_for(space.global_batch, mb, dp)
                    if ga is None or not pipeline_micro_batches_ok(ga, pp, vp, batch_given=given):
                        continue
                    if ga > 1 and not space.accumulation:
                        continue
                    group.append(
                        Strategy(
                            sharding=sharding,
                            tp=tp,
                            pp=pp,
                            vp=vp,
                            dp=dp,
                            micro_batch_size=mb,
                            grad_accum=ga,
                            activation_checkpointing=ckpt,
                            offload=space.offload,
                        )
                    )
                if group:
                    out.append(tuple(group))
    if not out and not space.accumulation:
        raise SpecError(
            f"optimizer_in_backward: no layout of {space.count} GPUs runs global_batch_size "
            f"{space.global_batch} without accumulation (micro-batch x data-parallel ranks must "
            "equal it)",
            hint="--set optimizer_in_backward=false, or a global batch that one step covers",
        )
    if not out:
        raise SpecError(
            f"global_batch_size: {space.global_batch} is not divisible by micro_batch_size x "
            f"data-parallel ranks for any layout of {space.count} GPUs"
        )
    return tuple(out)


def _keeps_weights_whole(st: Strategy) -> bool:
    """Whether ``st`` can pay torch autocast's per-micro-batch weight casts: no pipeline, and
    every rank holds the whole weights (no sharding over more than one rank, or ZeRO-1): the
    rule of ``speed._autocast_weight_traffic_s`` read from the strategy alone. The bound stays
    a bound if this says no where the layout casts (it only loosens), and where the engine
    casts nothing at all (the representative's cast part is then zero too); it must not say
    yes for a layout that shards its weights."""
    return st.pp == 1 and (st.sharding in ("none", "zero1") or st.shard_degree <= 1)


def bubble_fraction(st: Strategy) -> float:
    """Share of a 1F1B step the pipeline idles: ``(pp - 1) / (vp m + pp - 1)`` (as timed)."""
    if st.pp <= 1:
        return 0.0
    return (st.pp - 1) / (st.vp * st.grad_accum + st.pp - 1)


_RECOMPUTE = ("none", "selective", "selective-op", "full")
"""Checkpointing modes from the least recomputation to the most."""


class ComputeBound:
    """Lower bounds on seconds per sample, from one timing per (tp, checkpointing, micro-batch).

    ``time_of`` times a representative layout: the same TP, checkpointing and
    micro-batch, no stages, no data or expert parallelism. Its compute and its exposed
    tensor-parallel traffic, scaled by the step overhead the same estimate
    applies, are what any layout sharing TP, checkpointing and micro-batch must at
    least spend per sample; stages add the bubble on the compute.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[Strategy]],
        count: int,
        time_of: Callable[[Strategy], TimeEstimate],
    ) -> None:
        self._count = count
        self._time_of = time_of
        self._per_sample: dict[tuple[int, str, int], tuple[float, float, float]] = {}
        self._largest = max(g[-1].micro_batch_size for g in groups)
        modes = {g[0].activation_checkpointing for g in groups}
        self._lightest = min(modes, key=_RECOMPUTE.index)

    def _unit(self, st: Strategy, casts: bool | None = None) -> tuple[float, float]:
        """(compute, exposed TP traffic) in GPU-seconds per sample, with the step overhead;
        ``casts``: count torch autocast's weight casts (default: where ``st`` pays them)."""
        casts = _keeps_weights_whole(st) if casts is None else casts
        key = (st.tp, st.activation_checkpointing, st.micro_batch_size)
        unit = self._per_sample.get(key)
        if unit is None:
            # no expert parallelism either: its all-to-alls only add to a layout's time
            rep = dataclasses.replace(st, pp=1, vp=1, dp=1, ep=1, grad_accum=1, sharding="none")
            t = self._time_of(rep)
            modelled = t.compute_s + t.bubble_s + t.exposed_comm_s + t.optimizer_s
            overhead = max(1.0, t.step_time_s / modelled) if modelled > 0 else 1.0
            scale = st.tp / st.micro_batch_size * overhead
            cast = t.parts.get("autocast weight casts", 0.0)
            unit = ((t.compute_s - cast) * scale, cast * scale, t.exposed_comm_s * scale)
            self._per_sample[key] = unit
        compute, cast, tp_comm = unit
        # torch autocast's fp32 weights pay a cast and an accumulation every micro-batch, more
        # with more of them a step (speed.autocast_cast_ratio); a layout that shards its weights
        # pays none
        if casts:
            compute += cast * autocast_cast_ratio(st.grad_accum, st.activation_checkpointing)
        return compute, tp_comm

    def known(self, group: Sequence[Strategy]) -> bool:
        """Whether :meth:`group` needs no new timing for ``group``."""
        rep = group[-1]
        return (rep.tp, rep.activation_checkpointing, rep.micro_batch_size) in self._per_sample

    def option(self, st: Strategy) -> float:
        """A bound for one option: its own micro-batch's compute over its own bubble."""
        compute, tp_comm = self._unit(st)
        return (compute / (1 - bubble_fraction(st)) + tp_comm) / self._count * (1 - 1e-9)

    def group(self, group: Sequence[Strategy], *, coarse: bool = False) -> float:
        """A bound for every option of a layout: the least compute (largest micro-batch)
        over the least bubble (most micro-batches).

        ``coarse`` bounds by the compute without TP or recomputation at the largest
        micro-batch searched (splitting GEMMs and recomputing never save compute), one
        timing for all layouts; the search refines it when a layout comes up.
        """
        rep = group[-1]  # the largest micro-batch: the fewest micro-batches a step too
        if coarse:
            rep = dataclasses.replace(
                rep,
                tp=1,
                activation_checkpointing=self._lightest,
                micro_batch_size=self._largest,
                grad_accum=1,
            )
        # the coarse bound stands for every layout, sharded ones too: no weight casts
        compute, tp_comm = self._unit(rep, casts=False if coarse else None)
        if coarse:
            tp_comm = 0.0
        per_gpu = compute / (1 - bubble_fraction(group[0])) + tp_comm
        return per_gpu / self._count * (1 - 1e-9)


def search(
    groups: Sequence[Sequence[Strategy]],
    memory_of: Callable[[Strategy], MemoryCheck],
    time_of: Callable[[Strategy], TimeEstimate],
    *,
    count: int,
    require_fit: bool = True,
    prune: bool = True,
    prefer_sure: bool = True,
) -> tuple[Best | None, tuple[float, Strategy] | None]:
    """The fastest fitting option of ``groups`` and the closest miss (memory / usable, strategy).

    ``memory_of`` gives each option's verdict (:func:`gpuplan.estimate.memory.check_memory`);
    the caller explains the option it is given.

    ``prune=False`` visits every layout (for tests: the bounds must not change the answer).
    ``require_fit=False`` times the largest option of each layout whatever its memory.
    ``prefer_sure=False`` takes the largest micro-batch the point estimate fits, ``tight`` or not
    (the planner's ``--risk high``, or a deadline that only the faster one meets).
    """
    plain = PlainTimes(time_of)
    bound = ComputeBound(groups, count, plain.time)
    coarse = bound.group(groups[0], coarse=True) if prune else 0.0
    # (bound, simplicity rank, refined?): coarse bounds differ only by the bubble; a layout
    # is refined (its own TP, checkpointing and micro-batch) when it first comes up
    order = [
        (coarse / (1 - bubble_fraction(g[0])) if prune else 0.0, rank, not prune)
        for rank, g in enumerate(groups)
    ]
    heapq.heapify(order)
    best: Best | None = None
    closest: tuple[float, Strategy] | None = None
    while order:
        lower, rank, refined = heapq.heappop(order)
        if best is not None and lower >= best[0]:
            break  # every layout left is bounded by at least this
        ordered = groups[rank]
        # a refined bound is free when its timing is cached; else memory goes first
        if not refined and bound.known(ordered):
            heapq.heappush(order, (bound.group(ordered), rank, True))
            continue
        if require_fit:
            first = memory_of(ordered[0])
            if not first.fits:  # this layout's memory lower bound: never timed
                ratio = miss_ratio(first)
                if closest is None or ratio < closest[0]:
                    closest = (ratio, ordered[0])
                continue
        if not refined:
            heapq.heappush(order, (bound.group(ordered), rank, True))
            continue
        st0 = ordered[0]
        if require_fit:
            # a micro-batch that fits only as the caching allocator gives back its usual cache
            # is taken only where no smaller one fits with it (a full card runs, but risks
            # fragmentation and allocation retries); likewise one whose 80% upper bound does
            # not fit (tight) only where no smaller one fits surely: a larger micro-batch buys
            # a few percent of speed, an out-of-memory error costs the run
            first = memory_of(st0)
            roomy, sure = not first.reserve_squeezed, first.sure and prefer_sure
            lo, hi, fitting = 1, len(ordered) - 1, 0
            while lo <= hi:  # memory grows with the micro-batch: bisect the largest that fits
                mid = (lo + hi) // 2
                m = memory_of(ordered[mid])
                if m.fits and not (roomy and m.reserve_squeezed) and not (sure and not m.sure):
                    fitting, lo = mid, mid + 1
                else:
                    hi = mid - 1
        else:
            fitting = len(ordered) - 1
        # without stages the largest micro-batch is fastest; with them, fewer, larger
        # micro-batches enlarge the bubble, so every micro-batch that fits is a candidate
        for st in reversed(ordered[: fitting + 1] if st0.pp > 1 else ordered[fitting:][:1]):
            if prune and best is not None and st.pp > 1:
                if bound.option(st) >= best[0]:
                    continue
                if st.vp > 1 and plain.interleaved(st) >= best[0]:
                    continue
            t = plain.time(st)
            score = t.step_time_s / (st.micro_batch_size * st.grad_accum * st.dp)
            if best is None or (score, rank) < (best[0], best[1]):
                best = (score, rank, st, t)
    return best, closest


class PlainTimes:
    """Timings cached per strategy, and the bound interleaving's siblings take from them.

    Interleaving changes only the bubble (down) and the pipeline sends (up, in
    proportion to vp), so a layout with ``vp > 1`` takes at least its plain
    (``vp = 1``) sibling's step less that sibling's bubble plus its own.
    """

    def __init__(self, time_of: Callable[[Strategy], TimeEstimate]) -> None:
        self._time_of = time_of
        self._cache: dict[Strategy, TimeEstimate] = {}

    def time(self, st: Strategy) -> TimeEstimate:
        """``time_of(st)``, once."""
        t = self._cache.get(st)
        if t is None:
            t = self._time_of(st)
            self._cache[st] = t
        return t

    def interleaved(self, st: Strategy) -> float:
        """A lower bound on seconds per sample of ``st`` from its plain sibling's timing."""
        t1 = self.time(dataclasses.replace(st, vp=1))
        modelled = t1.compute_s + t1.bubble_s + t1.exposed_comm_s + t1.optimizer_s
        overhead = max(1.0, t1.step_time_s / modelled) if modelled > 0 else 1.0
        frac = bubble_fraction(st)
        bubble = t1.compute_s * frac / (1 - frac)
        step = t1.step_time_s + overhead * (bubble - t1.bubble_s)
        return step / (st.micro_batch_size * st.grad_accum * st.dp) * (1 - 1e-9)


def miss_ratio(mem: MemoryCheck | MemoryEstimate) -> float:
    """Device memory used over what may be used (> 1: does not fit)."""
    return mem.device_used_bytes / (mem.capacity_bytes * (1 - mem.safety_margin))


def describe_miss(mem: MemoryEstimate) -> str:
    """How far a layout misses, in GiB and %: ``needs 35.6 GiB per GPU, 0.2 GiB (0.6%) over ...``."""
    usable = mem.capacity_bytes * (1 - mem.safety_margin)
    over = mem.device_used_bytes - usable
    return (
        f"needs {mem.device_used_bytes / 2**30:.1f} GiB per GPU, {over / 2**30:.1f} GiB "
        f"({over / usable:.1%}) over the {usable / 2**30:.1f} GiB usable"
    )
