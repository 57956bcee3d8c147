"""``gpuplan validate``: estimator error against published measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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


MaxUnderOpt = Annotated[
    float | None,
    typer.Option(
        "--max-under",
        min=0.0,
        max=1.0,
        help="Exit 1 if the share of rows predicted more than 10% below the measurement "
        "exceeds this (e.g. 0.10; for memory these are false 'fits').",
    ),
]
MaxOver50Opt = Annotated[
    int | None,
    typer.Option("--max-over-50", min=0, help="Exit 1 if more rows than this are off by >50%."),
]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def register(app: typer.Typer) -> None:
    """Attach ``validate`` to the top-level app."""
    app.add_typer(validate_app, name="validate")


def _run(
    name: str,
    predict: Any,
    table: Path | None,
    json_out: bool,
    max_median: float | None,
    scale: float,
    unit: str,
    max_under: float | None = None,
    max_over_50: int | None = None,
) -> None:
    """Run one validation table, print it (or JSON), and apply the CI gates."""
    from gpuplan.validation import default_table, format_rows, run_table

    report = run_table(table or default_table(name), predict)
    s = report.summary()
    if json_out:
        print_json({"summary": s, "rows": report.rows, "excluded": report.excluded})
    else:
        from rich.table import Table

        t = Table(title=f"{name} validation: {report.table}")
        for col in (
            "id",
            "metric",
            f"predicted{unit}",
            f"measured{unit}",
            "error",
            "strategy / note",
        ):
            t.add_column(col)
        for cells in format_rows(report.rows, scale, unit):
            t.add_row(*cells)
        out = console()
        out.print(t)
        out.print(
            f"rows {s['rows']} (+{s['excluded']} excluded with reasons); median |error| "
            f"{_pct(s['median_abs_error'])} (single-node {_pct(s['median_abs_error_single_node'])}, "
            f"multi-node {_pct(s['median_abs_error_multi_node'])}); worst {_pct(s['worst_abs_error'])} "
            f"({s['worst_id']}); predicted >10% below measured: {s['under_predicted_over_10pct']}; "
            f"off by more than 50%: {s['rows_over_50pct']}"
        )
    failures = report.gate_failures(
        max_median=max_median, max_under=max_under, max_over_50=max_over_50
    )
    if failures:
        typer.echo(f"error: {failures[0]}", err=True)
        raise typer.Exit(1)


@validate_app.command("memory")
def memory(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    max_median: MaxMedianOpt = None,
    max_under: MaxUnderOpt = None,
    max_over_50: MaxOver50Opt = None,
) -> None:
    """Predicted vs measured per-GPU peak memory (GiB), with median and worst error."""
    from gpuplan.validation import predict_memory

    _run(
        "memory", predict_memory, table, json_out, max_median, 2**30, " GiB", max_under, max_over_50
    )


@validate_app.command("training")
def training(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    max_median: MaxMedianOpt = None,
    max_under: MaxUnderOpt = None,
    max_over_50: MaxOver50Opt = None,
) -> None:
    """Predicted vs measured throughput / time-to-train, with median and worst error."""
    from gpuplan.validation import predict_training

    _run(
        "training", predict_training, table, json_out, max_median, 1.0, "", max_under, max_over_50
    )


@validate_app.command("inference")
def inference(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    no_loso: Annotated[
        bool, typer.Option("--no-loso", help="Skip the leave-one-source-out refits (faster).")
    ] = False,
    max_memory: Annotated[
        float | None,
        typer.Option(
            "--max-memory", min=0.0, help="Exit 1 if the memory LOSO median exceeds this."
        ),
    ] = None,
    max_throughput: Annotated[
        float | None,
        typer.Option(
            "--max-throughput", min=0.0, help="Exit 1 if the throughput LOSO median exceeds this."
        ),
    ] = None,
    max_latency: Annotated[
        float | None,
        typer.Option(
            "--max-latency", min=0.0, help="Exit 1 if the latency LOSO median exceeds this."
        ),
    ] = None,
) -> None:
    """Serving estimates vs published measurements: per-row, median, worst, LOSO, bounds coverage."""
    from gpuplan.validation_inference import run

    report = run(table, loso=not no_loso)
    summary = report["summary"]
    if json_out:
        print_json(report)
    else:
        from rich.table import Table

        t = Table(title=f"inference validation: {report['table']}")
        for col in ("id", "metric", "predicted", "measured", "error", "LOSO error", "in bounds"):
            t.add_column(col)
        for r in report["rows"]:
            t.add_row(
                r.id,
                r.metric,
                f"{r.predicted:.4g}",
                f"{r.measured:.4g}",
                f"{r.error:+.1%}",
                f"{r.loso_error:+.1%}",
                "-" if r.in_bounds is None else ("yes" if r.in_bounds else "no"),
            )
        out = console()
        out.print(t)
        for group, s in summary.items():
            cov = s["bounds_coverage"]
            out.print(
                f"{group}: {s['rows']} rows from {s['sources']} sources; median |error| "
                f"{s['median_abs_error']:.1%}, LOSO median {s['loso_median_abs_error']:.1%}; worst "
                f"{s['worst_abs_error']:.1%} ({s['worst_id']}), LOSO worst "
                f"{s['loso_worst_abs_error']:.1%}; bounds coverage {_pct(cov)}"
            )
        out.print(f"excluded with reasons: {len(report['excluded'])} rows")
    for group, limit in (
        ("memory", max_memory),
        ("throughput", max_throughput),
        ("latency", max_latency),
    ):
        if limit is not None and summary[group]["loso_median_abs_error"] > limit:
            typer.echo(
                f"error: {group} LOSO median |error| "
                f"{summary[group]['loso_median_abs_error']:.1%} exceeds {limit:.1%}",
                err=True,
            )
            raise typer.Exit(1)
