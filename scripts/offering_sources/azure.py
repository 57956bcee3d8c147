"""Azure: anycloud-sh/catalog ``azure/vms.csv`` prices, Microsoft docs for shapes.

Which GPU each size carries, and its interconnect, come from the Microsoft
size docs (MicrosoftDocs/azure-docs ``articles/virtual-machines/sizes/
gpu-accelerated``) and ``cloud_offerings.csv``. Notably NC H100 v5 carries the
H100 **NVL** (94 GB, PCIe), not the SXM part.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from offering_sources.common import (
    ANYCLOUD,
    ANYCLOUD_AS_OF,
    GIB,
    SKIPPED,
    RegionPrices,
    Row,
    intra_for,
    num,
    offering,
    read_csv,
)

SOURCE = f"{ANYCLOUD}/azure/vms.csv"
DOC = "https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated"
NC_A100 = "nca100v4-series"
NC_H100 = "ncadsh100v5-series"
NV_A10 = "nvadsa10v5-series"
T4 = "ncast4v3-series"
SIZES: dict[str, tuple[str, float, str, float | None, str | None, str, str]] = {
    # size: (GPU id, count, link, network Gbps, fabric, doc page, note)
    "Standard_NC4as_T4_v3": ("T4", 1, "pcie", None, None, T4, ""),
    "Standard_NC8as_T4_v3": ("T4", 1, "pcie", None, None, T4, ""),
    "Standard_NC16as_T4_v3": ("T4", 1, "pcie", None, None, T4, ""),
    "Standard_NC64as_T4_v3": ("T4", 4, "pcie", None, None, T4, ""),
    "Standard_NC24ads_A100_v4": ("A100-80GB-PCIE", 1, "pcie", 20, "ethernet", NC_A100, ""),
    "Standard_NC48ads_A100_v4": ("A100-80GB-PCIE", 2, "pcie", 40, "ethernet", NC_A100, ""),
    "Standard_NC96ads_A100_v4": ("A100-80GB-PCIE", 4, "pcie", 80, "ethernet", NC_A100, ""),
    "Standard_NC40ads_H100_v5": (
        "H100-NVL",
        1,
        "pcie",
        40,
        "ethernet",
        NC_H100,
        "Microsoft doc: NVIDIA H100 NVL, 94 GB, PCIe.",
    ),
    "Standard_NC80adis_H100_v5": (
        "H100-NVL",
        2,
        "pcie",
        80,
        "ethernet",
        NC_H100,
        "Microsoft doc: NVIDIA H100 NVL, 94 GB, PCIe; an NVLink "
        "bridge between the pair is not stated, so pcie is assumed.",
    ),
    "Standard_ND40rs_v2": (
        "V100-32GB",
        8,
        "nvlink",
        100,
        "infiniband",
        "ndv2-series",
        "Microsoft doc: 8 NVLink-connected V100 32 GB; 100 Gb/s InfiniBand EDR.",
    ),
    "Standard_ND96asr_v4": (
        "A100-40GB",
        8,
        "sxm",
        1600,
        "infiniband",
        "nda100v4-series",
        "200 Gb/s HDR InfiniBand per GPU.",
    ),
    "Standard_ND96amsr_A100_v4": (
        "A100-80GB",
        8,
        "sxm",
        1600,
        "infiniband",
        "ndma100v4-series",
        "200 Gb/s HDR InfiniBand per GPU.",
    ),
    "Standard_ND96isr_H100_v5": (
        "H100-SXM",
        8,
        "sxm",
        3200,
        "infiniband",
        "ndh100v5-series",
        "400 Gb/s ConnectX-7 InfiniBand per GPU.",
    ),
    "Standard_ND96isr_H200_v5": (
        "H200",
        8,
        "sxm",
        None,
        "infiniband",
        "ndh200v5-series",
        "InfiniBand bandwidth not captured.",
    ),
    "Standard_ND96isr_MI300X_v5": (
        "MI300X",
        8,
        "if",
        3200,
        "infiniband",
        "ndmi300xv5-series",
        "Microsoft doc: Infinity Fabric 128 GB/s per GPU link; 400 "
        "Gb/s Quantum-2 InfiniBand per GPU.",
    ),
    "Standard_NV6ads_A10_v5": ("A10", 1 / 6, "pcie", 5, "ethernet", NV_A10, ""),
    "Standard_NV12ads_A10_v5": ("A10", 1 / 3, "pcie", 10, "ethernet", NV_A10, ""),
    "Standard_NV18ads_A10_v5": ("A10", 0.5, "pcie", 20, "ethernet", NV_A10, ""),
    "Standard_NV36ads_A10_v5": ("A10", 1, "pcie", 40, "ethernet", NV_A10, ""),
    "Standard_NV36adms_A10_v5": ("A10", 1, "pcie", 80, "ethernet", NV_A10, ""),
    "Standard_NV72ads_A10_v5": ("A10", 2, "pcie", 80, "ethernet", NV_A10, ""),
}
SLICE_GIB = {
    "Standard_NV6ads_A10_v5": 4,
    "Standard_NV12ads_A10_v5": 8,
    "Standard_NV18ads_A10_v5": 12,
}
"""Frame buffer of partial-A10 sizes ("1/6th of a GPU with 4-GiB frame buffer")."""
NCV3 = "NCv3 (V100) retired by Microsoft on 2025-09-30"
NC_A10_V4 = "NCads A10 v4: only 3 regions in the catalog and no Microsoft doc read"
LEFT_OUT = {
    "Standard_NC6s_v3": NCV3,
    "Standard_NC12s_v3": NCV3,
    "Standard_NC24s_v3": NCV3,
    "Standard_NC24rs_v3": NCV3,
    "Standard_NCC40ads_H100_v5": "confidential-computing H100 size; GPU variant not confirmed",
    "Standard_NC8ads_A10_v4": NC_A10_V4,
    "Standard_NC16ads_A10_v4": NC_A10_V4,
    "Standard_NC32ads_A10_v4": NC_A10_V4,
}


def build(ref: Path) -> list[Row]:
    """Azure offerings for the GPU sizes in :data:`SIZES`."""
    by_size: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in read_csv(ref / "skypilot-catalog" / "anycloud" / "azure" / "vms.csv"):
        if r["InstanceType"] in SIZES:
            by_size[r["InstanceType"]].append(r)
        elif r["AcceleratorName"]:
            why = LEFT_OUT.get(
                r["InstanceType"], f"accelerator {r['AcceleratorName']} has no GPU id"
            )
            SKIPPED.add(("azure", r["InstanceType"], why))
    return [_offering(size, rows) for size, rows in sorted(by_size.items())]


def _offering(size: str, rows: list[dict[str, str]]) -> Row:
    gpu, count, link, gbps, fabric, doc, note = SIZES[size]
    count = round(count, 4)
    rp = RegionPrices()
    for r in rows:
        rp.add(r["Region"], num(r["Price"]), num(r["SpotPrice"]))
    regions, prices, notes = rp.choose()
    slice_gib = SLICE_GIB.get(size)
    is_nv = size.startswith("Standard_NV")
    if slice_gib:
        vgpu_note = (
            f"Fractional A10 via vGPU ({slice_gib} GiB frame buffer); GRID licence "
            "included; not for multi-GPU NCCL training."
        )
    else:
        vgpu_note = "Full A10 via vGPU; GRID licence included." if is_nv else ""
    return offering(
        source_kind="catalog",
        provider="azure",
        instance_type=size,
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        gpu_memory_bytes=slice_gib * GIB if slice_gib else None,
        vcpus=num(rows[0]["vCPUs"]),
        ram_gb=num(rows[0]["MemoryGiB"]),
        intra_node="none" if count < 1 else intra_for(count, link),
        inter_node_gbps=gbps,
        fabric=fabric,
        hosting="vgpu-slice" if is_nv else "virtualized",
        prices=prices,
        source=SOURCE,
        as_of=ANYCLOUD_AS_OF,
        notes=[
            note,
            vgpu_note,
            *notes,
            f"Shape per {DOC}/{doc}.",
            "Prices: anycloud-sh/catalog (third-party, SkyPilot fetch_azure.py format) of "
            "2026-05-20, Linux pay-as-you-go.",
        ],
    )
