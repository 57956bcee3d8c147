"""Shared helpers: CSV reading, price dicts, region grouping, the row builder."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]
"""One offering as a plain dict, in schema field order, empty fields left out."""

GIB = 2**30
MIB = 2**20

GPU_IDS = frozenset(
    {
        "T4",
        "A10",
        "A10G",
        "L4",
        "L40S",
        "V100-16GB",
        "V100-32GB",
        "A100-40GB",
        "A100-80GB",
        "A100-80GB-PCIE",
        "A100-40GB-PCIE",
        "H100-SXM",
        "H100-PCIE",
        "H100-NVL",
        "H200",
        "H20",
        "GH200",
        "B200",
        "GB200",
        "MI300X",
        "MI325X",
        "RTX-4090",
        "RTX-3090",
        "RTX-A6000",
    }
)
"""Canonical GPU ids of ``gpus.yaml``; a row naming any other id is a bug."""

FIELD_ORDER = (
    "provider",
    "instance_type",
    "regions",
    "gpu",
    "gpu_count",
    "gpu_memory_bytes",
    "vcpus",
    "ram_gb",
    "intra_node",
    "inter_node_gbps",
    "fabric",
    "hosting",
    "compliance",
    "cold_start",
    "prices",
    "source",
    "source_kind",
    "as_of",
    "notes",
)

PRICE_ORDER = (
    "mode",
    "per_hour",
    "per_month",
    "per_year",
    "currency",
    "regions",
    "granularity_s",
    "minimum_s",
    "source",
    "source_kind",
    "as_of",
    "derived",
)

SKIPPED: set[tuple[str, str, str]] = set()
"""(provider, instance type, why) of GPU rows left out; printed by ``--report``."""

SKY = "https://github.com/skypilot-org/skypilot-catalog/blob"
ANYCLOUD = "https://github.com/anycloud-sh/catalog/blob/62ff0a987e0c257a89235415d2877812fb1aaf29"
ANYCLOUD_AS_OF = dt.date(2026, 5, 20)

DOC_AS_OF = dt.date(2026, 1, 1)
DOC_NOTE = (
    "Shape from an undated copy of the provider's instance-family doc seen in 2026; as_of "
    "set to 2026-01-01."
)


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file keyed by header (CRLF and LF both accepted)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return [
            {k: (v or "").strip() for k, v in row.items() if isinstance(k, str)}
            for row in csv.DictReader(fh)
        ]


def load_shapes(ref: Path) -> dict[tuple[str, str], dict[str, str]]:
    """``cloud/cloud_offerings.csv`` rows keyed by (provider label, instance type)."""
    rows = read_csv(ref / "cloud" / "cloud_offerings.csv")
    return {(r["provider"], r["instance_type"]): r for r in rows}


def first_url(text: str) -> str:
    """The first URL of a ``url ; url (note)`` source cell."""
    return text.split(" ; ")[0].split(" (")[0].strip()


def num(text: str | None) -> float | None:
    """A positive float, or None for empty, zero or unparsable cells."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def money(value: float) -> float:
    """Round sums of catalog prices so float noise does not reach the YAML."""
    return round(value, 6)


def fmt(value: float) -> str:
    """A price for a note, without trailing zeros."""
    return f"{value:g}"


def hourly(mode: str, amount: float, currency: str, **extra: Any) -> Row:
    """A per-hour price dict; ``extra`` (source, as_of) is kept when not None."""
    price: Row = {"mode": mode, "per_hour": money(amount), "currency": currency}
    price.update({k: v for k, v in extra.items() if v is not None})
    return price


def monthly(amount: float, currency: str) -> Row:
    """A per-month (subscription) price dict."""
    value = money(amount)
    return {
        "mode": "monthly",
        "per_month": int(value) if value.is_integer() else value,
        "currency": currency,
    }


def intra_for(count: float, link: str) -> str:
    """Intra-node interconnect from the GPU count and what the source says.

    Args:
        count: GPUs per instance.
        link: ``sxm`` (NVLink on an SXM/OAM baseboard), ``nvlink`` (NVLink without
            a switch: V100 hybrid cube mesh, bridges), ``pcie``, ``if`` (AMD
            Infinity Fabric) or ``unknown`` (source silent: PCIe is assumed, the
            conservative choice for bandwidth).

    >>> intra_for(8, "sxm"), intra_for(4, "sxm"), intra_for(1, "sxm"), intra_for(2, "unknown")
    ('nvswitch', 'nvlink', 'none', 'pcie')
    """
    if count <= 1:
        return "none"
    if link == "if":
        return "infinity-fabric"
    if link == "sxm":
        # 8-GPU HGX/NVL boards route NVLink through NVSwitch; smaller slices of
        # them are only claimed to be "NVLink" connected by their sources.
        return "nvswitch" if count >= 8 else "nvlink"
    if link == "nvlink":
        return "nvlink"
    return "pcie"


def _whole(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def offering(
    *,
    provider: str,
    instance_type: str,
    regions: Iterable[str],
    gpu: str,
    gpu_count: float,
    intra_node: str,
    source: str,
    as_of: dt.date,
    notes: Iterable[str] = (),
    gpu_memory_bytes: int | None = None,
    vcpus: float | None = None,
    ram_gb: float | None = None,
    inter_node_gbps: float | None = None,
    fabric: str | None = None,
    hosting: str = "virtualized",
    compliance: Iterable[str] = (),
    cold_start: str | None = None,
    prices: Iterable[Row] = (),
    source_kind: str | None = None,
) -> Row:
    """One offering row in schema field order, without empty fields."""
    if gpu not in GPU_IDS:
        raise ValueError(f"{provider}:{instance_type}: GPU id {gpu!r} is not canonical")
    row: Row = {
        "provider": provider,
        "instance_type": instance_type,
        "regions": sorted(set(regions)) or ["unspecified"],
        "gpu": gpu,
        "gpu_count": _whole(gpu_count),
        "gpu_memory_bytes": gpu_memory_bytes,
        "vcpus": _whole(vcpus),
        "ram_gb": _whole(ram_gb),
        "intra_node": intra_node,
        "inter_node_gbps": _whole(inter_node_gbps),
        "fabric": fabric,
        "hosting": hosting if hosting != "virtualized" else None,
        "compliance": sorted(set(compliance)) or None,
        "cold_start": cold_start,
        "prices": [{k: p[k] for k in PRICE_ORDER if k in p} for p in prices] or None,
        "source": source,
        "source_kind": source_kind,
        "as_of": as_of,
        "notes": " ".join(n.strip() for n in notes if n and n.strip()) or None,
    }
    return {k: v for k, v in row.items() if v is not None}


def grouped(
    mode: str, by_region: dict[str, float], regions: list[str], currency: str, **extra: Any
) -> list[Row]:
    """Prices of one mode, one per group of regions charging the same amount.

    Amounts are compared to 4 decimals (catalogs print one list price with
    different precision: 21.957642 vs 21.95764); a group keeps its lowest value.
    A group covering every region in ``regions`` is written without ``regions``
    (it applies to all of the offering's regions). Cheapest group first.
    """
    groups: dict[float, list[str]] = {}
    for region, amount in by_region.items():
        groups.setdefault(round(amount, 4), []).append(region)
    out = []
    for key in sorted(groups):
        members = sorted(groups[key])
        price = hourly(mode, min(by_region[r] for r in members), currency, **extra)
        if members != sorted(regions):
            price["regions"] = members
        out.append(price)
    return out


class RegionPrices:
    """On-demand and spot prices of one instance type, per region.

    :meth:`choose` keeps every region: one price per group of regions that
    charge the same, per mode (the schema's per-region prices).
    """

    def __init__(self) -> None:
        self.on_demand: dict[str, float] = {}
        self.spot: dict[str, float] = {}

    def add(self, region: str, od: float | None, spot: float | None) -> None:
        """Record one catalog row; the lowest price per region wins (zones, AZs)."""
        if od is not None:
            self.on_demand[region] = min(od, self.on_demand.get(region, od))
        if spot is not None:
            self.spot[region] = min(spot, self.spot.get(region, spot))

    def choose(self, currency: str = "USD") -> tuple[list[str], list[Row], list[str]]:
        """Every priced region, its prices grouped by amount, and notes."""
        notes: list[str] = []
        dropped = sorted(
            r for r, s in self.spot.items() if r in self.on_demand and s > self.on_demand[r]
        )
        spot = {r: s for r, s in self.spot.items() if r not in dropped}
        if dropped:
            notes.append(
                f"Spot above on-demand in {', '.join(dropped)} in the source; those "
                "spot prices were dropped."
            )
        if not self.on_demand and not spot:
            return [], [], notes
        if not self.on_demand:
            notes.append("The source has no on-demand price, only spot.")
        regions = sorted(set(self.on_demand) | set(spot))
        prices = [
            *grouped("on-demand", self.on_demand, regions, currency),
            *grouped("spot", spot, regions, currency),
        ]
        same = sorted(r for r, s in spot.items() if s == self.on_demand.get(r))
        if same:
            notes.append(f"The source's spot price equals on-demand in {', '.join(same)}.")
        if self.on_demand and len({round(v, 4) for v in self.on_demand.values()}) > 1:
            low, high = min(self.on_demand.values()), max(self.on_demand.values())
            notes.append(
                f"On-demand {fmt(low)}-{fmt(high)} {currency}/h across "
                f"{len(self.on_demand)} regions."
            )
        return regions, prices, notes
