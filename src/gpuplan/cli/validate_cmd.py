"""``gpuplan validate``: estimator error against published measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuplan.cli.common import JsonOpt, console, print_json

validate_app = typer.Typer(
    help="Compare estimators with published measurements (validation/*.csv).", no_args_is_help=True
)
TableOpt = Annotated[
    Path | None,
    typer.Option(
        "--table", help="Validation CSV (default: validation/<name>.csv).", dir_okay=False
    ),
]
MaxMedianOpt = Annotated[
    float | None,
    typer.Option(
        "--max-median",
        min=0.0,
        help="Exit 1 if the median absolute error exceeds this (e.g. 0.10).",
    ),
]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def register(app: typer.Typer) -> None:
    """Attach ``validate`` to the top-level app."""
    app.add_typer(validate_app, name="validate")


@validate_app.command("memory")
def memory(
    table: TableOpt = None, json_out: JsonOpt = False, max_median: MaxMedianOpt = None
) -> None:
    """Predicted vs measured per-GPU peak memory, with median and worst error."""
    from gpuplan.validation import default_table, format_rows, predict_memory, run_table

    report = run_table(table or default_table("memory"), predict_memory)
    if json_out:
        print_json({"summary": report.summary(), "rows": report.rows, "excluded": report.excluded})
    else:
        from rich.table import Table

        t = Table(title=f"memory validation: {report.table}")
        for col in ("id", "metric", "predicted GiB", "measured GiB", "error", "strategy / note"):
            t.add_column(col)
        for cells in format_rows(report.rows, 2**30, "GiB"):
            t.add_row(*cells)
        out = console()
        out.print(t)
        s = report.summary()
        out.print(
            f"rows {s['rows']} (+{s['excluded']} excluded with reasons); median |error| "
            f"{s['median_abs_error']:.1%}; worst {s['worst_abs_error']:.1%} ({s['worst_id']}); "
            f"under-predicted by >10%: {s['under_predicted_over_10pct']}"
        )
    if max_median is not None and not report.median_abs_error <= max_median:
        typer.echo(
            f"error: median |error| {report.median_abs_error:.1%} exceeds --max-median {max_median:.1%}",
            err=True,
        )
        raise typer.Exit(1)


@validate_app.command("training")
def training(
    table: TableOpt = None, json_out: JsonOpt = False, max_median: MaxMedianOpt = None
) -> None:
    """Predicted vs measured throughput / time-to-train, with median and worst error."""
    from gpuplan.validation import default_table, predict_training, run_table

    report = run_table(table or default_table("training"), predict_training)
    if json_out:
        print_json({"summary": report.summary(), "rows": report.rows, "excluded": report.excluded})
    else:
        from rich.table import Table

        t = Table(title=f"training validation: {report.table}")
        for col in ("id", "metric", "predicted", "measured", "error", "strategy / note"):
            t.add_column(col)
        for r in report.rows:
            err = "failed" if r.error is None else f"{r.error:+.1%}"
            t.add_row(
                r.id[:60], r.metric, f"{r.predicted:.4g}", f"{r.measured:.4g}", err, r.note[:50]
            )
        out = console()
        out.print(t)
        s = report.summary()
        out.print(
            f"rows {s['rows']} (+{s['excluded']} excluded with reasons); median |error| "
            f"{s['median_abs_error']:.1%} (single-node {_pct(s['median_abs_error_single_node'])}, "
            f"multi-node {_pct(s['median_abs_error_multi_node'])}); worst {s['worst_abs_error']:.1%} "
            f"({s['worst_id']}); rows off by more than 50%: {s['rows_over_50pct']}"
        )
    if max_median is not None and not report.median_abs_error <= max_median:
        typer.echo(
            f"error: median |error| {report.median_abs_error:.1%} exceeds --max-median {max_median:.1%}",
            err=True,
        )
        raise typer.Exit(1)
