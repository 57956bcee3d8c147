"""Tencent Cloud, Alibaba Cloud and Huawei Cloud (prices in CNY).

* Shapes: ``cloud_offerings.csv`` (each provider's instance-family doc).
* Tencent prices: ``prices_china.csv``, the official 价格总览 table from
  Tencent's documentation repository (hourly 按量计费 and monthly 包年包月, the
  ``china-mainland`` region group, CNY), plus ``prices_more.csv``: the
  international site's price overview (Guangzhou Zone 3, USD, 2023) and a 2026
  third-party transcription of two monthly prices from Tencent's price page.
* Alibaba prices: ``prices_alibaba.csv``, pay-as-you-go Linux list prices per
  region in CNY (overseas regions too: it is the China site's price file),
  copied from Alibaba's own ``instancePrice.json`` into a public repository
  (``source_kind: api-dump``). Types priced there but missing from the shape
  doc get a row from the price file's GPU and count alone.
* Huawei: no official GPU price was found (``cloud_billing.md`` §8), so its
  rows are shapes.
* Baidu (``prices_more.csv``): BML/EasyDL are ML-platform packages, not VMs,
  and their GPUs (V100 of unstated memory, K40, P40) have no unambiguous GPU id:
  left out, listed by ``--report``.
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
    fmt,
    grouped,
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
    "NVIDIA T4": ("T4", "pcie"),
    "NVIDIA T4 (vGPU)": ("T4", "pcie"),
    "NVIDIA A10": ("A10", "pcie"),
    "NVIDIA A10 (slice)": ("A10", "pcie"),
    "NVIDIA A10 (vGPU)": ("A10", "pcie"),
    "NVIDIA A100 80GB": ("A100-80GB", "sxm"),
    "NVIDIA A100 40GB": ("A100-40GB", "sxm"),
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
ALIBABA_PRICES_URL = (
    "https://github.com/cloudpilot-ai/karpenter-provider-alibabacloud/blob/"
    "5d2e077457ab51b9feb16f01523e06c042d9a27e/pkg/providers/pricing/initial-on-demand-prices.json"
)
ALIBABA_PRICES_AS_OF = dt.date(2024, 12, 30)
ALIBABA_PRICE_NOTE = (
    "On-demand: Alibaba's China-site pay-as-you-go Linux list prices per region (CNY per "
    "instance-hour, compute only: no disk, IP or bandwidth), from the official "
    "instancePrice.json behind https://www.aliyun.com/price/ecs/ecs-pricing/zh as committed on "
    "2024-12-30 in cloudpilot-ai/karpenter-provider-alibabacloud (api-dump); overseas regions "
    "are CNY too. No subscription (包年包月) or spot price was captured."
)
ALIBABA_THIRD_PARTY_NOTE = {
    "ecs.gn7e-c16g1.4xlarge": "A 2024 developer.aliyun.com community article quotes about "
    "34.742 CNY/h (https://developer.aliyun.com/article/1635082); the price file is used instead.",
}
NO_PRICE = (
    "Shape only: no sourced price (official CNY prices need the provider's price API; "
    "see cloud_billing.md §8)."
)
TENCENT_INTL_NOTE = (
    "ap-guangzhou: the international site's USD price for Guangzhou Zone 3 (official price "
    "overview, tencentyun/intlcloud-documents commit b7e17ea of 2023-06-30; compute only; the "
    "purchase page prevails); the china-mainland group is the China site's CNY list price."
)
TENCENT_MONTHLY_2026 = {
    # instance type: (CNY per instance-month, note); GPU count 1, so per GPU = per instance
    "GT4.4XLARGE96": 12948,
    "GN7.2XLARGE32": 2500,
}
TENCENT_MONTHLY_SOURCE = (
    "https://buy.cloud.tencent.com/price/cvm/overview (as transcribed by a third-party GPU-price "
    "scraper, generated 2026-06-15)"
)


def build(ref: Path, provider: str, shapes: dict[tuple[str, str], dict[str, str]]) -> list[Row]:
    """Offerings of ``provider`` (tencent, alibaba or huawei) from its doc shapes."""
    priced: dict[str, dict[str, str]] = {}
    intl: dict[str, dict[str, str]] = {}
    by_region: dict[str, dict[str, float]] = {}
    if provider == "tencent":
        priced = {
            r["instance_type"]: r
            for r in read_csv(ref / "cloud" / "prices_china.csv")
            if r["provider"] == "Tencent Cloud"
        }
        intl = {
            r["instance_type"]: r
            for r in read_csv(ref / "cloud" / "prices_more.csv")
            if r["provider"] == "Tencent Cloud (international site)"
        }
    if provider == "alibaba":
        by_region, price_only = _alibaba_prices(ref)
        shapes = {**price_only, **shapes}
    out = []
    for (label, it), shape in sorted(shapes.items()):
        if label != LABELS[provider]:
            continue
        if provider == "alibaba":
            prices, notes, source, as_of, regions = _alibaba(it, shape, by_region.get(it, {}))
        else:
            prices, notes, source, as_of, regions = _prices(it, shape, priced.get(it), intl.get(it))
        row = _offering(provider, shape, prices, notes, regions, source, as_of)
        if row is not None:
            out.append(row)
    return out


def _alibaba_prices(
    ref: Path,
) -> tuple[dict[str, dict[str, float]], dict[tuple[str, str], dict[str, str]]]:
    """Per instance type, CNY per hour by region; plus shape rows for types the doc lacks."""
    by_region: dict[str, dict[str, float]] = {}
    shapes: dict[tuple[str, str], dict[str, str]] = {}
    for r in read_csv(ref / "cloud" / "prices_alibaba.csv"):
        amount = num(r["price"])
        if amount is None or r["currency"] != "CNY" or r["unit"] != "per instance-hour":
            continue
        by_region.setdefault(r["instance_type"], {})[r["region"]] = amount
        shapes[("Alibaba Cloud", r["instance_type"])] = {
            "instance_type": r["instance_type"],
            "gpu_model": r["gpu"],
            "gpu_count": r["gpu_count"],
            "gpu_memory_gb": "",
            "vcpus": "",
            "ram_gb": "",
            "intra_node_interconnect": "not stated",
            "inter_node_network_gbps": "",
            "bare_metal": "yes" if r["instance_type"].startswith("ecs.ebm") else "no",
            "notes": "",
            "source": ALIBABA_PRICES_URL,
            "region": "",
            "price_only": "yes",
        }
    return by_region, shapes


def _alibaba(
    it: str, shape: dict[str, str], by_region: dict[str, float]
) -> tuple[list[Row], list[str], str, dt.date, list[str]]:
    notes = []
    if shape.get("price_only"):
        notes.append(
            "Shape not in the instance-family doc copy: GPU and count from the price "
            "file; vCPU, memory and network unknown; ecs.ebm* is elastic bare metal."
        )
    if not by_region:
        notes += [DOC_NOTE]
        return [], notes, first_url(shape["source"]), DOC_AS_OF, _regions(shape["region"])
    regions = sorted(by_region)
    prices = grouped("on-demand", by_region, regions, "CNY")
    notes.append(ALIBABA_PRICE_NOTE)
    if len({round(v, 4) for v in by_region.values()}) > 1:
        notes.append(
            f"On-demand {fmt(min(by_region.values()))}-{fmt(max(by_region.values()))} "
            f"CNY/h across {len(by_region)} regions."
        )
    if it in ALIBABA_THIRD_PARTY_NOTE:
        notes.append(ALIBABA_THIRD_PARTY_NOTE[it])
    if not shape.get("price_only"):
        notes.append(f"Shape per {first_url(shape['source'])} (an undated copy seen in 2026).")
    return prices, notes, ALIBABA_PRICES_URL, ALIBABA_PRICES_AS_OF, regions


def _prices(
    it: str, shape: dict[str, str], pr: dict[str, str] | None, intl: dict[str, str] | None
) -> tuple[list[Row], list[str], str, dt.date, list[str]]:
    if pr is not None:
        notes = []
        m = re.search(r"range: ([\d.]+-[\d.]+) 元/月 and ([\d.]+-[\d.]+) 元/小时", pr["notes"])
        if m:
            notes.append(
                f"The table gives ranges ({m.group(1)} CNY/month, {m.group(2)} CNY/h); "
                "the upper end is stored."
            )
        notes += [TENCENT_NOTE, f"Shape per {TENCENT_SHAPES}."]
        month = monthly(float(pr["price_monthly"]), "CNY")
        if it in TENCENT_MONTHLY_2026:
            newer = TENCENT_MONTHLY_2026[it]
            if newer == month["per_month"]:
                notes.append(
                    f"A 2026-06-15 third-party transcription of {TENCENT_MONTHLY_SOURCE} "
                    f"gives the same {newer} CNY/month."
                )
            else:
                notes.append(
                    f"Monthly: {newer} CNY from a 2026-06-15 third-party transcription "
                    f"of Tencent's price page; the 2023 table said "
                    f"{fmt(month['per_month'])}."
                )
                month = {
                    **monthly(float(newer), "CNY"),
                    "source": TENCENT_MONTHLY_SOURCE,
                    "source_kind": "third-party",
                    "as_of": dt.date(2026, 6, 15),
                }
        prices = [hourly("on-demand", float(pr["price_on_demand_per_hour"]), "CNY"), month]
        regions = ["china-mainland"]
        if intl is not None:
            prices = [{**p, "regions": ["china-mainland"]} for p in prices]
            prices.insert(1, _intl_price(intl))
            regions.append("ap-guangzhou")
            notes.append(TENCENT_INTL_NOTE)
        return prices, notes, pr["source"], TENCENT_AS_OF, regions
    if intl is not None:
        return (
            [_intl_price(intl)],
            [TENCENT_INTL_NOTE, DOC_NOTE],
            first_url(shape["source"]),
            DOC_AS_OF,
            ["ap-guangzhou"],
        )
    return [], [DOC_NOTE], first_url(shape["source"]), DOC_AS_OF, _regions(shape["region"])


def _intl_price(r: dict[str, str]) -> Row:
    src = (
        "https://github.com/tencentyun/intlcloud-documents/blob/"
        "b7e17ea691c4ad7ae878e00e9d6dc37ff7ae1f1c/yehe_doc/计算/GPU 云服务器/购买指南/"
        "价格总览_intl_en.md"
    )
    return hourly(
        "on-demand",
        float(r["price"]),
        r["currency"],
        regions=["ap-guangzhou"],
        source=src,
        source_kind="official",
        as_of=dt.date(2023, 6, 30),
    )


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
        SKIPPED.add(
            (
                provider,
                shape["instance_type"],
                f"{label}: SXM4 or PCIe not stated, so the A100 id is ambiguous",
            )
        )
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
    provider: str,
    shape: dict[str, str],
    prices: list[Row],
    notes: list[str],
    regions: list[str],
    source: str,
    as_of: dt.date,
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
        notes.append(
            "Tencent GN7 vGPU is vComputeServer (CUDA only, GRID driver); not for "
            "multi-GPU NCCL training."
        )
    if not prices:
        notes.append(NO_PRICE)
    mem, net = num(shape["gpu_memory_gb"]), num(shape["inter_node_network_gbps"])
    return offering(
        source_kind="api-dump" if source == ALIBABA_PRICES_URL else "official",
        provider=provider,
        instance_type=shape["instance_type"],
        regions=regions,
        gpu=gpu,
        gpu_count=round(count, 4),
        gpu_memory_bytes=int(mem * GIB) if (count < 1 and mem) else None,
        vcpus=num(shape["vcpus"]),
        ram_gb=num(shape["ram_gb"]),
        intra_node="none" if count < 1 else intra_for(count, link),
        inter_node_gbps=net,
        fabric="ethernet" if net else None,
        hosting=(
            "bare-metal"
            if shape["bare_metal"] == "yes"
            else "vgpu-slice"
            if is_slice
            else "virtualized"
        ),
        cold_start=_cold_start(doc),
        prices=prices,
        source=source,
        as_of=as_of,
        notes=notes,
    )
