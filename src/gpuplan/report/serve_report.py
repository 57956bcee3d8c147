"""Render a serve plan: plain-text rows for the terminal and one self-contained HTML page.

Formatting only: every number comes from the :class:`~gpuplan.planner.serve_plan.ServePlan`.
The HTML has no scripts or external resources and no timestamps (same plan, same bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuplan.planner.serve_plan import ServePlan, ServicePlan
from gpuplan.report.html import _STYLE
from gpuplan.report.svg import esc

REJECTED_SHOWN = 20


def latency_text(sp: ServicePlan) -> str:
    """``TTFT p99 0.37 s, TPOT p99 37 ms`` or ``p99 5 ms``."""
    lat = sp.latency
    if "ttft_p99_s" in lat:
        return f"TTFT p99 {lat['ttft_p99_s']:.2f} s, TPOT p99 {lat['tpot_p99_s'] * 1e3:.0f} ms"
    if "latency_p99_s" in lat:
        value = lat["latency_p99_s"]
        return f"p99 {value:.2f} s" if value >= 1 else f"p99 {value * 1e3:.0f} ms"
    return "-"


def service_rows(plan: ServePlan) -> list[list[str]]:
    """One row per service: name, placement, replicas, latency, cost/month, cost/M, why."""
    rows = []
    for sp in plan.services:
        per_m = (
            "-"
            if sp.cost_per_million is None
            else f"{sp.cost_per_million:,.3g} / M {sp.cost_per_million_unit}"
        )
        share = f" ({sp.share:.0%} of the GPU)" if sp.share is not None else ""
        rows.append(
            [
                sp.service,
                f"{sp.placement}, {sp.region}{share}",
                str(sp.replicas),
                latency_text(sp),
                f"{sp.cost_per_month:,.0f}",
                per_m,
                sp.why,
            ]
        )
    return rows


def gpu_rows(plan: ServePlan) -> list[list[str]]:
    """One row per shared GPU: placement, services, compute used, headroom, cost."""
    rows = []
    for g in plan.shared_gpus:
        mem = (
            f"{g.memory_headroom_bytes / 2**30:.1f} GiB free"
            if g.memory_headroom_bytes is not None
            else ", ".join(g.mig_profiles)
        )
        rows.append(
            [
                g.placement,
                ", ".join(g.services),
                f"{g.compute_used:.0%} used, {g.compute_headroom:.0%} free",
                mem,
                f"{g.cost_per_month:,.0f}",
            ]
        )
    return rows


def rejection_counts(plan: ServePlan) -> list[tuple[str, int]]:
    """Rejected placements grouped by reason (regions and providers folded), most first."""
    counts: dict[str, int] = {}
    for r in plan.rejected:
        reason = r.reason
        if reason.startswith(("no region matching", "provider ")):
            reason = "outside the constraints (region / provider)"
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def summary_line(plan: ServePlan) -> str:
    """The one-line answer: total cost, against a dedicated device per service."""
    shared = sum(len(g.services) for g in plan.shared_gpus)
    saving = plan.dedicated_cost_per_month - plan.cost_per_month
    text = (
        f"{len(plan.services)} services: {plan.cost_per_month:,.0f} {plan.currency}/month "
        f"(objective {plan.objective}); a dedicated device each: "
        f"{plan.dedicated_cost_per_month:,.0f} {plan.currency}/month"
    )
    if plan.shared_gpus:
        text += (
            f". {shared} services share {len(plan.shared_gpus)} GPU(s), saving "
            f"{saving:,.0f} {plan.currency}/month ({saving / plan.dedicated_cost_per_month:.0%})"
        )
    return text


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(plan: ServePlan, *, title: str = "gpuplan serve plan") -> str:
    """The whole plan as one HTML document."""
    near = [
        r for r in plan.rejected if not r.reason.startswith(("no region", "provider ", "no price"))
    ]
    rejected = [[r.service, r.placement, r.reason] for r in near[:REJECTED_SHOWN]]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p class='best'>{esc(summary_line(plan))}</p>",
        "<h2>Services</h2>",
        _table(
            [
                "service",
                "placement",
                "replicas",
                "latency",
                f"{plan.currency}/month",
                "cost per million",
                "why",
            ],
            service_rows(plan),
        ),
    ]
    if plan.shared_gpus:
        parts += [
            "<h2>Shared GPUs</h2>",
            _table(
                ["GPU", "services", "compute", "memory", f"{plan.currency}/month"], gpu_rows(plan)
            ),
        ]
    parts += [
        f"<h2>Rejected placements ({len(plan.rejected)})</h2>",
        _table(["reason", "placements"], [[k, str(v)] for k, v in rejection_counts(plan)]),
        f"<p>Placements that fit the constraints and have a price but failed (first {REJECTED_SHOWN}):</p>",
        _table(["service", "placement", "reason"], rejected),
        "<h2>Assumptions</h2><ul>",
        "".join(f"<li>{esc(a)}</li>" for a in plan.assumptions),
        f"</ul><p class='muted'>{plan.candidates_considered} placements considered; "
        f"{esc(plan.method)}.</p></body></html>",
    ]
    return "".join(parts) + "\n"
