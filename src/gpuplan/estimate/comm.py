"""Communication time: alpha-beta models of NCCL collectives on each interconnect tier.

Bus-bandwidth formulas follow nccl-tests (``doc/PERFORMANCE.md``): an all-reduce
of S bytes over n ranks moves ``2(n-1)/n x S`` per rank, an all-gather or
reduce-scatter ``(n-1)/n x S``. A group inside one node runs at the intra-node
link's achieved bandwidth; a group spanning nodes runs hierarchically
(reduce-scatter inside the node, all-reduce of 1/g of the data across nodes at
the GPU's share of the node's network, all-gather inside the node).
"""

from __future__ import annotations

import dataclasses

from gpuplan.catalog.schema import GpuSpec
from gpuplan.errors import MissingInputError
from gpuplan.estimate.calibration import Efficiencies


def usual_intra_node(gpu: GpuSpec, gpus_per_node: int) -> str:
    """The usual board for a GPU: SXM parts on NVSwitch, OAM parts on Infinity Fabric, PCIe cards
    on PCIe ("none" with one GPU a node)."""
    if gpus_per_node <= 1:
        return "none"
    if gpu.form_factor in ("sxm", "superchip"):
        return "nvswitch"
    return "infinity-fabric" if gpu.form_factor == "oam" else "pcie"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Where the GPUs are: per-node count, links inside and between nodes."""

    gpus: int
    gpus_per_node: int
    intra_node: str
    inter_node_gbps: float | None
    fabric: str | None
    hosting: str = "virtualized"
    gpudirect: bool = True
    compute_fraction: float = 1.0
    """Share of each GPU's compute the instance gets (< 1 for a vGPU / fractional slice)."""

    @property
    def nodes(self) -> int:
        """Nodes used (the last one may be partly used)."""
        return -(-self.gpus // self.gpus_per_node)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """Achieved per-GPU, per-direction bandwidth (bytes/s) and latency (s) of one hop."""

    bandwidth: float
    latency: float
    name: str


def intra_link(gpu: GpuSpec, topo: Topology, eff: Efficiencies) -> Link:
    """The link GPUs of one node talk over.

    ``nvlink`` without a switch means two things. PCIe cards are joined by NVLink bridges,
    two at a time, so a ring over more than two crosses PCIe. SXM GPUs take their NVLinks
    through the baseboard: an HGX A100 or H100 4-GPU board joins every pair directly
    (NVIDIA, "Introducing NVIDIA HGX A100", HGX A100 4-GPU "connected with NVLink"), and the
    V100 SXM2 8-GPU board's hybrid cube-mesh carries NCCL's rings on NVLink alone; their
    collectives run at the NVLink bandwidth.
    """
    pcie_gen = gpu.pcie_generation or 5
    pcie = eff.pcie_gb_per_s.get(pcie_gen, 31.5) * 1e9
    kind = topo.intra_node
    if kind in ("nvswitch", "nvlink", "infinity-fabric") and gpu.nvlink_bandwidth_gb_per_s:
        le = eff.links[kind]
        bw = gpu.nvlink_bandwidth_gb_per_s / 2 * 1e9 * le.efficiency
        if kind == "nvlink" and topo.gpus_per_node > 2 and gpu.form_factor == "pcie":
            # bridges join pairs; a ring over more GPUs also crosses PCIe
            p = eff.links["pcie"]
            return Link(
                bandwidth=min(bw, pcie * p.efficiency),
                latency=p.latency_s,
                name="nvlink pairs + pcie",
            )
        return Link(bandwidth=bw, latency=le.latency_s, name=kind)
    # no peer-to-peer (the driver gives the GPU none, or a vGPU slice): NCCL goes through host
    # memory
    p2p = topo.gpudirect and gpu.pcie_p2p and topo.hosting != "vgpu-slice"
    key = "pcie" if p2p else "pcie-no-p2p"
    le = eff.links[key]
    return Link(bandwidth=pcie * le.efficiency, latency=le.latency_s, name=key)


def inter_link(topo: Topology, eff: Efficiencies) -> Link | None:
    """Each GPU's share of its node's network, or None on one node."""
    if topo.nodes <= 1:
        return None
    fabric = topo.fabric or "ethernet"
    le = eff.links.get(fabric, eff.links["ethernet"])
    gbps = topo.inter_node_gbps or 0.0
    if gbps <= 0:
        raise MissingInputError(
            f"--inter-node-gbps: {topo.gpus} GPUs span {topo.nodes} nodes but the network bandwidth "
            "per node is unknown",
            hint="pass --inter-node-gbps 400 --fabric ib (or pick an offering whose network is known)",
        )
    factor = le.efficiency if topo.gpudirect else le.efficiency * 0.6
    return Link(
        bandwidth=gbps * 1e9 / 8 / topo.gpus_per_node * factor, latency=le.latency_s, name=fabric
    )


def _ring(kind: str, nbytes: float, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency
    return (n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency


def collective_time(
    kind: str, nbytes: float, group: int, per_node: int, intra: Link, inter: Link | None
) -> float:
    """Seconds for one collective of ``nbytes`` (per rank) over ``group`` ranks.

    ``per_node`` ranks of the group share a node. ``kind`` is all-reduce,
    all-gather or reduce-scatter.
    """
    if group <= 1:
        return 0.0
    per_node = max(1, min(per_node, group))
    nodes = -(-group // per_node)
    if nodes <= 1 or inter is None:
        return _ring(kind, nbytes, group, intra)
    inner = _ring(
        "reduce-scatter" if kind != "all-gather" else "all-gather", nbytes, per_node, intra
    )
    outer = _ring(kind, nbytes / per_node, nodes, inter)
    tail = _ring("all-gather", nbytes, per_node, intra) if kind == "all-reduce" else 0.0
    return inner + outer + tail


def p2p_time(nbytes: float, link: Link) -> float:
    """One point-to-point send."""
    return nbytes / link.bandwidth + link.latency


def all_to_all_time(
    nbytes: float, group: int, per_node: int, intra: Link, inter: Link | None
) -> float:
    """One all-to-all in which each of ``group`` ranks holds ``nbytes`` spread evenly over the
    group (a mixture of experts' token dispatch or combine): it keeps 1/group and sends the
    rest, the part bound for ranks of its own node over the intra-node link and the rest over
    its share of the node's network, both at once (NCCL's send/recv pairs)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    local = max(1, min(per_node, group))
    if local >= group or inter is None:
        return (group - 1) / group * nbytes / intra.bandwidth + (group - 1) * intra.latency
    inside = (local - 1) / group * nbytes / intra.bandwidth
    outside = (group - local) / group * nbytes / inter.bandwidth
    return max(inside, outside) + (group - 1) * inter.latency
