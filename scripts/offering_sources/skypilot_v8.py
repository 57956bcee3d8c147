"""Small skypilot-catalog v8 files: Nebius, Vast.ai, Verda and Hyperstack.

Each file is a SkyPilot ``vms.csv`` copied byte-for-byte at the commit in
:data:`COMMITS`. GPU names are not normalised across clouds (``A100-80G-PCIe``,
``Tesla-V100``, ``H100_SXM`` in an instance name), so each provider has its own
mapper; a row whose GPU has no unambiguous id is left out and reported.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from offering_sources.common import (
    SKIPPED,
    SKY,
    RegionPrices,
    Row,
    intra_for,
    num,
    offering,
    read_csv,
)

COMMITS = {
    "nebius": "0082b0435f3912ae4c566856b272455cc78f4f61",
    "vast": "680a69b15e686d34fd0c808ddc62c10df27bb46d",
    "verda": "538675a09162988c70e6f07f8302e7d986749ff8",
    "hyperstack": "fdc9d908ab0b2af9f468f139fb3f662c8c6b3257",
}
AS_OF = dt.date(2026, 1, 1)
DATE_NOTE = (
    "skypilot-catalog v8 file read from a public-code index that does not expose commit dates; "
    "its README calls it a 2026 snapshot, so as_of is set to 2026-01-01 (the earliest date that "
    "description allows)."
)
Mapped = tuple[str, str] | None
"""(GPU id, link) or None."""


def nebius(r: dict[str, str]) -> Mapped:
    """Nebius names the form factor in the instance type (``gpu-h100-sxm_...``)."""
    for prefix, gpu, link in (
        ("gpu-h100-sxm", "H100-SXM", "sxm"),
        ("gpu-h200-sxm", "H200", "sxm"),
        ("gpu-b200-sxm", "B200", "sxm"),
        ("gpu-l40s", "L40S", "pcie"),
    ):
        if r["InstanceType"].startswith(prefix):
            return gpu, link
    return None


def vast(r: dict[str, str]) -> Mapped:
    """Vast names the GPU in the offer (``8x-H100_SXM-32-65536``); memory splits A100s."""
    name = r["InstanceType"].split("-", 1)[1].rsplit("-", 2)[0]
    mem = re.search(r"'SizeInMiB': (\d+)", r["GpuInfo"])
    per_gpu_gib = int(mem.group(1)) / float(r["AcceleratorCount"]) / 1024 if mem else 0
    table: dict[str, tuple[str, str]] = {
        "H100_SXM": ("H100-SXM", "sxm"),
        "H100_NVL": ("H100-NVL", "pcie"),
        "H200": ("H200", "sxm"),
        "B200": ("B200", "sxm"),
        "L40S": ("L40S", "pcie"),
        "RTX_3090": ("RTX-3090", "pcie"),
        "RTX_4090": ("RTX-4090", "pcie"),
        "RTX_A6000": ("RTX-A6000", "pcie"),
        "A100_SXM4": ("A100-80GB" if per_gpu_gib > 60 else "A100-40GB", "sxm"),
    }
    if name == "A100_PCIE":
        return ("A100-80GB-PCIE", "pcie") if per_gpu_gib > 60 else ("A100-40GB-PCIE", "pcie")
    return table.get(name)


def verda(r: dict[str, str]) -> Mapped:
    """Verda's ``S`` suffix (``1H100.80S``) marks SXM; its V100 form factor is unstated."""
    name = r["AcceleratorName"]
    if name.startswith("A100-80GB"):
        return "A100-80GB", "sxm"
    if name.startswith("A100-40GB"):
        return "A100-40GB", "sxm"
    return {
        "H100": ("H100-SXM", "sxm"),
        "H200": ("H200", "sxm"),
        "B200": ("B200", "sxm"),
        "L40S": ("L40S", "pcie"),
        "RTX-A6000": ("RTX-A6000", "pcie"),
    }.get(name)


def hyperstack(r: dict[str, str]) -> Mapped:
    """Hyperstack spells out PCIe, SXM5 and NVLink bridges in the GPU name."""
    return {
        "A100-80G-PCIe": ("A100-80GB-PCIE", "pcie"),
        "A100-80G-PCIe-NVLink": ("A100-80GB-PCIE", "nvlink"),
        "H100-80G-PCIe": ("H100-PCIE", "pcie"),
        "H100-80G-PCIe-NVLink": ("H100-PCIE", "nvlink"),
        "H100-80G-SXM5": ("H100-SXM", "sxm"),
        "RTX-A6000": ("RTX-A6000", "pcie"),
    }.get(r["AcceleratorName"])


PROVIDERS: dict[str, tuple[Callable[[dict[str, str]], Mapped], str]] = {
    "nebius": (nebius, "Nebius AI Cloud list prices."),
    "vast": (
        vast,
        "Vast.ai marketplace offer snapshot: host-set prices, offers come and go; "
        "the catalog's 32 vCPU / 64 GiB figures are SkyPilot's query minimums, not host "
        "specs, so vCPU/RAM are left out. Interruptible (bid) pricing is not in the "
        "catalog. Storage billed while the instance exists; bandwidth at host rates.",
    ),
    "verda": (verda, "Verda (formerly DataCrunch), Finland."),
    "hyperstack": (hyperstack, "Hyperstack list prices."),
}


def build(ref: Path, provider: str) -> list[Row]:
    """Offerings of one small skypilot-catalog v8 provider."""
    mapper, _note = PROVIDERS[provider]
    by_type: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in read_csv(ref / "skypilot-catalog" / provider / "vms.csv"):
        if r["AcceleratorName"] and mapper(r):
            by_type[r["InstanceType"]].append(r)
        elif r["AcceleratorName"]:
            SKIPPED.add(
                (
                    provider,
                    r["InstanceType"],
                    f"accelerator {r['AcceleratorName']} has no (unambiguous) GPU id",
                )
            )
    return [_offering(provider, it, rows) for it, rows in sorted(by_type.items())]


def _offering(provider: str, it: str, rows: list[dict[str, str]]) -> Row:
    mapper, provider_note = PROVIDERS[provider]
    mapped = mapper(rows[0])
    assert mapped is not None
    gpu, link = mapped
    count = float(rows[0]["AcceleratorCount"])
    rp = RegionPrices()
    for r in rows:
        rp.add(r["Region"].lstrip(", ").strip(), num(r["Price"]), num(r["SpotPrice"]))
    regions, prices, notes = rp.choose()
    host_shapes = {(r["vCPUs"], r["MemoryGiB"]) for r in rows}
    if len(host_shapes) > 1 and provider != "vast":
        notes.append(
            "Host shape varies by region: "
            + ", ".join(f"{v} vCPU/{m} GiB" for v, m in sorted(host_shapes))
            + "; the first is shown."
        )
    if provider == "hyperstack" and link == "nvlink":
        notes.append("PCIe cards with NVLink bridges (per the catalog's GPU name).")
    has_host = provider != "vast"
    return offering(
        source_kind="catalog",
        provider=provider,
        instance_type=it,
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        vcpus=num(rows[0]["vCPUs"]) if has_host else None,
        ram_gb=num(rows[0]["MemoryGiB"]) if has_host else None,
        intra_node=intra_for(count, link),
        prices=prices,
        source=f"{SKY}/{COMMITS[provider]}/catalogs/v8/{provider}/vms.csv",
        as_of=AS_OF,
        notes=[*notes, provider_note, DATE_NOTE],
    )
