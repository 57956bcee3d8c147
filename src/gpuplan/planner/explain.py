"""Why an option wins, and the mismatches worth a warning."""

from __future__ import annotations

from collections.abc import Sequence

from gpuplan.planner.model import Option
from gpuplan.spec import JobSpec
from gpuplan.units import format_duration

HIGH_END = ("H100-SXM", "H100-PCIE", "H100-NVL", "H200", "B200", "GB200", "MI300X", "MI325X")


def explain(o: Option, *, cheapest: Option, fastest: Option, spec: JobSpec) -> str:
    """One sentence: fit, cost and speed against the cheapest and the fastest, deadline."""
    conf = o.configuration
    head = conf.fit.memory.headroom_bytes / 2**30
    parts = [
        f"{o.gpu} x{o.gpus}: fits with {spec.method} ({conf.strategy.label()}, {head:.0f} GiB headroom)"
    ]
    if o is not fastest and fastest.cost_total > 0:
        ratio = fastest.cost_total / o.cost_total if o.cost_total else float("inf")
        slower = o.time_s / fastest.time_s - 1
        if ratio >= 1.05:
            parts.append(
                f"{ratio:.1f}x cheaper than the fastest ({fastest.gpu} x{fastest.gpus}, "
                f"{fastest.billing_mode}), {slower:.0%} slower"
            )
        else:
            parts.append(f"{slower:.0%} slower than the fastest ({fastest.gpu} x{fastest.gpus})")
    elif o is fastest:
        parts.append("the fastest option")
    if o is cheapest:
        parts.append("the cheapest option")
    elif cheapest.cost_total > 0:
        parts.append(f"{o.cost_total / cheapest.cost_total:.1f}x the cost of the cheapest")
    deadline = spec.constraints.deadline
    if deadline is not None:
        parts.append(
            f"meets the {format_duration(deadline)} deadline ({format_duration(o.time_s)})"
        )
    if o.billing_mode == "spot":
        parts.append("interruptible: checkpoint overhead included")
    return "; ".join(parts)


def warnings_for(o: Option, feasible: Sequence[Option], cheapest: Option) -> tuple[str, ...]:
    """Mismatches the seed article names: oversized GPU, PCIe multi-GPU, vGPU for multi-GPU."""
    out = []
    if (
        o.gpu in HIGH_END
        and cheapest.gpu not in HIGH_END
        and cheapest.cost_total <= o.cost_total / 2
    ):
        out.append(
            f"{o.gpu} for a job {cheapest.gpu} does at {cheapest.cost_total / o.cost_total:.0%} of the cost"
        )
    t = o.configuration.time
    topo = o.configuration.topology
    if topo.intra_node == "pcie" and o.gpus > 1 and t.comm_fraction > 0.15:
        nvl = [
            f
            for f in feasible
            if f.configuration.topology.intra_node in ("nvswitch", "nvlink")
            and f.gpus == o.gpus
            and f.cost_total <= o.cost_total
        ]
        tail = f"; an NVLink option with {o.gpus} GPUs costs less" if nvl else ""
        out.append(
            f"{o.instance_type}: PCIe multi-GPU spends {t.comm_fraction:.0%} of each step in "
            f"communication{tail}"
        )
    if topo.hosting == "vgpu-slice" and o.gpus > 1:
        out.append(
            f"{o.instance_type}: vGPU slices for multi-GPU training (no peer-to-peer, shared compute)"
        )
    if o.price_as_of == "unknown":
        out.append(
            f"{o.provider} {o.instance_type}: price age unknown (imported without a date; "
            "re-import with --as-of DATE)"
        )
    return tuple(out)
