"""Inline SVG charts for the HTML report, drawn by hand (no plotting library).

Two charts: cost versus time of every ranked option with the Pareto front,
and the per-GPU memory breakdown of the top options against GPU capacity.
Both return an ``<svg>`` element as a string; every text is escaped and every
number is formatted with a fixed precision, so the same plan gives the same
bytes.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuplan.planner.model import Option
from gpuplan.units import format_duration

#: Fill colour per billing mode (colour-blind-safe Okabe-Ito palette).
MODE_COLORS: dict[str, str] = {
    "on-demand": "#0072B2",
    "spot": "#E69F00",
    "reserved-1y": "#009E73",
    "reserved-3y": "#56B4E9",
    "monthly": "#CC79A7",
    "capacity-block": "#D55E00",
    "community": "#8C6D31",
}
OTHER_COLOR = "#777777"

#: Memory parts in stacking order, with their colours.
MEMORY_PARTS: tuple[tuple[str, str], ...] = (
    ("weights", "#0072B2"),
    ("gradients", "#56B4E9"),
    ("optimizer", "#009E73"),
    ("activations", "#E69F00"),
    ("overhead", "#999999"),
)

GIB = 2**30
_WIDTH = 780

#: Every text the charts draw, in English; pass ``text=`` to draw them in another language
#: (``billing.<mode>`` keys, when given, name the billing modes in the legend).
TEXT: dict[str, str] = {
    "scatter.aria": "Cost versus time of the ranked options",
    "scatter.title": "Cost versus time; the line joins the Pareto front",
    "scatter.x": "Wall-clock time incl. startup ({unit}, log scale)",
    "scatter.y": "Total cost ({currency}, log scale)",
    "scatter.deadline": "deadline",
    "scatter.budget": "budget",
    "scatter.front": "Pareto front",
    "scatter.front_legend": "on the Pareto front (joined by the line)",
    "scatter.tip": "time {time}, cost {cost} {currency}",
    "scatter.tip_front": "on the Pareto front",
    "unit.min": "min",
    "unit.h": "h",
    "unit.days": "days",
    "memory.aria": "Per-GPU memory breakdown of the top options",
    "memory.title": "Per-GPU memory breakdown (GiB) against GPU capacity",
    "memory.axis": "Memory per GPU (GiB)",
    "memory.capacity": "GPU capacity",
    "memory.tip": "capacity {cap} GiB; used {used} GiB, headroom {headroom} GiB",
    "part.weights": "weights",
    "part.gradients": "gradients",
    "part.optimizer": "optimizer",
    "part.activations": "activations",
    "part.overhead": "overhead",
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChartOption:
    """What the charts draw of one option: from a planner :class:`Option` or its JSON."""

    provider: str
    instance_type: str
    region: str
    billing_mode: str
    nodes: int
    gpus: int
    gpu: str
    time_s: float
    cost_total: float
    label: str
    strategy: str
    capacity_bytes: float
    device_used_bytes: float
    headroom_bytes: float
    breakdown: Mapping[str, float]

    @classmethod
    def of(cls, o: Option | ChartOption) -> ChartOption:
        """The chart view of a planner option (a ChartOption is returned as is)."""
        if isinstance(o, ChartOption):
            return o
        mem = o.configuration.fit.memory
        return cls(
            provider=o.provider,
            instance_type=o.instance_type,
            region=o.region,
            billing_mode=o.billing_mode,
            nodes=o.nodes,
            gpus=o.gpus,
            gpu=o.gpu,
            time_s=o.time_s,
            cost_total=o.cost_total,
            label=o.label(),
            strategy=o.configuration.strategy.label(),
            capacity_bytes=mem.capacity_bytes,
            device_used_bytes=mem.device_used_bytes,
            headroom_bytes=mem.headroom_bytes,
            breakdown=mem.breakdown,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any], strategy: str) -> ChartOption:
        """The chart view of one option of ``plan --json`` (``strategy``: its label)."""
        used = float(d.get("device_used_bytes", 0))
        headroom = float(d.get("headroom_bytes", 0))
        return cls(
            provider=d["provider"],
            instance_type=d["instance_type"],
            region=d.get("region", ""),
            billing_mode=d["billing_mode"],
            nodes=int(d["nodes"]),
            gpus=int(d.get("gpus", 0)),
            gpu=d.get("gpu", ""),
            time_s=float(d["time_s"]),
            cost_total=float(d["cost_total"]),
            label=f"{d['provider']} {d['instance_type']} x{d['nodes']} "
            f"({d.get('gpus', '?')} {d.get('gpu', '?')}, {d['billing_mode']})",
            strategy=strategy,
            capacity_bytes=float(d.get("capacity_bytes", used + headroom)),
            device_used_bytes=used,
            headroom_bytes=headroom,
            breakdown={k: float(v) for k, v in d.get("memory_breakdown", {}).items()},
        )


def _text(text: Mapping[str, str] | None) -> dict[str, str]:
    return {**TEXT, **(text or {})}


def esc(text: object) -> str:
    """Escape any value for HTML/SVG text or attribute content."""
    return html.escape(str(text), quote=True)


def num(value: float) -> str:
    """Format a coordinate with a fixed precision (stable bytes)."""
    return f"{value:.1f}"


def option_key(o: Option | ChartOption) -> tuple[str, str, str, str, int]:
    """Identity of an option across ``plan.options`` and ``plan.pareto``."""
    return (o.provider, o.instance_type, o.region, o.billing_mode, o.nodes)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogAxis:
    """A base-10 log axis mapping ``[lo, hi]`` onto pixels ``[start, end]``."""

    lo: float
    hi: float
    start: float
    end: float

    @classmethod
    def fit(cls, values: Sequence[float], start: float, end: float) -> LogAxis:
        """An axis covering ``values`` with a little padding on both sides."""
        positive = [v for v in values if v > 0 and math.isfinite(v)] or [1.0]
        lo, hi = min(positive), max(positive)
        if hi / lo < 10:  # widen to at least one decade so ticks exist
            mid = math.sqrt(lo * hi)
            lo, hi = min(lo, mid / math.sqrt(10)), max(hi, mid * math.sqrt(10))
        pad = (hi / lo) ** 0.06
        return cls(lo=lo / pad, hi=hi * pad, start=start, end=end)

    def __call__(self, value: float) -> float:
        """Pixel position of ``value`` (clamped into the axis range)."""
        v = min(max(value, self.lo), self.hi)
        frac = math.log10(v / self.lo) / math.log10(self.hi / self.lo)
        return self.start + frac * (self.end - self.start)

    def ticks(self) -> list[float]:
        """1-2-5 ticks inside the range (only decades when there are many)."""
        first, last = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
        steps = (1.0,) if last - first > 4 else (1.0, 2.0, 5.0)
        out = [m * 10.0**e for e in range(first, last + 1) for m in steps]
        return [t for t in out if self.lo <= t <= self.hi]


def tick_label(value: float) -> str:
    """Short label for a tick value: ``0.05``, ``2``, ``1,000``."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


def _time_unit(max_s: float, t: Mapping[str, str]) -> tuple[str, float]:
    if max_s < 2 * 3600:
        return t["unit.min"], 60.0
    if max_s < 4 * 86400:
        return t["unit.h"], 3600.0
    return t["unit.days"], 86400.0


def scatter(
    ranked: Sequence[Option | ChartOption],
    pareto: Sequence[Option | ChartOption],
    *,
    currency: str,
    deadline_s: float | None = None,
    budget: float | None = None,
    text: Mapping[str, str] | None = None,
) -> str:
    """Cost (log) versus wall-clock time (log) of every option, with the Pareto front.

    Ranked options are numbered by rank; options on the front have a black
    ring and are joined by a line in time order. Each point carries a
    ``<title>`` tooltip (provider, instance, time, cost, strategy). Dashed
    lines mark the deadline and the budget when the spec gives them.
    ``text`` replaces any of :data:`TEXT` (labels in another language).
    """
    t = _text(text)
    height, left, right, top, bottom = 460, 84, 24, 40, 60
    ranked_c = [ChartOption.of(o) for o in ranked]
    pareto_c = [ChartOption.of(o) for o in pareto]
    rank = {option_key(o): i for i, o in enumerate(ranked_c, 1)}
    front = {option_key(o) for o in pareto_c}
    points: list[ChartOption] = []
    seen: set[tuple[str, str, str, str, int]] = set()
    for o in (*ranked_c, *pareto_c):
        if option_key(o) not in seen:
            seen.add(option_key(o))
            points.append(o)
    times = [o.time_s for o in points] + ([deadline_s] if deadline_s else [])
    unit, per = _time_unit(max(times, default=3600.0), t)
    x = LogAxis.fit([t / per for t in times], left, _WIDTH - right)
    costs = [o.cost_total for o in points] + ([budget] if budget else [])
    y = LogAxis.fit(costs, height - bottom, top)
    out = [
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
        f'role="img" aria-label="{esc(t["scatter.aria"])}">',
        f"<title>{esc(t['scatter.title'])}</title>",
    ]
    out += _grid(x, y, left, top, _WIDTH - right, height - bottom)
    out.append(
        f'<text class="axis" x="{num((left + _WIDTH - right) / 2)}" y="{height - 14}" '
        f'text-anchor="middle">{esc(t["scatter.x"].format(unit=unit))}</text>'
    )
    out.append(
        f'<text class="axis" transform="translate(18 {num((top + height - bottom) / 2)}) rotate(-90)" '
        f'text-anchor="middle">{esc(t["scatter.y"].format(currency=currency))}</text>'
    )
    if deadline_s:
        px = x(deadline_s / per)
        out.append(
            f'<line class="limit" x1="{num(px)}" y1="{top}" x2="{num(px)}" y2="{height - bottom}">'
            f"<title>{esc(t['scatter.deadline'])} {esc(format_duration(deadline_s))}</title></line>"
        )
        out.append(
            f'<text class="limit-label" x="{num(px - 4)}" y="{top + 12}" text-anchor="end">'
            f"{esc(t['scatter.deadline'])}</text>"
        )
    if budget:
        py = y(budget)
        out.append(
            f'<line class="limit" x1="{left}" y1="{num(py)}" x2="{_WIDTH - right}" y2="{num(py)}">'
            f"<title>{esc(t['scatter.budget'])} {budget:,.2f} {esc(currency)}</title></line>"
        )
        out.append(
            f'<text class="limit-label" x="{_WIDTH - right - 4}" y="{num(py - 4)}" '
            f'text-anchor="end">{esc(t["scatter.budget"])}</text>'
        )
    front_pts = sorted(
        (o for o in points if option_key(o) in front), key=lambda o: (o.time_s, o.cost_total)
    )
    if len(front_pts) > 1:
        path = " ".join(f"{num(x(o.time_s / per))},{num(y(o.cost_total))}" for o in front_pts)
        out.append(
            f'<polyline class="front" points="{path}"><title>{esc(t["scatter.front"])}</title></polyline>'
        )
    # draw unranked first so ranked points (and the best) end up on top
    for o in sorted(points, key=lambda o: -rank.get(option_key(o), 10**9)):
        out.append(
            _point(
                o,
                x(o.time_s / per),
                y(o.cost_total),
                rank.get(option_key(o)),
                option_key(o) in front,
                currency,
                t,
            )
        )
    out += _scatter_legend(points, left, 16, t)
    out.append("</svg>")
    return "\n".join(out)


def _grid(x: LogAxis, y: LogAxis, x0: float, y0: float, x1: float, y1: float) -> list[str]:
    out = [
        f'<rect class="plot" x="{num(x0)}" y="{num(y0)}" width="{num(x1 - x0)}" height="{num(y1 - y0)}"/>'
    ]
    for t in x.ticks():
        px = x(t)
        out.append(
            f'<line class="grid" x1="{num(px)}" y1="{num(y0)}" x2="{num(px)}" y2="{num(y1)}"/>'
        )
        out.append(
            f'<text class="tick" x="{num(px)}" y="{num(y1 + 16)}" text-anchor="middle">'
            f"{esc(tick_label(t))}</text>"
        )
    for t in y.ticks():
        py = y(t)
        out.append(
            f'<line class="grid" x1="{num(x0)}" y1="{num(py)}" x2="{num(x1)}" y2="{num(py)}"/>'
        )
        out.append(
            f'<text class="tick" x="{num(x0 - 6)}" y="{num(py + 4)}" text-anchor="end">'
            f"{esc(tick_label(t))}</text>"
        )
    return out


def _point(
    o: ChartOption,
    px: float,
    py: float,
    rank: int | None,
    on_front: bool,
    currency: str,
    t: Mapping[str, str],
) -> str:
    color = MODE_COLORS.get(o.billing_mode, OTHER_COLOR)
    ring = ' stroke="#000" stroke-width="2"' if on_front else ' stroke="#fff" stroke-width="1"'
    radius = 7 if rank == 1 else 5
    tip = [
        f"#{rank} " if rank else "",
        o.label,
        "\n"
        + t["scatter.tip"].format(
            time=format_duration(o.time_s), cost=f"{o.cost_total:,.2f}", currency=currency
        ),
        f"\n{o.strategy}",
        "\n" + t["scatter.tip_front"] if on_front else "",
    ]
    text = f"<title>{esc(''.join(tip))}</title>"
    out = f'<circle cx="{num(px)}" cy="{num(py)}" r="{radius}" fill="{color}"{ring}>{text}</circle>'
    if rank is not None and rank <= 9:
        out += f'<text class="rank" x="{num(px + radius + 2)}" y="{num(py - radius)}">{rank}</text>'
    return out


def _legend_width(label: str) -> float:
    """Approximate width of a legend entry (marker + 11px text) in pixels (CJK: double)."""
    return 24 + 6.6 * sum(2 if ord(c) > 0x2E80 else 1 for c in label)


def _scatter_legend(
    points: Sequence[ChartOption], x0: float, y0: float, t: Mapping[str, str]
) -> list[str]:
    modes = [m for m in MODE_COLORS if any(o.billing_mode == m for o in points)]
    modes += sorted({o.billing_mode for o in points} - set(MODE_COLORS))
    out = []
    lx = x0
    for mode in modes:
        color = MODE_COLORS.get(mode, OTHER_COLOR)
        name = t.get(f"billing.{mode}", mode)
        out.append(f'<circle cx="{num(lx + 6)}" cy="{num(y0)}" r="5" fill="{color}"/>')
        out.append(f'<text class="legend" x="{num(lx + 16)}" y="{num(y0 + 4)}">{esc(name)}</text>')
        lx += _legend_width(name)
    out.append(
        f'<circle cx="{num(lx + 6)}" cy="{num(y0)}" r="5" fill="#fff" stroke="#000" stroke-width="2"/>'
    )
    out.append(
        f'<text class="legend" x="{num(lx + 16)}" y="{num(y0 + 4)}">'
        f"{esc(t['scatter.front_legend'])}</text>"
    )
    return out


def _nice_step(span: float, target: int = 6) -> float:
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw)


def memory_bars(
    options: Sequence[Option | ChartOption], *, text: Mapping[str, str] | None = None
) -> str:
    """Stacked per-GPU memory of each option (GiB) with its GPU capacity marked.

    Parts are weights, gradients, optimizer, activations and overhead, as the
    memory estimator reports them (they sum to the device memory used). The
    red tick on each row is that GPU's capacity. ``text`` as for :func:`scatter`.
    """
    t = _text(text)
    label_w, right, top, row_h, gap = 300, 24, 44, 22, 8
    x0, x1 = label_w, _WIDTH - right
    rows = [ChartOption.of(o) for o in options]
    height = top + len(rows) * (row_h + gap) + 40
    peak = (
        max(
            (max(o.capacity_bytes, o.device_used_bytes) for o in rows),
            default=GIB,
        )
        / GIB
    )
    step = _nice_step(peak * 1.05)
    scale_max = math.ceil(peak * 1.05 / step) * step

    def px(gib: float) -> float:
        return x0 + gib / scale_max * (x1 - x0)

    out = [
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
        f'role="img" aria-label="{esc(t["memory.aria"])}">',
        f"<title>{esc(t['memory.title'])}</title>",
    ]
    lx = 90.0
    for part, color in (*MEMORY_PARTS, ("", "#C00000")):
        name = t.get(f"part.{part}", part) if part else t["memory.capacity"]
        if not part:
            out.append(
                f'<line x1="{num(lx + 6)}" y1="8" x2="{num(lx + 6)}" y2="22" stroke="{color}" '
                'stroke-width="3"/>'
            )
        else:
            out.append(f'<rect x="{num(lx)}" y="9" width="12" height="12" fill="{color}"/>')
        out.append(f'<text class="legend" x="{num(lx + 16)}" y="20">{esc(name)}</text>')
        lx += _legend_width(name)
    bottom_y = top + len(rows) * (row_h + gap)
    tick = 0.0
    while tick <= scale_max + 1e-9:
        out.append(
            f'<line class="grid" x1="{num(px(tick))}" y1="{top - 6}" x2="{num(px(tick))}" '
            f'y2="{num(bottom_y)}"/>'
        )
        out.append(
            f'<text class="tick" x="{num(px(tick))}" y="{num(bottom_y + 14)}" text-anchor="middle">'
            f"{esc(tick_label(tick))}</text>"
        )
        tick += step
    out.append(
        f'<text class="axis" x="{num((x0 + x1) / 2)}" y="{num(bottom_y + 32)}" text-anchor="middle">'
        f"{esc(t['memory.axis'])}</text>"
    )
    for i, o in enumerate(rows):
        out += _memory_row(o, i + 1, top + i * (row_h + gap), row_h, px, label_w, t)
    out.append("</svg>")
    return "\n".join(out)


def _memory_row(
    o: ChartOption,
    rank: int,
    y: float,
    h: float,
    px: Callable[[float], float],
    label_w: int,
    t: Mapping[str, str],
) -> list[str]:
    label = f"#{rank} {o.gpu} x{o.gpus} ({o.provider} {o.instance_type})"
    short = label if len(label) <= 44 else label[:43] + "\u2026"
    out = [
        f'<text class="rowlabel" x="{label_w - 8}" y="{num(y + h / 2 + 4)}" text-anchor="end">'
        f"<title>{esc(label)}</title>{esc(short)}</text>"
    ]
    parts = list(MEMORY_PARTS)
    parts += [(p, OTHER_COLOR) for p in sorted(o.breakdown) if p not in dict(MEMORY_PARTS)]
    cursor = 0.0
    for part, color in parts:
        gib = max(o.breakdown.get(part, 0.0), 0.0) / GIB
        if gib <= 0:
            continue
        x_a, x_b = px(cursor), px(cursor + gib)
        out.append(
            f'<rect x="{num(x_a)}" y="{num(y)}" width="{num(max(x_b - x_a, 0.5))}" height="{num(h)}" '
            f'fill="{color}"><title>{esc(t.get(f"part.{part}", part))}: {gib:.2f} GiB</title></rect>'
        )
        cursor += gib
    cap = o.capacity_bytes / GIB
    tip = t["memory.tip"].format(
        cap=f"{cap:.1f}", used=f"{cursor:.1f}", headroom=f"{o.headroom_bytes / GIB:.1f}"
    )
    out.append(
        f'<line x1="{num(px(cap))}" y1="{num(y - 3)}" x2="{num(px(cap))}" y2="{num(y + h + 3)}" '
        f'stroke="#C00000" stroke-width="3"><title>{esc(tip)}</title></line>'
    )
    return out
