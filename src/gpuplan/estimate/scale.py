"""Scaling tables: throughput and efficiency by GPU count and interconnect."""

from __future__ import annotations

from typing import Any

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import GpuPlanError
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.spec import JobSpec

INTERCONNECTS = (
    ("nvswitch", "infiniband"),
    ("pcie", "infiniband"),
    ("nvswitch", "roce"),
    ("pcie", "ethernet"),
)


def scale_table(
    spec: JobSpec,
    gpu: GpuSpec,
    *,
    max_gpus: int = 64,
    inter_node_gbps: float = 400.0,
    gpus_per_node: int = 8,
) -> list[dict[str, Any]]:
    """One row per (GPU count, interconnect): the fastest fitting configuration's numbers.

    Scaling efficiency compares per-GPU throughput with the smallest count that
    fits on the same interconnect. A count that cannot run (it does not fit, the batch does
    not divide) is a row with its ``error``; a problem with the job itself (an unknown model,
    a precision the GPU lacks), which every row would repeat, is raised instead.

    Raises:
        GpuPlanError: every row failed, with one and the same error.
    """
    counts = []
    n = 1
    while n <= max_gpus:
        counts.append(n)
        n *= 2
    rows: list[dict[str, Any]] = []
    failures: dict[str, GpuPlanError] = {}
    for intra, fabric in INTERCONNECTS:
        if intra == "nvswitch" and not gpu.nvlink_bandwidth_gb_per_s:
            continue
        base_per_gpu: float | None = None
        for count in counts:
            label = f"{intra} + {fabric} {inter_node_gbps:g}G" if count > gpus_per_node else intra
            if count == 1:
                label = "single GPU"
            topo = default_topology(
                gpu,
                count,
                gpus_per_node=min(count, gpus_per_node),
                intra_node=intra if count > 1 else "none",
                inter_node_gbps=inter_node_gbps,
                fabric=fabric,
            )
            try:
                conf = configure(spec, gpu, count, topo, with_scaling=False)
            except GpuPlanError as exc:
                failures.setdefault(exc.one_line(), exc)
                rows.append({"gpus": count, "interconnect": label, "error": exc.one_line()})
                continue
            t = conf.time
            per_gpu = t.samples_per_s / count
            base_per_gpu = base_per_gpu or per_gpu
            rows.append(
                {
                    "gpus": count,
                    "interconnect": label,
                    "samples_per_s": t.samples_per_s,
                    "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
                    "mfu": t.mfu,
                    "scaling_efficiency": per_gpu / base_per_gpu,
                    "comm_fraction": t.comm_fraction,
                    "step_time_s": t.step_time_s,
                    "strategy": conf.strategy.label(),
                }
            )
    if rows and len(failures) == 1 and all("error" in r for r in rows):
        raise next(iter(failures.values()))
    return rows
