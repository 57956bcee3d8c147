"""``gpuplan catalog``: list GPUs and offerings, validate catalog files, import SkyPilot catalogs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import CatalogOpt, CurrencyOpt, JsonOpt, console, fail, print_json

catalog_app = typer.Typer(
    help="The built-in GPU and cloud-offering catalog, and your overrides.", no_args_is_help=True
)
import_app = typer.Typer(
    help="Convert other tools' catalogs into a gpuplan overrides file.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    """Attach ``catalog`` to the top-level app."""
    catalog_app.add_typer(import_app, name="import")
    app.add_typer(catalog_app, name="catalog")


def _fmt_tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@catalog_app.command("gpus")
def gpus(
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Show only this GPU id or alias.")
    ] = None,
) -> None:
    """List GPUs: memory, bandwidth, dense peak TFLOPS per dtype, NVLink, MIG, source."""
    from gpuplan.catalog.loader import load_catalog

    cat = load_catalog(catalog)
    rows = [cat.gpu(gpu)] if gpu else sorted(cat.gpus, key=lambda g: g.id)
    if json_out:
        print_json([{**g.model_dump(mode="json"), "precisions": list(g.precisions)} for g in rows])
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} GPUs (dense peak TFLOPS)")
    for col in (
        "id",
        "arch",
        "mem GB",
        "BW GB/s",
        "fp32",
        "tf32",
        "bf16",
        "fp16",
        "fp8",
        "NVLink GB/s",
        "MIG",
        "as_of",
    ):
        table.add_column(col, justify="left" if col in ("id", "arch") else "right")
    for g in rows:
        p = g.peak_tflops_dense
        table.add_row(
            g.id,
            g.architecture,
            f"{g.memory_bytes / 1e9:g}",
            f"{g.memory_bandwidth_gb_per_s:g}",
            _fmt_tflops(p.get("fp32")),
            _fmt_tflops(p.get("tf32")),
            _fmt_tflops(p.get("bf16")),
            _fmt_tflops(p.get("fp16")),
            _fmt_tflops(p.get("fp8")),
            _fmt_tflops(g.nvlink_bandwidth_gb_per_s),
            str(g.mig_max_instances or "-"),
            str(g.as_of),
        )
    console().print(table)


def _offering_row(off: Any, cat: Any, currency: str) -> dict[str, Any]:
    prices = {}
    for p in off.prices:
        prices[p.mode] = round(cat.convert(p.hourly_equivalent, p.currency, currency), 4)
    return {**off.model_dump(mode="json"), "hourly": prices, "hourly_currency": currency}


@catalog_app.command("offerings")
def offerings(
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Only offerings of this GPU id or alias.")
    ] = None,
    provider: Annotated[
        list[str] | None, typer.Option("--provider", help="Only this provider (repeatable).")
    ] = None,
    region: Annotated[
        str | None,
        typer.Option("--region", help="Only offerings in a region containing this text."),
    ] = None,
    max_price: Annotated[
        float | None,
        typer.Option(
            "--max-price",
            help="Only on-demand instance-hour prices at most this (in --currency).",
            min=0,
        ),
    ] = None,
    currency: CurrencyOpt = "USD",
) -> None:
    """List cloud GPU offerings with prices per billing mode, interconnect and source."""
    from gpuplan.catalog.loader import load_catalog

    cat = load_catalog(catalog)
    cat.convert(1.0, "USD", currency)  # validates the currency early
    rows = cat.filter_offerings(
        gpu=gpu,
        providers=provider or (),
        region=region,
        max_price_per_hour=max_price,
        currency=currency,
    )
    rows = tuple(sorted(rows, key=lambda o: (o.provider, o.gpu, o.gpu_count, o.instance_type)))
    if json_out:
        print_json([_offering_row(o, cat, currency) for o in rows])
        return
    from rich.table import Table

    n_prov = len({o.provider for o in rows})
    table = Table(
        title=f"{len(rows)} offerings from {n_prov} providers ({currency} per instance-hour)"
    )
    for col in (
        "provider",
        "instance",
        "gpu",
        "n",
        "interconnect",
        "net Gbps",
        "on-demand",
        "spot",
        "monthly (/h)",
        "regions",
        "as_of",
    ):
        table.add_column(col)
    for o in rows:
        row = _offering_row(o, cat, currency)["hourly"]
        regions = ", ".join(o.regions[:2]) + (
            f" +{len(o.regions) - 2}" if len(o.regions) > 2 else ""
        )
        table.add_row(
            o.provider,
            o.instance_type,
            o.gpu,
            f"{o.gpu_count:g}",
            o.intra_node,
            f"{o.inter_node_gbps:g}" if o.inter_node_gbps else "-",
            *(f"{row[m]:.3f}" if m in row else "-" for m in ("on-demand", "spot", "monthly")),
            regions,
            str(o.as_of),
        )
    console().print(table)


@catalog_app.command("validate")
def validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Extra catalog/overrides files to check (default: built-in + your user file).",
            dir_okay=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check every shipped and user catalog file: schema, GPU references, prices, currencies, dates.

    Exit 1 when it finds problems (each listed); 2 when a file cannot be read as YAML at all.
    """
    from gpuplan.catalog.loader import (
        _builtin_parsed,
        _merge,
        catalog_from_data,
        check_catalog,
        read_catalog_data,
        user_catalog_path,
    )
    from gpuplan.errors import CatalogError

    problems: list[str] = []
    parsed = list(_builtin_parsed())
    names = [n for n, _ in parsed]
    user = user_catalog_path()
    paths = [(user, "user catalog")] if user.is_file() else []
    paths += [(path, "catalog validate") for path in files or []]
    for path, what in paths:
        # A file that is not YAML at all is a usage error (exit 2); schema problems are listed.
        data = read_catalog_data(path, what=what)
        try:
            parsed.append((str(path), catalog_from_data(data, origin=str(path))))
            names.append(str(path))
        except CatalogError as exc:
            problems.append(exc.one_line())
    cat = _merge(parsed)
    problems += check_catalog(cat)
    summary = {
        "files": names,
        "gpus": len(cat.gpus),
        "offerings": len(cat.offerings),
        "providers": len(cat.providers),
        "problems": problems,
    }
    if json_out:
        print_json(summary)
    else:
        out = console()
        for name in names:
            out.print(f"checked {name}")
        out.print(
            f"{len(cat.gpus)} GPUs, {len(cat.offerings)} offerings, {len(cat.providers)} providers"
        )
        for problem in problems:
            out.print(f"[red]problem:[/red] {problem}")
        if not problems:
            out.print("[green]catalog valid[/green]")
    if problems:
        raise typer.Exit(1)


@import_app.command("skypilot")
def import_skypilot(
    path: Annotated[
        Path,
        typer.Argument(
            help="A SkyPilot-format vms.csv (e.g. ~/.sky/catalogs/v8/gcp/vms.csv).", dir_okay=False
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Overrides YAML to write.", dir_okay=False)],
    provider: Annotated[
        str | None, typer.Option("--provider", help="Provider id (default: the CSV's folder name).")
    ] = None,
    as_of: Annotated[
        str | None,
        typer.Option("--as-of", help="Date of the prices, YYYY-MM-DD (default: file date)."),
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Convert a SkyPilot vms.csv into an overrides file that --catalog reads."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.catalog.skypilot import convert_vms_csv, dump_catalog_file, write_atomically

    date = None
    if as_of is not None:
        try:
            date = dt.date.fromisoformat(as_of)
        except ValueError:
            raise fail(f"--as-of: expected a date YYYY-MM-DD, got {as_of!r}") from None
    cat = load_catalog(catalog)
    result = convert_vms_csv(path, cat, provider=provider, as_of=date)
    write_atomically(out, dump_catalog_file(result.catalog))
    n = len(result.catalog.offerings)
    typer.echo(f"wrote {n} offerings from {result.rows_read} rows to {out}")
    for reason, count in sorted(result.skipped.items()):
        typer.echo(f"  skipped {count}: {reason}")
