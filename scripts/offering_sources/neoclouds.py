"""Lambda, RunPod and CoreWeave.

* Lambda: anycloud-sh/catalog ``lambda/vms.csv`` (SkyPilot format, last changed
  2026-05-07), cross-checked against a 2026-09-20 transcription of
  lambda.ai/instances in ``cloud_offerings.csv``.
* RunPod and CoreWeave: price transcriptions in ``cloud_offerings.csv`` (the
  2.2 MB skypilot-catalog RunPod file was not copied into the reference).
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from pathlib import Path

from offering_sources.common import (
    ANYCLOUD,
    SKIPPED,
    RegionPrices,
    Row,
    hourly,
    intra_for,
    num,
    offering,
    read_csv,
)

LAMBDA_AS_OF = dt.date(2026, 5, 7)
LAMBDA_CHECKED = dt.date(2026, 9, 20)
LAMBDA: dict[str, tuple[str, str]] = {
    # instance type: (GPU id, link). GPU ids from the catalog name and lambda.ai's
    # own labels ("SXM", "PCIe"); the 8x V100 box is PCIe per the transcription.
    "gpu_1x_a10": ("A10", "pcie"),
    "gpu_1x_a100_sxm4": ("A100-40GB", "sxm"),
    "gpu_8x_a100": ("A100-40GB", "sxm"),
    "gpu_8x_a100_80gb_sxm4": ("A100-80GB", "sxm"),
    "gpu_1x_a6000": ("RTX-A6000", "pcie"),
    "gpu_2x_a6000": ("RTX-A6000", "pcie"),
    "gpu_4x_a6000": ("RTX-A6000", "pcie"),
    "gpu_1x_b200_sxm6": ("B200", "sxm"),
    "gpu_1x_gh200": ("GH200", "sxm"),
    "gpu_2x_b200_sxm6": ("B200", "sxm"),
    "gpu_4x_b200_sxm6": ("B200", "sxm"),
    "gpu_8x_b200_sxm6": ("B200", "sxm"),
    "gpu_1x_h100_pcie": ("H100-PCIE", "pcie"),
    "gpu_1x_h100_sxm5": ("H100-SXM", "sxm"),
    "gpu_2x_h100_sxm5": ("H100-SXM", "sxm"),
    "gpu_4x_h100_sxm5": ("H100-SXM", "sxm"),
    "gpu_8x_h100_sxm5": ("H100-SXM", "sxm"),
    "gpu_8x_v100": ("V100-16GB", "pcie"),
    "gpu_8x_v100_n": ("V100-16GB", "pcie"),
}
A100_AMBIGUOUS = "A100 40GB, SXM4 or PCIe not stated (A100-40GB-PCIE if Lambda confirms PCIe)"
LAMBDA_LEFT_OUT = {
    "gpu_1x_a100": A100_AMBIGUOUS,
    "gpu_2x_a100": A100_AMBIGUOUS,
    "gpu_4x_a100": A100_AMBIGUOUS,
}
LAMBDA_TRANSCRIPT = {
    # name in the lambda.ai transcription -> catalog instance type
    "1x A10": "gpu_1x_a10",
    "8x A100 40GB SXM": "gpu_8x_a100",
    "8x A100 80GB SXM": "gpu_8x_a100_80gb_sxm4",
    "4x A6000": "gpu_4x_a6000",
    "1x B200": "gpu_1x_b200_sxm6",
    "1x GH200": "gpu_1x_gh200",
    "2x B200": "gpu_2x_b200_sxm6",
    "4x B200": "gpu_4x_b200_sxm6",
    "8x B200 SXM6": "gpu_8x_b200_sxm6",
    "1x H100 PCIe": "gpu_1x_h100_pcie",
    "1x H100 SXM": "gpu_1x_h100_sxm5",
    "2x H100 SXM": "gpu_2x_h100_sxm5",
    "4x H100 SXM": "gpu_4x_h100_sxm5",
    "8x H100 SXM": "gpu_8x_h100_sxm5",
    "8x V100": "gpu_8x_v100",
}


def build_lambda(ref: Path, shapes: dict[tuple[str, str], dict[str, str]]) -> list[Row]:
    """Lambda on-demand instances (Lambda has no spot market)."""
    transcript = {
        LAMBDA_TRANSCRIPT[it]: r
        for (p, it), r in shapes.items()
        if p == "Lambda" and it in LAMBDA_TRANSCRIPT
    }
    by_type: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in read_csv(ref / "skypilot-catalog" / "anycloud" / "lambda" / "vms.csv"):
        if r["InstanceType"] in LAMBDA:
            by_type[r["InstanceType"]].append(r)
        elif r["AcceleratorName"]:
            why = LAMBDA_LEFT_OUT.get(
                r["InstanceType"], f"accelerator {r['AcceleratorName']} has no GPU id"
            )
            SKIPPED.add(("lambda", r["InstanceType"], why))
    return [_lambda(it, rows, transcript.get(it)) for it, rows in sorted(by_type.items())]


def _lambda(it: str, rows: list[dict[str, str]], seen: dict[str, str] | None) -> Row:
    gpu, link = LAMBDA[it]
    rp = RegionPrices()
    for r in rows:
        rp.add(r["Region"], num(r["Price"]), num(r["SpotPrice"]))
    regions, prices, notes = rp.choose()
    count = float(rows[0]["AcceleratorCount"])
    if seen and prices and num(seen["price_on_demand_per_hour"]) == prices[0]["per_hour"]:
        prices[0] = {**prices[0], "as_of": LAMBDA_CHECKED}
        notes.append(
            "Same list price in a 2026-09-20 transcription of "
            "https://lambda.ai/instances, so the price carries that date."
        )
    elif seen:
        notes.append(
            f"The 2026-09-20 lambda.ai transcription lists "
            f"{seen['price_on_demand_per_hour']} USD/h."
        )
    if gpu.startswith("V100"):
        notes.append("The lambda.ai transcription lists the 8x V100 box as PCIe.")
    return offering(
        provider="lambda",
        instance_type=it,
        regions=regions,
        gpu=gpu,
        gpu_count=count,
        vcpus=num(rows[0]["vCPUs"]),
        ram_gb=num(rows[0]["MemoryGiB"]),
        intra_node=intra_for(count, link),
        prices=prices,
        source=f"{ANYCLOUD}/lambda/vms.csv",
        as_of=LAMBDA_AS_OF,
        notes=[
            *notes,
            "Lambda quotes per GPU-hour; the price here is per instance. No egress "
            "fees. Catalog: anycloud-sh/catalog lambda/vms.csv, last changed 2026-05-07.",
        ],
    )


RUNPOD = {
    # instance type: (GPU id, label in cloud_offerings.csv)
    "H100 SXM": ("H100-SXM", "H100 SXM pod (1 GPU)"),
    "H100 PCIe": ("H100-PCIE", "H100 PCIe pod (1 GPU)"),
    "H100 NVL": ("H100-NVL", "H100 NVL pod (1 GPU)"),
    "A100 PCIe": ("A100-80GB-PCIE", "A100 PCIe pod (1 GPU)"),
    "A100 SXM": ("A100-80GB", "A100 SXM pod (1 GPU)"),
    "H200": ("H200", "H200 pod (1 GPU)"),
    "B200": ("B200", "B200 pod (1 GPU)"),
}
RUNPOD_NOTE = (
    "RunPod prices move often (snapshots a month apart differ, e.g. Secure H100 SXM $3.49 on "
    "2026-10-07 vs $3.99 on 2026-11-09). No data-transfer fees. Regions not stated by the source."
)


def build_runpod(rows: list[dict[str, str]]) -> list[Row]:
    """RunPod 1-GPU pods: Secure Cloud as on-demand, Community Cloud as community."""
    rows = [r for r in rows if r["provider"] == "RunPod"]
    labels = {label for _gpu, label in RUNPOD.values()}
    for r in rows:
        if r["instance_type"] not in labels:
            SKIPPED.add(("runpod", r["instance_type"], f"GPU '{r['gpu_model']}' has no GPU id"))
    out = []
    for it, (gpu, label) in sorted(RUNPOD.items()):
        found = {r["region"]: r for r in rows if r["instance_type"] == label}
        secure = found.get("Secure Cloud") or found.get("unspecified")
        community = found.get("Community Cloud")
        base = secure or community
        if base is None:
            continue
        as_of = dt.date.fromisoformat(base["as_of"])
        prices, notes = [], ["Per-GPU price of a 1-GPU pod."]
        if secure:
            prices.append(hourly("on-demand", float(secure["price_on_demand_per_hour"]), "USD"))
            notes.append(
                "on-demand = Secure Cloud price."
                if "Secure" in secure["region"]
                else "Cloud tier (Secure/Community) not stated by the transcription."
            )
        if community:
            c_as_of = dt.date.fromisoformat(community["as_of"])
            prices.append(
                hourly(
                    "community",
                    float(community["price_on_demand_per_hour"]),
                    "USD",
                    as_of=c_as_of if c_as_of != as_of else None,
                )
            )
            notes.append("community = Community Cloud price (third-party hosts).")
        notes += [f"Source: {base['source']} ({as_of}).", RUNPOD_NOTE]
        out.append(
            offering(
                provider="runpod",
                instance_type=it,
                regions=["global"],
                gpu=gpu,
                gpu_count=1,
                intra_node="none",
                prices=prices,
                source="https://www.runpod.io/pricing",
                as_of=as_of,
                notes=notes,
            )
        )
    return out


COREWEAVE = {
    # label in cloud_offerings.csv: (GPU id, count, link)
    "HGX H100 8x": ("H100-SXM", 8, "sxm"),
    "HGX H200 8x": ("H200", 8, "sxm"),
    "A100 8x (80GB)": ("A100-80GB", 8, "sxm"),
    "L40S 8x": ("L40S", 8, "pcie"),
    "HGX B200 8x": ("B200", 8, "sxm"),
    "GB200 NVL72 (4-GPU node)": ("GB200", 4, "nvl72"),
    "GH200": ("GH200", 1, "sxm"),
}
COREWEAVE_NOTE = (
    "Hourly list price from a public transcription of https://www.coreweave.com/pricing "
    "(2026-09-20); metering granularity not verified; reserved capacity 'up to 60%' off; "
    "egress free."
)


def build_coreweave(rows: list[dict[str, str]]) -> list[Row]:
    """CoreWeave nodes with on-demand and (where listed) spot prices."""
    rows = [r for r in rows if r["provider"] == "CoreWeave"]
    out = []
    for r in rows:
        if r["instance_type"] not in COREWEAVE:
            SKIPPED.add(("coreweave", r["instance_type"], f"GPU '{r['gpu_model']}' has no GPU id"))
            continue
        gpu, count, link = COREWEAVE[r["instance_type"]]
        prices = [hourly("on-demand", float(r["price_on_demand_per_hour"]), "USD")]
        if m := re.search(r"spot \$([\d.]+)/h", r["notes"]):
            prices.append(hourly("spot", float(m.group(1)), "USD"))
        notes = []
        if link == "nvl72":
            notes.append("One 4-GPU tray of a GB200 NVL72 rack; the NVLink domain spans 72 GPUs.")
        if r["instance_type"] == "A100 8x (80GB)":
            notes.append(
                "The transcription does not state the interconnect; an 8x A100 80GB "
                "node is taken to be an NVSwitch (HGX) board."
            )
        out.append(
            offering(
                provider="coreweave",
                instance_type=r["instance_type"],
                regions=["north-america"],
                gpu=gpu,
                gpu_count=count,
                vcpus=num(r["vcpus"]),
                ram_gb=num(r["ram_gb"]),
                intra_node="nvswitch" if link == "nvl72" else intra_for(count, link),
                prices=prices,
                source="https://www.coreweave.com/pricing",
                as_of=dt.date.fromisoformat(r["as_of"]),
                notes=[*notes, COREWEAVE_NOTE],
            )
        )
    return out
