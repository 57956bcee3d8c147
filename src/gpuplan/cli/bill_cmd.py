"""``gpuplan bill``: recurring GPU use, the cheapest mix of commitment and on-demand capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import (
    CatalogOpt,
    CurrencyOpt,
    JsonOpt,
    WideOpt,
    console,
    print_json,
    print_table,
)

UsageArg = Annotated[
    Path,
    typer.Argument(
        help="Usage YAML (GPU-hours per day/week) or a utilization trace CSV.", dir_okay=False
    ),
]


def register(app: typer.Typer) -> None:
    """Attach ``bill`` to the top-level app."""
    app.command("bill")(bill_command)


def bill_command(
    usage_path: UsageArg,
    json_out: JsonOpt = False,
    currency: CurrencyOpt = "USD",
    catalog: CatalogOpt = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU id (required for a CSV trace; overrides YAML).")
    ] = None,
    provider: Annotated[
        list[str] | None,
        typer.Option("--provider", help="Only this provider (repeatable; overrides YAML)."),
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", help="Only regions containing this text (repeatable)."),
    ] = None,
    autostop_after: Annotated[
        str | None,
        typer.Option(
            "--autostop-after", help="Idle time before auto-stop, e.g. 10m (default 10m)."
        ),
    ] = None,
    busy_threshold: Annotated[
        float | None,
        typer.Option(
            "--busy-threshold",
            min=0.0,
            max=100.0,
            help="CSV with per-GPU utilization: busy at or above this percent (default 10).",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows in the table.")] = 15,
    wide: WideOpt = False,
) -> None:
    """Monthly cost of recurring use: pure on-demand, with auto-stop, commitments, the best mix."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.cost.mix import bill

    usage = _load_usage(usage_path, gpu, provider, region, autostop_after, busy_threshold)
    cat = load_catalog(catalog)
    report = bill(usage, catalog=cat, currency=currency)
    if json_out:
        print_json(report.as_dict())
        return
    _print_report(report, top, wide)


def _load_usage(
    path: Path,
    gpu: str | None,
    providers: list[str] | None,
    regions: list[str] | None,
    autostop_after: str | None,
    busy_threshold: float | None,
) -> Any:
    from gpuplan.cost.usage import usage_from_text
    from gpuplan.errors import SpecError
    from gpuplan.userfile import read_text

    text = read_text(path, what="usage", error=SpecError)
    return usage_from_text(
        text,
        origin=str(path),
        is_csv=path.suffix.lower() == ".csv",
        gpu=gpu,
        providers=providers,
        regions=regions,
        autostop_after=autostop_after,
        busy_threshold=busy_threshold,
    )


def _money(amount: float) -> str:
    return f"{amount:,.0f}"


def _print_report(report: Any, top: int, wide: bool = False) -> None:
    from gpuplan.report.table import Column

    cur = report.currency
    out = console()
    out.print(
        f"{report.gpu}: {report.busy_gpu_hours_per_month:,.0f} busy GPU-hours/month, "
        f"{report.on_gpu_hours_per_month:,.0f} powered on without auto-stop, peak "
        f"{report.peak_busy_gpus} GPUs ({report.origin})",
        highlight=False,
    )
    columns = (
        Column(header="offering", shrink=True, min_width=14),
        Column(header="region", priority=2, shrink=True, min_width=8),
        Column(header="GPUs", justify="right"),
        Column(header="best strategy", shrink=True, min_width=10),
        Column(header="per month", justify="right"),
        Column(header="on-demand", justify="right", priority=1),
        Column(header="+auto-stop", justify="right", priority=3),
        Column(header="commit peak", justify="right", priority=4),
        Column(header="break-even", justify="right", priority=5),
        Column(header="auto-stop saves", justify="right", priority=6),
    )
    cells = []
    for o in report.offerings[:top]:
        by_kind: dict[str, list[Any]] = {}
        for s in o.strategies:
            by_kind.setdefault(s.kind, []).append(s)
        od = by_kind.get("on-demand", [None])[0]
        auto = by_kind.get("on-demand+autostop", [None])[0]
        commit_cost = min((s.monthly_cost for s in by_kind.get("commitment", [])), default=None)
        quotes = [c for c in o.commitments if c.break_even is not None]
        even = min(quotes, key=lambda c: c.break_even, default=None)
        region = o.region + (f" +{len(o.price_regions) - 1}" if len(o.price_regions) > 1 else "")
        saves = "-"
        if o.autostop is not None:
            saves = f"{_money(o.autostop.monthly_savings)} ({o.autostop.percent:.0f}%)"
        cells.append(
            (
                f"{o.provider}:{o.instance_type}",
                region,
                f"{o.gpus_per_instance:g}",
                o.best.name,
                _money(o.best.monthly_cost) + ("*" if o.unknown else ""),
                "-" if od is None else _money(od.monthly_cost),
                "-" if auto is None else _money(auto.monthly_cost),
                "-" if commit_cost is None else _money(commit_cost),
                "-" if even is None else f"{even.mode} {even.break_even:.0%}",
                saves,
            )
        )
    print_table(
        columns,
        cells,
        title=f"Cost per 730-hour month in {cur}, cheapest first",
        wide=wide,
        out=out,
    )
    out.print(
        "break-even: the share of the term an instance must be busy for the commitment to "
        "cost no more than on-demand in the same region; region +N: more regions at the same "
        "prices",
        highlight=False,
    )
    if any(o.unknown for o in report.offerings[:top]):
        out.print("* lower bound: a rate is unknown (see --json `unknown`)", highlight=False)
    if report.offerings:
        best = report.offerings[0]
        cost = _money(best.best.monthly_cost)
        name = f"{best.provider}:{best.instance_type}"
        out.print(f"Why {name} costs {cost} {cur}/month ({best.best.name}):", highlight=False)
        lines = [*best.assumptions, *report.assumptions]
        lines += [f"unknown: {u}" for u in best.unknown]
        lines += [f"not costed: {n}" for n in best.not_costed]
        if best.autostop is not None:
            a = best.autostop
            lines.append(
                f"auto-stop: {a.idle_instance_hours_removed:,.0f} idle instance-hours/month no "
                f"longer billed, {a.autostop_tail_instance_hours:,.1f} h of auto-stop delay still "
                f"billed; billing increments add {a.rounding_instance_hours_with:,.1f} h with "
                f"auto-stop vs {a.rounding_instance_hours_without:,.1f} h without"
            )
        for line in lines:
            out.print(f"  - {line}", highlight=False)
    if report.skipped:
        shown = "; ".join(f"{k}: {r}" for k, r in report.skipped[:5])
        out.print(f"{len(report.skipped)} offering(s) skipped: {shown}", highlight=False)
