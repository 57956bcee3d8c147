"""Choose the fastest strategy that fits, for a spec on N GPUs of one type and topology.

With ``parallelism: auto`` the search covers sharding stage, tensor and
pipeline degrees, micro-batch size and activation checkpointing; with an
explicit parallelism only the micro-batch and checkpointing given are used.
Every candidate is checked for memory first; the fastest that fits wins.
"""

from __future__ import annotations

import dataclasses

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError, InfeasibleError
from gpuplan.estimate import comm
from gpuplan.estimate.bounds import bounds_for
from gpuplan.estimate.fit import (
    FitResult,
    candidate_strategies,
    check_precision,
    max_micro_batch,
    memory_job,
    model_shape,
    strategy_class,
)
from gpuplan.estimate.memory import DEFAULT_SAFETY_MARGIN, MemoryEstimate, estimate_memory
from gpuplan.estimate.speed import TimeEstimate, estimate_time
from gpuplan.estimate.strategy import Strategy, grad_accum_for
from gpuplan.spec import JobSpec, ParallelismSpec

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


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
    if intra_node is None:
        if gpn <= 1:
            intra_node = "none"
        elif gpu.form_factor in ("sxm", "superchip"):
            intra_node = "nvswitch"
        elif gpu.form_factor == "oam":
            intra_node = "infinity-fabric"
        else:
            intra_node = "pcie"
    return comm.Topology(
        gpus=count,
        gpus_per_node=gpn,
        intra_node=intra_node,
        inter_node_gbps=inter_node_gbps,
        fabric=fabric,
        hosting=hosting,
    )


def _candidates(spec: JobSpec, count: int, gpus_per_node: int) -> list[Strategy]:
    shape = model_shape(spec.model)
    base = candidate_strategies(spec, count, shape, gpus_per_node)
    if isinstance(spec.parallelism, ParallelismSpec):
        return base
    ckpts = (
        ["none", "full"]
        if spec.activation_checkpointing == "none"
        else [spec.activation_checkpointing]
    )
    if spec.activation_checkpointing in ("selective", "selective-op"):
        ckpts = [spec.activation_checkpointing, "full"]
    out: list[Strategy] = []
    layouts = {(s.sharding, s.tp, s.pp, s.dp) for s in base}
    for sharding, tp, pp, dp in sorted(layouts):
        for mb in sorted(set(MICRO_BATCHES) | {spec.micro_batch_size}):
            ga = grad_accum_for(spec.global_batch_size, mb, dp)
            if ga is None:
                continue
            for ckpt in ckpts:
                out.append(
                    Strategy(
                        sharding=sharding,
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        micro_batch_size=mb,
                        grad_accum=ga,
                        activation_checkpointing=ckpt,
                        offload=spec.offload,
                    )
                )
    return out


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
) -> Configuration:
    """The fastest configuration of ``spec`` on ``count`` x ``gpu`` that fits in memory.

    ``require_fit=False`` is for timing a layout known to have run (validation
    rows): candidates are timed even where our memory model says they do not fit.

    Raises:
        InfeasibleError: no candidate fits (the message says the closest).
    """
    check_precision(spec, gpu)
    shape = model_shape(spec.model)
    job = memory_job(spec, shape)
    topo = topo or default_topology(gpu, count)
    best: tuple[float, Strategy, MemoryEstimate, TimeEstimate] | None = None
    closest: tuple[float, str] | None = None
    groups: dict[tuple[str, int, int, int, str], list[Strategy]] = {}
    for cand in _candidates(spec, count, topo.gpus_per_node):
        key = (cand.sharding, cand.tp, cand.pp, cand.dp, cand.activation_checkpointing)
        groups.setdefault(key, []).append(cand)

    def memory_of(st: Strategy) -> MemoryEstimate:
        return estimate_memory(
            shape,
            job,
            st,
            gpu,
            capacity_bytes=capacity,
            safety_margin=margin,
            image_size=spec.image_size,
        )

    # pipeline stages cost a bubble: consider them only when no layout without them fits
    flat = [g for k, g in groups.items() if k[2] == 1]
    staged = [g for k, g in groups.items() if k[2] > 1]
    for members in flat + staged:
        if members[0].pp > 1 and best is not None:
            break
        ordered = sorted(members, key=lambda c: c.micro_batch_size)
        # memory grows with the micro-batch: binary-search the largest that fits
        lo, hi = 0, len(ordered) - 1
        fitting = -1
        mems: dict[int, MemoryEstimate] = {}
        while lo <= hi and require_fit:
            mid = (lo + hi) // 2
            mems[mid] = memory_of(ordered[mid])
            if mems[mid].fits:
                fitting, lo = mid, mid + 1
            else:
                hi = mid - 1
        if not require_fit:
            fitting = len(ordered) - 1
        if fitting < 0:
            mem = mems.get(0) or memory_of(ordered[0])
            over = mem.device_used_bytes / (mem.capacity_bytes * (1 - margin))
            if closest is None or over < closest[0]:
                closest = (
                    over,
                    f"{ordered[0].label()} needs {mem.device_used_bytes / 2**30:.1f} GiB per GPU",
                )
            continue
        # the largest fitting micro-batch; with pipelining also the next smaller one, since
        # fewer, larger micro-batches enlarge the bubble
        for idx in (fitting, fitting - 1) if ordered[0].pp > 1 else (fitting,):
            if idx < 0:
                continue
            st = ordered[idx]
            mem = mems.get(idx) or memory_of(st)
            t = estimate_time(shape, job, st, gpu, topo, work=spec.work, image_size=spec.image_size)
            score = t.step_time_s / (st.micro_batch_size * st.grad_accum * st.dp)
            if best is None or score < best[0]:
                best = (score, st, mem, t)
    if best is None:
        detail = closest[1] if closest else "no layout"
        raise InfeasibleError(
            f"{spec.model} does not fit on {count} x {gpu.id} with any strategy tried; closest: {detail}",
            closest=[detail],
            hint="use more GPUs, a larger GPU, lora/qlora, or activation checkpointing",
        )
    _, st, mem, t = best
    mmb = max_micro_batch(
        shape, job, st, gpu, capacity=capacity, margin=margin, image_size=spec.image_size
    )
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
