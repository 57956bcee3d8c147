"""Cost of one job on one offering in one billing mode: the planner's entry point.

:func:`job_cost` is called once per candidate option (tens of thousands of
times per plan), so it does no I/O and no pydantic validation: it reads the
already-validated catalog rows and does arithmetic. Every number it returns is
explained in the breakdown's ``assumptions``; every rate it lacks is listed in
``unknown`` rather than guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuplan.catalog.loader import Catalog
from gpuplan.catalog.schema import Offering, Price
from gpuplan.cost.billing import (
    CAPACITY_BLOCK_SOURCE,
    COMMITMENT_MODES,
    COMMITMENT_POLICIES,
    HOURLY_MODES,
    TERM_HOURS,
    CommitmentPolicy,
    billed_seconds,
    break_even_utilization,
    capacity_block_seconds,
    commitment_terms,
    expected_loss_per_interruption_s,
    spot_overhead_s,
    term_price,
)
from gpuplan.cost.breakdown import CostBreakdown
from gpuplan.cost.money import FxUse, fx_rate, fx_use
from gpuplan.cost.transfer import DataPlan, Location, StorageRate, stored_gb_months, transfer_cost
from gpuplan.errors import MissingInputError
from gpuplan.units import format_duration


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Startup:
    """Time from asking for an instance to training on it; billed like run time.

    Attributes:
        provisioning_s: until the instance is running.
        image_pull_s: pulling the container image / environment setup.
        cold_start_s: loading the model and data, compiling, warm-up.
    """

    provisioning_s: float
    image_pull_s: float
    cold_start_s: float

    def __post_init__(self) -> None:
        for f in ("provisioning_s", "image_pull_s", "cold_start_s"):
            if getattr(self, f) < 0:
                raise ValueError(f"startup.{f} must be >= 0")

    @property
    def total_s(self) -> float:
        """All three phases, seconds.

        >>> Startup(provisioning_s=120, image_pull_s=60, cold_start_s=30).total_s
        210
        """
        return self.provisioning_s + self.image_pull_s + self.cold_start_s


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpotRisk:
    """The stated interruption risk of spot capacity and how the job recovers.

    Attributes:
        interruptions_per_hour: expected interruptions per instance-hour (stated by the user;
            providers do not publish one).
        checkpoint_interval_s: seconds between checkpoints.
        restart_s: seconds from an interruption to training again.
    """

    interruptions_per_hour: float
    checkpoint_interval_s: float
    restart_s: float

    def __post_init__(self) -> None:
        for f in ("interruptions_per_hour", "checkpoint_interval_s", "restart_s"):
            if getattr(self, f) < 0:
                raise ValueError(f"spot.{f} must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CostOptions:
    """Everything besides the offering, price and run time that a job's cost depends on.

    Build it once per plan and pass it to every :func:`job_cost` call.

    Attributes:
        startup: startup phases, billed.
        commitment: how monthly/reserved prices are charged (see ``CommitmentPolicy``).
        spot: interruption risk; required to cost a spot price (None = spot not costed).
        data: data sizes and endpoints; None = transfer and storage not costed (stated
            in the assumptions).
        storage_rates: storage prices by provider that the caller vouches for; the catalog
            has none, so a provider missing here makes storage "unknown".
    """

    startup: Startup
    commitment: CommitmentPolicy
    spot: SpotRisk | None
    data: DataPlan | None
    storage_rates: Mapping[str, StorageRate] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.commitment not in COMMITMENT_POLICIES:
            raise ValueError(
                f"commitment must be one of {', '.join(COMMITMENT_POLICIES)}, "
                f"got {self.commitment!r}"
            )


@dataclasses.dataclass(slots=True)
class _Parts:
    """Mutable scratch record while one breakdown is assembled (never escapes)."""

    wall_s: float = 0.0
    spot_overhead_s: float = 0.0
    billed_s: float = 0.0
    compute: float = 0.0
    startup: float = 0.0
    spot_overhead: float = 0.0
    rounding: float | None = 0.0
    commitment_unused: float = 0.0
    on_demand_remainder: float = 0.0
    commitment: str | None = None


def _hourly(
    offering: Offering,
    price: Price,
    nodes: int,
    run_s: float,
    startup_s: float,
    per_hour: float,
    options: CostOptions,
    catalog: Catalog,
    notes: list[str],
    unknown: list[str],
    sources: list[str],
) -> _Parts:
    p = _Parts()
    if price.mode == "spot":
        risk = options.spot
        if risk is None:
            raise MissingInputError(
                f"{offering.provider}:{offering.instance_type}: a spot price needs a stated "
                "interruption rate, checkpoint interval and restart time",
                hint="pass CostOptions(spot=SpotRisk(...)) or leave spot out of the billing modes",
            )
        p.spot_overhead_s = spot_overhead_s(
            run_s,
            interruptions_per_hour=risk.interruptions_per_hour,
            checkpoint_interval_s=risk.checkpoint_interval_s,
            restart_s=risk.restart_s,
        )
        loss_s = expected_loss_per_interruption_s(risk.checkpoint_interval_s, risk.restart_s)
        notes.append(
            f"spot: stated {risk.interruptions_per_hour:g} interruptions/h; each loses "
            f"{loss_s:g} s (half the {risk.checkpoint_interval_s:g} s checkpoint interval + "
            f"{risk.restart_s:g} s restart); expected overhead {p.spot_overhead_s:.0f} s "
            f"= run x f / (1 - f), f = {risk.interruptions_per_hour:g}/3600 x {loss_s:g}; "
            "restarts' extra billing increments not counted"
        )
    if price.per_hour is None:
        notes.append(f"{price.mode}: monthly amount spread over 730 h")
    p.wall_s = startup_s + run_s + p.spot_overhead_s
    p.billed_s = billed_seconds(p.wall_s, price.granularity_s, price.minimum_s)
    per_s = per_hour / 3600.0 * nodes
    p.compute = run_s * per_s
    p.startup = startup_s * per_s
    p.spot_overhead = p.spot_overhead_s * per_s
    if price.granularity_s is None:
        p.rounding = None
        unknown.append(
            f"rounding: no billing increment for {offering.provider} in the catalog "
            "(billing.yaml); billed time taken as the exact wall time, a lower bound"
        )
    else:
        p.rounding = (p.billed_s - p.wall_s) * per_s
        notes.append(
            f"billing: {price.granularity_s} s increments, {price.minimum_s or 0} s minimum; "
            f"wall {p.wall_s:.0f} s billed {p.billed_s:.0f} s per instance x {nodes}"
        )
        rule = catalog.billing.get(offering.provider)
        if rule is not None:
            sources.append(
                f"{offering.provider} billing rule: {' '.join(rule.source.split())} "
                f"(as of {rule.as_of})"
            )
    return p


def _commitment(
    price: Price,
    nodes: int,
    run_s: float,
    startup_s: float,
    rate: float,
    options: CostOptions,
    notes: list[str],
    on_demand: tuple[Price, float] | None = None,
) -> _Parts:
    """A commitment price: whole terms, or the job's share of a term already held.

    With ``whole-terms`` and an on-demand price in the same region (``on_demand``:
    the price and its FX rate), a job longer than one term commits the terms it
    fills and runs the rest on demand when that is cheaper than one more term
    (the on-demand/commitment mix of a job of weeks).
    """
    p = _Parts(commitment=options.commitment)
    mode = price.mode
    one_term = (
        term_price(
            per_hour=price.per_hour, per_month=price.per_month, per_year=price.per_year, mode=mode
        )
        * rate
    )
    term_h = TERM_HOURS[mode]
    per_s = one_term / (term_h * 3600.0) * nodes
    p.wall_s = startup_s + run_s
    p.compute = run_s * per_s
    p.startup = startup_s * per_s
    if options.commitment == "whole-terms":
        terms = commitment_terms(p.wall_s, mode)
        full = int(p.wall_s // (term_h * 3600.0))
        rest_s = p.wall_s - full * term_h * 3600.0
        if on_demand is not None and 0 < full < terms:
            od, od_rate = on_demand
            od_billed = billed_seconds(rest_s, od.granularity_s, od.minimum_s)
            od_cost = od_billed * od.hourly_equivalent * od_rate / 3600.0 * nodes
            if od_cost < one_term * nodes:
                p.billed_s = full * term_h * 3600.0 + od_billed
                p.on_demand_remainder = od_cost - rest_s * per_s
                notes.append(
                    f"{mode}: commitment bought for this job: {full} whole term(s) of {term_h:g} h "
                    f"x {nodes} instance(s), then the last {format_duration(rest_s)} on demand "
                    f"({od_cost:,.2f} instead of one more term at {one_term * nodes:,.2f}); the "
                    "on-demand premium over the commitment rate is on_demand_remainder"
                )
                return p
        p.billed_s = terms * term_h * 3600.0
        p.commitment_unused = terms * one_term * nodes - p.compute - p.startup
        notes.append(
            f"{mode}: commitment bought for this job: {terms} whole term(s) of {term_h:g} h "
            f"x {nodes} instance(s) cover the {format_duration(p.wall_s)} wall time; "
            "the unused part is charged as commitment_unused"
        )
    else:
        p.billed_s = p.wall_s
        notes.append(
            f"{mode}: commitment already held: this job is charged its pro-rata share "
            f"({format_duration(p.wall_s)} of the {term_h:g} h term); the rest of the term "
            "is not charged to this job"
        )
    return p


def _break_even_note(
    offering: Offering,
    price: Price,
    region: str | None,
    commit_per_hour: float,
    catalog: Catalog,
    currency: str,
    notes: list[str],
) -> None:
    """Say at what utilization the commitment beats on-demand in the same region."""
    od = offering.price("on-demand", region) if region in offering.regions else None
    if od is None:
        notes.append(f"{price.mode}: no on-demand price in the same region to compare with")
        return
    od_per_hour = od.hourly_equivalent * fx_rate(catalog.fx, od.currency, currency)
    ratio = break_even_utilization(commit_per_hour, od_per_hour)
    notes.append(
        f"{price.mode}: break-even at {ratio:.0%} utilization of the term vs on-demand "
        f"({od_per_hour:.4g} {currency}/h in {region})"
        + ("; it never pays off" if ratio > 1 else "")
    )


def _capacity_block(
    nodes: int, run_s: float, startup_s: float, per_hour: float, notes: list[str]
) -> _Parts:
    p = _Parts()
    p.wall_s = startup_s + run_s
    p.billed_s = capacity_block_seconds(p.wall_s)
    per_s = per_hour / 3600.0 * nodes
    p.compute = run_s * per_s
    p.startup = startup_s * per_s
    p.rounding = (p.billed_s - p.wall_s) * per_s
    notes.append(
        f"capacity-block: reserved in whole days, paid upfront ({p.billed_s / 86400:g} day(s) "
        f"x {nodes} instance(s)); the catalog's per-second rule covers only the OS fee, "
        "which is not modelled"
    )
    return p


def _gpu_region(offering: Offering, region: str | None, data: DataPlan, notes: list[str]) -> str:
    if region is not None:
        return region
    for loc in (data.dataset_source, data.results_destination):
        if loc is not None and loc.provider == offering.provider and loc.region in offering.regions:
            notes.append(f"region: runs in {loc.region}, where the data is")
            return loc.region
    if len(offering.regions) == 1:
        return offering.regions[0]
    return "(one of " + ", ".join(offering.regions) + ")"


def _data_parts(
    offering: Offering,
    region: str | None,
    wall_s: float,
    currency: str,
    catalog: Catalog,
    options: CostOptions,
    notes: list[str],
    unknown: list[str],
    sources: list[str],
    fx: list[FxUse],
) -> tuple[float | None, float | None]:
    data = options.data
    if data is None:
        notes.append("data transfer and storage not costed: no data sizes were given")
        return 0.0, 0.0
    at = Location(provider=offering.provider, region=_gpu_region(offering, region, data, notes))
    moved = transfer_cost(data, gpus_at=at, billing=catalog.billing)
    notes.extend(moved.lines)
    unknown.extend(f"egress: {line}" for line in moved.unknown)
    sources.extend(moved.sources)
    egress: float | None = None
    if moved.egress_usd is not None:
        egress = moved.egress_usd * fx_rate(catalog.fx, "USD", currency)
        if moved.egress_usd > 0 and currency != "USD":
            used = fx_use(catalog.fx, "USD", currency)
            if used is not None:
                fx.append(used)
    gb_months = stored_gb_months(data, wall_s)
    if gb_months == 0:
        return 0.0, egress
    storage_rate = options.storage_rates.get(offering.provider)
    if storage_rate is None:
        unknown.append(
            f"storage: {gb_months:.3g} GB-months at {offering.provider}: no storage rate "
            "in the catalog (unknown)"
        )
        return None, egress
    rate = fx_rate(catalog.fx, storage_rate.currency, currency)
    if storage_rate.currency != currency:
        used = fx_use(catalog.fx, storage_rate.currency, currency)
        if used is not None:
            fx.append(used)
    storage = gb_months * storage_rate.per_gb_month * rate
    notes.append(
        f"storage: {data.dataset_gb:g} GB dataset + {data.checkpoint_gb:g} GB checkpoints for "
        f"{format_duration(wall_s)} = {gb_months:.3g} GB-months x {storage_rate.per_gb_month:g} "
        f"{storage_rate.currency}/GB-month"
    )
    sources.append(f"{offering.provider} storage: {storage_rate.source}")
    return storage, egress


def job_cost(
    offering: Offering,
    price: Price,
    nodes: int,
    run_s: float,
    *,
    catalog: Catalog,
    currency: str,
    options: CostOptions,
    region: str | None = None,
) -> CostBreakdown:
    """Cost of running a job for ``run_s`` seconds on ``nodes`` instances of ``offering``.

    Args:
        offering: the catalog offering.
        price: one of ``offering.prices`` (its mode selects the billing model).
        nodes: instances, >= 1.
        run_s: useful run time in seconds (from the speed estimate), >= 0.
        catalog: the loaded catalog (billing rules, FX rates).
        currency: ISO code of the result; converted with the catalog's dated rates.
        options: startup, commitment policy, spot risk, data plan, storage rates.
        region: the GPUs' region; None = where the data is, when the offering has that
            region, else unresolved (cross-region legs then report "unknown").

    Returns:
        The breakdown; ``total`` is a lower bound when ``unknown`` is not empty.

    Raises:
        MissingInputError: a spot price without ``options.spot``.
        InfeasibleError: spot interruptions lose more work than is done.
        UnknownNameError: a currency the catalog has no rate for.
        ValueError: ``nodes < 1``, a negative ``run_s`` or an unknown billing mode.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if run_s < 0:
        raise ValueError(f"run_s must be >= 0, got {run_s}")
    notes: list[str] = []
    unknown: list[str] = []
    sources: list[str] = [price.source or offering.source]
    fx: list[FxUse] = []
    rate = fx_rate(catalog.fx, price.currency, currency)
    if price.currency != currency:
        used = fx_use(catalog.fx, price.currency, currency)
        if used is not None:
            fx.append(used)
    per_hour = price.hourly_equivalent * rate
    startup = options.startup
    startup_s = startup.total_s
    notes.append(
        f"startup billed: {startup_s:g} s (provisioning {startup.provisioning_s:g} + image pull "
        f"{startup.image_pull_s:g} + cold start {startup.cold_start_s:g})"
    )
    mode = price.mode
    if mode in HOURLY_MODES:
        p = _hourly(
            offering, price, nodes, run_s, startup_s, per_hour, options, catalog,
            notes, unknown, sources,
        )  # fmt: skip
    elif mode in COMMITMENT_MODES:
        od = offering.price("on-demand", region) if region in offering.regions else None
        od_pair = None if od is None else (od, fx_rate(catalog.fx, od.currency, currency))
        p = _commitment(price, nodes, run_s, startup_s, rate, options, notes, od_pair)
        _break_even_note(offering, price, region, per_hour, catalog, currency, notes)
    elif mode == "capacity-block":
        p = _capacity_block(nodes, run_s, startup_s, per_hour, notes)
        sources.append(CAPACITY_BLOCK_SOURCE)
    else:  # pragma: no cover - the schema's Literal forbids it
        raise ValueError(f"unknown billing mode {mode!r}")
    storage, egress = _data_parts(
        offering, region, p.wall_s, currency, catalog, options, notes, unknown, sources, fx
    )
    total = p.compute + p.startup + p.spot_overhead + p.commitment_unused + p.on_demand_remainder
    for part in (p.rounding, storage, egress):
        if part is not None:
            total += part
    notes.extend(f.describe() for f in fx)
    return CostBreakdown(
        mode=mode,
        commitment=p.commitment,
        currency=currency,
        nodes=nodes,
        price_per_hour=per_hour,
        run_s=run_s,
        startup_s=startup_s,
        spot_overhead_s=p.spot_overhead_s,
        billed_s=p.billed_s,
        compute=p.compute,
        startup=p.startup,
        spot_overhead=p.spot_overhead,
        rounding=p.rounding,
        commitment_unused=p.commitment_unused,
        on_demand_remainder=p.on_demand_remainder,
        storage=storage,
        egress=egress,
        total=total,
        unknown=tuple(unknown),
        fx=tuple(dict.fromkeys(fx)),
        sources=tuple(dict.fromkeys(sources)),
        assumptions=tuple(notes),
    )
