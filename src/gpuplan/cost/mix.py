"""Recurring use: commitment vs on-demand per offering, the cheapest mix, auto-stop savings.

Prices are per region: each offering is costed in every allowed region whose
prices differ, and the region with the cheapest best strategy is kept (named,
with the regions at the same prices). Each commitment price is quoted with its
break-even utilization against on-demand in the same region.

Each instance level of :mod:`gpuplan.cost.runs` is an independent choice: pay
its runs on demand, or commit (monthly or reserved) and pay the whole month
whatever the use. Committing level ``j`` pays off when its monthly on-demand
cost exceeds the commitment's monthly price; levels are nested, so the cheapest
mix commits the ``k`` most-used levels and bursts the rest on demand. Every
``k`` is evaluated. Amounts are per 730-hour month: a week repeats 730/168
times; a trace of length ``D`` is scaled by 730 h / ``D``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import HOURS_PER_MONTH, Offering, Price
from gpuplan.cost.billing import COMMITMENT_MODES, TERM_HOURS, break_even_utilization, term_price
from gpuplan.cost.money import FxUse, fx_rate, fx_use
from gpuplan.cost.runs import MONTH_S, Levels, instance_levels
from gpuplan.cost.usage import Usage
from gpuplan.errors import InfeasibleError, UnknownNameError

StrategyKind = Literal["on-demand", "on-demand+autostop", "commitment", "mix"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One way to buy the capacity, per month.

    Attributes:
        kind: ``on-demand``, ``on-demand+autostop``, ``commitment`` or ``mix``.
        name: short label.
        monthly_cost: total per 730-hour month, in the report's currency.
        committed_instances: instances on a commitment.
        commitment_mode: monthly / reserved-1y / reserved-3y, or None.
        committed_cost: the commitments' monthly cost.
        on_demand_cost: the on-demand part's monthly cost.
        on_demand_instance_hours: billed on-demand instance-hours per month.
        autostop: whether on-demand instances stop after the auto-stop delay.
    """

    kind: StrategyKind
    name: str
    monthly_cost: float
    committed_instances: int
    commitment_mode: str | None
    committed_cost: float
    on_demand_cost: float
    on_demand_instance_hours: float
    autostop: bool

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        d = dataclasses.asdict(self)
        for key in ("monthly_cost", "committed_cost", "on_demand_cost", "on_demand_instance_hours"):
            d[key] = round(d[key], 4)
        return d


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AutostopSavings:
    """What auto-stop saves on pure on-demand capacity, per month.

    Attributes:
        monthly_savings: on-demand cost without auto-stop minus with it.
        percent: savings as a percentage of the cost without auto-stop.
        idle_instance_hours_removed: idle instance-hours no longer running.
        autostop_tail_instance_hours: instance-hours still running for the auto-stop delay.
        rounding_instance_hours_without: billing increments/minimums added without auto-stop.
        rounding_instance_hours_with: the same with auto-stop (more, shorter runs).
    """

    monthly_savings: float
    percent: float
    idle_instance_hours_removed: float
    autostop_tail_instance_hours: float
    rounding_instance_hours_without: float
    rounding_instance_hours_with: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {k: round(v, 4) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CommitmentQuote:
    """One commitment price of an offering, per instance, and when it pays off.

    Attributes:
        mode: monthly / reserved-1y / reserved-3y.
        per_month: its cost per instance per 730-hour month, in the report's currency.
        per_hour: the same spread over the month's hours.
        break_even: share of the term an instance must be busy for the commitment to cost
            no more than on-demand in the same region (None without an on-demand price).
        derived: how the price was derived when it is not listed (a published rule).
        source: where the price comes from.
    """

    mode: str
    per_month: float
    per_hour: float
    break_even: float | None
    derived: str | None
    source: str

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {
            "mode": self.mode,
            "per_month": round(self.per_month, 4),
            "per_hour": round(self.per_hour, 6),
            "break_even_utilization": None
            if self.break_even is None
            else round(self.break_even, 4),
            "derived": self.derived,
            "source": self.source,
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OfferingBill:
    """The strategies for one offering, cheapest first, with the reasons.

    Attributes:
        provider: provider id.
        instance_type: instance type.
        gpus_per_instance: GPUs per instance.
        regions: the offering's regions.
        region: the region costed (the cheapest of the allowed ones).
        price_regions: allowed regions with the same prices as ``region`` (``region`` first).
        commitments: every commitment price in ``region``, with its break-even utilization.
        instances_peak: instances needed at the busiest moment.
        strategies: every strategy costed, cheapest first.
        best: the cheapest strategy.
        autostop: savings of auto-stop on pure on-demand; None without an on-demand price.
        unknown: parts whose rate is unknown, so the amounts are lower bounds.
        not_costed: strategies left out for lack of a price in the catalog.
        assumptions: numbers and rules behind the amounts.
        sources: price and billing-rule sources.
        fx: conversions used.
    """

    provider: str
    instance_type: str
    gpus_per_instance: float
    regions: tuple[str, ...]
    region: str
    price_regions: tuple[str, ...]
    commitments: tuple[CommitmentQuote, ...]
    instances_peak: int
    strategies: tuple[Strategy, ...]
    best: Strategy
    autostop: AutostopSavings | None
    unknown: tuple[str, ...]
    not_costed: tuple[str, ...]
    assumptions: tuple[str, ...]
    sources: tuple[str, ...]
    fx: tuple[FxUse, ...]

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "gpus_per_instance": self.gpus_per_instance,
            "regions": list(self.regions),
            "region": self.region,
            "price_regions": list(self.price_regions),
            "commitments": [c.as_dict() for c in self.commitments],
            "instances_peak": self.instances_peak,
            "best": self.best.name,
            "best_monthly_cost": round(self.best.monthly_cost, 4),
            "strategies": [s.as_dict() for s in self.strategies],
            "autostop": None if self.autostop is None else self.autostop.as_dict(),
            "unknown": list(self.unknown),
            "not_costed": list(self.not_costed),
            "assumptions": list(self.assumptions),
            "sources": list(self.sources),
            "fx": [
                {"from": f.from_currency, "to": f.to_currency, "rate": f.rate,
                 "as_of": f.as_of.isoformat(), "source": f.source}
                for f in self.fx
            ],
        }  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BillReport:
    """``gpuplan bill``'s answer: every matching offering, cheapest first.

    Attributes:
        gpu: GPU id.
        currency: ISO code of every amount.
        origin: where the usage came from.
        busy_gpu_hours_per_month: GPU-hours of work per month.
        on_gpu_hours_per_month: GPU-hours powered on per month without auto-stop.
        peak_busy_gpus: most GPUs busy at once.
        autostop_after_s: auto-stop delay used.
        offerings: per-offering results, cheapest best strategy first.
        skipped: (provider:instance_type, reason) for offerings not costed.
        assumptions: report-wide assumptions.
    """

    gpu: str
    currency: str
    origin: str
    busy_gpu_hours_per_month: float
    on_gpu_hours_per_month: float
    peak_busy_gpus: int
    autostop_after_s: float
    offerings: tuple[OfferingBill, ...]
    skipped: tuple[tuple[str, str], ...]
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {
            "gpu": self.gpu,
            "currency": self.currency,
            "origin": self.origin,
            "busy_gpu_hours_per_month": round(self.busy_gpu_hours_per_month, 4),
            "on_gpu_hours_per_month": round(self.on_gpu_hours_per_month, 4),
            "peak_busy_gpus": self.peak_busy_gpus,
            "autostop_after_s": self.autostop_after_s,
            "assumptions": list(self.assumptions),
            "offerings": [o.as_dict() for o in self.offerings],
            "skipped": [{"offering": k, "reason": r} for k, r in self.skipped],
        }


def _source(offering: Offering, price: Price) -> str:
    where = f"{offering.provider}:{offering.instance_type} {price.mode}"
    return f"{where}: {price.source or offering.source}"


def bill_offering(
    offering: Offering,
    usage: Usage,
    *,
    catalog: Catalog,
    currency: str,
    regions: tuple[str, ...] | None = None,
) -> OfferingBill | str:
    """Cost the usage on one offering: pure strategies and the cheapest mix.

    Every allowed region with its own set of prices is costed; the region with the
    cheapest best strategy is kept (ties: the first region in order).

    Args:
        offering: the catalog offering.
        usage: the recurring use.
        catalog: the loaded catalog (FX rates).
        currency: the report's currency.
        regions: the regions allowed; None = every region of the offering.

    Returns:
        The result, or a one-line reason the offering cannot be costed.
    """
    if offering.gpu_count < 1:
        return "fractional GPU slice: not usable for whole-GPU demand"
    wanted = offering.regions if regions is None else regions
    groups: dict[tuple[int, ...], list[str]] = {}
    for region in wanted:
        prices = [offering.price(m, region) for m in ("on-demand", *COMMITMENT_MODES)]
        if any(p is not None for p in prices):
            groups.setdefault(tuple(id(p) for p in prices), []).append(region)
    if not groups:
        return "no on-demand or monthly/reserved price in the catalog"
    best: OfferingBill | None = None
    for members in groups.values():
        res = _bill_at(offering, usage, members, catalog=catalog, currency=currency)
        if best is None or res.best.monthly_cost < best.best.monthly_cost - 1e-9:
            best = res
    assert best is not None
    return best


def _bill_at(
    offering: Offering, usage: Usage, regions: list[str], *, catalog: Catalog, currency: str
) -> OfferingBill:
    """The bill in ``regions``, which all charge the same prices."""
    region = regions[0]
    od = offering.price("on-demand", region)
    commits = [p for m in COMMITMENT_MODES if (p := offering.price(m, region)) is not None]
    timeline = usage.timeline
    per_inst = offering.gpu_count
    notes: list[str] = [
        f"{per_inst:g} GPU(s) per instance: ceil(busy GPUs / {per_inst:g}) instances at each moment"
    ]
    unknown: list[str] = []
    not_costed: list[str] = []
    sources: list[str] = []
    fx: list[FxUse] = []
    hours = 1.0 / 3600.0
    strategies: list[Strategy] = []
    autostop: AutostopSavings | None = None
    levels: Levels | None = None
    od_hourly = 0.0
    if od is not None:
        rate = fx_rate(catalog.fx, od.currency, currency)
        od_hourly = od.hourly_equivalent * rate
        sources.append(_source(offering, od))
        _note_fx(catalog, od.currency, currency, fx)
        levels = instance_levels(timeline, per_inst, od, usage.autostop_after_s)
        if od.granularity_s is None:
            unknown.append(
                f"rounding: no billing increment for {offering.provider} in the catalog; runs "
                "billed at their exact length (a lower bound)"
            )
        else:
            notes.append(
                f"on-demand {od_hourly:.4g} {currency}/h per instance, {od.granularity_s} s "
                f"increments, {od.minimum_s or 0} s minimum per run"
            )
        no_auto = sum(levels.on_billed) * hours * od_hourly
        auto = sum(levels.auto_billed) * hours * od_hourly
        strategies.append(_pure_od("on-demand, no auto-stop", no_auto, levels, False))
        strategies.append(_pure_od("on-demand + auto-stop", auto, levels, True))
        autostop = AutostopSavings(
            monthly_savings=no_auto - auto,
            percent=0.0 if no_auto == 0 else 100.0 * (no_auto - auto) / no_auto,
            idle_instance_hours_removed=(sum(levels.on_exact) - sum(levels.auto_exact)) * hours
            + levels.tail * hours,
            autostop_tail_instance_hours=levels.tail * hours,
            rounding_instance_hours_without=(sum(levels.on_billed) - sum(levels.on_exact)) * hours,
            rounding_instance_hours_with=(sum(levels.auto_billed) - sum(levels.auto_exact)) * hours,
        )
    peak = levels.peak_busy if levels else math.ceil(timeline.peak_busy_gpus / per_inst - 1e-9)
    quotes: list[CommitmentQuote] = []
    for price in commits:
        rate = fx_rate(catalog.fx, price.currency, currency)
        term = term_price(
            per_hour=price.per_hour,
            per_month=price.per_month,
            per_year=price.per_year,
            mode=price.mode,
        )
        per_month = term * rate / (TERM_HOURS[price.mode] / HOURS_PER_MONTH)
        sources.append(_source(offering, price))
        _note_fx(catalog, price.currency, currency, fx)
        even = (
            break_even_utilization(per_month / HOURS_PER_MONTH, od_hourly)
            if od is not None
            else None
        )
        quotes.append(
            CommitmentQuote(
                mode=price.mode,
                per_month=per_month,
                per_hour=per_month / HOURS_PER_MONTH,
                break_even=even,
                derived=price.derived,
                source=price.source or offering.source,
            )
        )
        notes.append(
            f"{price.mode}: {per_month:.6g} {currency} per instance-month"
            + ("" if price.mode == "monthly" else f" (needs a {price.mode[-2:]} term)")
            + ("" if even is None else f"; break-even at {even:.0%} utilization vs on-demand")
            + (f"; derived: {price.derived}" if price.derived else "")
        )
        strategies.append(
            Strategy(
                kind="commitment",
                name=f"{price.mode} x{peak} (the peak)",
                monthly_cost=peak * per_month,
                committed_instances=peak,
                commitment_mode=price.mode,
                committed_cost=peak * per_month,
                on_demand_cost=0.0,
                on_demand_instance_hours=0.0,
                autostop=False,
            )
        )
        if levels is not None:
            mix = _best_mix(price.mode, per_month, od_hourly, levels)
            if 0 < mix.committed_instances < peak:
                strategies.append(mix)
            else:
                pure = "on-demand + auto-stop" if mix.committed_instances == 0 else price.mode
                notes.append(f"the cheapest mix of {price.mode} and on-demand is pure {pure}")
    if not commits:
        not_costed.append(
            "commitment: no monthly or reserved price in the catalog, so no commitment or mix"
        )
    if od is None:
        not_costed.append("on-demand: no on-demand price in the catalog, so no mix or auto-stop")
    strategies.sort(key=lambda s: (s.monthly_cost, s.committed_instances, s.name))
    if len(offering.regions) > 1:
        notes.insert(
            0,
            f"region: {region}"
            + (f" (same prices in {', '.join(regions[1:])})" if len(regions) > 1 else "")
            + ", the cheapest allowed region",
        )
    return OfferingBill(
        provider=offering.provider,
        instance_type=offering.instance_type,
        gpus_per_instance=per_inst,
        regions=offering.regions,
        region=region,
        price_regions=tuple(regions),
        commitments=tuple(quotes),
        instances_peak=peak,
        strategies=tuple(strategies),
        best=strategies[0],
        autostop=autostop,
        unknown=tuple(unknown),
        not_costed=tuple(not_costed),
        assumptions=tuple(notes) + tuple(f.describe() for f in fx),
        sources=tuple(dict.fromkeys(sources)),
        fx=tuple(dict.fromkeys(fx)),
    )


def _note_fx(catalog: Catalog, frm: str, to: str, fx: list[FxUse]) -> None:
    used = fx_use(catalog.fx, frm, to)
    if used is not None and used not in fx:
        fx.append(used)


def _pure_od(name: str, cost: float, levels: Levels, autostop: bool) -> Strategy:
    billed = levels.auto_billed if autostop else levels.on_billed
    return Strategy(
        kind="on-demand+autostop" if autostop else "on-demand",
        name=name,
        monthly_cost=cost,
        committed_instances=0,
        commitment_mode=None,
        committed_cost=0.0,
        on_demand_cost=cost,
        on_demand_instance_hours=sum(billed) / 3600.0,
        autostop=autostop,
    )


def _best_mix(mode: str, per_month: float, od_hourly: float, levels: Levels) -> Strategy:
    """Commit the ``k`` most-used levels, burst the rest on demand with auto-stop; best ``k``."""
    level_cost = [b / 3600.0 * od_hourly for b in levels.auto_billed]
    best: tuple[float, int] | None = None
    for k in range(len(level_cost) + 1):
        cost = k * per_month + sum(level_cost[k:])
        if best is None or cost < best[0] - 1e-9:
            best = (cost, k)
    assert best is not None
    cost, k = best
    return Strategy(
        kind="mix",
        name=f"{mode} x{k} + on-demand bursts (auto-stop)",
        monthly_cost=cost,
        committed_instances=k,
        commitment_mode=mode,
        committed_cost=k * per_month,
        on_demand_cost=sum(level_cost[k:]),
        on_demand_instance_hours=sum(levels.auto_billed[k:]) / 3600.0,
        autostop=True,
    )


def bill(usage: Usage, *, catalog: Catalog, currency: str) -> BillReport:
    """Cost recurring ``usage`` on every matching offering, cheapest best strategy first.

    Raises:
        UnknownNameError: an unknown GPU, provider or currency.
        InfeasibleError: no offering of the GPU matches the filters.
    """
    fx_rate(catalog.fx, "USD", currency)  # validates the currency
    gpu = catalog.gpu(usage.gpu).id
    for p in usage.providers:
        if p not in catalog.providers:
            raise UnknownNameError("provider", p, catalog.providers, field="providers")
    offerings: list[tuple[Offering, tuple[str, ...]]] = []
    for o in catalog.filter_offerings(gpu=gpu, providers=usage.providers):
        regions = tuple(
            r
            for r in o.regions
            if not usage.regions or any(w.lower() in r.lower() for w in usage.regions)
        )
        if regions:
            offerings.append((o, regions))
    if not offerings:
        raise InfeasibleError(
            f"bill: no {gpu} offering matches providers={list(usage.providers) or 'all'} "
            f"regions={list(usage.regions) or 'all'}",
            hint=f"gpuplan catalog offerings --gpu {gpu}",
        )
    results: list[OfferingBill] = []
    skipped: list[tuple[str, str]] = []
    for off, regions in offerings:
        res = bill_offering(off, usage, catalog=catalog, currency=currency, regions=regions)
        if isinstance(res, str):
            skipped.append((f"{off.provider}:{off.instance_type}", res))
        else:
            results.append(res)
    results.sort(key=lambda r: (r.best.monthly_cost, r.provider, r.instance_type))
    t = usage.timeline
    scale = MONTH_S / t.period_s / 3600.0
    return BillReport(
        gpu=gpu,
        currency=currency,
        origin=t.origin,
        busy_gpu_hours_per_month=t.busy_gpu_s * scale,
        on_gpu_hours_per_month=t.on_gpu_s * scale,
        peak_busy_gpus=t.peak_busy_gpus,
        autostop_after_s=usage.autostop_after_s,
        offerings=tuple(results),
        skipped=tuple(skipped),
        assumptions=(
            *t.notes,
            f"a month is {HOURS_PER_MONTH:g} h; "
            + ("the week repeats 730/168 times" if t.cyclic else "the trace is scaled to a month"),
            f"auto-stop after {usage.autostop_after_s:g} s idle ({usage.autostop_source})",
            "each offering is costed alone (no mixing of instance types)",
            "commitments cost the whole month whatever the use; spot is not considered",
        ),
    )
