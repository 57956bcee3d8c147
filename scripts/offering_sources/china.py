"""Tencent Cloud, Alibaba Cloud and Huawei Cloud (prices in CNY).

* Shapes: ``cloud_offerings.csv`` (each provider's instance-family doc).
* Tencent prices: ``prices_china.csv``, the official 价格总览 table from
  Tencent's documentation repository (hourly 按量计费 and monthly 包年包月).
* Alibaba and Huawei: no official GPU price was found (``cloud_billing.md``
  §8), so their rows are shapes; one Alibaba row carries a third-party price.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from offering_sources.common import (
    DOC_AS_OF,
    DOC_NOTE,
    GIB,
    SKIPPED,
    Row,
    first_url,
    hourly,
    intra_for,
    monthly,
    num,
    offering,
    read_csv,
)

LABELS = {"tencent": "Tencent Cloud", "alibaba": "Alibaba Cloud", "huawei": "Huawei Cloud"}
GPU = {
    # GPU name in cloud_offerings.csv -> (GPU id, default link when NVLink is stated)
    "NVIDIA T4": ("T4", "pcie"), "NVIDIA T4 (vGPU)": ("T4", "pcie"),
    "NVIDIA A10": ("A10", "pcie"), "NVIDIA A10 (slice)": ("A10", "pcie"),
    "NVIDIA A10 (vGPU)": ("A10", "pcie"),
    "NVIDIA A100 80GB": ("A100-80GB", "sxm"), "NVIDIA A100 40GB": ("A100-40GB", "sxm"),
    "NVIDIA A100 40GB (NVLink)": ("A100-40GB", "sxm"),
    "NVIDIA V100 SXM2 32GB": ("V100-32GB", "nvlink"),
    "NVIDIA V100 SXM2 16GB": ("V100-16GB", "nvlink"),
    "NVIDIA V100 32GB (NVLink)": ("V100-32GB", "nvlink"),
}
H20_LABEL = "NVIDIA Hopper-class 96GB HBM3 GPU"
H20_NOTE = (
    "Alibaba's doc names only an 'NVIDIA Hopper 96 GB HBM3' GPU with 900 GB/s NVLink; third "
    "parties identify it as the H20, the only Hopper part with that memory and link, so it is "
    "mapped to H20."
)
TENCENT_AS_OF = dt.date(2023, 1, 1)
TENCENT_NOTE = (
    "CNY list prices (刊例价) from Tencent's 价格总览 table, mainland China, compute part only "
    "(CPU+RAM+GPU; disk and network extra; the purchase page prevails). The table is undated "
    "and was dropped from the live page (updated 2025-12-19); it predates the PNV4 family, so "
    "as_of is set conservatively to 2023-01-01."
)
TENCENT_SHAPES = "https://cloud.tencent.com/document/product/560/19700"
ALIBABA_THIRD_PARTY = {
    # instance type: (CNY/h, as_of, source, note)
    "ecs.gn7e-c16g1.4xlarge": (
        34.742, dt.date(2024, 1, 1), "https://developer.aliyun.com/article/1635082",
        "On-demand price is third-party (a 2024 developer.aliyun.com community article, not "
        "re-verified; as_of set to 2024-01-01); no official ECS GPU price was found.",
    ),
}
NO_PRICE = ("Shape only: no sourced price (official CNY prices need the provider's price API; "
            "see cloud_billing.md §8).")


def build(ref: Path, provider: str, shapes: dict[tuple[str, str], dict[str, str]]) -> list[Row]:
    """Offerings of ``provider`` (tencent, alibaba or huawei) from its doc shapes."""
    priced = {}
    if provider == "tencent":
        priced = {r["instance_type"]: r for r in read_csv(ref / "cloud" / "prices_china.csv")
                  if r["provider"] == "Tencent Cloud"}
    out = []
    for (label, it), shape in sorted(shapes.items()):
        if label != LABELS[provider]:
            continue
        prices, notes, source, as_of, regions = _prices(provider, it, shape, priced.get(it))
        row = _offering(provider, shape, prices, notes, regions, source, as_of)
        if row is not None:
            out.append(row)
    return out


def _prices(
    provider: str, it: str, shape: dict[str, str], pr: dict[str, str] | None
) -> tuple[list[Row], list[str], str, dt.date, list[str]]:
    if pr is not None:
        notes = []
        m = re.search(r"range: ([\d.]+-[\d.]+) 元/月 and ([\d.]+-[\d.]+) 元/小时", pr["notes"])
        if m:
            notes.append(f"The table gives ranges ({m.group(1)} CNY/month, {m.group(2)} CNY/h); "
                         "the upper end is stored.")
        notes += [TENCENT_NOTE, f"Shape per {TENCENT_SHAPES}."]
        prices = [hourly("on-demand", float(pr["price_on_demand_per_hour"]), "CNY"),
                  monthly(float(pr["price_monthly"]), "CNY")]
        return prices, notes, pr["source"], TENCENT_AS_OF, ["china-mainland"]
    prices, notes = [], []
    if provider == "alibaba" and it in ALIBABA_THIRD_PARTY:
        amount, as_of, src, note = ALIBABA_THIRD_PARTY[it]
        prices.append(hourly("on-demand", amount, "CNY", as_of=as_of, source=src))
        notes.append(note)
    notes.append(DOC_NOTE)
    return prices, notes, first_url(shape["source"]), DOC_AS_OF, _regions(shape["region"])


def _regions(text: str) -> list[str]:
    if text.startswith(("multiple", "specific")):
        return ["unspecified"]
    return [t.strip() for t in text.split(",") if t.strip()]


def _link(text: str, default: str) -> str:
    if text.startswith("PCIe") or "no NVLink" in text:
        return "pcie"
    if "NVLink" in text:
        return "sxm" if default == "sxm" else "nvlink"
    return "unknown"


def _gpu(provider: str, shape: dict[str, str]) -> tuple[str, str, list[str]] | None:
    label = shape["gpu_model"]
    if label.startswith(H20_LABEL):
        return "H20", _link(shape["intra_node_interconnect"], "sxm"), [H20_NOTE]
    if label not in GPU:
        SKIPPED.add((provider, shape["instance_type"], f"GPU '{label}' has no GPU id"))
        return None
    gpu, default = GPU[label]
    link = _link(shape["intra_node_interconnect"], default)
    if gpu.startswith("A100") and link == "unknown":
        SKIPPED.add((provider, shape["instance_type"],
                     f"{label}: SXM4 or PCIe not stated, so the A100 id is ambiguous"))
        return None
    return gpu, link, []


def _cold_start(doc_notes: str) -> str | None:
    if "invitation only" in doc_notes:
        return "Invitation only (per doc)."
    if "allowlist" in doc_notes:
        return "Not self-service: allowlist (per doc)."
    if "available by ticket" in doc_notes:
        return "Not self-service: available by ticket (per doc)."
    return None


def _offering(
    provider: str, shape: dict[str, str], prices: list[Row], notes: list[str],
    regions: list[str], source: str, as_of: dt.date,
) -> Row | None:
    mapped = _gpu(provider, shape)
    if mapped is None:
        return None
    gpu, link, notes_first = mapped
    count = float(shape["gpu_count"])
    notes = notes_first + notes
    if link == "unknown" and count > 1:
        notes.append("Intra-node link not stated by the doc; pcie assumed (conservative).")
    is_slice = count < 1 or "vGPU" in shape["gpu_model"] or "slice" in shape["gpu_model"]
    doc = shape["notes"]
    if "third-party" not in doc and (keep := [s.strip() for s in doc.split(";") if s.strip()]):
        notes.append("Doc: " + "; ".join(keep) + ".")
    if "vGPU" in doc and provider == "tencent":
        notes.append("Tencent GN7 vGPU is vComputeServer (CUDA only, GRID driver); not for "
                     "multi-GPU NCCL training.")
    if not prices:
        notes.append(NO_PRICE)
    mem, net = num(shape["gpu_memory_gb"]), num(shape["inter_node_network_gbps"])
    return offering(
        provider=provider, instance_type=shape["instance_type"], regions=regions, gpu=gpu,
        gpu_count=round(count, 4),
        gpu_memory_bytes=int(mem * GIB) if (count < 1 and mem) else None,
        vcpus=num(shape["vcpus"]), ram_gb=num(shape["ram_gb"]),
        intra_node="none" if count < 1 else intra_for(count, link),
        inter_node_gbps=net, fabric="ethernet" if net else None,
        hosting=("bare-metal" if shape["bare_metal"] == "yes" else
                 "vgpu-slice" if is_slice else "virtualized"),
        cold_start=_cold_start(doc), prices=prices, source=source, as_of=as_of, notes=notes,
    )
