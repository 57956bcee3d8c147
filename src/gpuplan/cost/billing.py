"""Billing arithmetic: billed duration, commitment terms, capacity blocks, spot overhead.

Pure functions on numbers (seconds, hours, prices); no catalog lookups here.
Facts behind the constants are in ``shared/reference/cloud/cloud_billing.md``
(sections 1 and 2) and the catalog's ``billing.yaml``.
"""

from __future__ import annotations

import math
from typing import Final, Literal

from gpuplan.catalog.schema import HOURS_PER_MONTH
from gpuplan.errors import InfeasibleError

HourlyMode = Literal["on-demand", "spot", "community"]
CommitmentMode = Literal["monthly", "reserved-1y", "reserved-3y"]
CommitmentPolicy = Literal["whole-terms", "job-share"]
"""How a commitment is charged to one job.

``whole-terms``: the job buys the commitment, so it pays every whole term that
covers its wall time (a 10-day job on a monthly price pays one month).
``job-share``: the user already holds the commitment, so the job is charged
its pro-rata share (wall time x the commitment's hourly equivalent).
"""

HOURLY_MODES: Final[tuple[str, ...]] = ("on-demand", "spot", "community")
COMMITMENT_MODES: Final[tuple[str, ...]] = ("monthly", "reserved-1y", "reserved-3y")
COMMITMENT_POLICIES: Final[tuple[str, ...]] = ("whole-terms", "job-share")

TERM_HOURS: Final[dict[str, float]] = {
    "monthly": HOURS_PER_MONTH,
    "reserved-1y": 12 * HOURS_PER_MONTH,
    "reserved-3y": 36 * HOURS_PER_MONTH,
}
"""Length of one commitment term in hours (a month is 730 h, as AWS/GCP/Azure count it)."""

CAPACITY_BLOCK_INCREMENT_S: Final[int] = 86_400
"""EC2 Capacity Blocks for ML are reserved for whole days (1-14 days at launch), paid
upfront and cannot be cancelled (cloud_billing.md section 2). Only the OS fee is billed
per second; that fee is not in the catalog and is not modelled."""
CAPACITY_BLOCK_SOURCE: Final[str] = (
    "EC2 Capacity Blocks for ML: whole days, paid upfront "
    "(https://aws.amazon.com/ec2/capacityblocks/pricing/ via cloud_billing.md section 2)"
)


def billed_seconds(run_s: float, granularity_s: int | None, minimum_s: int | None) -> float:
    """Billed duration of one instance that ran ``run_s`` seconds.

    The run is rounded up to a whole number of billing increments, and never
    billed less than the minimum charge. A run of 0 s was never started and
    bills nothing. Hourly rounding is ``granularity_s=3600``.

    Args:
        run_s: wall time the instance ran, seconds (>= 0).
        granularity_s: billing increment in seconds (1 = per second); None when the
            provider's increment is unknown, in which case the exact time is returned
            (a lower bound: the caller must report the increment as unknown).
        minimum_s: minimum billed duration in seconds; None or 0 = none.

    Returns:
        Billed seconds, >= ``run_s``.

    Raises:
        ValueError: a negative or non-finite run time.

    >>> billed_seconds(30, 1, 60)      # per second, 60 s minimum
    60.0
    >>> billed_seconds(61, 1, 60)
    61.0
    >>> billed_seconds(3601, 3600, 0)  # hourly rounding
    7200.0
    >>> billed_seconds(90, 60, 0)      # per minute
    120.0
    >>> billed_seconds(0, 1, 60)
    0.0
    >>> billed_seconds(12.5, None, None)
    12.5
    """
    if not math.isfinite(run_s) or run_s < 0:
        raise ValueError(f"run_s must be a finite number >= 0, got {run_s!r}")
    if run_s == 0:
        return 0.0
    billed = float(run_s)
    if granularity_s is not None:
        # a started increment is a billed one (max: run_s / granularity_s may underflow to 0)
        billed = float(max(1, math.ceil(run_s / granularity_s)) * granularity_s)
    if minimum_s and billed < minimum_s:
        billed = float(minimum_s)
    return billed


def commitment_terms(wall_s: float, mode: str) -> int:
    """Whole commitment terms needed to cover ``wall_s`` seconds (at least one).

    >>> commitment_terms(10 * 86400, "monthly")
    1
    >>> commitment_terms(731 * 3600, "monthly")
    2
    >>> commitment_terms(400 * 86400, "reserved-1y")
    2
    """
    term_s = TERM_HOURS[mode] * 3600.0
    return max(1, math.ceil(wall_s / term_s))


def term_price(
    *, per_hour: float | None, per_month: float | None, mode: str, per_year: float | None = None
) -> float:
    """Price of one commitment term of ``mode``, in the price's currency.

    A monthly amount is multiplied by the months in the term, a yearly one by the
    years; an hourly amount (the effective hourly rate of a reservation) by the
    hours in the term.

    >>> term_price(per_hour=None, per_month=5190.0, mode="monthly")
    5190.0
    >>> term_price(per_hour=2.0, per_month=None, mode="reserved-1y")
    17520.0
    >>> term_price(per_hour=None, per_month=None, per_year=9000.0, mode="reserved-3y")
    27000.0
    """
    hours = TERM_HOURS[mode]
    if per_month is not None:
        return per_month * hours / HOURS_PER_MONTH
    if per_year is not None:
        return per_year * hours / (12 * HOURS_PER_MONTH)
    if per_hour is None:
        raise ValueError("a price needs per_hour, per_month or per_year")
    return per_hour * hours


def break_even_utilization(commit_per_hour: float, on_demand_per_hour: float) -> float:
    """Share of a commitment's term an instance must be busy for it to cost no more than on-demand.

    Both amounts are per instance-hour in one currency: the commitment's effective
    hourly rate over its term (owed whether used or not) and the on-demand price in
    the same region. Above 1 the commitment never pays off; auto-stop billing
    increments are ignored (they only move on-demand up, slightly).

    >>> break_even_utilization(6.0, 10.0)
    0.6
    >>> break_even_utilization(12.0, 10.0)
    1.2
    """
    if on_demand_per_hour <= 0:
        raise ValueError("on_demand_per_hour must be > 0")
    return commit_per_hour / on_demand_per_hour


def capacity_block_seconds(wall_s: float) -> float:
    """Seconds of capacity block reserved to cover ``wall_s``: whole days, at least one.

    >>> capacity_block_seconds(3600)
    86400.0
    >>> capacity_block_seconds(86401)
    172800.0
    """
    days = max(1, math.ceil(wall_s / CAPACITY_BLOCK_INCREMENT_S))
    return float(days * CAPACITY_BLOCK_INCREMENT_S)


def expected_loss_per_interruption_s(checkpoint_interval_s: float, restart_s: float) -> float:
    """Expected work lost to one spot interruption: half a checkpoint interval plus the restart.

    An interruption lands uniformly within a checkpoint interval, so on average
    half an interval of work is redone; the restart (re-provision, image pull,
    load the checkpoint) is lost too.

    >>> expected_loss_per_interruption_s(1800, 300)
    1200.0
    """
    return checkpoint_interval_s / 2.0 + restart_s


def spot_overhead_s(
    work_s: float,
    *,
    interruptions_per_hour: float,
    checkpoint_interval_s: float,
    restart_s: float,
) -> float:
    """Expected extra wall time on spot capacity for ``work_s`` seconds of useful work.

    With ``L`` the expected loss per interruption and ``lam`` interruptions per
    second, interruptions also strike the redone work, so the expected wall time
    ``T`` solves ``T = work + lam * T * L``, i.e. ``T = work / (1 - lam * L)``;
    the overhead is ``T - work``. (To first order it is ``lam * work * L``.)

    Args:
        work_s: useful run time, seconds.
        interruptions_per_hour: stated expected interruptions per instance-hour.
        checkpoint_interval_s: seconds between checkpoints.
        restart_s: seconds from interruption to training again.

    Raises:
        InfeasibleError: when ``lam * L >= 1`` (more work is lost than done).

    >>> round(spot_overhead_s(36000, interruptions_per_hour=0.1,
    ...                       checkpoint_interval_s=1800, restart_s=300), 3)
    1241.379
    >>> spot_overhead_s(3600, interruptions_per_hour=0.0, checkpoint_interval_s=600, restart_s=60)
    0.0
    """
    loss_s = expected_loss_per_interruption_s(checkpoint_interval_s, restart_s)
    lost_fraction = interruptions_per_hour / 3600.0 * loss_s
    if lost_fraction >= 1.0:
        raise InfeasibleError(
            f"spot: {interruptions_per_hour:g} interruptions/h x {loss_s:g} s lost each "
            "is more time lost than gained; the job never finishes in expectation",
            hint="checkpoint more often, or use on-demand capacity",
        )
    if lost_fraction == 0.0:
        return 0.0
    return work_s / (1.0 - lost_fraction) - work_s
