"""Billing arithmetic: table-driven hand-computed cases and properties.

Every expected number below is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuplan.catalog.loader import Catalog, load_catalog
from gpuplan.catalog.schema import BillingRule, FxRates, GpuSpec, Offering, Price
from gpuplan.cost import (
    CostOptions,
    DataPlan,
    Location,
    SpotRisk,
    Startup,
    StorageRate,
    billed_seconds,
    fx_rate,
    job_cost,
    spot_overhead_s,
)
from gpuplan.cost.mix import bill, bill_offering
from gpuplan.cost.usage import DemandBlock, Usage, parse_trace_csv, weekly_timeline
from gpuplan.errors import InfeasibleError, MissingInputError, UnknownNameError

DAY = dt.date(2026, 1, 1)
NO_STARTUP = Startup(provisioning_s=0, image_pull_s=0, cold_start_s=0)


def _rule(provider: str, granularity_s: int, minimum_s: int, egress: float | None) -> BillingRule:
    return BillingRule(
        provider=provider,
        granularity_s=granularity_s,
        minimum_s=minimum_s,
        egress_usd_per_gb=egress,
        source=f"test rule {provider}",
        as_of=DAY,
    )


GPU = GpuSpec(
    id="TESTGPU",
    vendor="NVIDIA",
    architecture="Hopper",
    form_factor="sxm",
    memory_bytes=80 * 10**9,
    memory_type="HBM3",
    memory_bandwidth_gb_per_s=3350,
    peak_tflops_dense={"fp32": 67.0, "bf16": 989.0},
    source="test datasheet",
    as_of=DAY,
)


def _catalog(*offerings: Offering) -> Catalog:
    return Catalog(
        gpus=(GPU,),
        offerings=offerings,
        billing={
            "aws": _rule("aws", 1, 60, 0.09),
            "lambda": _rule("lambda", 60, 0, 0.0),
            "tencent": _rule("tencent", 1, 0, None),
        },
        fx=FxRates(per_usd={"CNY": 7.0, "EUR": 0.5}, source="test fx", as_of=DAY),
        files=(),
    )


def _offering(provider: str, *prices: Price, regions: tuple[str, ...] = ("r1",)) -> Offering:
    return Offering(
        provider=provider,
        instance_type="box",
        regions=regions,
        gpu="TESTGPU",
        gpu_count=1,
        intra_node="none",
        prices=prices,
        source=f"test price page {provider}",
        as_of=DAY,
    )


def _price(mode: str, *, per_hour: float | None = None, per_month: float | None = None,
           currency: str = "USD", granularity_s: int | None = 1,
           minimum_s: int | None = 0) -> Price:  # fmt: skip
    return Price(
        mode=mode,  # type: ignore[arg-type]
        per_hour=per_hour,
        per_month=per_month,
        currency=currency,
        granularity_s=granularity_s,
        minimum_s=minimum_s,
    )


def _opts(**changes: object) -> CostOptions:
    base: dict[str, object] = {
        "startup": NO_STARTUP,
        "commitment": "whole-terms",
        "spot": None,
        "data": None,
    }
    base.update(changes)
    return CostOptions(**base)  # type: ignore[arg-type]


# --- billed duration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_s", "granularity_s", "minimum_s", "billed"),
    [
        (30, 1, 60, 60),  # per second, 60 s minimum: a 30 s run pays the minute
        (61, 1, 60, 61),  # past the minimum: every second counts
        (60, 1, 60, 60),
        (59.5, 1, 0, 60),  # a started second is a billed second
        (3601, 3600, 0, 7200),  # hourly rounding: 1 h 1 s pays 2 h
        (3600, 3600, 0, 3600),
        (1, 3600, 0, 3600),
        (90, 60, 0, 120),  # per minute
        (10, 60, 120, 120),  # minimum above one increment
        (0, 1, 60, 0),  # never started: nothing billed
        (10, 1, None, 10),
        (12.5, None, None, 12.5),  # unknown increment: exact (the caller reports "unknown")
    ],
)
def test_billed_seconds(
    run_s: float, granularity_s: int | None, minimum_s: int | None, billed: float
) -> None:
    assert billed_seconds(run_s, granularity_s, minimum_s) == billed


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_billed_seconds_rejects_bad_run(bad: float) -> None:
    with pytest.raises(ValueError, match="run_s"):
        billed_seconds(bad, 1, 60)


@given(
    run_s=st.floats(min_value=0, max_value=1e8, allow_nan=False),
    granularity_s=st.one_of(st.none(), st.integers(min_value=1, max_value=86_400)),
    minimum_s=st.one_of(st.none(), st.integers(min_value=0, max_value=86_400)),
)
def test_billed_at_least_exact(
    run_s: float, granularity_s: int | None, minimum_s: int | None
) -> None:
    billed = billed_seconds(run_s, granularity_s, minimum_s)
    assert billed >= run_s
    if granularity_s is not None and run_s > 0:
        assert billed < max(run_s + granularity_s, minimum_s or 0) + 1e-6


@given(
    a=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    b=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    granularity_s=st.one_of(st.none(), st.integers(min_value=1, max_value=7200)),
    minimum_s=st.integers(min_value=0, max_value=7200),
)
def test_billed_monotonic_in_run_time(
    a: float, b: float, granularity_s: int | None, minimum_s: int
) -> None:
    lo, hi = sorted((a, b))
    assert billed_seconds(lo, granularity_s, minimum_s) <= billed_seconds(
        hi, granularity_s, minimum_s
    )


# --- job cost: hourly modes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("price", "nodes", "run_s", "total", "compute"),
    [
        # $3.60/h per second with a 60 s minimum: 30 s bills 60 s = $0.06; work is 30 s = $0.03
        (_price("on-demand", per_hour=3.6, minimum_s=60), 1, 30, 0.06, 0.03),
        # 61 s bills 61 s = $0.061
        (_price("on-demand", per_hour=3.6, minimum_s=60), 1, 61, 0.061, 0.061),
        # hourly rounding: $2/h x 2 nodes, 3601 s bills 2 h each = $8; work 2 x 2 x 3601/3600
        (_price("on-demand", per_hour=2.0, granularity_s=3600), 2, 3601, 8.0, 4.0 * 3601 / 3600),
        # per minute: $6/h = $0.1/min; 90 s bills 2 min = $0.2
        (_price("community", per_hour=6.0, granularity_s=60), 1, 90, 0.2, 0.15),
    ],
)
def test_hourly_modes(price: Price, nodes: int, run_s: float, total: float, compute: float) -> None:
    off = _offering("aws", price)
    b = job_cost(off, price, nodes, run_s, catalog=_catalog(off), currency="USD", options=_opts())
    assert b.total == pytest.approx(total)
    assert b.compute == pytest.approx(compute)
    assert b.rounding == pytest.approx(total - compute)
    assert b.commitment is None
    assert b.complete


def test_startup_is_billed() -> None:
    # 200 s startup + 3400 s run at $1/h, per second: 3600 s = $1.00, startup share 200/3600
    price = _price("on-demand", per_hour=1.0)
    off = _offering("aws", price)
    startup = Startup(provisioning_s=120, image_pull_s=60, cold_start_s=20)
    b = job_cost(off, price, 1, 3400, catalog=_catalog(off), currency="USD",
                 options=_opts(startup=startup))  # fmt: skip
    assert b.total == pytest.approx(1.0)
    assert b.startup == pytest.approx(200 / 3600)
    assert b.billed_s == 3600
    assert any("provisioning 120 + image pull 60 + cold start 20" in a for a in b.assumptions)


def test_unknown_increment_is_reported_not_invented() -> None:
    price = _price("on-demand", per_hour=1.0, granularity_s=None, minimum_s=None)
    off = _offering("nebius", price)
    b = job_cost(off, price, 1, 30, catalog=_catalog(off), currency="USD", options=_opts())
    assert b.rounding is None
    assert not b.complete
    assert any("no billing increment for nebius" in u for u in b.unknown)
    assert b.total == pytest.approx(30 / 3600)  # exact time: a lower bound
    assert b.as_dict()["rounding"] == "unknown"
    assert b.as_dict()["total_is_lower_bound"]


# --- spot --------------------------------------------------------------------------------------


def test_spot_overhead_hand_computed() -> None:
    # 10 h of work, 0.1 interruptions/h, checkpoint every 30 min, 5 min restart:
    # loss per interruption L = 900 + 300 = 1200 s; f = 0.1/3600 x 1200 = 1/30;
    # wall T = 36000 / (1 - 1/30) = 36000 x 30/29 = 37241.379 s; overhead 1241.379 s.
    over = spot_overhead_s(
        36_000, interruptions_per_hour=0.1, checkpoint_interval_s=1800, restart_s=300
    )
    assert over == pytest.approx(36_000 * 30 / 29 - 36_000)
    price = _price("spot", per_hour=1.0)
    off = _offering("aws", price)
    risk = SpotRisk(interruptions_per_hour=0.1, checkpoint_interval_s=1800, restart_s=300)
    b = job_cost(off, price, 1, 36_000, catalog=_catalog(off), currency="USD",
                 options=_opts(spot=risk))  # fmt: skip
    assert b.spot_overhead_s == pytest.approx(over)
    assert b.spot_overhead == pytest.approx(over / 3600)
    # billed = ceil(37241.379) = 37242 s at $1/h
    assert b.total == pytest.approx(37_242 / 3600)
    assert any("0.1 interruptions/h" in a and "1200 s" in a for a in b.assumptions)


def test_spot_needs_a_stated_rate() -> None:
    price = _price("spot", per_hour=1.0)
    off = _offering("aws", price)
    with pytest.raises(MissingInputError, match="interruption rate"):
        job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD", options=_opts())


def test_spot_that_never_finishes() -> None:
    with pytest.raises(InfeasibleError, match="never finishes"):
        spot_overhead_s(3600, interruptions_per_hour=2, checkpoint_interval_s=3600, restart_s=0)


# --- commitments and capacity blocks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("price", "policy", "run_h", "total", "unused"),
    [
        # 730/month = $1/h. 10 days (240 h) buys one month: $730, of which 490 unused
        (_price("monthly", per_month=730.0), "whole-terms", 240, 730.0, 490.0),
        # already held: the job's share is 240 h x $1
        (_price("monthly", per_month=730.0), "job-share", 240, 240.0, 0.0),
        # 31 days (744 h) needs two months: $1460
        (_price("monthly", per_month=730.0), "whole-terms", 744, 1460.0, 716.0),
        # reserved-1y at an effective $1.50/h: one 8760 h term = $13140 for a 100 h job
        (_price("reserved-1y", per_hour=1.5), "whole-terms", 100, 13_140.0, 12_990.0),
        (_price("reserved-1y", per_hour=1.5), "job-share", 100, 150.0, 0.0),
        # reserved-3y monthly amount $500: 36 months = $18000
        (_price("reserved-3y", per_month=500.0), "whole-terms", 10, 18_000.0, 18_000 - 500 / 73),
    ],
)
def test_commitments(price: Price, policy: str, run_h: float, total: float, unused: float) -> None:
    off = _offering("aws", price)
    b = job_cost(off, price, 1, run_h * 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(commitment=policy))  # fmt: skip
    assert b.total == pytest.approx(total)
    assert b.commitment_unused == pytest.approx(unused)
    assert b.commitment == policy
    word = "already held" if policy == "job-share" else "bought for this job"
    assert any(word in a for a in b.assumptions)


def test_job_of_weeks_mixes_whole_terms_and_on_demand() -> None:
    """31 days: one month committed, the last day on demand (issue 12's mix), not two months."""
    month = _price("monthly", per_month=730.0)  # $1/h
    od = _price("on-demand", per_hour=2.0)
    off = _offering("aws", od, month)
    b = job_cost(off, month, 1, 744 * 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(), region="r1")  # fmt: skip
    wall_h = 744 + b.startup_s / 3600
    assert b.total == pytest.approx(730.0 + (wall_h - 730) * 2.0)
    assert b.commitment_unused == 0
    assert b.on_demand_remainder == pytest.approx((wall_h - 730) * 1.0)
    assert any("on demand" in a for a in b.assumptions)
    assert any("break-even at 50%" in a for a in b.assumptions)
    # shorter than a term: the commitment option still buys one whole term
    short = job_cost(off, month, 1, 240 * 3600, catalog=_catalog(off), currency="USD",
                     options=_opts(), region="r1")  # fmt: skip
    assert short.total == pytest.approx(730.0)


def test_commitment_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="commitment"):
        _opts(commitment="some")


@pytest.mark.parametrize(("run_h", "total"), [(20, 960.0), (24, 960.0), (25, 1920.0)])
def test_capacity_block_whole_days(run_h: float, total: float) -> None:
    # $40/h capacity block is reserved in whole days: 1 day = $960, 2 days = $1920
    price = _price("capacity-block", per_hour=40.0, minimum_s=60)
    off = _offering("aws", price)
    b = job_cost(off, price, 1, run_h * 3600, catalog=_catalog(off), currency="USD",
                 options=_opts())  # fmt: skip
    assert b.total == pytest.approx(total)


# --- egress and storage ------------------------------------------------------------------------


def _data(src: Location | None, *, dataset_gb: float = 1000, out_gb: float = 0,
          dest: Location | None = None, ckpt_gb: float = 0) -> DataPlan:  # fmt: skip
    return DataPlan(dataset_gb=dataset_gb, dataset_source=src, checkpoint_gb=ckpt_gb,
                    results_out_gb=out_gb, results_destination=dest)  # fmt: skip


@pytest.mark.parametrize(
    ("gpu_provider", "data", "egress"),
    [
        # same provider and region: free
        ("aws", _data(Location(provider="aws", region="r1")), 0.0),
        # dataset leaves aws for another cloud: 1000 GB x $0.09 = $90
        ("lambda", _data(Location(provider="aws", region="r1")), 90.0),
        # lambda states no egress fee: free
        ("aws", _data(Location(provider="lambda", region="x")), 0.0),
        # from outside the catalog clouds: ingress, not charged
        ("aws", _data(None), 0.0),
        # results out of aws to the internet: 20 GB x $0.09 = $1.80
        ("aws", _data(None, dataset_gb=0, out_gb=20), 1.8),
        # results to the same region: free
        ("aws", _data(None, dataset_gb=0, out_gb=20, dest=Location(provider="aws", region="r1")),
         0.0),
    ],
)  # fmt: skip
def test_egress(gpu_provider: str, data: DataPlan, egress: float) -> None:
    price = _price("on-demand", per_hour=1.0)
    off = _offering(gpu_provider, price)
    b = job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(data=data))  # fmt: skip
    assert b.egress == pytest.approx(egress)
    assert b.total == pytest.approx(1.0 + egress)


@pytest.mark.parametrize(
    ("gpu_provider", "data", "why"),
    [
        # same provider, other region: the catalog has no inter-region rate
        ("aws", _data(Location(provider="aws", region="r9")), "inter-region rate"),
        # tencent's billing rule has no egress rate
        ("aws", _data(Location(provider="tencent", region="x")), "no egress rate for tencent"),
        # a provider with no billing rule at all
        ("aws", _data(Location(provider="nebius", region="x")), "no egress rate for nebius"),
    ],
)
def test_egress_unknown_is_reported(gpu_provider: str, data: DataPlan, why: str) -> None:
    price = _price("on-demand", per_hour=1.0)
    off = _offering(gpu_provider, price)
    b = job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(data=data))  # fmt: skip
    assert b.egress is None
    assert any(why in u for u in b.unknown)
    assert b.total == pytest.approx(1.0)  # known parts only: a lower bound
    assert b.as_dict()["egress"] == "unknown"


def test_region_follows_the_data() -> None:
    price = _price("on-demand", per_hour=1.0)
    off = _offering("aws", price, regions=("r1", "r2"))
    data = _data(Location(provider="aws", region="r2"))
    b = job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(data=data))  # fmt: skip
    assert b.egress == 0.0
    assert any("runs in r2" in a for a in b.assumptions)
    pinned = job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD",
                      options=_opts(data=data), region="r1")  # fmt: skip
    assert pinned.egress is None


def test_storage_unknown_without_a_rate_and_priced_with_one() -> None:
    price = _price("on-demand", per_hour=1.0)
    off = _offering("aws", price)
    # 500 GB dataset + 230 GB checkpoints for 73 h = 730 GB x 0.1 month = 73 GB-months
    data = _data(None, dataset_gb=500, ckpt_gb=230)
    b = job_cost(off, price, 1, 73 * 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(data=data))  # fmt: skip
    assert b.storage is None
    assert any("73 GB-months" in u for u in b.unknown)
    rate = StorageRate(per_gb_month=0.023, currency="USD", source="S3 Standard price page")
    b = job_cost(off, price, 1, 73 * 3600, catalog=_catalog(off), currency="USD",
                 options=_opts(data=data, storage_rates={"aws": rate}))  # fmt: skip
    assert b.storage == pytest.approx(73 * 0.023)
    assert b.complete
    assert any("S3 Standard" in s for s in b.sources)


def test_no_data_plan_is_stated() -> None:
    price = _price("on-demand", per_hour=1.0)
    off = _offering("aws", price)
    b = job_cost(off, price, 1, 3600, catalog=_catalog(off), currency="USD", options=_opts())
    assert b.storage == 0.0
    assert b.egress == 0.0
    assert any("not costed" in a for a in b.assumptions)


# --- currency ----------------------------------------------------------------------------------


def test_currency_conversion_with_catalog_rate() -> None:
    # 7 CNY/h with 7 CNY per USD: one hour costs $1.00; in EUR (0.5 per USD) 0.50
    price = _price("on-demand", per_hour=7.0, currency="CNY")
    off = _offering("tencent", price)
    cat = _catalog(off)
    usd = job_cost(off, price, 1, 3600, catalog=cat, currency="USD", options=_opts())
    assert usd.total == pytest.approx(1.0)
    assert usd.fx[0].rate == pytest.approx(1 / 7)
    assert usd.fx[0].as_of == DAY
    assert usd.as_dict()["fx"][0]["as_of"] == "2026-01-01"
    eur = job_cost(off, price, 1, 3600, catalog=cat, currency="EUR", options=_opts())
    assert eur.total == pytest.approx(0.5)
    with pytest.raises(UnknownNameError, match="currency"):
        job_cost(off, price, 1, 3600, catalog=cat, currency="XYZ", options=_opts())


def test_fx_matches_builtin_catalog_convert() -> None:
    cat = load_catalog(use_user=False)
    for cur in ("CNY", "EUR", "GBP"):
        assert fx_rate(cat.fx, cur, "USD") == pytest.approx(cat.convert(1.0, cur, "USD"))
        assert fx_rate(cat.fx, "USD", cur) == pytest.approx(cat.convert(1.0, "USD", cur))


def test_every_builtin_price_costs() -> None:
    """Every shipped price yields a breakdown whose parts add up to the total."""
    cat = load_catalog(use_user=False)
    risk = SpotRisk(interruptions_per_hour=0.05, checkpoint_interval_s=1800, restart_s=300)
    opts = _opts(spot=risk, data=_data(Location(provider="aws", region="us-east-1")))
    for off in cat.offerings:
        for price in off.prices:
            b = job_cost(off, price, 2, 5 * 3600, catalog=cat, currency="USD", options=opts)
            parts = (b.compute, b.startup, b.spot_overhead, b.rounding, b.commitment_unused,
                     b.on_demand_remainder, b.storage, b.egress)  # fmt: skip
            assert b.total == pytest.approx(sum(p for p in parts if p is not None))
            assert b.total >= b.compute > 0


@given(
    a=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    b=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    granularity_s=st.sampled_from([1, 60, 3600]),
    mode=st.sampled_from(["on-demand", "spot", "monthly", "capacity-block"]),
)
def test_job_cost_monotonic_in_run_time(a: float, b: float, granularity_s: int, mode: str) -> None:
    if mode == "monthly":
        price = _price(mode, per_month=500.0)
    else:
        price = _price(mode, per_hour=2.0, granularity_s=granularity_s, minimum_s=60)
    off = _offering("aws", price)
    cat = _catalog(off)
    opts = _opts(spot=SpotRisk(interruptions_per_hour=0.1, checkpoint_interval_s=600, restart_s=60))
    lo, hi = sorted((a, b))
    c_lo = job_cost(off, price, 1, lo, catalog=cat, currency="USD", options=opts)
    c_hi = job_cost(off, price, 1, hi, catalog=cat, currency="USD", options=opts)
    assert c_lo.total <= c_hi.total + 1e-9
    assert c_lo.billed_s >= lo


# --- recurring use: commitment vs on-demand, auto-stop -----------------------------------------

MONTH_PER_WEEK = 730 / 168


def _usage(*blocks: DemandBlock, autostop_s: float = 600) -> Usage:
    return Usage(
        gpu="TESTGPU",
        providers=(),
        regions=(),
        autostop_after_s=autostop_s,
        autostop_source="test",
        timeline=weekly_timeline(blocks, origin="test"),
    )


def _by_kind(res: object) -> dict[str, float]:
    return {s.kind: s.monthly_cost for s in res.strategies}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("granularity_s", "no_autostop_h", "autostop_h"),
    [
        # 8 GPUs busy 10 h + idle 6 h on 5 days: 8 x 16 x 5 = 640 instance-h/week up.
        # Auto-stop after 10 min: 8 x (10 h 10 min) x 5 = 406.67 h/week.
        (1, 640.0, 8 * (10 + 1 / 6) * 5),
        # Hourly increments: the 16 h runs are whole hours; 10 h 10 min bills 11 h -> 440 h/week.
        (3600, 640.0, 8 * 11 * 5),
    ],
)
def test_autostop_savings_with_granularity(
    granularity_s: int, no_autostop_h: float, autostop_h: float
) -> None:
    price = _price("on-demand", per_hour=1.0, granularity_s=granularity_s)
    off = _offering("aws", price)
    block = DemandBlock(gpus=8, hours_per_day=10, days_per_week=5, idle_hours_per_day=6)
    res = bill_offering(off, _usage(block), catalog=_catalog(off), currency="USD")
    assert not isinstance(res, str)
    costs = _by_kind(res)
    assert costs["on-demand"] == pytest.approx(no_autostop_h * MONTH_PER_WEEK)
    assert costs["on-demand+autostop"] == pytest.approx(autostop_h * MONTH_PER_WEEK)
    assert res.autostop is not None
    assert res.autostop.monthly_savings == pytest.approx(
        (no_autostop_h - autostop_h) * MONTH_PER_WEEK
    )
    # 8 x 6 idle hours x 5 days no longer run
    assert res.autostop.idle_instance_hours_removed == pytest.approx(240 * MONTH_PER_WEEK)
    assert res.best.kind == "on-demand+autostop"


def test_cheapest_mix_commits_the_base_load() -> None:
    # On demand $1/h (per second), monthly $500 per 1-GPU instance.
    # Base: 2 GPUs 24x7 -> on demand 730 h x $1 = $730/month each > $500: commit both.
    # Bursts: 6 GPUs 10 h x 5 days, stopped by hand when done (no idle hours, so auto-stop
    #         changes nothing: it never keeps a machine up longer than it was) = 50 h/week
    #         x 730/168 = $217.26/month each < $500: burst on demand.
    # Mix = 2 x 500 + 6 x 217.26 = $2303.57; all monthly = 8 x 500 = $4000;
    # all on demand = 2 x 730 + 6 x 217.26 = $2763.57.
    od = _price("on-demand", per_hour=1.0)
    monthly = _price("monthly", per_month=500.0)
    off = _offering("aws", od, monthly)
    base = DemandBlock(gpus=2, hours_per_day=24, days_per_week=7)
    burst = DemandBlock(gpus=6, hours_per_day=10, days_per_week=5)
    res = bill_offering(off, _usage(base, burst), catalog=_catalog(off), currency="USD")
    assert not isinstance(res, str)
    burst_month = 50 * MONTH_PER_WEEK
    costs = _by_kind(res)
    assert costs["mix"] == pytest.approx(1000 + 6 * burst_month)
    assert costs["commitment"] == pytest.approx(4000)
    assert costs["on-demand"] == pytest.approx(2 * 730 + 6 * burst_month)
    assert costs["on-demand+autostop"] == pytest.approx(costs["on-demand"])
    assert res.best.kind == "mix"
    assert res.best.committed_instances == 2
    assert res.best.on_demand_instance_hours == pytest.approx(6 * burst_month)


def test_mix_in_another_currency() -> None:
    # monthly 3500 CNY at 7 CNY/USD = $500: the same answer as above, in USD
    od = _price("on-demand", per_hour=7.0, currency="CNY")
    monthly = _price("monthly", per_month=3500.0, currency="CNY")
    off = _offering("tencent", od, monthly)
    base = DemandBlock(gpus=2, hours_per_day=24, days_per_week=7)
    res = bill_offering(off, _usage(base), catalog=_catalog(off), currency="USD")
    assert not isinstance(res, str)
    assert res.best.kind == "commitment"
    assert res.best.monthly_cost == pytest.approx(1000)
    assert any("1 CNY = 0.142857 USD" in a for a in res.assumptions)


def test_offerings_that_cannot_be_billed_are_skipped_with_a_reason() -> None:
    spot_only = _offering("aws", _price("spot", per_hour=1.0))
    res = bill_offering(spot_only, _usage(DemandBlock(gpus=1, hours_per_day=1, days_per_week=1)),
                        catalog=_catalog(spot_only), currency="USD")  # fmt: skip
    assert isinstance(res, str)
    assert "no on-demand" in res


def test_bill_ranks_offerings_and_names_what_is_missing() -> None:
    cheap = _offering("aws", _price("on-demand", per_hour=1.0))
    dear = _offering("lambda", _price("on-demand", per_hour=2.0))
    report = bill(_usage(DemandBlock(gpus=1, hours_per_day=8, days_per_week=5)),
                  catalog=_catalog(cheap, dear), currency="USD")  # fmt: skip
    assert [o.provider for o in report.offerings] == ["aws", "lambda"]
    assert report.busy_gpu_hours_per_month == pytest.approx(40 * MONTH_PER_WEEK)
    assert all(o.not_costed for o in report.offerings)  # no commitment prices


def test_trace_per_gpu_utilization() -> None:
    text = (
        "timestamp,gpu0,gpu1\n"
        "2026-11-02T00:00:00Z,95,5\n"  # gpu1 up but idle (< 10 %)
        "2026-11-02T01:00:00Z,95,\n"  # gpu1 off
        "2026-11-02T02:00:00Z,90,80\n"
    )
    t = parse_trace_csv(text, origin="t.csv")
    assert t.period_s == 3 * 3600
    assert not t.cyclic
    assert t.busy_gpu_s == pytest.approx((1 + 1 + 2) * 3600)
    assert t.on_gpu_s == pytest.approx((2 + 1 + 2) * 3600)
