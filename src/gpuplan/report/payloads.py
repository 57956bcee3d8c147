"""The JSON payloads of ``plan``, ``fit``, ``estimate``, ``catalog offerings`` and ``serve plan``.

One builder per command, shared by the CLI's ``--json`` and the web API, so
both print exactly the same document. Builders only format results; they
never recompute them (``fit_rows`` runs the per-GPU fits the table needs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import GpuSpec, Offering
from gpuplan.errors import SpecError
from gpuplan.estimate.comm import Topology
from gpuplan.estimate.configure import Configuration
from gpuplan.estimate.fit import FitResult, fit
from gpuplan.planner.model import Plan
from gpuplan.planner.serve_plan import ServePlan
from gpuplan.spec import JobSpec


def plan_payload(result: Plan) -> dict[str, Any]:
    """The machine-readable plan (contract: ``options`` best first, ``rejected``)."""
    return {
        "objective": result.objective,
        "currency": result.currency,
        "options": [o.as_dict() for o in result.options],
        "pareto": [
            {
                "provider": o.provider,
                "instance_type": o.instance_type,
                "region": o.region,
                "billing_mode": o.billing_mode,
                "nodes": o.nodes,
                "time_s": o.time_s,
                "cost_total": round(o.cost_total, 4),
            }
            for o in result.pareto
        ],
        "rejected": [r.as_dict() for r in result.rejected],
        "considered": result.considered,
        "warnings": list(result.warnings),
        "assumptions": list(result.assumptions),
        "provenance": result.provenance,
    }


def fit_payload(result: FitResult, count: int) -> dict[str, Any]:
    """``fit --gpu G --json``: one GPU's strategy and memory breakdown."""
    return {
        "gpu": result.gpu.id,
        "count": count,
        "strategy": result.strategy.as_contract(),
        "memory": result.as_contract(),
    }


def fit_rows(spec: JobSpec, catalog: Catalog, gpus: int, *, margin: float) -> list[dict[str, Any]]:
    """``fit --json`` without ``--gpu``: one row per catalog GPU, smallest memory first."""
    rows: list[dict[str, Any]] = []
    for g in sorted(catalog.gpus, key=lambda g: (g.memory_bytes, g.id)):
        try:
            r = fit(spec, g, gpus, margin=margin)
        except SpecError as exc:
            rows.append({"gpu": g.id, "fits": False, "verdict": "no", "reason": exc.one_line()})
            continue
        rows.append(
            {
                "gpu": g.id,
                "fits": r.memory.fits,
                "verdict": r.verdict,
                "device_used_bytes": round(r.memory.device_used_bytes),
                "device_used_bounds_bytes": [round(v) for v in r.bounds()["device_used_bytes"]],
                "capacity_bytes": round(r.memory.capacity_bytes),
                "headroom_bytes": round(r.memory.headroom_bytes),
                "max_micro_batch": r.max_micro_batch,
                "strategy": r.strategy.as_contract(),
            }
        )
    return rows


def estimate_payload(
    conf: Configuration, gpu: GpuSpec, count: int, topo: Topology
) -> dict[str, Any]:
    """``estimate --json``: memory, time, strategy and topology of one configuration."""
    return {
        "gpu": gpu.id,
        "count": count,
        "strategy": conf.strategy.as_contract(),
        "memory": conf.fit.as_contract(),
        "time": conf.time_contract(),
        "topology": {
            "gpus_per_node": topo.gpus_per_node,
            "intra_node": topo.intra_node,
            "inter_node_gbps": topo.inter_node_gbps,
            "fabric": topo.fabric,
            "hosting": topo.hosting,
        },
    }


def offering_row(
    off: Offering, catalog: Catalog, currency: str, region: str | None = None
) -> dict[str, Any]:
    """An offering as ``catalog offerings --json`` prints it: the row, its cheapest price
    per mode (``hourly``, converted to ``currency``) and every price per region as
    published (``region_prices``); ``region`` keeps the regions containing it."""
    hourly: dict[str, float] = {}
    per_region = []
    for mode in dict.fromkeys(p.mode for p in off.prices):
        for r, p in off.region_prices(mode):
            if region and region.lower() not in r.lower():
                continue
            amount = round(catalog.convert(p.hourly_equivalent, p.currency, currency), 4)
            hourly[mode] = min(amount, hourly.get(mode, amount))
            per_region.append(
                {
                    "region": r,
                    "mode": mode,
                    "hourly_equivalent": p.hourly_equivalent,
                    "currency": p.currency,
                    "hourly_converted": amount,
                }
            )
    return {
        **off.model_dump(mode="json"),
        "hourly": hourly,
        "hourly_currency": currency,
        "region_prices": per_region,
    }


def select_offerings(
    catalog: Catalog,
    *,
    gpu: str | None = None,
    providers: Iterable[str] = (),
    region: str | None = None,
    max_price: float | None = None,
    currency: str = "USD",
) -> tuple[Offering, ...]:
    """The offerings ``catalog offerings`` lists for these filters, in its order."""
    catalog.convert(1.0, "USD", currency)  # validates the currency early
    rows = catalog.filter_offerings(
        gpu=gpu,
        providers=tuple(providers),
        region=region,
        max_price_per_hour=max_price,
        currency=currency,
    )
    return tuple(sorted(rows, key=lambda o: (o.provider, o.gpu, o.gpu_count, o.instance_type)))


def offerings_payload(
    catalog: Catalog, rows: Iterable[Offering], currency: str, region: str | None = None
) -> list[dict[str, Any]]:
    """``catalog offerings --json``."""
    return [offering_row(o, catalog, currency, region) for o in rows]


def serve_plan_payload(result: ServePlan) -> dict[str, Any]:
    """``serve plan --json``: every service's placement, the shared GPUs, the rejections."""
    return result.as_dict()
