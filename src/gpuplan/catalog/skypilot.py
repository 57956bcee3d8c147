"""Convert a SkyPilot-format ``vms.csv`` into a gpuplan overrides file.

SkyPilot users keep these catalogs under ``~/.sky/catalogs/<version>/<cloud>/``.
Traps handled here (see the SkyPilot catalog README and skypilot-catalog #31):

* columns differ in order between clouds, so they are read by header name;
* on GCP the GPU is priced on its own row (empty ``InstanceType``) and the
  instance price is host VM + accelerator in the same zone;
* accelerator names vary (``A6000``/``RTXA6000``; SkyPilot's ``A100`` is 40 GB),
  so they go through an alias map and, when ambiguous, per-GPU memory;
* empty or ``0`` spot prices mean no spot offer, and spot prices above
  on-demand are dropped (they occur in real files);
* spot prices are per zone: the lowest zone price in a region is kept.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import functools
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import UNKNOWN_DATE, CatalogFile, IntraNode, Offering, Price
from gpuplan.errors import CatalogError, UnknownNameError

KNOWN_PROVIDERS = (
    "aws",
    "gcp",
    "azure",
    "lambda",
    "runpod",
    "nebius",
    "vast",
    "oci",
    "cudo",
    "fluidstack",
    "paperspace",
    "hyperstack",
    "jarvislabs",
    "lium",
    "mithril",
    "seeweb",
    "shadeform",
    "verda",
    "yotta",
    "hyperbolic",
    "primeintellect",
    "do",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """The converted overrides and what was skipped, with reasons."""

    catalog: CatalogFile
    rows_read: int
    skipped: Mapping[str, int]


@functools.lru_cache(maxsize=1)
def _mapping() -> dict[str, Any]:
    text = resources.files("gpuplan.catalog").joinpath("skypilot_map.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    data["accelerators"] = {k.upper(): v for k, v in data["accelerators"].items()}
    return data


def infer_provider(path: Path) -> str | None:
    """The cloud a catalog file belongs to, from its folder name (``.../gcp/vms.csv``)."""
    for part in reversed(path.resolve().parts[:-1]):
        if part.lower() in KNOWN_PROVIDERS:
            return part.lower()
    return None


def _gpu_memory_mib(info: str) -> float | None:
    """Per-GPU memory from a GpuInfo blob in any of its forms, or None."""
    info = info.strip()
    if not info.startswith("{"):
        return None
    try:
        blob = ast.literal_eval(info.replace("null", "None"))
    except (ValueError, SyntaxError):
        try:
            blob = json.loads(info)
        except ValueError:
            return None
    gpus = blob.get("Gpus") if isinstance(blob, dict) else None
    if not gpus or not isinstance(gpus, list):
        return None
    size = (gpus[0].get("MemoryInfo") or {}).get("SizeInMiB")
    return float(size) if isinstance(size, (int, float)) and size > 0 else None


def resolve_gpu(name: str, memory_mib: float | None, catalog: Catalog) -> str | None:
    """Map a SkyPilot accelerator name to a gpuplan GPU id, or None if unknown."""
    candidates = _mapping()["accelerators"].get(name.strip().upper())
    if candidates is None:
        try:
            return catalog.gpu(name).id
        except UnknownNameError:
            return None
    if len(candidates) == 1 or memory_mib is None:
        return str(candidates[0])
    mem_bytes = memory_mib * 2**20
    for gpu_id in candidates:
        spec = catalog.gpu(gpu_id)
        if abs(spec.memory_bytes - mem_bytes) / spec.memory_bytes < 0.1:
            return str(gpu_id)
    return str(candidates[0])


def _float(value: str | None) -> float | None:
    try:
        out = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return out if out is not None and out > 0 else None


@dataclasses.dataclass(slots=True)
class _Row:
    instance_type: str
    gpu: str
    count: float
    vcpus: float | None
    ram_gib: float | None
    region: str
    price: float | None
    spot: float | None


def _read_rows(path: Path) -> tuple[list[dict[str, str]], list[str]]:
    from gpuplan.userfile import read_csv

    header, rows = read_csv(path, what="import", error=CatalogError)
    needed = {"InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "Region"}
    missing = sorted(needed - set(header))
    if missing:
        raise CatalogError(
            f"import: {path} is not a SkyPilot vms.csv: missing column(s) {', '.join(missing)}"
        )
    return rows, header


def _gcp_rows(raw: list[dict[str, str]], catalog: Catalog, skipped: dict[str, int]) -> list[_Row]:
    """Join GCP host-VM rows with their accelerator rows in the same zone."""
    machines = _mapping()["gcp_machines"]
    accel: dict[tuple[str, float, str], tuple[float | None, float | None, float | None]] = {}
    for r in raw:
        if r["InstanceType"] == "" and r["AcceleratorName"]:
            key = (
                r["AcceleratorName"].upper(),
                _float(r["AcceleratorCount"]) or 0.0,
                r.get("AvailabilityZone", ""),
            )
            accel[key] = (
                _float(r["Price"]),
                _float(r.get("SpotPrice")),
                _gpu_memory_mib(r.get("GpuInfo", "")),
            )
    out = []
    for r in raw:
        itype = r["InstanceType"]
        if not itype:
            continue
        shape = machines.get(itype)
        if shape is None:
            if r["AcceleratorName"]:
                skipped["GPU VM shape not in the GCP machine map"] += 1
            continue
        key = (
            str(shape["accelerator"]).upper(),
            float(shape["count"]),
            r.get("AvailabilityZone", ""),
        )
        if key not in accel:
            skipped["no accelerator price row in the same zone"] += 1
            continue
        gpu_price, gpu_spot, mem = accel[key]
        host, host_spot = _float(r["Price"]), _float(r.get("SpotPrice"))
        gpu = resolve_gpu(str(shape["accelerator"]), mem, catalog)
        if gpu is None:
            skipped["unknown accelerator"] += 1
            continue
        price = host + gpu_price if host and gpu_price else None
        spot = host_spot + gpu_spot if host_spot and gpu_spot else None
        out.append(
            _Row(
                instance_type=itype,
                gpu=gpu,
                count=float(shape["count"]),
                vcpus=_float(r.get("vCPUs")),
                ram_gib=_float(r.get("MemoryGiB")),
                region=r["Region"],
                price=price,
                spot=spot,
            )
        )
    return out


def _plain_rows(raw: list[dict[str, str]], catalog: Catalog, skipped: dict[str, int]) -> list[_Row]:
    out = []
    for r in raw:
        name = r["AcceleratorName"].strip()
        if not name:
            continue
        if not r["InstanceType"]:
            skipped["accelerator row without an instance type"] += 1
            continue
        gpu = resolve_gpu(name, _gpu_memory_mib(r.get("GpuInfo", "")), catalog)
        if gpu is None:
            skipped[f"unknown accelerator {name}"] += 1
            continue
        count = _float(r["AcceleratorCount"])
        if count is None:
            skipped["no accelerator count"] += 1
            continue
        out.append(
            _Row(
                instance_type=r["InstanceType"],
                gpu=gpu,
                count=count,
                vcpus=_float(r.get("vCPUs")),
                ram_gib=_float(r.get("MemoryGiB")),
                region=r["Region"],
                price=_float(r["Price"]),
                spot=_float(r.get("SpotPrice")),
            )
        )
    return out


def _intra_node(gpu_form: str, count: float) -> IntraNode:
    if count <= 1:
        return "none"
    return "nvswitch" if gpu_form in ("sxm", "oam", "superchip") else "pcie"


def _grouped(
    mode: str, by_region: dict[str, float | None], regions: tuple[str, ...]
) -> list[Price]:
    """One USD price per group of regions charging the same (5 decimals); all regions: no list."""
    groups: dict[float, list[str]] = defaultdict(list)
    for region, amount in by_region.items():
        if amount is not None:
            groups[round(amount, 5)].append(region)
    return [
        Price(
            mode=mode,
            per_hour=amount,
            currency="USD",
            regions=() if tuple(sorted(members)) == regions else tuple(sorted(members)),
        )
        for amount, members in sorted(groups.items())
    ]


def convert_vms_csv(
    path: Path,
    catalog: Catalog,
    *,
    provider: str | None = None,
    as_of: dt.date | None = None,
    source: str | None = None,
) -> ImportResult:
    """Convert one SkyPilot-format ``vms.csv`` into gpuplan offerings.

    Each instance type becomes one offering listing every region that sells it,
    with one price per billing mode and group of regions charging the same
    amount (the schema's per-region prices).

    Args:
        path: the CSV file.
        catalog: the loaded catalog (for GPU ids and memory).
        provider: provider id; inferred from the folder name when None.
        as_of: date the prices were read at the source. SkyPilot-format catalogs record
            no such date (no column, no version file: the schema folder ``v8`` names the
            format, not a day), and a file's modification time is when it was copied, so
            without it the rows are marked ``as_of: unknown`` rather than guessed.
        source: provenance text; defaults to the file path.
    """
    provider = (provider or infer_provider(path) or "").lower()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", provider):
        raise CatalogError(
            f"import: --provider: cannot infer the provider from {path}",
            hint="pass --provider gcp (lowercase letters, digits, dashes)",
        )
    raw, _ = _read_rows(path)
    skipped: dict[str, int] = defaultdict(int)
    rows = (
        _gcp_rows(raw, catalog, skipped)
        if provider == "gcp"
        else _plain_rows(raw, catalog, skipped)
    )

    # region-level: lowest spot across zones, on-demand is per region
    by_region: dict[tuple[str, str], _Row] = {}
    for row in rows:
        key = (row.instance_type, row.region)
        prev = by_region.get(key)
        if prev is None:
            by_region[key] = row
        elif row.spot is not None and (prev.spot is None or row.spot < prev.spot):
            by_region[key] = dataclasses.replace(prev, spot=row.spot)
    by_type: dict[str, list[_Row]] = defaultdict(list)
    for row in by_region.values():
        spot = row.spot
        if spot is not None and row.price is not None and spot >= row.price:
            skipped["spot price at or above on-demand dropped (kept on-demand)"] += 1
            spot = None
        by_type[row.instance_type].append(dataclasses.replace(row, spot=spot))

    offerings = []
    src = source or f"SkyPilot-format catalog {path.name} ({path})"
    for itype, members in sorted(by_type.items()):
        members.sort(key=lambda m: m.region)
        first = members[0]
        spec = catalog.gpu(first.gpu)
        regions = tuple(sorted({m.region for m in members}))
        prices = [
            *_grouped("on-demand", {m.region: m.price for m in members}, regions),
            *_grouped("spot", {m.region: m.spot for m in members}, regions),
        ]
        offerings.append(
            Offering(
                provider=provider,
                instance_type=itype,
                regions=regions,
                gpu=first.gpu,
                gpu_count=first.count,
                vcpus=first.vcpus,
                ram_gb=round(first.ram_gib * 2**30 / 1e9, 1) if first.ram_gib else None,
                intra_node=_intra_node(spec.form_factor, first.count),
                prices=tuple(prices),
                source=src,
                source_kind="catalog",
                as_of=UNKNOWN_DATE if as_of is None else as_of,
                notes="imported from a SkyPilot-format catalog; intra_node derived from the GPU's form "
                "factor; prices per region (spot = lowest zone price in the region)",
            )
        )
    if not offerings:
        raise CatalogError(
            f"import: {path}: no GPU offerings found ({sum(skipped.values())} rows skipped)"
        )
    return ImportResult(
        catalog=CatalogFile(offerings=tuple(offerings)), rows_read=len(raw), skipped=dict(skipped)
    )


def dump_catalog_file(cat: CatalogFile) -> str:
    """Serialise a catalog file as YAML that ``--catalog`` reads back."""
    data = cat.model_dump(mode="json", exclude_defaults=True)
    data = {"schema_version": cat.schema_version, **data}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def write_atomically(path: Path, text: str) -> None:
    """Write text to path via a temp file so nothing half-written is left behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CatalogError(f"--out: cannot write {path}: {exc.strerror}") from exc
