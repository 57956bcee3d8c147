"""Instance runs over a demand timeline, billed on demand with and without auto-stop.

For an offering with ``n`` GPUs per instance, the demand of a :class:`Timeline`
needs ``ceil(busy_gpus / n)`` instances at each moment. Number the instances
1, 2, ... so that instance ``j`` runs whenever at least ``j`` are needed: its
*runs* are the stretches where demand reaches level ``j``. On demand, each run is
billed rounded up to the increment with the minimum charge
(:func:`gpuplan.cost.billing.billed_seconds`). Without auto-stop a run lasts while
the instance is *on* (busy + idle); with auto-stop it lasts while it is *busy*,
plus the auto-stop delay after each busy stretch, but never past the moment it
was switched off without auto-stop. Amounts are per 730-hour month.
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.catalog.schema import HOURS_PER_MONTH, Price
from gpuplan.cost.billing import billed_seconds
from gpuplan.cost.usage import Timeline

MONTH_S = HOURS_PER_MONTH * 3600.0
Run = tuple[float, float]


def _level_runs(timeline: Timeline, gpus_per_instance: float, attr: str) -> list[list[Run]]:
    """Runs (start, end) of each instance level; index 0 is level 1."""
    levels: list[list[Run]] = []
    for seg in timeline.segments:
        need = math.ceil(getattr(seg, attr) / gpus_per_instance - 1e-9)
        while len(levels) < need:
            levels.append([])
        end = seg.start_s + seg.duration_s
        for j in range(need):
            runs = levels[j]
            if runs and abs(runs[-1][1] - seg.start_s) < 1e-6:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((seg.start_s, end))
    if timeline.cyclic:
        for runs in levels:
            _wrap(runs, timeline.period_s)
    return levels


def _wrap(runs: list[Run], period_s: float) -> None:
    """Join the last run with the first when it continues across the period's end."""
    if len(runs) > 1 and runs[-1][1] >= runs[0][0] + period_s - 1e-6:
        last = runs.pop()
        first = runs.pop(0)
        runs.append((last[0], first[1] + period_s))


def _with_autostop(
    busy: list[Run], on: list[Run], delay_s: float, timeline: Timeline
) -> tuple[list[Run], float]:
    """Busy runs extended by the auto-stop delay (never past the end of the on-run).

    Returns the merged runs and the total seconds of auto-stop tail added.
    """
    period = timeline.period_s
    out: list[Run] = []
    for start, end in busy:
        limit = math.inf if timeline.cyclic else period
        for on_start, on_end in on:
            if on_start - 1e-6 <= start and end <= on_end + 1e-6:
                full = on_end - on_start >= period - 1e-6 and timeline.cyclic
                limit = math.inf if full else on_end
                break
        if timeline.cyclic and end - start >= period - 1e-6:
            out.append((start, end))  # busy all the time: never stops
            continue
        new_end = min(end + delay_s, limit)
        if out and new_end <= out[-1][1]:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], new_end)
        else:
            out.append((start, new_end))
    if timeline.cyclic:
        _wrap(out, period)
        if len(out) == 1 and out[0][1] - out[0][0] >= period:
            out = [(0.0, period)]  # the stops never come: up all the time
    tail = sum(e - s for s, e in out) - sum(e - s for s, e in busy)
    return out, max(tail, 0.0)


def _billed(runs: list[Run], price: Price, timeline: Timeline) -> tuple[float, float]:
    """(exact, billed) seconds of one level's runs within one period."""
    exact = billed = 0.0
    for start, end in runs:
        length = end - start
        exact += length
        if timeline.cyclic and length >= timeline.period_s - 1e-6:
            billed += length  # never stopped: no rounding
        else:
            billed += billed_seconds(length, price.granularity_s, price.minimum_s)
    return exact, billed


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Levels:
    """Per instance level (index 0 = level 1), on-demand seconds per 730-hour month.

    Attributes:
        on_exact: seconds up without auto-stop.
        on_billed: the same, billed (increments and minimum per run).
        auto_exact: seconds up with auto-stop.
        auto_billed: the same, billed.
        tail: seconds per month the auto-stop delay keeps instances up, all levels.
        peak_busy: instances busy at the busiest moment.
    """

    on_exact: tuple[float, ...]
    on_billed: tuple[float, ...]
    auto_exact: tuple[float, ...]
    auto_billed: tuple[float, ...]
    tail: float
    peak_busy: int


def instance_levels(
    timeline: Timeline, per_instance: float, price: Price, delay_s: float
) -> Levels:
    """Monthly run time of every instance level, exact and billed, with and without auto-stop.

    >>> from gpuplan.cost.usage import DemandBlock, weekly_timeline
    >>> week = weekly_timeline([DemandBlock(gpus=2, hours_per_day=10, days_per_week=5,
    ...                                     idle_hours_per_day=6)], origin="doc")
    >>> price = Price(mode="on-demand", per_hour=1.0, currency="USD", granularity_s=3600,
    ...               minimum_s=0)
    >>> lv = instance_levels(week, 1, price, 600)
    >>> [round(s / 3600 * 168 / 730, 3) for s in lv.on_billed]   # h/week: 16 h x 5 days
    [80.0, 80.0]
    >>> [round(s / 3600 * 168 / 730, 3) for s in lv.auto_billed]  # 10 h 10 min -> 11 h x 5
    [55.0, 55.0]
    """
    scale = MONTH_S / timeline.period_s
    on_runs = _level_runs(timeline, per_instance, "on_gpus")
    busy_runs = _level_runs(timeline, per_instance, "busy_gpus")
    on_exact, on_billed, auto_exact, auto_billed = [], [], [], []
    tail = 0.0
    for j, busy in enumerate(busy_runs):
        on = on_runs[j] if j < len(on_runs) else busy
        e, b = _billed(on, price, timeline)
        on_exact.append(e * scale)
        on_billed.append(b * scale)
        ext, t = _with_autostop(busy, on, delay_s, timeline)
        tail += t * scale
        e, b = _billed(ext, price, timeline)
        auto_exact.append(e * scale)
        auto_billed.append(b * scale)
    for on in on_runs[len(busy_runs) :]:  # levels that are on but never busy
        e, b = _billed(on, price, timeline)
        on_exact.append(e * scale)
        on_billed.append(b * scale)
    return Levels(
        on_exact=tuple(on_exact),
        on_billed=tuple(on_billed),
        auto_exact=tuple(auto_exact),
        auto_billed=tuple(auto_billed),
        tail=tail,
        peak_busy=len(busy_runs),
    )
