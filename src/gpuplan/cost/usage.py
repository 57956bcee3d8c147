"""Recurring GPU use: the usage file of ``gpuplan bill`` and utilization traces.

A usage file (YAML) describes a week of demand as stacked blocks of busy GPUs::

    gpu: H100-SXM              # GPU id or alias from the catalog
    providers: [aws, gcp]      # optional; empty = every provider with the GPU
    regions: []                # optional region substrings
    autostop_after: 10m        # optional; idle time before auto-stop (default 10m,
                               # the idle window of `gpuplan watch`)
    demand:                    # blocks add up; each starts at the same hour of the day
      - {gpus: 2, hours_per_day: 24, days_per_week: 7}                        # base load
      - {gpus: 6, hours_per_day: 10, days_per_week: 5, idle_hours_per_day: 6}  # bursts

One block can be written inline instead of ``demand``:
``{gpu: H100-SXM, gpus: 8, hours_per_day: 10, days_per_week: 5, idle_hours_per_day: 6}``.
``idle_hours_per_day`` are hours after the busy stretch when the machines stay up
(and billed) but idle, because nobody stops them; auto-stop removes them.

A trace (CSV) records what happened, one row per sample; each row's values hold
until the next row, and the last row for the median sampling interval::

    timestamp,gpus_busy,gpus_on        # gpus_on optional (default: the peak of gpus_busy,
    2026-11-02T00:00:00Z,2,8           #   i.e. the fleet stays up for the whole trace)

or one utilization column per GPU (percent; an empty cell = that GPU was off)::

    timestamp,gpu0,gpu1,gpu2
    2026-11-02T00:00:00Z,97,95,0

Parsing is pure (text in, objects out); the CLI reads the files.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import math
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuplan.errors import SpecError
from gpuplan.schema_base import UserModel
from gpuplan.units import parse_duration_s

WEEK_S = 7 * 86_400
DEFAULT_AUTOSTOP_S = 600.0
"""Idle time before auto-stop when the usage file gives none: the 10-minute idle
window of ``gpuplan watch`` (``monitor.policy.PolicyConfig.window_s``)."""
DEFAULT_BUSY_THRESHOLD_PCT = 10.0
"""A GPU counts as busy at or above this utilization: the threshold of ``gpuplan watch``."""


class _Model(UserModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DemandBlock(_Model):
    """GPUs busy for a stretch of each active day, and how long they then idle."""

    gpus: int = Field(ge=1, le=100_000, description="GPUs busy at once in this block.")
    hours_per_day: float = Field(gt=0, le=24, description="Busy hours per active day.")
    days_per_week: int = Field(ge=1, le=7, description="Active days per week.")
    idle_hours_per_day: float = Field(
        default=0.0,
        ge=0,
        le=24,
        description="Hours per active day the machines stay up idle after the busy stretch.",
    )

    @model_validator(mode="after")
    def _fits_in_a_day(self) -> DemandBlock:
        if self.hours_per_day + self.idle_hours_per_day > 24:
            raise ValueError("hours_per_day + idle_hours_per_day must be <= 24")
        return self


class UsageSpec(_Model):
    """A usage file: the GPU, where to look, and a week of demand (see the module docs)."""

    gpu: str = Field(min_length=1, description="GPU id or alias from the catalog.")
    providers: tuple[str, ...] = Field(default=(), description="Providers (empty = all).")
    regions: tuple[str, ...] = Field(default=(), description="Region substrings (empty = all).")
    autostop_after: float = Field(
        default=DEFAULT_AUTOSTOP_S,
        description="Idle time before auto-stop, e.g. 10m (default: 10m, as `gpuplan watch`).",
    )
    demand: tuple[DemandBlock, ...] | None = Field(
        default=None, min_length=1, description="Stacked demand blocks."
    )
    gpus: int | None = Field(default=None, ge=1, le=100_000, description="Inline block: GPUs.")
    hours_per_day: float | None = Field(default=None, gt=0, le=24, description="Inline block.")
    days_per_week: int | None = Field(default=None, ge=1, le=7, description="Inline block.")
    idle_hours_per_day: float | None = Field(default=None, ge=0, le=24, description="Inline.")

    @field_validator("autostop_after", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration_s(value, field="autostop_after")

    @field_validator("providers")
    @classmethod
    def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.lower() for v in value)

    @model_validator(mode="after")
    def _one_form(self) -> UsageSpec:
        inline = {
            k: getattr(self, k)
            for k in ("gpus", "hours_per_day", "days_per_week", "idle_hours_per_day")
            if getattr(self, k) is not None
        }
        if self.demand is not None and inline:
            raise ValueError(f"give demand or inline {', '.join(inline)}, not both")
        if self.demand is None:
            missing = [k for k in ("gpus", "hours_per_day", "days_per_week") if k not in inline]
            if missing:
                raise ValueError(f"{missing[0]}: field required (or give a demand: list of blocks)")
            if (self.hours_per_day or 0.0) + (self.idle_hours_per_day or 0.0) > 24:
                raise ValueError("hours_per_day + idle_hours_per_day must be <= 24")
        return self

    def blocks(self) -> tuple[DemandBlock, ...]:
        """The demand blocks, the inline form turned into one block."""
        if self.demand is not None:
            return self.demand
        return (
            DemandBlock(
                gpus=self.gpus or 0,
                hours_per_day=self.hours_per_day or 0.0,
                days_per_week=self.days_per_week or 0,
                idle_hours_per_day=self.idle_hours_per_day or 0.0,
            ),
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A stretch of time with a constant number of busy and powered-on GPUs.

    Attributes:
        start_s: seconds from the timeline's start.
        duration_s: length, seconds.
        busy_gpus: GPUs doing work.
        on_gpus: GPUs up and billed (>= busy_gpus) when nothing stops idle machines.
    """

    start_s: float
    duration_s: float
    busy_gpus: int
    on_gpus: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """GPU demand over a period, as contiguous segments from 0 to ``period_s``.

    Attributes:
        segments: contiguous, in time order.
        period_s: length of the timeline.
        cyclic: True when the period repeats (a typical week), so a run that ends at
            ``period_s`` continues at 0.
        origin: where the timeline came from, for the report.
        notes: assumptions made while reading it.
    """

    segments: tuple[Segment, ...]
    period_s: float
    cyclic: bool
    origin: str
    notes: tuple[str, ...]

    @property
    def busy_gpu_s(self) -> float:
        """GPU-seconds of work in one period."""
        return sum(s.duration_s * s.busy_gpus for s in self.segments)

    @property
    def on_gpu_s(self) -> float:
        """GPU-seconds powered on in one period (without auto-stop)."""
        return sum(s.duration_s * s.on_gpus for s in self.segments)

    @property
    def peak_busy_gpus(self) -> int:
        """Most GPUs busy at once."""
        return max((s.busy_gpus for s in self.segments), default=0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Everything ``bill`` needs besides the catalog.

    Attributes:
        gpu: GPU id or alias.
        providers: provider filter (empty = all).
        regions: region substring filter (empty = all).
        autostop_after_s: idle seconds before auto-stop.
        autostop_source: why that value (stated in the file, or the default and why).
        timeline: the demand.
    """

    gpu: str
    providers: tuple[str, ...]
    regions: tuple[str, ...]
    autostop_after_s: float
    autostop_source: str
    timeline: Timeline


def _merge(segments: list[Segment]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for seg in segments:
        if seg.duration_s <= 0:
            continue
        last = out[-1] if out else None
        if last and (last.busy_gpus, last.on_gpus) == (seg.busy_gpus, seg.on_gpus):
            out[-1] = dataclasses.replace(last, duration_s=last.duration_s + seg.duration_s)
        else:
            out.append(seg)
    return tuple(out)


def weekly_timeline(blocks: Sequence[DemandBlock], *, origin: str) -> Timeline:
    """A repeating week built from stacked demand blocks.

    Every block's busy stretch starts at hour 0 of each of its active days (days
    0..days_per_week-1), followed by its idle hours, so the blocks overlap as much
    as they can: the largest block sets the peak.

    >>> t = weekly_timeline([DemandBlock(gpus=8, hours_per_day=10, days_per_week=5,
    ...                                  idle_hours_per_day=6)], origin="test")
    >>> t.busy_gpu_s / 3600, t.on_gpu_s / 3600
    (400.0, 640.0)
    """
    cuts = {0.0, float(WEEK_S)}
    for b in blocks:
        for day in range(b.days_per_week):
            t0 = day * 86_400.0
            cuts.update({t0, t0 + b.hours_per_day * 3600.0})
            cuts.add(t0 + (b.hours_per_day + b.idle_hours_per_day) * 3600.0)
    edges = sorted(cuts)
    segments = []
    for start, end in zip(edges, edges[1:], strict=False):
        mid = (start + end) / 2.0
        day_index, into_s = divmod(mid, 86_400.0)
        busy = on = 0
        for b in blocks:
            if day_index >= b.days_per_week:
                continue
            if into_s < b.hours_per_day * 3600.0:
                busy += b.gpus
                on += b.gpus
            elif into_s < (b.hours_per_day + b.idle_hours_per_day) * 3600.0:
                on += b.gpus
        segments.append(Segment(start_s=start, duration_s=end - start, busy_gpus=busy, on_gpus=on))
    return Timeline(
        segments=_merge(segments),
        period_s=float(WEEK_S),
        cyclic=True,
        origin=origin,
        notes=(
            "demand blocks start at the same hour of each active day (days 1..N of the week), "
            "so they overlap as much as they can",
        ),
    )


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    path = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    if ":" in msg.split(" ")[0]:  # the validator already named the field
        return msg
    return f"{path}: {msg}" if path else msg


def parse_usage_yaml(text: str, *, origin: str) -> Usage:
    """Parse and validate a usage file; errors are one-line ``SpecError`` naming the field.

    >>> u = parse_usage_yaml("gpu: H100-SXM\\ngpus: 8\\nhours_per_day: 10\\ndays_per_week: 5",
    ...                      origin="u.yaml")
    >>> u.timeline.busy_gpu_s / 3600, u.autostop_after_s
    (400.0, 600.0)
    """
    from gpuplan.userfile import parse_yaml

    data = parse_yaml(text, what=origin, path=None, error=SpecError)
    if not isinstance(data, dict):
        raise SpecError(
            f"{origin}: expected a mapping of usage fields (gpu, demand or gpus/hours_per_day/"
            f"days_per_week), got {type(data).__name__}",
            hint="see the example examples/usage-team-8xh100.yaml",
        )
    try:
        spec = UsageSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{origin}: {_describe(exc)}") from exc
    stated = "autostop_after" in data
    return Usage(
        gpu=spec.gpu,
        providers=spec.providers,
        regions=spec.regions,
        autostop_after_s=spec.autostop_after,
        autostop_source="stated in the usage file"
        if stated
        else "default: the 10-minute idle window of `gpuplan watch`",
        timeline=weekly_timeline(spec.blocks(), origin=f"{origin}: weekly demand"),
    )


def _timestamp(raw: str, where: str) -> float:
    try:
        stamp = dt.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(f"{where}: timestamp: expected ISO 8601, got {raw!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def _count(raw: str, where: str, *, lo: float = 0.0, hi: float = math.inf) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{where}: expected a number, got {raw!r}") from None
    if not (lo <= value <= hi) or not math.isfinite(value):
        raise SpecError(f"{where}: expected a number in [{lo:g}, {hi:g}], got {raw!r}")
    return value


def _gpus(raw: str, where: str) -> int:
    value = _count(raw, where)
    if not value.is_integer():
        raise SpecError(f"{where}: expected a whole number of GPUs, got {raw!r}")
    return int(value)


def parse_trace_csv(
    text: str, *, origin: str, busy_threshold_pct: float = DEFAULT_BUSY_THRESHOLD_PCT
) -> Timeline:
    """Parse a utilization trace (see the module docs) into a non-repeating timeline.

    >>> t = parse_trace_csv("timestamp,gpus_busy,gpus_on\\n2026-01-01T00:00Z,2,4\\n"
    ...                     "2026-01-01T01:00Z,4,4\\n", origin="t.csv")
    >>> t.period_s, t.busy_gpu_s / 3600, t.on_gpu_s / 3600
    (7200.0, 6.0, 8.0)
    """
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise SpecError(f"{origin}: malformed CSV: {exc}") from None
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    if len(rows) < 3:
        raise SpecError(f"{origin}: a trace needs a header and at least two rows")
    header = [h.strip().lower() for h in rows[0]]
    if header[0] != "timestamp":
        raise SpecError(f"{origin}: first column must be timestamp, got {rows[0][0]!r}")
    per_gpu = "gpus_busy" not in header
    if per_gpu:
        if not all(h.startswith("gpu") for h in header[1:]) or len(header) < 2:
            raise SpecError(
                f"{origin}: header: expected timestamp,gpus_busy[,gpus_on] or "
                "timestamp,gpu0,gpu1,... (utilization percent per GPU)"
            )
    else:
        extra = [h for h in header[1:] if h not in ("gpus_busy", "gpus_on")]
        if extra:
            raise SpecError(f"{origin}: header: unknown column {extra[0]!r}")
    times: list[float] = []
    busy: list[int] = []
    on: list[int | None] = []
    for n, row in enumerate(rows[1:], start=2):
        where = f"{origin}: row {n}"
        if len(row) != len(header):
            raise SpecError(f"{where}: expected {len(header)} columns, got {len(row)}")
        times.append(_timestamp(row[0], where))
        if times[-1] <= (times[-2] if len(times) > 1 else -math.inf):
            raise SpecError(f"{where}: timestamp: not after the previous row")
        cells = dict(zip(header, (c.strip() for c in row), strict=True))
        if per_gpu:
            utils = [
                _count(cells[h], f"{where}: {h}", hi=100.0) for h in header[1:] if cells[h] != ""
            ]
            busy.append(sum(1 for u in utils if u >= busy_threshold_pct))
            on.append(len(utils))
        else:
            busy.append(_gpus(cells["gpus_busy"], f"{where}: gpus_busy"))
            raw_on = cells.get("gpus_on", "")
            gpus_on = None if raw_on == "" else _gpus(raw_on, f"{where}: gpus_on")
            if gpus_on is not None and gpus_on < busy[-1]:
                raise SpecError(f"{where}: gpus_on: fewer than gpus_busy")
            on.append(gpus_on)
    steps = [b - a for a, b in zip(times, times[1:], strict=False)]
    last_s = statistics.median(steps)
    notes = [f"each sample holds until the next; the last for the median interval {last_s:g} s"]
    peak = max(busy)
    if not per_gpu and any(o is None for o in on):
        notes.append(
            f"no gpus_on value: the fleet is taken as up for the whole trace with {peak} GPUs "
            "(the peak of gpus_busy)"
        )
    if per_gpu:
        notes.append(
            f"a GPU is busy at >= {busy_threshold_pct:g}% utilization; an empty cell = off"
        )
    durations = [*steps, last_s]
    segments = []
    start = 0.0
    for d, b, o in zip(durations, busy, on, strict=True):
        segments.append(
            Segment(start_s=start, duration_s=d, busy_gpus=b, on_gpus=peak if o is None else o)
        )
        start += d
    first = dt.datetime.fromtimestamp(times[0], tz=dt.timezone.utc).isoformat()
    return Timeline(
        segments=_merge(segments),
        period_s=start,
        cyclic=False,
        origin=f"{origin}: {len(times)} samples from {first} over {start / 3600:g} h",
        notes=tuple(notes),
    )


def usage_from_text(
    text: str,
    *,
    origin: str,
    is_csv: bool,
    gpu: str | None = None,
    providers: Sequence[str] | None = None,
    regions: Sequence[str] | None = None,
    autostop_after: str | None = None,
    busy_threshold: float | None = None,
) -> Usage:
    """A usage YAML or utilization CSV with ``bill``'s flag overrides applied.

    The one reader behind ``gpuplan bill FILE`` and the web's ``POST /api/bill``;
    ``is_csv`` selects the trace format (a CSV needs ``gpu``; ``busy_threshold`` None
    means :data:`DEFAULT_BUSY_THRESHOLD_PCT`).
    """
    if is_csv:
        if gpu is None:
            raise SpecError(
                f"--gpu: required with a CSV trace ({origin})",
                hint=f"gpuplan bill {origin} --gpu A100",
            )
        usage = Usage(
            gpu=gpu,
            providers=(),
            regions=(),
            autostop_after_s=DEFAULT_AUTOSTOP_S,
            autostop_source="default: the 10-minute idle window of `gpuplan watch`",
            timeline=parse_trace_csv(
                text,
                origin=origin,
                busy_threshold_pct=DEFAULT_BUSY_THRESHOLD_PCT
                if busy_threshold is None
                else busy_threshold,
            ),
        )
    else:
        if busy_threshold is not None:
            raise SpecError(
                f"--busy-threshold: only for a utilization trace CSV, not the usage YAML {origin}"
            )
        usage = parse_usage_yaml(text, origin=origin)
    changes: dict[str, Any] = {}
    if gpu is not None:
        changes["gpu"] = gpu
    if providers:
        changes["providers"] = tuple(p.lower() for p in providers)
    if regions:
        changes["regions"] = tuple(regions)
    if autostop_after is not None:
        try:
            changes["autostop_after_s"] = parse_duration_s(autostop_after, field="--autostop-after")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        changes["autostop_source"] = "--autostop-after"
    return dataclasses.replace(usage, **changes)
