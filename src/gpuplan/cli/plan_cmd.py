"""``gpuplan plan``: the cheapest (or fastest, or Pareto) configurations across the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import (
    CatalogOpt,
    JsonOpt,
    WideOpt,
    console,
    print_json,
    print_table,
    progress,
)
from gpuplan.cli.spec_cmd import SetOpt

_EXPORTS = ("skypilot", "torchrun")


def register(app: typer.Typer) -> None:
    """Attach ``plan`` to the top-level app."""
    app.command("plan")(plan_command)


def plan_command(
    spec_path: Annotated[
        Path, typer.Argument(help="Job spec YAML (see `gpuplan spec schema`).", dir_okay=False)
    ],
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="cost (cheapest meeting the deadline), time "
            "(fastest within the budget) or pareto (the cost/time front).",
        ),
    ] = "cost",
    top: Annotated[int, typer.Option("--top", min=1, max=500, help="Options to show.")] = 10,
    max_gpus: Annotated[
        int | None,
        typer.Option(
            "--max-gpus",
            min=1,
            help="Most GPUs per option (default: the spec's constraints.max_gpus, else 64).",
        ),
    ] = None,
    currency: Annotated[
        str | None, typer.Option("--currency", help="USD or CNY (default: the spec's).")
    ] = None,
    spot_rate: Annotated[
        float,
        typer.Option("--spot-rate", min=0.0, help="Assumed spot interruptions per instance-hour."),
    ] = 0.05,
    checkpoint_interval: Annotated[
        str, typer.Option("--checkpoint-interval", help="Checkpoint interval for spot, e.g. 30m.")
    ] = "30m",
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report.", dir_okay=False),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            help="Print the best option as skypilot (task YAML) "
            "or torchrun (launch command + config).",
        ),
    ] = None,
    risk: Annotated[
        str,
        typer.Option(
            "--risk",
            help="Memory risk: low (only options whose 80% upper bound fits), medium (also "
            "'tight' ones, where only the estimate fits, ranked after sure ones at equal cost; "
            "each offering runs the largest micro-batch that fits surely, a tight one only where "
            "no smaller one fits or only it meets the deadline or budget) or high (the estimate "
            "alone: the fastest micro-batch it fits).",
        ),
    ] = "medium",
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    wide: WideOpt = False,
) -> None:
    """Rank every offering x node count x strategy x billing mode for a job spec, with reasons."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.errors import SpecError
    from gpuplan.planner import plan
    from gpuplan.planner.flags import plan_settings, spec_overrides
    from gpuplan.spec import load_spec

    settings = plan_settings(
        objective=objective,
        top=top,
        max_gpus=max_gpus,
        spot_rate=spot_rate,
        checkpoint_interval=checkpoint_interval,
        risk=risk,
    )
    if export is not None and export not in _EXPORTS:
        raise SpecError(f"--export: unknown {export!r}; allowed: {', '.join(_EXPORTS)}")
    if export is not None and json_out:
        raise SpecError("--export and --json conflict: --export prints the launcher config")
    spec = load_spec(spec_path, spec_overrides(overrides, currency))
    cat = load_catalog(catalog)
    with progress(f"planning {spec.model} across {len(cat.offerings)} offerings"):
        result = plan(spec, cat, settings)
    if html is not None:
        from gpuplan.report.html import render_html

        _write(html, render_html(result, spec))
    if export is not None:
        from gpuplan.planner.export import export as do_export

        typer.echo(do_export(result.options[0], spec, export))
        return
    if json_out:
        from gpuplan.report.payloads import plan_payload

        print_json(plan_payload(result))
        return
    _print_plan(result, spec, html, wide)


def _write(path: Path, text: str) -> None:
    from gpuplan.catalog.skypilot import write_atomically

    write_atomically(path, text)


_VERDICT_STYLE = {"fits": "fits", "tight": "[yellow]tight[/yellow]", "no": "[red]no[/red]"}
_OBJECTIVE_WHY = {
    "cost": "the cheapest option that meets the spec",
    "time": "the fastest option within the spec",
    "pareto": "the fastest on the cost/time front",
}


def plan_columns(currency: str) -> tuple[Any, ...]:
    """The plan table's columns; a higher priority number is dropped first on a narrow terminal."""
    from gpuplan.report.table import Column

    return (
        Column(header="#", justify="right"),
        Column(header="GPU"),
        Column(header="n", justify="right"),
        Column(header="offering", shrink=True, min_width=14),
        Column(header="region", priority=3, shrink=True, min_width=8),
        Column(header="billing", priority=1),
        Column(header="strategy", priority=4, shrink=True, min_width=10),
        Column(header="time", justify="right"),
        Column(header=f"cost {currency}", justify="right"),
        Column(header="per 1M tok", priority=6, justify="right"),
        Column(header="headroom", priority=5, justify="right"),
        Column(header="memory", priority=2),
    )


def plan_rows(result: Any) -> list[tuple[str, ...]]:
    """One row of cells per shown option, best first (see :func:`plan_columns`)."""
    from gpuplan.units import format_duration

    rows: list[tuple[str, ...]] = []
    for i, o in enumerate(result.options, 1):
        per_m = o.cost_per_million_tokens
        bound = "*" if not o.cost.complete else ""
        rows.append(
            (
                str(i),
                o.gpu,
                str(o.gpus),
                f"{o.provider} {o.instance_type} x{o.nodes}",
                o.region_label(),
                o.billing_mode,
                o.configuration.strategy.label(),
                format_duration(o.time_s),
                f"{o.cost_total:,.2f}{bound}",
                f"{per_m:.3f}" if per_m else "-",
                f"{o.configuration.fit.memory.headroom_bytes / 2**30:.0f} GiB",
                _VERDICT_STYLE[o.configuration.fit.verdict],
            )
        )
    return rows


def verdict_line(result: Any) -> str:
    """The best option in one line: what, where, how long, how much, and why."""
    from gpuplan.units import format_duration

    o = result.options[0]
    fit = o.configuration.fit
    memory = (
        f"fits with {fit.memory.headroom_bytes / 2**30:.0f} GiB headroom"
        if fit.verdict == "fits"
        else "memory tight"
    )
    bound = " (lower bound)" if not o.cost.complete else ""
    return (
        f"Best: {o.gpus}x {o.gpu} on {o.provider} {o.instance_type} x{o.nodes} "
        f"({o.region}, {o.billing_mode}): {format_duration(o.time_s)} for "
        f"{o.cost_total:,.2f} {result.currency}{bound}; "
        f"{_OBJECTIVE_WHY.get(result.objective, result.objective)}, {memory}"
    )


def _print_plan(result: Any, spec: Any, html: Path | None, wide: bool = False) -> None:
    from collections import Counter

    cur = result.currency
    out = console()
    if result.options:
        out.print(f"[bold]{verdict_line(result)}[/bold]", highlight=False)
    layout = print_table(
        plan_columns(cur),
        plan_rows(result),
        title=f"{spec.model} ({spec.method}) - best by {result.objective}, {cur}; "
        f"{result.considered} priced options, {len(result.rejected)} rejected",
        wide=wide,
        out=out,
    )
    for i, o in enumerate(result.options[:5], 1):
        out.print(f"{i}. {o.why}")
    for w in result.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    from gpuplan.planner.model import reason_class

    reasons = Counter(reason_class(r.reason) for r in result.rejected)
    out.print("rejected: " + "; ".join(f"{n} x {why}" for why, n in reasons.most_common(6)))
    near = [r for r in result.rejected if r.time_s is not None][:3]
    for r in near:
        out.print(
            f"  closest rejected: {r.provider} {r.instance_type} x{r.nodes} ({r.billing_mode}): {r.reason}"
        )
    if any(not o.cost.complete for o in result.options):
        out.print(
            "* cost is a lower bound: some parts (storage, egress) have no catalog rate; see --json"
        )
    if "region" not in layout.dropped and any(
        len(o.price_regions) > 1 or o.priced_regions > 1 for o in result.options
    ):
        out.print(
            "  region: the cheapest allowed region of each offering; +N = more regions at the "
            "same price (--json: price_regions, other_regions_priced)",
            highlight=False,
        )
    for a in result.assumptions:
        out.print(f"  assumption: {a}")
    if html is not None:
        out.print(f"HTML report written to {html}")
