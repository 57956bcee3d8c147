"""GCP: anycloud-sh/catalog ``gcp/vms.csv`` (SkyPilot fetch_gcp.py format).

GCP prices a GPU VM as two catalog rows: the host machine type (no
accelerator columns) and the accelerator (empty InstanceType). The instance
price is their sum in the same zone (skypilot-catalog issue #31); this is the
only arithmetic the producer does on prices.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from offering_sources.common import (
    ANYCLOUD,
    ANYCLOUD_AS_OF,
    RegionPrices,
    Row,
    fmt,
    intra_for,
    money,
    num,
    offering,
    read_csv,
)

SOURCE = f"{ANYCLOUD}/gcp/vms.csv"
BUNDLED: dict[str, tuple[str, int, str]] = {
    # machine type: (catalog AcceleratorName, count, GPU id); per SkyPilot's
    # _ACC_INSTANCE_TYPE_DICTS in sky/catalog/gcp_catalog.py.
    **{f"a2-highgpu-{n}g": ("A100", n, "A100-40GB") for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("A100", 16, "A100-40GB"),
    **{f"a2-ultragpu-{n}g": ("A100-80GB", n, "A100-80GB") for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("H100", n, "H100-SXM") for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("H100-MEGA", 8, "H100-SXM"),
    "a3-ultragpu-8g": ("H200", 8, "H200"),
    "a4-highgpu-8g": ("B200", 8, "B200"),
    **{f"g2-standard-{v}": ("L4", 1, "L4") for v in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("L4", 2, "L4"),
    "g2-standard-48": ("L4", 4, "L4"),
    "g2-standard-96": ("L4", 8, "L4"),
}
NETWORK = {
    # Gbps and fabric, from cloud_offerings.csv / cloud_billing.md §5 (GCP GPU docs).
    "a2-highgpu-8g": (100, "ethernet", ""),
    "a2-megagpu-16g": (100, "ethernet", ""),
    "a2-ultragpu-8g": (100, "ethernet", ""),
    "g2-standard-96": (100, "ethernet", ""),
    "a3-highgpu-8g": (1000, "ethernet", "GPU networking ~1,000 Gbps via GPUDirect-TCPX."),
    "a3-megagpu-8g": (1800, "ethernet", "GPU networking ~1,800 Gbps via GPUDirect-TCPXO."),
    "a3-ultragpu-8g": (3200, "roce", "3,200 Gbps RoCE (8x ConnectX-7) plus 400 Gbps gVNIC."),
}
ATTACHABLE = {
    "T4": ("T4", "pcie", {1: 4, 2: 8, 4: 48}),
    "V100": ("V100-16GB", "nvlink", {1: 8, 2: 16, 4: 32, 8: 64}),
}
"""Attachable GPU -> (GPU id, link, GPU count -> host vCPUs), SkyPilot's _NUM_ACC_TO_NUM_CPU."""
N1 = ("n1-standard-", "n1-highmem-", "n1-highcpu-")
JOIN_NOTE = (
    "Price = host VM row + accelerator row in the same zone (GCP bills them "
    "separately; skypilot-catalog issue #31)."
)
CATALOG_NOTE = (
    "Catalog: anycloud-sh/catalog (third-party, SkyPilot fetch_gcp.py format) of 2026-05-20."
)

Vm = dict[tuple[str, str], dict[str, str]]
Acc = dict[tuple[str, float, str], dict[str, str]]


def build(ref: Path) -> list[Row]:
    """GCP offerings: A2/A3/A4/G2 machine types, then T4/V100 attached to N1 hosts."""
    vm: Vm = {}
    acc: Acc = {}
    for r in read_csv(ref / "skypilot-catalog" / "anycloud" / "gcp" / "vms.csv"):
        if r["InstanceType"]:
            vm[(r["InstanceType"], r["AvailabilityZone"])] = r
        elif r["AcceleratorName"]:
            acc[(r["AcceleratorName"], float(r["AcceleratorCount"]), r["AvailabilityZone"])] = r
    out = [row for it in sorted(BUNDLED) if (row := _bundled(it, vm, acc)) is not None]
    for name in sorted(ATTACHABLE):
        for count in sorted(ATTACHABLE[name][2]):
            row = _attached(name, count, vm, acc)
            if row is not None:
                out.append(row)
    return out


def _sum(a: str, b: str) -> float | None:
    x, y = num(a), num(b)
    return money(x + y) if x is not None and y is not None else None


def _bundled(it: str, vm: Vm, acc: Acc) -> Row | None:
    acc_name, count, gpu = BUNDLED[it]
    rp = RegionPrices()
    hosts = [v for (t, _z), v in vm.items() if t == it]
    if not hosts:
        return None
    host_zero = False
    for v in hosts:
        a = acc.get((acc_name, float(count), v["AvailabilityZone"]))
        if a is None:
            continue
        if num(v["Price"]) is None:
            host_zero = True
            continue
        rp.add(v["Region"], _sum(v["Price"], a["Price"]), _sum(v["SpotPrice"], a["SpotPrice"]))
    regions, prices, notes = rp.choose()
    if host_zero and not prices:
        gpu_only = sorted(
            {
                p
                for (n, c, _z), a in acc.items()
                if n == acc_name and c == count and (p := num(a["Price"]))
            }
        )
        regions = sorted({v["Region"] for v in hosts})
        notes = [
            "No price: the catalog lists the host VM at $0/h and the accelerator row alone "
            f"at {fmt(gpu_only[0])}-{fmt(gpu_only[-1])} USD/h; whether the host is really "
            "free was not verified, so no total is given."
        ]
    gbps, fabric, net_note = NETWORK.get(it, (None, None, ""))
    return offering(
        source_kind="catalog",
        provider="gcp",
        instance_type=it,
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        vcpus=num(hosts[0]["vCPUs"]),
        ram_gb=num(hosts[0]["MemoryGiB"]),
        intra_node=intra_for(count, "pcie" if gpu == "L4" else "sxm"),
        inter_node_gbps=gbps,
        fabric=fabric,
        prices=prices,
        source=SOURCE,
        as_of=ANYCLOUD_AS_OF,
        notes=[*notes, net_note, JOIN_NOTE if prices else "", CATALOG_NOTE],
    )


def _host_for(zone: str, cpus: int, vm: Vm) -> dict[str, str] | None:
    """SkyPilot's host for an attachable GPU: cheapest N1 VM with >= cpus and >= 4*cpus GiB."""
    hosts = [
        v
        for (t, z), v in vm.items()
        if z == zone
        and t.startswith(N1)
        and (num(v["vCPUs"]) or 0) >= cpus
        and (num(v["MemoryGiB"]) or 0) >= 4 * cpus
        and num(v["Price"]) is not None
    ]
    return min(hosts, key=lambda v: (float(v["Price"]), v["InstanceType"])) if hosts else None


def _attached(name: str, count: int, vm: Vm, acc: Acc) -> Row | None:
    gpu, link, cpus_by_count = ATTACHABLE[name]
    cpus = cpus_by_count[count]
    pairs = []
    for (n, c, zone), a in acc.items():
        if n == name and c == count and (host := _host_for(zone, cpus, vm)) is not None:
            pairs.append((host, a))
    if not pairs:
        return None
    host_type = Counter(h["InstanceType"] for h, _a in pairs).most_common(1)[0][0]
    pairs = [(h, a) for h, a in pairs if h["InstanceType"] == host_type]
    rp = RegionPrices()
    for h, a in pairs:
        rp.add(h["Region"], _sum(h["Price"], a["Price"]), _sum(h["SpotPrice"], a["SpotPrice"]))
    regions, prices, notes = rp.choose()
    return offering(
        source_kind="catalog",
        provider="gcp",
        instance_type=f"{host_type}+{name}:{count}",
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        vcpus=num(pairs[0][0]["vCPUs"]),
        ram_gb=num(pairs[0][0]["MemoryGiB"]),
        intra_node=intra_for(count, link),
        prices=prices,
        source=SOURCE,
        as_of=ANYCLOUD_AS_OF,
        notes=[
            f"Attachable {name} on an N1 host; the host is the cheapest N1 VM with >= {cpus} "
            f"vCPU and >= {4 * cpus} GiB, SkyPilot's rule (sky/catalog/gcp_catalog.py). Launch "
            f"as machine type {host_type} with {count} accelerator(s).",
            *notes,
            JOIN_NOTE,
            CATALOG_NOTE,
        ],
    )
