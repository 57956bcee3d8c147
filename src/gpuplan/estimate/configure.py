"""Choose the fastest layout that fits, for a spec on N GPUs of one type and topology.

With ``parallelism: auto`` the layout search of
:mod:`gpuplan.estimate.layout_search` covers tensor, pipeline (with
interleaving) and data parallelism, the sharding stage, activation
checkpointing and the micro-batch; with an explicit parallelism only the spec's
own layout is used. Every candidate is checked for memory first; the fastest
that fits wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError, InfeasibleError
from gpuplan.estimate import comm
from gpuplan.estimate.bounds import bounds_for
from gpuplan.estimate.fit import (
    FitResult,
    OnGpu,
    candidate_strategies,
    check_precision,
    max_micro_batch,
    memory_job,
    memory_verdict,
    spec_shape,
    strategy_class,
)
from gpuplan.estimate.frameworks import FRAMEWORKS
from gpuplan.estimate.layout_search import (
    SearchSpace,
    checkpointing_modes,
    describe_miss,
    layout_groups,
    search,
)
from gpuplan.estimate.memory import (
    DEFAULT_SAFETY_MARGIN,
    MemoryCheck,
    MemoryEstimate,
)
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.speed import TimeEstimate, estimate_time
from gpuplan.estimate.strategy import AUTO_SHARDINGS, Strategy
from gpuplan.spec import JobSpec, ParallelismSpec


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """A strategy with its memory verdict and time estimate."""

    fit: FitResult
    time: TimeEstimate
    topology: comm.Topology

    @property
    def strategy(self) -> Strategy:
        """The chosen strategy."""
        return self.fit.strategy

    def time_bounds(self) -> dict[str, list[float] | None]:
        """Calibrated 80% intervals ``[lo, hi]`` of the time figures (None where unknown)."""
        b = bounds_for("time", self.fit.job_class)
        t = self.time
        tok = t.tokens_per_s_per_gpu
        return {
            "step_time_s": b.around(t.step_time_s),
            "tokens_per_s_per_gpu": None if tok is None else b.around_inverse(tok),
            "samples_per_s": b.around_inverse(t.samples_per_s),
            "time_to_train_s": None if t.time_to_train_s is None else b.around(t.time_to_train_s),
        }

    def time_contract(self) -> dict[str, object]:
        """The ``time`` object of ``gpuplan estimate --json``, with its bounds."""
        return {
            **self.time.as_contract(),
            "bounds": self.time_bounds(),
            "bounds_basis": bounds_for("time", self.fit.job_class).describe(),
        }


def default_topology(
    gpu: GpuSpec,
    count: int,
    *,
    gpus_per_node: int | None = None,
    intra_node: str | None = None,
    inter_node_gbps: float | None = None,
    fabric: str | None = None,
    hosting: str = "bare-metal",
) -> comm.Topology:
    """The usual board for a GPU: SXM/OAM parts on NVSwitch (or Infinity Fabric), PCIe cards on PCIe."""
    gpn = gpus_per_node or min(count, 8)
    return comm.Topology(
        gpus=count,
        gpus_per_node=gpn,
        intra_node=intra_node or comm.usual_intra_node(gpu, gpn),
        inter_node_gbps=inter_node_gbps,
        fabric=fabric,
        hosting=hosting,
    )


def search_space(spec: JobSpec, shape: Shape, count: int, gpus_per_node: int) -> SearchSpace:
    """The layout space ``parallelism: auto`` searches for ``spec`` on ``count`` GPUs."""
    text = shape.family != "cnn"
    return SearchSpace(
        count=count,
        gpus_per_node=gpus_per_node,
        heads=shape.heads if text else 1,
        kv_heads=shape.kv_heads if text else 1,
        layers=shape.layers if text else 1,
        global_batch=spec.global_batch_size,
        micro_batch=spec.micro_batch_size,
        checkpointing=checkpointing_modes(spec.activation_checkpointing),
        offload=spec.offload,
        shardings=auto_shardings(spec.framework, count, gpus_per_node),
        accumulation=not spec.optimizer_in_backward,
    )


def auto_shardings(framework: str, count: int, gpus_per_node: int) -> tuple[str, ...]:
    """The sharding stages ``parallelism: auto`` tries: those the engine implements
    (:data:`gpuplan.estimate.frameworks.FRAMEWORKS`), and ``hsdp`` only across nodes (within one
    node it shards over every GPU, the same arithmetic as ``zero3``)."""
    supported = FRAMEWORKS[framework].shardings
    return tuple(
        s for s in AUTO_SHARDINGS if s in supported and (s != "hsdp" or count > gpus_per_node)
    )


def refusal_hint(spec: JobSpec, closest: Strategy | None) -> str:
    """What would make a refused job fit, from what its closest layout still leaves on the table
    (a micro-batch above 1, no recompute, a full fine-tune), after more or larger GPUs."""
    ways = ["more GPUs", "a larger GPU"]
    if closest is not None and closest.micro_batch_size > 1:
        ways.append(f"a micro_batch_size below {closest.micro_batch_size}")
    if closest is not None and closest.activation_checkpointing == "none":
        ways.append("activation_checkpointing: full")
    if spec.method == "full":
        ways.append("lora/qlora")
    elif spec.method == "lora":
        ways.append("qlora")
    return "use " + ", ".join(ways[:-1]) + " or " + ways[-1]


def configure(
    spec: JobSpec,
    gpu: GpuSpec,
    count: int,
    topo: comm.Topology | None = None,
    *,
    margin: float = DEFAULT_SAFETY_MARGIN,
    capacity: float | None = None,
    with_scaling: bool = True,
    require_fit: bool = True,
    prefer_sure: bool = True,
) -> Configuration:
    """The fastest configuration of ``spec`` on ``count`` x ``gpu`` that fits in memory.

    ``prefer_sure`` (default): of one layout's micro-batches, a ``tight`` one (only the point
    estimate fits) is taken only where no smaller one fits with its upper bound too
    (:func:`gpuplan.estimate.layout_search.search`); False: the fastest the estimate fits.

    ``require_fit=False`` is for timing a layout known to have run (validation
    rows): an explicit layout is timed even where our memory model says it does
    not fit, and an automatic search that finds nothing that fits times the
    closest layout instead of refusing.

    Raises:
        InfeasibleError: no candidate fits (the message names the closest layout
            and by how much it misses, in GiB and %).
    """
    check_precision(spec, gpu)
    shape = spec_shape(spec)
    job = memory_job(spec, shape)
    topo = topo or default_topology(gpu, count)
    explicit = isinstance(spec.parallelism, ParallelismSpec)
    if explicit:
        groups: Sequence[Sequence[Strategy]] = [
            candidate_strategies(spec, count, shape, topo.gpus_per_node)
        ]
    else:
        groups = layout_groups(search_space(spec, shape, count, topo.gpus_per_node))
    where = OnGpu(gpu, capacity, margin, spec.image_size, topo.intra_node, topo.gpus_per_node)
    cache: dict[Strategy, MemoryCheck] = {}

    def check_of(st: Strategy) -> MemoryCheck:
        mem = cache.get(st)
        if mem is None:
            mem = where.check(shape, job, st)
            # the verdict `fits` asks the upper bound of the layout's job class to fit too
            cls = strategy_class(spec, st, count, topo.gpus_per_node)
            mem = dataclasses.replace(mem, sure=memory_verdict(cls, mem) == "fits")
            cache[st] = mem
        return mem

    def memory_of(st: Strategy) -> MemoryEstimate:
        return where.estimate(shape, job, st)

    def time_of(st: Strategy) -> TimeEstimate:
        return estimate_time(shape, job, st, gpu, topo, work=spec.work, image_size=spec.image_size)

    best, closest = search(
        groups,
        check_of,
        time_of,
        count=count,
        require_fit=require_fit or not explicit,
        prefer_sure=prefer_sure,
    )
    if best is None and not require_fit and closest is not None:
        st = closest[1]
        best = (0.0, 0, st, time_of(st))
    if best is None:
        detail = (
            f"{closest[1].label()} {describe_miss(memory_of(closest[1]))}"
            if closest
            else "no layout"
        )
        raise InfeasibleError(
            f"{spec.model} does not fit on {count} x {gpu.id} with any strategy tried; closest: {detail}",
            closest=[detail],
            hint=refusal_hint(spec, closest[1] if closest else None),
        )
    _, _, st, t = best
    mem = memory_of(st)
    mmb = max_micro_batch(shape, job, st, where)
    result = FitResult(
        gpu=gpu,
        count=count,
        strategy=st,
        memory=mem,
        max_micro_batch=mmb,
        job_class=strategy_class(spec, st, count, topo.gpus_per_node),
    )
    if with_scaling and count > 1:
        t = dataclasses.replace(
            t, scaling_efficiency=_scaling(spec, gpu, count, topo, t, margin, capacity)
        )
    return Configuration(fit=result, time=t, topology=topo)


def _scaling(
    spec: JobSpec,
    gpu: GpuSpec,
    count: int,
    topo: comm.Topology,
    t: TimeEstimate,
    margin: float,
    capacity: float | None,
) -> float:
    """Per-GPU throughput at ``count`` over that at the smallest power-of-two count that fits."""
    n = 1
    while n < count:
        small = dataclasses.replace(
            topo,
            gpus=n,
            gpus_per_node=min(n, topo.gpus_per_node),
            intra_node=topo.intra_node if n > 1 else "none",
        )
        try:
            base = configure(
                spec, gpu, n, small, margin=margin, capacity=capacity, with_scaling=False
            )
        except GpuPlanError:  # does not fit, or the layout needs more GPUs
            n *= 2
            continue
        per_gpu_base = base.time.samples_per_s / n
        return (t.samples_per_s / count) / per_gpu_base
    return 1.0
