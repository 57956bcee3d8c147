"""HTML fragments of the API's JSON: plan result, fit table, bill, serve plan, offerings.

They format the JSON documents the API returns (the CLI's ``--json``) and
recompute nothing; the charts are :mod:`gpuplan.report.svg`'s, drawn from the
JSON with the page's language.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplan.planner.model import reason_class
from gpuplan.report.svg import ChartOption, esc, memory_bars, scatter
from gpuplan.web.i18n import Texts

MEMORY_ROWS = 10
"""Options that get a memory bar (as the HTML report)."""


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Sequence[int] = (),
    table_id: str = "",
) -> str:
    """A table of already-escaped cells; ``numeric`` columns align right."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if j in numeric else f"<td>{c}</td>" for j, c in enumerate(r)
        )
        + "</tr>\n"
        for r in rows
    )
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def strategy_label(st: Mapping[str, Any]) -> str:
    """``fsdp tp2 dp4`` from a strategy contract (tp1/pp1 left out)."""
    parts = [str(st.get("sharding", "none"))]
    parts += [
        f"{k}{st[k]}" for k in ("tp", "pp", "dp") if k in st and not (k != "dp" and st[k] == 1)
    ]
    if st.get("vp", 1) > 1:
        parts.append(f"vp{st['vp']}")
    if st.get("tp", 1) > 1 and st.get("sequence_parallel") is False:
        parts.append("sp=off")
    return " ".join(parts)


def _verdict(t: Texts, value: str | None) -> str:
    if value is None:
        return ""
    return f'<span class="verdict {esc(value)}">{esc(t(f"verdict.{value}"))}</span>'


def plan_result(
    t: Texts,
    result: Mapping[str, Any],
    *,
    deadline_s: float | None,
    budget: float | None,
) -> str:
    """The ranked table, the chart, memory bars, rejections and provenance of a plan."""
    cur = str(result["currency"])
    options: list[Mapping[str, Any]] = list(result["options"])
    charts = [ChartOption.from_json(o, strategy_label(o["strategy"])) for o in options]
    front_keys = {
        (p["provider"], p["instance_type"], p["billing_mode"], p["nodes"]) for p in result["pareto"]
    }
    pareto = [
        c for c in charts if (c.provider, c.instance_type, c.billing_mode, c.nodes) in front_keys
    ]
    out = [_best(t, options, cur, result)]
    has_verdict = any("verdict" in o for o in options)
    headers = [
        "#",
        t("col.gpu"),
        t("col.gpus"),
        t("col.offering"),
        t("col.region"),
        t("col.billing"),
        t("col.strategy"),
        t("col.time"),
        t("col.cost", currency=t.get(f"currency.{cur}", cur)),
        t("col.per_m"),
        t("col.headroom"),
    ]
    if has_verdict:
        headers.append(t("col.verdict"))
    headers.append(t("col.why"))
    rows = []
    for i, o in enumerate(options, 1):
        front = (o["provider"], o["instance_type"], o["billing_mode"], o["nodes"]) in front_keys
        row = [
            f"<strong>{i}</strong>" if front else str(i),
            esc(o["gpu"]),
            str(o["gpus"]),
            esc(f"{o['provider']} {o['instance_type']} x{o['nodes']}"),
            esc(o["region"]),
            esc(t.get(f"billing.{o['billing_mode']}", o["billing_mode"])),
            f"<code>{esc(strategy_label(o['strategy']))}</code>",
            esc(t.duration(o["time_s"])),
            esc(t.num(o["cost_total"], 2))
            + ("*" if o["cost_breakdown"].get("total_is_lower_bound") else ""),
            esc(t.num(o.get("cost_per_1m_tokens"), 3)),
            esc(t.gib(o["headroom_bytes"])),
        ]
        if has_verdict:
            row.append(_verdict(t, o.get("verdict")))
        why = str(o["why"])
        head, _, rest = why.partition("; ")
        row.append(
            f'<details class="why"><summary>{esc(head)}</summary>{esc(rest)}</details>'
            if rest
            else f'<span class="why">{esc(why)}</span>'
        )
        rows.append(row)
    out += [
        f"<h2>{esc(t('h.ranked'))}</h2>",
        table(headers, rows, numeric=(0, 2, 7, 8, 9, 10), table_id="ranked"),
        f'<p class="muted">{esc(t("note.ranked"))}</p>',
        f"<h2>{esc(t('h.chart'))}</h2>",
        f'<p class="muted">{esc(t("note.chart"))}</p>',
        '<div class="chart" id="chart">'
        + scatter(charts, pareto, currency=cur, deadline_s=deadline_s, budget=budget, text=t.svg())
        + "</div>",
    ]
    if charts:
        out += [
            f"<h2>{esc(t('h.memory'))}</h2>",
            f'<p class="muted">{esc(t("note.memory"))}</p>',
            '<div class="chart" id="memory">'
            + memory_bars(charts[:MEMORY_ROWS], text=t.svg())
            + "</div>",
        ]
    out.append(_rejections(t, result["rejected"]))
    out.append(_notes(t, result))
    return "\n".join(out)


def _best(
    t: Texts, options: Sequence[Mapping[str, Any]], cur: str, result: Mapping[str, Any]
) -> str:
    summary = t(
        "plan.summary",
        considered=t.num(result["considered"]),
        rejected=t.num(len(result["rejected"])),
        objective=t.get(f"objective.{result['objective']}", str(result["objective"])),
    )
    if not options:
        return (
            f'<p class="muted">{esc(summary)}</p><div class="best none">{esc(t("plan.none"))}</div>'
        )
    o = options[0]
    head = t(
        "plan.best",
        offering=f"{o['provider']} {o['instance_type']} x{o['nodes']} ({o['gpus']} {o['gpu']})",
        region=o["region"],
        time=t.duration(o["time_s"]),
        cost=t.money(o["cost_total"], cur),
    )
    return (
        f'<p class="muted">{esc(summary)}</p>'
        f'<div class="best"><strong>{esc(head)}</strong><br>{esc(o["why"])}</div>'
    )


def _rejections(t: Texts, rejected: Sequence[Mapping[str, Any]]) -> str:
    out = [f"<h2>{esc(t('h.rejected', n=t.num(len(rejected))))}</h2>"]
    if not rejected:
        return "\n".join([*out, f"<p>{esc(t('none'))}</p>"])
    counts = Counter(reason_class(r["reason"]) for r in rejected)
    example: dict[str, Mapping[str, Any]] = {}
    for r in rejected:
        example.setdefault(reason_class(r["reason"]), r)
    rows = []
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        ex = example[name]
        rows.append(
            [
                esc(t.get(f"reason.{name}", name)),
                esc(t.num(n)),
                esc(f"{ex['provider']} {ex['instance_type']}: {ex['reason']}"),
            ]
        )
    out.append(
        table(
            [t("col.reason"), t("col.count"), t("col.example")],
            rows,
            numeric=(1,),
            table_id="rejected",
        )
    )
    return "\n".join(out)


def _notes(t: Texts, result: Mapping[str, Any]) -> str:
    out = [f"<h2>{esc(t('h.assumptions'))}</h2>", _list(result["assumptions"])]
    if result["warnings"]:
        out += [f"<h3>{esc(t('h.warnings'))}</h3>", _list(result["warnings"])]
    p = result.get("provenance", {})
    sources = sorted({o["price_source"] for o in result["options"]})
    dates = ", ".join(p.get("price_as_of", [])) or "-"
    out += [
        f"<h2>{esc(t('h.provenance'))}</h2>",
        f"<p>{esc(t('prov.version', version=p.get('gpuplan_version', '?'), schema=p.get('catalog_schema_version', '?'), dates=dates))}</p>",
        _list(sources),
    ]
    return "\n".join(out)


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


# --- fit, bill, offerings -----------------------------------------------------------


def fit_table(t: Texts, payload: Any) -> str:
    """``fit --json``: the per-GPU table, or one GPU's memory breakdown."""
    if isinstance(payload, dict):
        mem = payload["memory"]
        rows = [[esc(k), esc(t.gib(v))] for k, v in mem.get("breakdown", {}).items() if v]
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes"):
            if key in mem:
                rows.append([f"<strong>{esc(t(f'fit.{key}'))}</strong>", esc(t.gib(mem[key]))])
        verdict = mem.get("verdict") or ("fits" if mem.get("fits") else "no")
        head = t("fit.one", gpu=payload["gpu"], count=payload["count"])
        return (
            f"<p>{esc(head)} {_verdict(t, verdict)} - <code>{esc(strategy_label(payload['strategy']))}</code></p>"
            + table([t("col.part"), "GiB"], rows, numeric=(1,), table_id="fit")
        )
    rows = []
    for r in payload:
        verdict = r.get("verdict") or ("fits" if r.get("fits") else "no")
        if "reason" in r:
            rows.append([esc(r["gpu"]), _verdict(t, verdict), "-", "-", "-", "-", esc(r["reason"])])
            continue
        rows.append(
            [
                esc(r["gpu"]),
                _verdict(t, verdict),
                esc(t.gib(r["device_used_bytes"])),
                esc(t.gib(r["capacity_bytes"])),
                esc(t.gib(r["headroom_bytes"])),
                esc(t.num(r["max_micro_batch"])),
                f"<code>{esc(strategy_label(r['strategy']))}</code>",
            ]
        )
    headers = [
        t("col.gpu"),
        t("col.verdict"),
        t("col.used"),
        t("col.capacity"),
        t("col.headroom"),
        t("col.max_mb"),
        t("col.strategy_reason"),
    ]
    return table(headers, rows, numeric=(2, 3, 4, 5), table_id="fit")


def bill_table(t: Texts, report: Mapping[str, Any], top: int = 15) -> str:
    """``bill --json``: monthly cost per offering, best strategy first."""
    cur = str(report.get("currency", "USD"))
    rows = []
    for o in list(report.get("offerings", []))[:top]:
        rows.append(
            [
                esc(f"{o['provider']}:{o['instance_type']}"),
                esc(f"{o.get('gpus_per_instance', 0):g}"),
                esc(o.get("best", "-")),
                esc(t.money(o.get("best_monthly_cost"), cur)),
            ]
        )
    head = t(
        "bill.summary",
        gpu=report.get("gpu", "?"),
        busy=t.num(report.get("busy_gpu_hours_per_month")),
        peak=t.num(report.get("peak_busy_gpus")),
    )
    return f"<p>{esc(head)}</p>" + table(
        [t("col.offering"), t("col.gpus"), t("col.best_strategy"), t("col.per_month")],
        rows,
        numeric=(1, 3),
        table_id="bill",
    )


def _p99(latency: Mapping[str, Any]) -> float | None:
    """The service's p99 latency in seconds (LLMs: time to first token)."""
    value = latency.get("latency_p99_s", latency.get("ttft_p99_s"))
    return None if value is None else float(value)


def serve_tables(t: Texts, result: Mapping[str, Any]) -> str:
    """``serve plan --json``: each service's placement, then the GPUs services share."""
    cur = str(result.get("currency", "USD"))
    head = t(
        "serve.summary",
        total=t.money(result.get("cost_per_month"), cur),
        dedicated=t.money(result.get("dedicated_cost_per_month"), cur),
    )
    rows = []
    for s in result.get("services", []):
        p99 = _p99(s.get("latency", {}))
        rows.append(
            [
                esc(s["service"]),
                esc(s["placement"]),
                esc(t.num(s.get("replicas"))),
                esc("-" if p99 is None else f"{t.num(p99 * 1000, 1)} ms"),
                esc(t.money(s.get("cost_per_month"), cur)),
                esc(s.get("why", "")),
            ]
        )
    out = f"<p>{esc(head)}</p>" + table(
        [
            t("col.service"),
            t("col.placement"),
            t("col.replicas"),
            t("col.p99"),
            t("col.per_month"),
            t("col.why"),
        ],
        rows,
        numeric=(2, 3, 4),
        table_id="serve-services",
    )
    shared = list(result.get("shared_gpus", []))
    if shared:
        gpu_rows = [
            [
                esc(g["placement"]),
                esc(", ".join(g.get("services", []))),
                esc(f"{t.num(100 * float(g.get('compute_used', 0.0)))}%"),
                esc(t.gib(g.get("memory_used_bytes"))),
                esc(t.money(g.get("cost_per_month"), cur)),
            ]
            for g in shared
        ]
        out += f"<h2>{esc(t('serve.shared'))}</h2>" + table(
            [
                t("col.gpu"),
                t("col.services"),
                t("col.compute"),
                t("col.memory_gib"),
                t("col.per_month"),
            ],
            gpu_rows,
            numeric=(2, 3, 4),
            table_id="serve-shared",
        )
    return out


def offerings_table(t: Texts, rows: Sequence[Mapping[str, Any]]) -> str:
    """``catalog offerings --json``: one row per offering with source and as-of date."""
    cur = rows[0]["hourly_currency"] if rows else "USD"
    body = []
    for o in rows:
        h = o.get("hourly", {})
        src = str(o.get("source", ""))
        body.append(
            [
                esc(o["provider"]),
                esc(o["instance_type"]),
                esc(o["gpu"]),
                esc(f"{o['gpu_count']:g}"),
                esc(
                    ", ".join(o.get("regions", [])[:3])
                    + (f" +{len(o['regions']) - 3}" if len(o.get("regions", [])) > 3 else "")
                ),
                esc(t.num(h.get("on-demand"), 3)),
                esc(t.num(h.get("spot"), 3)),
                esc(str(o.get("as_of", ""))),
                f'<span class="src">{esc(src)}</span>',
            ]
        )
    headers = [
        t("col.provider"),
        t("col.instance"),
        t("col.gpu"),
        t("col.gpus"),
        t("col.regions"),
        t("col.on_demand", currency=t.get(f"currency.{cur}", cur)),
        t("col.spot"),
        t("col.as_of"),
        t("col.source"),
    ]
    return table(headers, body, numeric=(3, 5, 6), table_id="offerings")
