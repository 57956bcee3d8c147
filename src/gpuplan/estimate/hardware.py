"""The hardware of one ``estimate``: a GPU and count, or a catalog offering and node count."""

from __future__ import annotations

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import SpecError
from gpuplan.estimate.comm import Topology
from gpuplan.estimate.configure import default_topology

_FABRICS = {
    "ib": "infiniband",
    "infiniband": "infiniband",
    "roce": "roce",
    "efa": "efa",
    "ethernet": "ethernet",
}
_INTRA = ("nvswitch", "nvlink", "pcie", "infinity-fabric", "none")


def resolve_hardware(
    cat: Catalog,
    gpu: str | None,
    count: int | None,
    gpus_per_node: int | None,
    intra_node: str | None,
    inter_node_gbps: float | None,
    fabric: str | None,
    offering: str | None,
    nodes: int | None,
) -> tuple[GpuSpec, int, Topology]:
    """(GpuSpec, GPU count, Topology) from either --gpu/--count or --offering/--nodes."""
    given = {
        "--gpu": gpu,
        "--count": count,
        "--gpus-per-node": gpus_per_node,
        "--intra-node": intra_node,
        "--inter-node-gbps": inter_node_gbps,
        "--fabric": fabric,
    }
    clashing = [flag for flag, value in given.items() if value is not None]
    if offering is not None and clashing:
        raise SpecError(
            f"{clashing[0]} and --offering conflict: the offering sets the GPU, node size and "
            "network; give one or the other",
            hint="--offering PROVIDER:INSTANCE --nodes N, or --gpu ID --count N",
        )
    if offering is None and nodes is not None:
        raise SpecError("--nodes: only with --offering (give --count for a GPU count)")
    if inter_node_gbps is not None and inter_node_gbps <= 0:
        raise SpecError(f"--inter-node-gbps: must be > 0, got {inter_node_gbps:g}")
    if fabric is not None and fabric.lower() not in _FABRICS:
        raise SpecError(f"--fabric: unknown {fabric!r}; allowed: ib, roce, efa, ethernet")
    fab = _FABRICS[fabric.lower()] if fabric else None
    if intra_node is not None and intra_node not in _INTRA:
        raise SpecError(f"--intra-node: unknown {intra_node!r}; allowed: {', '.join(_INTRA)}")
    if offering is not None:
        provider, sep, instance = offering.partition(":")
        if not sep:
            raise SpecError(
                f"--offering: expected PROVIDER:INSTANCE, got {offering!r}",
                hint="see `gpuplan catalog offerings`",
            )
        off = cat.offering(provider, instance)
        per_node = int(off.gpu_count) if off.gpu_count >= 1 else 1
        k = nodes or 1
        topo = default_topology(
            cat.gpu(off.gpu),
            per_node * k,
            gpus_per_node=per_node,
            intra_node=off.intra_node,
            inter_node_gbps=off.inter_node_gbps,
            fabric=off.fabric,
            hosting=off.hosting,
        )
        return cat.gpu(off.gpu), per_node * k, topo
    if gpu is None:
        raise SpecError(
            "--gpu: required (or --offering PROVIDER:INSTANCE)", hint="gpuplan catalog gpus"
        )
    spec_gpu = cat.gpu(gpu)
    n = count or 1
    topo = default_topology(
        spec_gpu,
        n,
        gpus_per_node=gpus_per_node,
        intra_node=intra_node,
        inter_node_gbps=inter_node_gbps,
        fabric=fab,
    )
    return spec_gpu, n, topo
