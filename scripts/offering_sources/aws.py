"""AWS: prices from ``cloud/prices_aws.csv``, shapes from ``cloud/cloud_offerings.csv``.

``prices_aws.csv`` holds skypilot-catalog v8 ``aws/vms.csv`` rows (commit
00148f2, us-east-1 and us-west-2) plus a cross-check snapshot from
anycloud-sh/catalog (2026-04-02). Shapes add the network and interconnect
from AWS's accelerated-instance doc.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from pathlib import Path

from offering_sources.common import (
    DOC_AS_OF,
    GIB,
    MIB,
    SKIPPED,
    SKY,
    RegionPrices,
    Row,
    first_url,
    grouped,
    hourly,
    intra_for,
    num,
    offering,
    read_csv,
)

SKY_URL = f"{SKY}/00148f2af3672e2229b4f7bf8157d5a3f36e3c35/catalogs/v8/aws/vms.csv"
AS_OF = dt.date(2025, 7, 1)
DATE_NOTE = (
    "skypilot-catalog v8 aws/vms.csv (commit 00148f2) is undated; it already carries the "
    "June 2025 P5 price cut (p5.48xlarge $55.04/h), so as_of is set to 2025-07-01, the "
    "earliest date consistent with its content."
)
CROSS_CHECK_AS_OF = dt.date(2026, 4, 2)

GPU = {
    "T4": "T4",
    "T4g": "T4",
    "A10G": "A10G",
    "L4": "L4",
    "L40S": "L40S",
    "V100": "V100-16GB",
    "V100-32GB": "V100-32GB",
    "A100": "A100-40GB",
    "A100-80GB": "A100-80GB",
    "H100": "H100-SXM",
    "H200": "H200",
    "B200": "B200",
}
"""SkyPilot AcceleratorName -> GPU id (T4g is the T4 sold with Graviton2)."""
SHAPE_GPU = {"NVIDIA L4 (fractional)": "L4", "NVIDIA L40S": "L40S"}
"""GPU names of shape-only rows (not in prices_aws.csv)."""
LINK = {
    "p3": "nvlink",
    "p3dn": "nvlink",
    "p4d": "sxm",
    "p4de": "sxm",
    "p5": "sxm",
    "p5e": "sxm",
    "p5en": "sxm",
    "p6-b200": "sxm",
}
CAPACITY_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
"""Families EC2 Capacity Blocks cover (cloud_billing.md §2)."""
P_FAMILY_COLD_START = (
    "P-family capacity is often constrained; EC2 Capacity Blocks reserve it up to 8 weeks "
    "ahead (cloud_billing.md §2)."
)
CAPACITY_BLOCK = {
    # Third-party figures after the 2026-01-04 rise (cloud_billing.md §2). The
    # official pre-2025 p5/p4d Capacity Block prices are superseded and left out.
    "p5e.48xlarge": (
        39.80,
        "Capacity Block $39.80/h after the 2026-01-04 increase (third-party report).",
    ),
    "p5en.48xlarge": (41.61, "Capacity Block about $41.61/h in 2026 (third-party report)."),
}
CAPACITY_BLOCK_SOURCE = (
    "third-party report cited in cloud_billing.md §2 (official page: "
    "https://aws.amazon.com/ec2/capacityblocks/pricing/)"
)


def build(ref: Path, shapes: dict[tuple[str, str], dict[str, str]]) -> list[Row]:
    """AWS offerings: every priced GPU instance type plus shape-only rows."""
    rows = read_csv(ref / "cloud" / "prices_aws.csv")
    primary: dict[str, list[dict[str, str]]] = defaultdict(list)
    second: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        (primary if "skypilot-catalog" in r["source"] else second)[r["instance_type"]].append(r)
    out = []
    for it in sorted(set(primary) | {it for (p, it) in shapes if p == "AWS"}):
        row = _offering(it, primary.get(it, []), second.get(it, []), shapes.get(("AWS", it), {}))
        if row is not None:
            out.append(row)
    return out


def _accelerator(prs: list[dict[str, str]], shape: dict[str, str]) -> str | None:
    m = re.search(r"AcceleratorName=([\w-]+)", prs[0]["notes"]) if prs else None
    if m:
        return m.group(1)
    return SHAPE_GPU.get(shape.get("gpu_model", ""))


def _offering(
    it: str, prs: list[dict[str, str]], alt: list[dict[str, str]], shape: dict[str, str]
) -> Row | None:
    acc = _accelerator(prs, shape)
    gpu = GPU.get(acc or "")
    if gpu is None:
        SKIPPED.add(("aws", it, f"accelerator {acc} has no GPU id"))
        return None
    family = it.split(".")[0]
    count = float(prs[0]["gpu_count"] if prs else shape["gpu_count"])
    regions, prices, notes = _prices(it, prs, alt)
    memory, mem_notes = _slice_memory(count, prs, shape)
    notes += mem_notes
    net = num(shape.get("inter_node_network_gbps"))
    fabric = None
    if net is not None:
        efa = "EFA" in shape.get("notes", "") or (family in CAPACITY_FAMILIES and count >= 8)
        fabric = "efa" if efa else "ethernet"
    if acc == "T4g":
        notes.append("AWS calls the GPU T4G (T4 paired with Graviton2, arm64); mapped to T4.")
    notes += _doc_notes(shape)
    if prs:
        notes.append(DATE_NOTE)
    else:
        notes += [
            "Shape only: no price was captured for it (it is not among the catalog rows "
            "read into prices_aws.csv).",
            "Shape from an undated AWS doc copy seen in 2026.",
        ]
    first = prs[0] if prs else shape
    return offering(
        source_kind="catalog" if prs else "official",
        provider="aws",
        instance_type=it,
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        gpu_memory_bytes=memory,
        vcpus=num(first.get("vcpus")),
        ram_gb=num(first.get("ram_gb")),
        intra_node="none" if count < 1 else intra_for(count, LINK.get(family, "pcie")),
        inter_node_gbps=net,
        fabric=fabric,
        hosting=(
            "bare-metal" if it.endswith(".metal") else "vgpu-slice" if count < 1 else "virtualized"
        ),
        cold_start=P_FAMILY_COLD_START if family in CAPACITY_FAMILIES else None,
        prices=prices,
        source=SKY_URL if prs else first_url(shape["source"]),
        as_of=AS_OF if prs else DOC_AS_OF,
        notes=notes,
    )


def _prices(
    it: str, prs: list[dict[str, str]], alt: list[dict[str, str]]
) -> tuple[list[str], list[Row], list[str]]:
    rp = RegionPrices()
    for r in prs:
        rp.add(r["region"], num(r["price_on_demand_per_hour"]), num(r["price_spot_per_hour"]))
    regions, prices, choose_notes = rp.choose()
    notes = []
    if rp.spot:
        notes.append("Spot per region is the lowest AZ price (Local Zones excluded).")
    notes += choose_notes
    has_od = any(p["mode"] == "on-demand" for p in prices)
    alt_spot: dict[str, float] = {}
    for r in alt:
        s = num(r["price_spot_per_hour"])
        if s is not None and r["region"] in rp.on_demand:
            alt_spot[r["region"]] = min(s, alt_spot.get(r["region"], s))
    if has_od and alt_spot and not any(p["mode"] == "spot" for p in prices):
        prices += grouped(
            "spot", alt_spot, regions, "USD", source=alt[0]["source"], as_of=CROSS_CHECK_AS_OF
        )
        notes.append(
            "The v8 snapshot has no spot price; spot comes from the anycloud-sh/catalog "
            "AWS snapshot of 2026-04-02."
        )
    if alt:
        notes.append("On-demand price identical in the anycloud-sh/catalog snapshot of 2026-04-02.")
    if it in CAPACITY_BLOCK:
        amount, note = CAPACITY_BLOCK[it]
        prices.append(
            hourly(
                "capacity-block",
                amount,
                "USD",
                as_of=dt.date(2026, 1, 4),
                source=CAPACITY_BLOCK_SOURCE,
            )
        )
        notes.append(note)
    return regions, prices, notes


def _slice_memory(
    count: float, prs: list[dict[str, str]], shape: dict[str, str]
) -> tuple[int | None, list[str]]:
    if count >= 1:
        return None, []
    m = re.search(r"(\d+) MiB GPU memory", prs[0]["notes"]) if prs else None
    if m:
        return int(m.group(1)) * MIB, [
            f"Fractional L4 (vGPU); {m.group(1)} MiB GPU memory per catalog."
        ]
    if shape.get("gpu_memory_gb"):
        return int(float(shape["gpu_memory_gb"]) * GIB), [
            f"Fractional L4 (vGPU profile {shape['gpu_memory_gb']} GiB)."
        ]
    return None, []


def _doc_notes(shape: dict[str, str]) -> list[str]:
    keep = [
        s.strip()
        for s in shape.get("notes", "").split(";")
        if s.strip() and not re.search(r"Capacity Block|OD cut|older OD|third-party", s)
    ]
    return ["Doc: " + "; ".join(keep) + "."] if keep else []
