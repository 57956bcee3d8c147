"""``gpuplan validate``: estimator error against published measurements."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import JsonOpt, WideOpt, console, print_json, print_table, progress

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


MaxLosoMedianOpt = Annotated[
    float | None,
    typer.Option(
        "--max-loso-median",
        min=0.0,
        help="Exit 1 if the leave-one-source-out median absolute error exceeds this.",
    ),
]
MaxLosoUnderOpt = Annotated[
    float | None,
    typer.Option(
        "--max-loso-under",
        min=0.0,
        max=1.0,
        help="Exit 1 if the share of rows predicted more than 10% low, leave-one-source-out, "
        "exceeds this.",
    ),
]
MaxLosoOver50Opt = Annotated[
    int | None,
    typer.Option(
        "--max-loso-over-50",
        min=0,
        help="Exit 1 if more rows than this are off by >50%, leave-one-source-out.",
    ),
]
MaxTimeUnderOpt = Annotated[
    float | None,
    typer.Option(
        "--max-time-under",
        min=0.0,
        max=1.0,
        help="Exit 1 if the share of rows whose run time is predicted more than 10% short "
        "exceeds this, whatever the metric (a speed predicted high is a time predicted short: "
        "the plan runs over).",
    ),
]
MaxLosoTimeUnderOpt = Annotated[
    float | None,
    typer.Option(
        "--max-loso-time-under",
        min=0.0,
        max=1.0,
        help="As --max-time-under, leave-one-source-out.",
    ),
]
MaxRefusedOpt = Annotated[
    int | None,
    typer.Option(
        "--max-refused",
        min=0,
        help="Exit 1 if the memory model refuses more than this many rows whose layout ran as "
        "published (a false 'does not fit').",
    ),
]
MinCoverageOpt = Annotated[
    float | None,
    typer.Option(
        "--min-coverage",
        min=0.0,
        max=1.0,
        help="Exit 1 if fewer rows than this share fall inside their 80% bounds.",
    ),
]
MinHeldOutCoverageOpt = Annotated[
    float | None,
    typer.Option(
        "--min-held-out-coverage",
        min=0.0,
        max=1.0,
        help="Exit 1 if fewer rows than this share fall inside 80% bounds fitted without "
        "their own source (the coverage a job from an unseen engine gets).",
    ),
]
MaxCoverageOpt = Annotated[
    float | None,
    typer.Option(
        "--max-coverage",
        min=0.0,
        max=1.0,
        help="Exit 1 if more rows than this share fall inside their 80% bounds, as shipped or "
        "fitted without their own source (bounds wider than the 80% they claim).",
    ),
]
MaxHeldOutCoverageOpt = Annotated[
    float | None,
    typer.Option(
        "--max-held-out-coverage",
        min=0.0,
        max=1.0,
        help="Exit 1 if more rows than this share fall inside 80% bounds fitted without their "
        "own source (the held-out side of --max-coverage alone).",
    ),
]
MaxWidthOpt = Annotated[
    float | None,
    typer.Option(
        "--max-width",
        min=0.0,
        help="Exit 1 if the median half-width of the 80% bounds exceeds this fraction "
        "(0.20 = +/-20%).",
    ),
]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _time_short(summary: dict[str, Any]) -> str:
    """The run-time short-prediction count, where the table measures time or speed."""
    n = summary.get("time_under_predicted_over_10pct")
    return "" if n is None else f"run time predicted >10% short: {n}; "


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
    loso_gates: tuple[float | None, float | None, int | None, float | None] = (
        None,
        None,
        None,
        None,
    ),
    *,
    wide: bool = False,
    max_refused: int | None = None,
    time_under_gates: tuple[float | None, float | None] = (None, None),
    max_width: float | None = None,
    min_held_out_coverage: float | None = None,
    max_coverage: float | None = None,
    max_held_out_coverage: float | None = None,
) -> None:
    """Run one validation table, print it (or JSON), and apply the CI gates."""
    from gpuplan import holdout
    from gpuplan.validation import default_table, format_rows, refused_rows, run_table

    path = table or default_table(name)
    with progress(f"validating {name} estimates against {path.name}"):
        report = run_table(path, predict)
        s = report.summary()
        loso = holdout.memory_loso(path) if name == "memory" else holdout.training_loso(path)
        kind = "memory" if name == "memory" else "time"
        cov = holdout.coverage(loso, path, kind) if loso is not None else None
        refused = refused_rows(path) if name == "training" else None
    loso_summary = loso.report.summary() if loso is not None else None
    loso_errors = {r.id: r.error for r in loso.report.rows} if loso is not None else {}
    if json_out:
        print_json(
            {
                "summary": s,
                "rows": report.rows,
                "excluded": report.excluded,
                "loso": None
                if loso is None
                else {
                    "summary": loso_summary,
                    "stale": loso.stale or None,
                    "rows": [
                        {"id": r.id, "source": r.source, "predicted": r.predicted, "error": r.error}
                        for r in loso.report.rows
                    ],
                    "fold_params": loso.fold_params,
                    "by_source": loso.report.by_source(),
                },
                "coverage": cov.as_json() if cov else None,
                "fitted_constants": [c.as_json() for c in loso.constants] if loso else [],
                **(
                    {"refused_by_memory": [r.as_json() for r in refused]}
                    if refused is not None
                    else {}
                ),
            }
        )
    else:
        from gpuplan.report.table import Column

        columns = (
            Column(header="id", shrink=True, min_width=12),
            Column(header="metric", priority=3),
            Column(header=f"predicted{unit}", justify="right"),
            Column(header=f"measured{unit}", justify="right"),
            Column(header="error", justify="right"),
            Column(header="LOSO error", justify="right", priority=1),
            Column(header="strategy / note", priority=2, shrink=True, min_width=12),
        )
        cells = []
        for row, text in zip(report.rows, format_rows(report.rows, scale, unit), strict=True):
            err = loso_errors.get(row.id)
            cells.append((*text[:5], "-" if err is None else f"{err:+.1%}", text[5]))
        out = console()
        print_table(columns, cells, title=f"{name} validation: {report.table}", wide=wide, out=out)
        out.print(
            f"rows {s['rows']} (+{s['excluded']} excluded with reasons); median |error| "
            f"{_pct(s['median_abs_error'])} (single-node {_pct(s['median_abs_error_single_node'])}, "
            f"multi-node {_pct(s['median_abs_error_multi_node'])}); worst {_pct(s['worst_abs_error'])} "
            f"({s['worst_id']}); predicted >10% below measured: {s['under_predicted_over_10pct']}; "
            + _time_short(s)
            + f"off by more than 50%: {s['rows_over_50pct']}"
        )
        if loso_summary is not None and loso is not None:
            out.print(
                f"leave-one-source-out (each source predicted by constants fitted without it): "
                f"median |error| {_pct(loso_summary['median_abs_error'])}; predicted >10% below "
                f"measured: {loso_summary['under_predicted_over_10pct']}; "
                + _time_short(loso_summary)
                + f"off by more than 50%: {loso_summary['rows_over_50pct']}"
                + (f" [stale: {loso.stale}]" if loso.stale else "")
            )
            groups = loso.report.by_source()
            if groups:
                out.print(
                    f"  by source (LOSO median |error|, rows; median over the "
                    f"{len(groups)} sources {_pct(loso_summary['median_of_source_medians'])}): "
                    + ", ".join(
                        f"{g['source'] or '?'} {_pct(g['median_abs_error'])} ({g['rows']})"
                        for g in groups
                    )
                )
            for c in loso.constants:
                helps = {True: "lowers", False: "does NOT lower", None: "?"}[c.helps]
                out.print(
                    f"  fitted {c.name} = {c.value:g} on {len(c.rows)} rows; {helps} the LOSO "
                    f"error of its rows ({_pct(c.loso_median_fitted)} vs "
                    f"{_pct(c.loso_median_prior)} unfitted)"
                )
        else:
            out.print(
                "leave-one-source-out: no stored folds (run scripts/fit_efficiency.py --write)"
            )
        if cov is not None:
            out.print(
                f"80% bounds: {cov.inside:.0%} of {cov.rows} rows inside ({cov.inside_held_out:.0%} "
                f"with bounds also fitted without the row's source); median width "
                f"+/-{cov.median_half_width:.0%}"
            )
        if refused is not None:
            out.print(
                f"memory model refuses {len(refused)} of the rows whose layout ran as published"
                + (
                    ": "
                    + ", ".join(
                        f"{r.id} ({r.strategy}: {r.device_used_bytes / 2**30:.1f} of "
                        f"{r.capacity_bytes / 2**30:.1f} GiB)"
                        for r in refused
                    )
                    if refused
                    else ""
                )
            )
    failures = report.gate_failures(
        max_median=max_median,
        max_under=max_under,
        max_over_50=max_over_50,
        max_time_under=time_under_gates[0],
    )
    failures += _loso_failures(loso, cov, *loso_gates, max_time_under=time_under_gates[1])
    if max_width is not None and (cov is None or cov.median_half_width > max_width):
        got = "no bounds" if cov is None else f"+/-{cov.median_half_width:.1%}"
        failures.append(f"80% bounds median width {got}, above --max-width +/-{max_width:.0%}")
    if min_held_out_coverage is not None and (
        cov is None or cov.inside_held_out < min_held_out_coverage
    ):
        got = "no rows" if cov is None else f"{cov.inside_held_out:.0%}"
        failures.append(
            f"80% bounds fitted without each row's source cover {got} of rows, below "
            f"--min-held-out-coverage {min_held_out_coverage:.0%}"
        )
    if max_coverage is not None and cov is not None:
        for share, which in (
            (cov.inside, ""),
            (cov.inside_held_out, " fitted without each row's source"),
        ):
            if share > max_coverage:
                failures.append(
                    f"80% bounds{which} cover {share:.0%} of rows, above --max-coverage "
                    f"{max_coverage:.0%}"
                )
    if (
        max_held_out_coverage is not None
        and cov is not None
        and cov.inside_held_out > max_held_out_coverage
    ):
        failures.append(
            f"80% bounds fitted without each row's source cover {cov.inside_held_out:.0%} of "
            f"rows, above --max-held-out-coverage {max_held_out_coverage:.0%}"
        )
    if max_refused is not None and refused is not None and len(refused) > max_refused:
        failures.append(
            f"the memory model refuses {len(refused)} rows that ran as published, more than "
            f"--max-refused {max_refused}"
        )
    if failures:
        typer.echo(f"error: {failures[0]}", err=True)
        raise typer.Exit(1)


def _loso_failures(
    loso: Any,
    cov: Any,
    max_median: float | None,
    max_under: float | None,
    max_over_50: int | None,
    min_coverage: float | None,
    *,
    max_time_under: float | None = None,
) -> list[str]:
    """Why the leave-one-source-out figures fail their gates."""
    gates = (max_median, max_under, max_over_50, min_coverage, max_time_under)
    gated = any(g is not None for g in gates)
    if not gated:
        return []
    if loso is None or loso.stale:
        why = loso.stale if loso is not None else "no stored folds"
        return [f"leave-one-source-out: {why}"]
    out = [
        f"leave-one-source-out: {f}"
        for f in loso.report.gate_failures(
            max_median=max_median,
            max_under=max_under,
            max_over_50=max_over_50,
            max_time_under=max_time_under,
        )
    ]
    if min_coverage is not None and (cov is None or cov.inside < min_coverage):
        got = "no rows" if cov is None else f"{cov.inside:.0%}"
        out.append(f"80% bounds cover {got} of rows, below --min-coverage {min_coverage:.0%}")
    return out


def _run_traced(
    table: Path | None,
    json_out: bool,
    wide: bool,
    gates: dict[str, Any],
    in_sample: tuple[float | None, float | None, int | None],
) -> None:
    """``validate memory --trace``: the traced estimate on every row the tracer can run."""
    from gpuplan.errors import SpecError
    from gpuplan.report.table import Column
    from gpuplan.trace import require_torch
    from gpuplan.validation import (
        default_table,
        format_rows,
        predict_memory_traced,
        run_table,
    )

    given = sorted(name for name, value in gates.items() if value is not None)
    if given:
        raise SpecError(
            f"--trace: {', '.join(given)} gate the analytic estimates (leave-one-source-out "
            "folds, bounds); with --trace only --max-median, --max-under and --max-over-50 apply"
        )
    require_torch()  # one line naming the trace extra, before any row is read
    path = table or default_table("memory")
    with progress(f"tracing the memory rows of {path.name} (seconds a row)"):
        report = run_table(path, predict_memory_traced)
    traced = [r for r in report.rows if r.error is not None]
    skipped = [r for r in report.rows if r.error is None]
    done = dataclasses.replace(report, rows=tuple(traced))
    if json_out:
        print_json(
            {
                "summary": done.summary() if traced else None,
                "rows": traced,
                "not_traced": [{"id": r.id, "reason": r.note} for r in skipped],
                "excluded": report.excluded,
            }
        )
        _traced_gates(done, in_sample)
        return
    columns = (
        Column(header="id", shrink=True, min_width=12),
        Column(header="metric", priority=3),
        Column(header="traced GiB", justify="right"),
        Column(header="measured GiB", justify="right"),
        Column(header="error", justify="right"),
        Column(header="strategy", priority=2, shrink=True, min_width=12),
    )
    out = console()
    print_table(
        columns,
        format_rows(traced, 2**30, ""),
        title=f"memory validation, traced: {report.table}",
        wide=wide,
        out=out,
    )
    if traced:
        s = done.summary()
        out.print(
            f"traced rows {len(traced)}; median |error| {_pct(s['median_abs_error'])}; worst "
            f"{_pct(s['worst_abs_error'])} ({s['worst_id']}); predicted >10% below measured: "
            f"{s['under_predicted_over_10pct']}; off by more than 50%: {s['rows_over_50pct']}"
        )
    reasons = collections.Counter(r.note.split(" (hint:")[0] for r in skipped)
    out.print(
        f"not traced: {len(skipped)} rows"
        + "".join(f"\n  {n} x {why}" for why, n in reasons.most_common())
    )
    _traced_gates(done, in_sample)


def _traced_gates(done: Any, in_sample: tuple[float | None, float | None, int | None]) -> None:
    max_median, max_under, max_over_50 = in_sample
    if not done.rows:
        if any(g is not None for g in in_sample):
            typer.echo("error: --trace: no row could be traced", err=True)
            raise typer.Exit(1)
        return
    failures = done.gate_failures(
        max_median=max_median, max_under=max_under, max_over_50=max_over_50
    )
    if failures:
        typer.echo(f"error: traced: {failures[0]}", err=True)
        raise typer.Exit(1)


@validate_app.command("memory")
def memory(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
    max_median: MaxMedianOpt = None,
    max_under: MaxUnderOpt = None,
    max_over_50: MaxOver50Opt = None,
    max_loso_median: MaxLosoMedianOpt = None,
    max_loso_under: MaxLosoUnderOpt = None,
    max_loso_over_50: MaxLosoOver50Opt = None,
    min_coverage: MinCoverageOpt = None,
    max_width: MaxWidthOpt = None,
    min_held_out_coverage: MinHeldOutCoverageOpt = None,
    max_coverage: MaxCoverageOpt = None,
    max_held_out_coverage: MaxHeldOutCoverageOpt = None,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            help="Validate the traced estimate (fit --trace: the real model on the meta device, "
            "PyTorch's caching allocator replayed) on every row the tracer can run, instead of "
            "the analytic one; seconds a row, needs the trace extra. Lists the rows not traced "
            "and why.",
        ),
    ] = False,
) -> None:
    """Predicted vs measured per-GPU peak memory (GiB): in-sample and leave-one-source-out
    error, the fitted constants, and how often the 80% bounds hold."""
    from gpuplan.validation import predict_memory

    if trace:
        _run_traced(
            table,
            json_out,
            wide,
            {
                "--max-loso-median": max_loso_median,
                "--max-loso-under": max_loso_under,
                "--max-loso-over-50": max_loso_over_50,
                "--min-coverage": min_coverage,
                "--max-width": max_width,
                "--min-held-out-coverage": min_held_out_coverage,
                "--max-coverage": max_coverage,
                "--max-held-out-coverage": max_held_out_coverage,
            },
            (max_median, max_under, max_over_50),
        )
        return

    _run(
        "memory",
        predict_memory,
        table,
        json_out,
        max_median,
        2**30,
        " GiB",
        max_under,
        max_over_50,
        (max_loso_median, max_loso_under, max_loso_over_50, min_coverage),
        wide=wide,
        max_width=max_width,
        min_held_out_coverage=min_held_out_coverage,
        max_coverage=max_coverage,
        max_held_out_coverage=max_held_out_coverage,
    )


@validate_app.command("training")
def training(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
    max_median: MaxMedianOpt = None,
    max_under: MaxUnderOpt = None,
    max_over_50: MaxOver50Opt = None,
    max_loso_median: MaxLosoMedianOpt = None,
    max_loso_under: MaxLosoUnderOpt = None,
    max_loso_over_50: MaxLosoOver50Opt = None,
    min_coverage: MinCoverageOpt = None,
    max_refused: MaxRefusedOpt = None,
    max_time_under: MaxTimeUnderOpt = None,
    max_loso_time_under: MaxLosoTimeUnderOpt = None,
    max_width: MaxWidthOpt = None,
    min_held_out_coverage: MinHeldOutCoverageOpt = None,
    max_coverage: MaxCoverageOpt = None,
    max_held_out_coverage: MaxHeldOutCoverageOpt = None,
) -> None:
    """Predicted vs measured throughput / time-to-train: in-sample and leave-one-source-out
    error, the fitted constants, how often the 80% bounds hold, and the rows that ran but
    that the memory model refuses."""
    from gpuplan.validation import predict_training

    _run(
        "training",
        predict_training,
        table,
        json_out,
        max_median,
        1.0,
        "",
        max_under,
        max_over_50,
        (max_loso_median, max_loso_under, max_loso_over_50, min_coverage),
        wide=wide,
        max_refused=max_refused,
        time_under_gates=(max_time_under, max_loso_time_under),
        max_width=max_width,
        min_held_out_coverage=min_held_out_coverage,
        max_coverage=max_coverage,
        max_held_out_coverage=max_held_out_coverage,
    )


@validate_app.command("inference")
def inference(
    table: TableOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
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

    with progress("validating serving estimates"):
        report = run(table, loso=not no_loso)
    summary = report["summary"]
    if json_out:
        print_json(report)
    else:
        from gpuplan.report.table import Column

        columns = (
            Column(header="id", shrink=True, min_width=12),
            Column(header="metric", priority=3),
            Column(header="predicted", justify="right"),
            Column(header="measured", justify="right"),
            Column(header="error", justify="right"),
            Column(header="LOSO error", justify="right", priority=1),
            Column(header="in bounds", priority=2),
        )
        cells = [
            (
                r.id,
                r.metric,
                f"{r.predicted:.4g}",
                f"{r.measured:.4g}",
                f"{r.error:+.1%}",
                f"{r.loso_error:+.1%}",
                "-" if r.in_bounds is None else ("yes" if r.in_bounds else "no"),
            )
            for r in report["rows"]
        ]
        out = console()
        print_table(
            columns,
            cells,
            title=f"inference validation: {report['table']}",
            wide=wide,
            out=out,
        )
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
