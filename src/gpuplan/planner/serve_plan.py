"""``gpuplan serve plan``: a device and replica count for every service, at least cost.

1. :func:`~gpuplan.planner.serve_candidates.dedicated_candidates`: every service
   alone on every priced offering it may use (whole GPUs with tensor
   parallelism, vGPU instances), with the replicas its load and SLO need.
2. With ``objective=cost``, :func:`~gpuplan.planner.serve_pack.pack` decides which
   services share a single GPU (time-slicing, MPS or MIG) and which stay on their
   cheapest dedicated placement: an exact MILP. With ``objective=latency`` every
   service takes the dedicated placement with the lowest p99 latency (sharing
   only adds latency), cost breaking ties.
3. The plan reports per service its placement, replicas, expected latency, cost
   per month and per million tokens or requests, and why; per shared GPU who is
   on it and the headroom; and the rejected placements with reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import HOURS_PER_MONTH
from gpuplan.errors import InfeasibleError
from gpuplan.planner.serve_candidates import (
    BinType,
    Candidate,
    Demand,
    EstimateCache,
    Rejected,
    allowed,
    bin_types,
    dedicated_candidates,
    demand,
    region_of,
)
from gpuplan.planner.serve_pack import MILP_MAX_SETS, Packing, pack, prune_dominated
from gpuplan.serve.spec import ServeSpec, ServiceSpec

Objective = Literal["cost", "latency"]
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServicePlan:
    """Where one service runs."""

    service: str
    model: str
    placement: str
    kind: str
    provider: str
    instance_type: str
    region: str
    gpu: str
    device: str
    replicas: int
    instances: float
    latency: dict[str, Any]
    cost_per_month: float
    cost_per_million: float | None
    cost_per_million_unit: str
    shared_with: tuple[str, ...]
    share: float | None
    k8s_resource: str
    memory_bytes: float
    why: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SharedGpu:
    """One GPU several services share."""

    placement: str
    mode: str
    gpu: str
    services: tuple[str, ...]
    cost_per_month: float
    compute_used: float
    compute_headroom: float
    memory_used_bytes: float | None
    memory_headroom_bytes: float | None
    mig_profiles: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServePlan:
    """The whole answer of ``gpuplan serve plan``."""

    objective: str
    currency: str
    services: tuple[ServicePlan, ...]
    shared_gpus: tuple[SharedGpu, ...]
    cost_per_month: float
    dedicated_cost_per_month: float
    method: str
    rejected: tuple[Rejected, ...]
    candidates_considered: int
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` object."""
        return dataclasses.asdict(self)


def _latency_key(c: Candidate) -> tuple[float, float]:
    """End-to-end p99 latency (LLMs: TTFT + output x TPOT), then cost."""
    lat = c.estimate.latency
    value = lat.get("latency_p99_s") or lat.get("ttft_p99_s") or 0.0
    return (float(value), c.cost_per_month)


def _per_million(
    svc: ServiceSpec, kind: str, cost: float, capacity_rps: float
) -> tuple[float | None, str]:
    """Monthly cost per million tokens (LLMs) or requests (others) at the service's load."""
    rps = svc.load.qps or capacity_rps
    if not rps:
        return None, "requests" if kind != "llm" else "tokens"
    if kind != "llm":
        return cost / (rps * SECONDS_PER_MONTH) * 1e6, "requests"
    tokens = rps * (svc.input_tokens + svc.output_tokens) * SECONDS_PER_MONTH
    return cost / tokens * 1e6, "tokens"


def plan_services(
    spec: ServeSpec, cat: Catalog, *, objective: Objective = "cost", currency: str | None = None
) -> ServePlan:
    """Place every service of ``spec`` at the least monthly cost (or the lowest latency).

    Raises:
        InfeasibleError: a service has no placement at all; lists the closest rejections.
    """
    currency = currency or spec.constraints.currency
    cache = EstimateCache()
    rejected: list[Rejected] = []
    cands = dedicated_candidates(spec, cat, cache, currency, rejected.append)
    names = [s.name for s in spec.services]
    types: list[BinType] = bin_types(spec, cat, currency) if objective == "cost" else []
    demands: dict[tuple[str, int], Demand] = {}
    for t, bt in enumerate(types):
        for svc in spec.services:
            if bt.mode not in spec.constraints_of(svc).sharing:
                continue
            if allowed(bt.offering, spec.constraints_of(svc)):
                continue
            d = demand(svc, bt, cache)
            if d is None:
                rejected.append(
                    Rejected(
                        service=svc.name,
                        placement=bt.label,
                        reason="does not fit a share of this GPU at its load and SLO",
                    )
                )
            else:
                demands[(svc.name, t)] = d
    types, demands = prune_dominated(types, demands)
    shareable = {s for s, _ in demands}
    for name in names:
        if not cands[name] and name not in shareable:
            closest = [f"{r.placement}: {r.reason}" for r in rejected if r.service == name][:5]
            raise InfeasibleError(
                f"service {name}: no device in the catalog meets its load and latency targets",
                closest=closest,
                hint="relax slo, lower the load, allow more sharing modes or regions",
            )
    best: dict[str, Candidate] = {}
    for name in names:
        if cands[name]:
            key = (lambda c: (c.cost_per_month,)) if objective == "cost" else _latency_key
            best[name] = min(cands[name], key=key)
    dedicated_cost = {n: best[n].cost_per_month if n in best else float("inf") for n in names}
    if objective == "cost" and types:
        packing = pack(names, dedicated_cost, types, demands)
    else:
        packing = Packing(
            bins=(),
            dedicated=tuple(names),
            cost_per_month=sum(dedicated_cost.values()),
            method="dedicated placements (objective latency: no sharing)",
            optimal=True,
        )
    services, shared = _assemble(spec, packing, best, demands, types, cands)
    baseline = sum(v for v in dedicated_cost.values() if v != float("inf"))
    assumptions = (
        f"prices: the cheapest of {', '.join(spec.constraints.billing) or 'on-demand, monthly, reserved'}"
        f" per offering, hourly x {HOURS_PER_MONTH:g} h a month, converted to {currency} at the "
        "catalog's dated FX rates; spot is left out for serving",
        "whole GPUs: an n-GPU instance hosts n / tp replicas of tensor parallelism tp",
        "shared GPUs (time-slicing, MPS): a service takes qps / (its SLO capacity on the whole "
        "GPU with the measured interference) of the GPU's time and the memory its requests in "
        "flight need; shares add up to at most 1 and memory to the GPU's (no isolation)",
        "MIG: each service takes the smallest profile that meets its load and SLO; compute "
        "slices add up to at most 7 and memory slices to 8 (placement geometry not modelled)",
        "offline and closed-loop (concurrency) services run on dedicated devices",
        f"packing: {packing.method}"
        + ("" if packing.optimal else " (not proven optimal)")
        + f"; exact while at most {MILP_MAX_SETS:,} service sets fit one GPU, first-fit beyond",
        "estimates: see `gpuplan serve estimate` for each placement's assumptions",
    )
    return ServePlan(
        objective=objective,
        currency=currency,
        services=tuple(services),
        shared_gpus=tuple(shared),
        cost_per_month=packing.cost_per_month,
        dedicated_cost_per_month=baseline,
        method=packing.method,
        rejected=tuple(rejected),
        candidates_considered=sum(len(v) for v in cands.values()) + len(demands),
        assumptions=assumptions,
    )


def _assemble(
    spec: ServeSpec,
    packing: Packing,
    best: dict[str, Candidate],
    demands: dict[tuple[str, int], Demand],
    types: list[BinType],
    cands: dict[str, list[Candidate]],
) -> tuple[list[ServicePlan], list[SharedGpu]]:
    by_name = {s.name: s for s in spec.services}
    out: dict[str, ServicePlan] = {}
    shared: list[SharedGpu] = []
    for b in packing.bins:
        t = types.index(b.type)
        ds = [demands[(s, t)] for s in b.services]
        total_share = sum(d.share for d in ds) or 1.0
        profiles: list[str] = []
        for s, d in zip(b.services, ds, strict=True):
            svc = by_name[s]
            cost = b.type.price.per_month * (d.share / total_share)
            per_m, unit = _per_million(svc, d.estimate.kind, cost, d.estimate.capacity_rps)
            others = tuple(x for x in b.services if x != s)
            dedicated = best.get(s)
            why = (
                f"shares one {b.type.gpu.id} ({b.type.mode}) with {', '.join(others) or 'headroom'}"
                + (
                    f"; alone it would cost {dedicated.cost_per_month:,.0f} {spec.constraints.currency}"
                    f"/month on {dedicated.label}"
                    if dedicated
                    else ""
                )
            )
            if b.type.mode == "mig":
                profiles.append(f"{s}={d.device.slice}")
            out[s] = ServicePlan(
                service=s,
                model=svc.model,
                placement=f"{b.type.label}",
                kind=b.type.mode,
                provider=b.type.offering.provider,
                instance_type=b.type.offering.instance_type,
                region=region_of(b.type.offering, spec.constraints_of(svc)),
                gpu=b.type.gpu.id,
                device=d.device.label if b.type.mode == "mig" else f"{b.type.gpu.id} {b.type.mode}",
                replicas=1,
                instances=d.share / total_share,
                latency=_lat(d.estimate),
                cost_per_month=cost,
                cost_per_million=per_m,
                cost_per_million_unit=unit,
                shared_with=others,
                share=d.share,
                k8s_resource=d.device.k8s_resource,
                memory_bytes=float(d.use[1])
                if b.type.mode != "mig"
                else float(d.device.memory_bytes),
                why=why,
            )
        mem_cap = b.type.capacity[1] if b.type.mode != "mig" else None
        shared.append(
            SharedGpu(
                placement=b.type.label,
                mode=b.type.mode,
                gpu=b.type.gpu.id,
                services=b.services,
                cost_per_month=b.type.price.per_month,
                compute_used=b.used[0] / b.type.capacity[0],
                compute_headroom=1 - b.used[0] / b.type.capacity[0],
                memory_used_bytes=b.used[1] if mem_cap else None,
                memory_headroom_bytes=(mem_cap - b.used[1]) if mem_cap else None,
                mig_profiles=tuple(profiles),
            )
        )
    for s in packing.dedicated:
        c = best[s]
        svc = by_name[s]
        per_m, unit = _per_million(
            svc, c.estimate.kind, c.cost_per_month, c.estimate.capacity_rps * c.replicas
        )
        n_options = len(cands[s])
        out[s] = ServicePlan(
            service=s,
            model=svc.model,
            placement=c.label,
            kind=c.device.kind,
            provider=c.offering.provider,
            instance_type=c.offering.instance_type,
            region=c.region,
            gpu=c.device.gpu.id,
            device=c.device.label,
            replicas=c.replicas,
            instances=float(c.instances),
            latency=_lat(c.estimate),
            cost_per_month=c.cost_per_month,
            cost_per_million=per_m,
            cost_per_million_unit=unit,
            shared_with=(),
            share=None,
            k8s_resource=c.device.k8s_resource,
            memory_bytes=float(c.estimate.memory["total_bytes"]),
            why=f"cheapest of {n_options} dedicated placements meeting its load and SLO"
            + (" (no cheaper shared GPU)" if packing.bins or demands else ""),
        )
    return [out[s.name] for s in spec.services], shared


def _lat(est: Any) -> dict[str, Any]:
    keys = ("ttft_p99_s", "tpot_p99_s", "latency_p99_s")
    return {k: est.latency.get(k) for k in keys if est.latency.get(k) is not None}
