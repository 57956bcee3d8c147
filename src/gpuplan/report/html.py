"""``plan --html``: one self-contained HTML report of a :class:`~gpuplan.planner.Plan`.

The document has no scripts, no external stylesheets, fonts or images: the
style is one inline ``<style>`` block and the charts are inline SVG drawn by
:mod:`gpuplan.report.svg`, so it renders offline in any browser. URLs in the
provenance (price sources, exchange-rate source) are plain text, never loaded.

The report only formats the plan; it recomputes nothing. Output is
deterministic: no timestamps, fixed number formats, stable ordering, so the
same plan and spec give the same bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from gpuplan.planner.model import Option, Plan, Rejection, reason_class
from gpuplan.report.svg import GIB, esc, memory_bars, option_key, scatter
from gpuplan.spec import JobSpec
from gpuplan.units import format_count, format_duration

#: How many of the top options get a memory bar and a cost breakdown.
MEMORY_ROWS = 10
COST_DETAILS = 3
CLOSEST_REJECTED = 10

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5rem auto;
       max-width: 1200px; padding: 0 1rem; color: #1b1b1b; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem;
       border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.sub { color: #555; margin-top: 0; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dl.summary dt { font-weight: 600; } dl.summary dd { margin: 0; }
.best { background: #eef6ee; border-left: 4px solid #2e7d32; padding: .6rem 1rem; margin: 1rem 0; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0; }
th, td { border: 1px solid #ddd; padding: .25rem .45rem; vertical-align: top; text-align: left; }
th { background: #f4f4f4; } td.n { text-align: right; white-space: nowrap; }
tr.front td:first-child { font-weight: 700; }
.warn { color: #8a4b00; } .muted { color: #666; } code { font-size: .85rem; }
svg.chart { max-width: 100%; height: auto; font-size: 11px; }
svg .plot { fill: #fff; stroke: #bbb; } svg .grid { stroke: #e5e5e5; }
svg .tick, svg .legend, svg .rowlabel { fill: #333; } svg .axis { fill: #111; font-size: 12px; }
svg .front { fill: none; stroke: #000; stroke-width: 1.5; }
svg .limit { stroke: #C00000; stroke-dasharray: 5 4; } svg .limit-label { fill: #C00000; }
svg .rank { font-weight: 700; fill: #000; }
"""


def render_html(plan: Plan, spec: JobSpec, *, title: str | None = None) -> str:
    """Render ``plan`` (made for ``spec``) as one self-contained HTML document.

    Args:
        plan: the planner's result.
        spec: the job spec the plan was made for (model, method, constraints).
        title: page title; default ``gpuplan plan: <model> (<method>)``.

    Returns:
        The HTML text (UTF-8, no external resources, deterministic).
    """
    title = title or f"gpuplan plan: {spec.model} ({spec.method})"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{esc(title)}</h1>",
        _summary(plan, spec),
        _best(plan),
        _charts(plan, spec),
        _options_table(plan),
        _cost_details(plan),
        _rejections(plan, spec),
        _assumptions(plan),
        _provenance(plan),
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


# --- summary ---------------------------------------------------------------------------


def _work(spec: JobSpec) -> str:
    w = spec.work
    if w is None:
        return "not given"
    if w.tokens is not None:
        return f"{format_count(w.tokens)} tokens"
    if w.samples is not None:
        return f"{format_count(w.samples)} samples x {w.epochs or 1:g} epochs"
    return f"{w.steps} optimizer steps"


def _constraints(spec: JobSpec) -> list[tuple[str, str]]:
    c = spec.constraints
    rows = [
        ("deadline", format_duration(c.deadline) if c.deadline is not None else "none"),
        ("budget", f"{c.budget:,.2f} {c.currency}" if c.budget is not None else "none"),
        ("providers", ", ".join(c.providers) or "any"),
        ("regions", ", ".join(c.regions) or "any"),
        ("billing modes", ", ".join(c.billing) or "any"),
    ]
    if c.compliance:
        rows.append(("compliance", ", ".join(c.compliance)))
    if c.max_gpus is not None:
        rows.append(("max GPUs", str(c.max_gpus)))
    if c.bare_metal_only:
        rows.append(("bare metal only", "yes"))
    return rows


def _summary(plan: Plan, spec: JobSpec) -> str:
    version = plan.provenance.get("gpuplan_version", "unknown")
    batch = f"micro-batch {spec.micro_batch_size}"
    if spec.global_batch_size is not None:
        batch += f", global batch {spec.global_batch_size}"
    if spec.seq_len is not None:
        batch += f", sequence {spec.seq_len}"
    rows: list[tuple[str, str]] = [
        ("model", spec.model),
        ("method", spec.method + (f" (rank {spec.lora.rank})" if spec.lora is not None else "")),
        ("precision / optimizer", f"{spec.precision} / {spec.optimizer}"),
        ("batch", batch),
        ("work", _work(spec)),
        *_constraints(spec),
        ("currency", plan.currency),
        ("objective", plan.objective),
        (
            "searched",
            f"{plan.considered:,} priced options; {len(plan.options)} ranked shown, "
            f"{len(plan.pareto)} on the Pareto front, {len(plan.rejected):,} rejected",
        ),
    ]
    items = "\n".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    return (
        f'<p class="sub">Generated by gpuplan {esc(version)}. Estimates, not measurements: '
        f"see the assumptions and provenance below.</p>\n"
        f'<dl class="summary">\n{items}\n</dl>'
    )


def _best(plan: Plan) -> str:
    if not plan.options:
        return '<div class="best">No option was ranked.</div>'
    o = plan.options[0]
    per_m = o.cost_per_million_tokens
    tail = f", {per_m:.3f} {plan.currency} per 1M tokens" if per_m else ""
    return (
        f'<div class="best"><strong>Best by {esc(plan.objective)}:</strong> {esc(o.label())} in '
        f"{esc(o.region)}: {esc(format_duration(o.time_s))}, "
        f"{esc(_money(o.cost_total, o))} {esc(plan.currency)}{esc(tail)}.<br>{esc(o.why)}</div>"
    )


def _charts(plan: Plan, spec: JobSpec) -> str:
    c = spec.constraints
    out = [
        "<h2>Cost versus time</h2>",
        '<p class="muted">Each dot is a ranked option or a Pareto-front option (hover for details); '
        "numbers are ranks; black rings and the line mark the cost/time Pareto front.</p>",
        scatter(
            plan.options,
            plan.pareto,
            currency=plan.currency,
            deadline_s=c.deadline,
            budget=c.budget,
        ),
    ]
    if plan.options:
        out += [
            "<h2>Memory per GPU</h2>",
            '<p class="muted">Estimated peak per-GPU memory of the top options, by part, '
            "against the GPU's capacity (red tick).</p>",
            memory_bars(plan.options[:MEMORY_ROWS]),
        ]
    return "\n".join(out)


# --- tables ----------------------------------------------------------------------------


def _money(value: float, o: Option | None = None) -> str:
    text = f"{value:,.2f}"
    if o is not None and not o.cost.complete:
        text += "*"
    return text


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    numeric: Sequence[int] = (),
    row_classes: Sequence[str] | None = None,
) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="n">{c}</td>' if j in numeric else f"<td>{c}</td>"
            for j, c in enumerate(row)
        )
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>{cells}</tr>")
    return (
        f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )


def _options_table(plan: Plan) -> str:
    cur = plan.currency
    front = {option_key(o) for o in plan.pareto}
    rows, classes = [], []
    for i, o in enumerate(plan.options, 1):
        per_m = o.cost_per_million_tokens
        head = o.configuration.fit.memory.headroom_bytes / GIB
        warn = "<br>".join(f'<span class="warn">{esc(w)}</span>' for w in o.warnings)
        rows.append(
            [
                str(i),
                esc(o.gpu),
                str(o.gpus),
                esc(o.provider),
                f"{esc(o.instance_type)} x{o.nodes}",
                esc(o.region),
                esc(o.billing_mode),
                f"<code>{esc(o.configuration.strategy.label())}</code>",
                esc(format_duration(o.time_s)),
                esc(_money(o.cost_total, o)),
                f"{per_m:.3f}" if per_m else "-",
                f"{head:.1f} GiB",
                esc(o.configuration.fit.verdict),
                esc(o.why),
                warn,
            ]
        )
        classes.append("front" if option_key(o) in front else "")
    headers = [
        "#",
        "GPU",
        "GPUs",
        "provider",
        "instance x nodes",
        "region",
        "billing",
        "strategy",
        "time",
        f"cost ({cur})",
        f"{cur} / 1M tokens",
        "headroom",
        "memory",
        "why",
        "warnings",
    ]
    note = (
        '<p class="muted">Bold rank: on the Pareto front. * cost is a lower bound (a part has no '
        "catalog rate; see the cost breakdown). Memory: <i>fits</i> when the 80% upper bound "
        "of the estimate fits, <i>tight</i> when only the estimate does.</p>"
    )
    return (
        "<h2>Ranked options</h2>\n"
        + _table(headers, rows, numeric=(0, 2, 8, 9, 10, 11), row_classes=classes)
        + "\n"
        + note
    )


def _cost_details(plan: Plan) -> str:
    if not plan.options:
        return ""
    out = ["<h2>Cost breakdown of the top options</h2>"]
    labels = (
        ("compute", "compute (run time)"),
        ("startup", "startup (billed)"),
        ("spot_overhead", "spot interruptions"),
        ("rounding", "billing rounding / minimum"),
        ("commitment_unused", "unused commitment"),
        ("on_demand_remainder", "on-demand after the last whole term"),
        ("storage", "storage"),
        ("egress", "data transfer"),
    )
    for i, o in enumerate(plan.options[:COST_DETAILS], 1):
        c = o.cost
        rows = []
        for attr, label in labels:
            value: float | None = getattr(c, attr)
            rows.append([esc(label), "unknown" if value is None else f"{value:,.4f}"])
        rows.append(["<strong>total</strong>", f"<strong>{esc(_money(c.total, o))}</strong>"])
        out.append(f"<h3>#{i} {esc(o.label())}</h3>")
        out.append(
            f'<p class="muted">{esc(c.currency)}; {c.price_per_hour:,.4f} per instance-hour x '
            f"{c.nodes} instance(s); billed {esc(format_duration(c.billed_s))} each; "
            f"price as of {esc(o.price_as_of)}.</p>"
        )
        out.append(_table(["part", f"amount ({c.currency})"], rows, numeric=(1,)))
        notes = [*c.unknown, *c.assumptions]
        if notes:
            out.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(out)


# --- rejections ------------------------------------------------------------------------


def _closeness(
    r: Rejection, deadline: float | None, budget: float | None
) -> tuple[float, str, str, int, str]:
    score = (r.time_s or 0.0) / (deadline or 1.0) + (r.cost_total or 0.0) / (budget or 1e18)
    return (score, r.provider, r.instance_type, r.nodes, r.billing_mode)


def _rejections(plan: Plan, spec: JobSpec) -> str:
    out = [f"<h2>Rejected options ({len(plan.rejected):,})</h2>"]
    if not plan.rejected:
        return "\n".join([*out, "<p>None.</p>"])
    counts = Counter(reason_class(r.reason) for r in plan.rejected)
    example: dict[str, Rejection] = {}
    for r in plan.rejected:
        example.setdefault(reason_class(r.reason), r)
    rows = []
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        ex = example[name]
        rows.append([esc(name), str(n), esc(f"{ex.provider} {ex.instance_type}: {ex.reason}")])
    out.append(_table(["reason", "count", "example"], rows, numeric=(1,)))
    c = spec.constraints
    priced = sorted(
        (r for r in plan.rejected if r.time_s is not None),
        key=lambda r: _closeness(r, c.deadline, c.budget),
    )[:CLOSEST_REJECTED]
    if priced:
        out.append("<h3>Closest rejected options</h3>")
        rows = [
            [
                esc(r.provider),
                f"{esc(r.instance_type)} x{r.nodes}",
                esc(r.gpu),
                esc(r.billing_mode),
                esc(format_duration(r.time_s)) if r.time_s is not None else "-",
                f"{r.cost_total:,.2f}" if r.cost_total is not None else "-",
                esc(r.reason),
            ]
            for r in priced
        ]
        out.append(
            _table(
                [
                    "provider",
                    "instance x nodes",
                    "GPU",
                    "billing",
                    "time",
                    f"cost ({plan.currency})",
                    "why rejected",
                ],
                rows,
                numeric=(4, 5),
            )
        )
    return "\n".join(out)


# --- assumptions and provenance --------------------------------------------------------


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


def _assumptions(plan: Plan) -> str:
    out = ["<h2>Assumptions</h2>", _list(plan.assumptions)]
    if plan.warnings:
        out += ["<h3>Warnings</h3>", _list(plan.warnings)]
    return "\n".join(out)


def _provenance(plan: Plan) -> str:
    p: dict[str, Any] = plan.provenance
    rows = [
        ["gpuplan version", esc(p.get("gpuplan_version", "unknown"))],
        ["catalog schema version", esc(p.get("catalog_schema_version", "unknown"))],
        [
            "price as_of dates (shown options)",
            esc(", ".join(p.get("price_as_of", [])) or "unknown"),
        ],
    ]
    fx = p.get("fx")
    if isinstance(fx, dict):
        rates = ", ".join(f"{k} {v:g}" for k, v in sorted(fx.get("per_usd", {}).items()))
        rows.append(
            [
                "exchange rates (per USD)",
                esc(
                    f"{rates} (as of {fx.get('as_of', '?')}; {fx.get('source', 'source unknown')})"
                ),
            ]
        )
    out = ["<h2>Provenance</h2>", _table(["item", "value"], rows)]
    files = p.get("catalog_files", [])
    if files:
        out += ["<h3>Catalog files</h3>", _list(str(f) for f in files)]
    sources = sorted(
        {s for o in plan.options for s in o.cost.sources} | {o.price_source for o in plan.options}
    )
    if sources:
        out += ["<h3>Price sources of the shown options</h3>", _list(sources)]
    eff = p.get("efficiency")
    if isinstance(eff, dict) and eff:
        rows = [
            [
                esc(arch),
                f"{a.get('gemm', 0):.2f}",
                f"{a.get('gemm_fp8', 0):.2f}",
                f"{a.get('hbm', 0):.2f}",
                esc(a.get("basis", "")),
            ]
            for arch, a in sorted(eff.items())
        ]
        out += [
            "<h3>Efficiency basis (fraction of datasheet peak)</h3>",
            _table(["architecture", "GEMM", "GEMM fp8", "HBM", "basis"], rows, numeric=(1, 2, 3)),
        ]
    return "\n".join(out)
