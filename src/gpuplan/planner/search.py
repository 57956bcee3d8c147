"""Search every offering x node count x strategy x billing mode; rank, explain, reject.

Prices are per region: for each offering and billing mode the planner takes
the cheapest region allowed by ``constraints.regions`` (converted to the plan's
currency with the dated FX rates; the data's region wins a tie), so one option
is ranked per offering and mode, never one per region. The option names that
region, the regions that charge the same, and how many others were priced.

Deterministic: the same spec, catalog and settings give the same plan (ties
are broken by provider, instance type, region, billing mode and node count).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from gpuplan import __version__
from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import SCHEMA_VERSION, GpuSpec, Offering, Price
from gpuplan.cost import CostOptions, DataPlan, Location, SpotRisk, Startup, job_cost
from gpuplan.errors import GpuPlanError, InfeasibleError, MissingInputError
from gpuplan.estimate import comm
from gpuplan.estimate.calibration import efficiencies
from gpuplan.estimate.configure import Configuration, configure
from gpuplan.planner.explain import explain, warnings_for
from gpuplan.planner.model import DEFAULT_MAX_GPUS, Option, Plan, PlanSettings, Rejection
from gpuplan.planner.pareto import pareto_front
from gpuplan.spec import JobSpec


def _allowed(off: Offering, spec: JobSpec) -> str | None:
    """Why an offering breaks the spec's constraints, or None."""
    c = spec.constraints
    if c.providers and off.provider not in c.providers:
        return f"provider {off.provider} not in constraints.providers"
    if c.regions and not any(want.lower() in r.lower() for want in c.regions for r in off.regions):
        return f"no region matching constraints.regions {list(c.regions)}"
    missing = [tag for tag in c.compliance if tag not in off.compliance]
    if missing:
        return (
            f"lacks compliance {', '.join(missing)} (offering states "
            f"{list(off.compliance) or 'none'}); if your own deployment holds it, declare it "
            f"in your overrides file: compliance_declarations: [{{provider: {off.provider}, "
            f"tag: {missing[0]}, reference: <your certificate or filing no.>, as_of: "
            "YYYY-MM-DD}] (README, Compliance)"
        )
    if c.bare_metal_only and off.hosting != "bare-metal":
        return f"{off.hosting}, not bare metal (constraints.bare_metal_only)"
    return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PriceChoice:
    """The price an option is costed at, and where.

    Attributes:
        price: the catalog price (in its published currency).
        region: the region whose price it is (the cheapest allowed one).
        same_price: every allowed region charging this same price, ``region`` first.
        priced_regions: allowed regions with any price in this mode.
    """

    price: Price
    region: str
    same_price: tuple[str, ...]
    priced_regions: int


def _allowed_regions(off: Offering, spec: JobSpec) -> tuple[str, ...]:
    wanted = [w.lower() for w in spec.constraints.regions]
    if not wanted:
        return off.regions
    return tuple(r for r in off.regions if any(w in r.lower() for w in wanted))


def _data_region(off: Offering, spec: JobSpec) -> str | None:
    src = spec.data.source if spec.data is not None else None
    if src is not None and src.provider == off.provider:
        return src.region
    return None


def price_choices(
    off: Offering, spec: JobSpec, modes: set[str], catalog: Catalog, currency: str
) -> list[PriceChoice]:
    """One price per billing mode: the cheapest allowed region's (the data's region on a tie)."""
    regions = _allowed_regions(off, spec)
    allowed = set(regions)
    near = _data_region(off, spec)
    out: list[PriceChoice] = []
    by_mode: dict[str, list[Price]] = {}
    for p in off.prices:
        if not modes or p.mode in modes:
            by_mode.setdefault(p.mode, []).append(p)
    for found in by_mode.values():
        # a region takes the first price of the mode that names it (Offering.price's rule)
        taken: set[str] = set()
        ranked: list[tuple[float, bool, str, Price]] = []
        counted = 0
        for price in found:
            where = [r for r in off.price_regions(price) if r in allowed and r not in taken]
            if not where:
                continue
            taken.update(where)
            counted += len(where)
            amount = round(catalog.convert(price.hourly_equivalent, price.currency, currency), 9)
            ranked.extend((amount, r != near, r, price) for r in where)
        if not ranked:
            continue
        best = min(ranked, key=lambda t: t[:3])
        same = tuple(r for _a, _n, r, p in sorted(ranked, key=lambda t: t[:3]) if p is best[3])
        out.append(
            PriceChoice(price=best[3], region=best[2], same_price=same, priced_regions=counted)
        )
    return out


def _node_counts(off: Offering, max_gpus: int) -> Iterator[int]:
    per_node = max(1, int(off.gpu_count))
    n = 1
    while n * per_node <= max_gpus:
        yield n
        if off.gpu_count < 1:
            return
        n *= 2


def _topology(off: Offering, nodes: int) -> comm.Topology:
    per_node = max(1, int(off.gpu_count))
    fraction = off.gpu_count if off.gpu_count < 1 else 1.0
    intra = off.intra_node if per_node > 1 else "none"
    return comm.Topology(
        gpus=per_node * nodes,
        gpus_per_node=per_node,
        intra_node=intra,
        inter_node_gbps=off.inter_node_gbps,
        fabric=off.fabric,
        hosting=off.hosting,
        compute_fraction=fraction,
    )


def _cost_options(spec: JobSpec, settings: PlanSettings) -> CostOptions:
    data = None
    if spec.data is not None:
        src = spec.data.source
        data = DataPlan(
            dataset_gb=spec.data.dataset_gb,
            dataset_source=Location(provider=src.provider, region=src.region) if src else None,
            checkpoint_gb=spec.data.checkpoint_gb,
            results_out_gb=spec.data.results_gb,
            results_destination=None,
        )
    return CostOptions(
        startup=Startup(
            provisioning_s=settings.provisioning_s,
            image_pull_s=settings.image_pull_s,
            cold_start_s=settings.cold_start_s,
        ),
        commitment=settings.commitment,  # type: ignore[arg-type]
        spot=SpotRisk(
            interruptions_per_hour=settings.spot_interruptions_per_hour,
            checkpoint_interval_s=settings.checkpoint_interval_s,
            restart_s=settings.restart_s,
        ),
        data=data,
    )


RISKS = ("low", "medium", "high")


def _unsure(o: Option, risk: str) -> int:
    """1 for an option whose memory is only ``tight``, where the risk setting ranks it later."""
    return int(risk != "high" and o.configuration.fit.verdict == "tight")


def _sort_key(objective: str, o: Option, risk: str = "high") -> tuple[Any, ...]:
    tie = (o.provider, o.instance_type, o.region, o.billing_mode, o.nodes)
    if objective == "time":
        return (o.time_s, _unsure(o, risk), o.cost_total, *tie)
    return (o.cost_total, _unsure(o, risk), o.time_s, *tie)


def _margin(spec: JobSpec, settings: PlanSettings, gpus: int, gpus_per_node: int) -> float:
    """The memory margin for ``configure``: with ``--risk low``, room for the upper bound."""
    if settings.risk != "low":
        return settings.safety_margin
    from gpuplan.estimate.bounds import bounds_for, margin_for_sure_fit
    from gpuplan.estimate.fit import strategy_class
    from gpuplan.estimate.strategy import Strategy

    classes = {
        strategy_class(spec, Strategy(tp=tp), gpus, gpus_per_node)
        for tp in ((1, 2) if gpus > 1 else (1,))
    }
    hi = max(bounds_for("memory", c).hi for c in classes)
    return max(settings.safety_margin, margin_for_sure_fit(hi))


def _configure(
    spec: JobSpec,
    settings: PlanSettings,
    off: Offering,
    gpu: GpuSpec,
    topo: comm.Topology,
    *,
    sure: bool,
) -> Configuration | GpuPlanError:
    """The offering's configuration (``sure``: prefer micro-batches whose upper bound fits), or
    why it has none."""
    try:
        return configure(
            spec,
            gpu,
            topo.gpus,
            topo,
            margin=_margin(spec, settings, topo.gpus, topo.gpus_per_node),
            capacity=off.gpu_memory_bytes,
            with_scaling=False,
            prefer_sure=sure,
        )
    except GpuPlanError as exc:
        return exc


def _misses(o: Option, deadline: float | None, budget: float | None) -> bool:
    """Whether ``o`` misses the spec's deadline or budget."""
    return (deadline is not None and o.time_s > deadline) or (
        budget is not None and o.cost_total > budget
    )


def plan(spec: JobSpec, catalog: Catalog, settings: PlanSettings | None = None) -> Plan:
    """Plan ``spec`` over the whole catalog.

    Raises:
        MissingInputError: the spec has no ``work`` (time and cost need it).
        InfeasibleError: nothing meets the constraints; carries the closest rejections.
    """
    settings = settings or PlanSettings()
    if spec.work is None:
        raise MissingInputError(
            "work: plan needs how much training to do",
            hint="add `work: {tokens: 1e9}` (or {samples, epochs} / {steps})",
        )
    currency = spec.constraints.currency
    catalog.convert(1.0, "USD", currency)  # unknown currency fails early, naming it
    max_gpus = settings.max_gpus or spec.constraints.max_gpus or DEFAULT_MAX_GPUS
    options_cost = _cost_options(spec, settings)
    modes = set(spec.constraints.billing)
    deadline = spec.constraints.deadline
    budget = spec.constraints.budget
    options: list[Option] = []
    rejected: list[Rejection] = []
    configs: dict[tuple[Any, ...], Configuration | GpuPlanError] = {}
    fast_configs: dict[tuple[Any, ...], Configuration | GpuPlanError] = {}
    considered = 0
    for off in sorted(catalog.offerings, key=lambda o: (o.provider, o.instance_type, o.regions)):
        why_not = _allowed(off, spec)
        if why_not:
            rejected.append(_offering_rejection(off, why_not))
            continue
        prices = price_choices(off, spec, modes, catalog, currency)
        if not prices:
            if not off.prices:
                reason = "no price in the catalog"
            elif not any(not modes or p.mode in modes for p in off.prices):
                reason = f"no price in the allowed billing modes {sorted(modes)}"
            else:
                reason = f"no price in a region matching constraints.regions {list(spec.constraints.regions)}"
            rejected.append(_offering_rejection(off, reason))
            continue
        gpu = catalog.gpu(off.gpu)
        for nodes in _node_counts(off, max_gpus):
            if nodes > 1 and not off.inter_node_gbps:
                rejected.append(
                    _offering_rejection(
                        off,
                        "multi-node: the catalog states no network bandwidth for this instance",
                        nodes=nodes,
                    )
                )
                break
            topo = _topology(off, nodes)
            # one node: the network does not matter, so offerings share the configuration
            shared = dataclasses.replace(
                topo,
                hosting="vgpu-slice" if topo.hosting == "vgpu-slice" else "bare-metal",
                inter_node_gbps=topo.inter_node_gbps if nodes > 1 else None,
                fabric=topo.fabric if nodes > 1 else None,
            )
            key = (gpu.id, shared, off.gpu_memory_bytes)
            if key not in configs:
                # --risk high ranks by the estimate alone: the fastest micro-batch it fits
                configs[key] = _configure(
                    spec, settings, off, gpu, topo, sure=settings.risk != "high"
                )
            conf = configs[key]
            if isinstance(conf, GpuPlanError):
                rejected.append(_offering_rejection(off, conf.message, nodes=nodes))
                if not isinstance(conf, InfeasibleError):
                    break  # network unknown or precision unsupported: more nodes will not help
                continue
            run_s = conf.time.time_to_train_s or 0.0
            for price in prices:
                considered += 1
                try:
                    opt = _option(
                        off, price, nodes, conf, run_s, spec, catalog, currency, options_cost
                    )
                    if settings.risk == "medium" and _misses(opt, deadline, budget):
                        # a sure micro-batch that misses the deadline or the budget gives way to
                        # the faster tight one where that one meets them (it ranks as tight)
                        if key not in fast_configs:
                            fast_configs[key] = _configure(
                                spec, settings, off, gpu, topo, sure=False
                            )
                        fast = fast_configs[key]
                        if (
                            isinstance(fast, Configuration)
                            and fast.fit.strategy != conf.fit.strategy
                        ):
                            alt = _option(
                                off,
                                price,
                                nodes,
                                fast,
                                fast.time.time_to_train_s or 0.0,
                                spec,
                                catalog,
                                currency,
                                options_cost,
                            )
                            opt = opt if _misses(alt, deadline, budget) else alt
                    options.append(opt)
                except GpuPlanError as exc:
                    rejected.append(
                        _offering_rejection(
                            off, exc.message, nodes=nodes, billing_mode=price.price.mode
                        )
                    )
    feasible: list[Option] = []
    for o in options:
        if settings.risk == "low" and o.configuration.fit.verdict != "fits":
            rejected.append(
                _reject(o, f"memory {_tight_reason(o)}; --risk low keeps sure fits only")
            )
        elif deadline is not None and o.time_s > deadline:
            rejected.append(
                _reject(
                    o, f"misses the deadline: {o.time_s / 3600:.1f} h > {deadline / 3600:.1f} h"
                )
            )
        elif budget is not None and o.cost_total > budget:
            rejected.append(
                _reject(o, f"over budget: {o.cost_total:,.2f} > {budget:,.2f} {currency}")
            )
        else:
            feasible.append(o)
    if not feasible:
        near = sorted(
            (r for r in rejected if r.time_s is not None),
            key=lambda r: (
                (r.time_s or 0) / (deadline or 1) + (r.cost_total or 0) / (budget or 1e18)
            ),
        )
        closest = [
            f"{r.provider} {r.instance_type} x{r.nodes} ({r.billing_mode}): {r.reason}"
            for r in near[:5]
        ]
        if not closest:
            closest = [f"{r.provider} {r.instance_type}: {r.reason}" for r in rejected[:5]]
        raise InfeasibleError(
            f"no option meets the spec ({len(rejected)} rejected); closest: "
            + "; ".join(closest[:3]),
            closest=closest,
            hint="relax constraints.deadline or budget, allow more providers, or raise --max-gpus",
        )
    objective = settings.objective
    front = pareto_front(feasible)
    risk = settings.risk
    ranked = sorted(
        front if objective == "pareto" else feasible,
        key=lambda o: _sort_key(objective, o, risk),
    )
    if objective == "pareto":
        ranked = sorted(ranked, key=lambda o: _sort_key("time", o, risk))
    cheapest = min(feasible, key=lambda o: _sort_key("cost", o))
    fastest = min(feasible, key=lambda o: _sort_key("time", o))
    top = [
        dataclasses.replace(
            o,
            why=_with_risk(explain(o, cheapest=cheapest, fastest=fastest, spec=spec), o, risk),
            warnings=(
                *warnings_for(o, feasible, cheapest),
                *((f"{o.label()}: memory {_tight_reason(o)}",) if _is_tight(o) else ()),
            ),
        )
        for o in ranked[: settings.top]
    ]
    eff = efficiencies()
    provenance = {
        "gpuplan_version": __version__,
        "catalog_schema_version": SCHEMA_VERSION,
        "catalog_files": list(catalog.files),
        "fx": {
            "per_usd": catalog.fx.per_usd,
            "as_of": catalog.fx.as_of.isoformat(),
            "source": catalog.fx.source,
        },
        "efficiency": {
            name: {
                "gemm": a.gemm,
                "gemm_fp8": a.gemm_fp8,
                "hbm": a.hbm,
                "step_overhead": a.step_overhead,
                "basis": a.basis,
            }
            for name, a in eff.archs.items()
        },
        "price_as_of": sorted({o.price_as_of for o in top}),
    }
    assumptions = (
        f"spot: {settings.spot_interruptions_per_hour:g} interruptions per instance-hour, checkpoint every "
        f"{settings.checkpoint_interval_s / 60:.0f} min, {settings.restart_s / 60:.0f} min to restart (stated, "
        "not published by providers; change with --spot-rate/--checkpoint-interval)",
        f"startup billed: {settings.provisioning_s:.0f} s provisioning + {settings.image_pull_s:.0f} s image "
        f"pull + {settings.cold_start_s:.0f} s cold start",
        f"monthly/reserved prices charged as whole terms ({settings.commitment})",
        "multi-node only where the offering states its network bandwidth",
    )
    plan_warnings = tuple(sorted({w for o in top for w in o.warnings}))
    return Plan(
        options=tuple(top),
        pareto=tuple(sorted(front, key=lambda o: _sort_key("time", o))),
        rejected=tuple(rejected),
        currency=currency,
        objective=objective,
        provenance=provenance,
        assumptions=assumptions,
        warnings=plan_warnings,
        considered=considered,
    )


def _is_tight(o: Option) -> bool:
    return o.configuration.fit.verdict == "tight"


def _tight_reason(o: Option) -> str:
    fit = o.configuration.fit
    m = fit.memory
    hi = fit.bounds()["device_used_bytes"][1]
    return (
        f"tight: the estimate ({m.device_used_bytes / 2**30:.1f} GiB) fits the "
        f"{m.capacity_bytes / 2**30:.1f} GiB but its 80% upper bound ({hi / 2**30:.1f} GiB) "
        "does not, so the run may run out of memory"
    )


def _with_risk(why: str, o: Option, risk: str) -> str:
    """The option's reasons, with why a tight option ranks where it does."""
    if not _is_tight(o):
        return why
    rank = (
        "ranked after sure options at equal cost (--risk medium)"
        if risk == "medium"
        else "ranked by the estimate alone (--risk high)"
    )
    return f"{why}; memory {_tight_reason(o)}; {rank}"


def _offering_rejection(
    off: Offering, reason: str, *, nodes: int = 0, billing_mode: str = ""
) -> Rejection:
    """A rejection of an offering before any option was priced."""
    return Rejection(
        provider=off.provider,
        instance_type=off.instance_type,
        reason=reason,
        gpu=off.gpu,
        nodes=nodes,
        billing_mode=billing_mode,
    )


def _reject(o: Option, reason: str) -> Rejection:
    return Rejection(
        provider=o.provider,
        instance_type=o.instance_type,
        reason=reason,
        gpu=o.gpu,
        nodes=o.nodes,
        billing_mode=o.billing_mode,
        time_s=o.time_s,
        cost_total=o.cost_total,
    )


def _option(
    off: Offering,
    choice: PriceChoice,
    nodes: int,
    conf: Configuration,
    run_s: float,
    spec: JobSpec,
    catalog: Catalog,
    currency: str,
    options_cost: CostOptions,
) -> Option:
    price, region = choice.price, choice.region
    cost = job_cost(
        off,
        price,
        nodes,
        run_s,
        catalog=catalog,
        currency=currency,
        options=options_cost,
        region=region,
    )
    wall = cost.run_s + cost.startup_s + cost.spot_overhead_s
    tokens = None
    if conf.time.tokens_per_s is not None:
        tokens = conf.time.tokens_per_s * run_s
    return Option(
        provider=off.provider,
        instance_type=off.instance_type,
        region=region,
        regions=off.regions,
        price_regions=choice.same_price,
        priced_regions=choice.priced_regions,
        price_amount=_amount(price),
        billing_mode=price.mode,
        nodes=nodes,
        gpus=conf.topology.gpus,
        gpu=off.gpu,
        configuration=conf,
        cost=cost,
        time_s=wall,
        tokens=tokens,
        price_as_of=str(price.as_of or off.as_of),
        price_source=price.source or off.source,
    )


def _amount(price: Price) -> dict[str, Any]:
    """The price as published: amount, unit and currency (not converted)."""
    for unit in ("per_hour", "per_month", "per_year"):
        value = getattr(price, unit)
        if value is not None:
            out: dict[str, Any] = {"amount": value, "unit": unit, "currency": price.currency}
            if price.derived:
                out["derived"] = price.derived
            return out
    raise AssertionError("a price has an amount")  # pragma: no cover - schema guarantees it
