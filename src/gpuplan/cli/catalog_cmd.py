"""``gpuplan catalog``: list GPUs and offerings, validate catalog files, import SkyPilot catalogs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import (
    CatalogOpt,
    JsonOpt,
    WideOpt,
    console,
    fail,
    print_json,
    print_table,
)

catalog_app = typer.Typer(
    help="The built-in GPU and cloud-offering catalog, and your overrides.", no_args_is_help=True
)
import_app = typer.Typer(
    help="Convert other tools' catalogs into a gpuplan overrides file.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    """Attach ``catalog`` to the top-level app."""
    from gpuplan.cli import catalog_fetch_cmd

    catalog_app.add_typer(import_app, name="import")
    catalog_fetch_cmd.register(catalog_app)
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
    wide: WideOpt = False,
) -> None:
    """List GPUs: memory, bandwidth, dense peak TFLOPS per dtype, NVLink, MIG, source."""
    from gpuplan.catalog.loader import load_catalog

    cat = load_catalog(catalog)
    rows = [cat.gpu(gpu)] if gpu else sorted(cat.gpus, key=lambda g: g.id)
    if json_out:
        print_json([{**g.model_dump(mode="json"), "precisions": list(g.precisions)} for g in rows])
        return
    from gpuplan.report.table import Column

    columns = (
        Column(header="id"),
        Column(header="arch", priority=3),
        Column(header="mem GB", justify="right"),
        Column(header="BW GB/s", justify="right"),
        Column(header="fp32", justify="right", priority=5),
        Column(header="tf32", justify="right", priority=6),
        Column(header="bf16", justify="right"),
        Column(header="fp16", justify="right", priority=7),
        Column(header="fp8", justify="right", priority=1),
        Column(header="NVLink GB/s", justify="right", priority=2),
        Column(header="MIG", justify="right", priority=4),
        Column(header="as_of", priority=8),
    )
    cells = []
    for g in rows:
        p = g.peak_tflops_dense
        cells.append(
            (
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
        )
    print_table(columns, cells, title=f"{len(rows)} GPUs (dense peak TFLOPS)", wide=wide)


_TABLE_MODES = ("on-demand", "spot", "monthly", "reserved-1y")


def _gpus_label(off: Any) -> str:
    """``4``, or ``1/12 vGPU 2GiB`` for a slice of one GPU."""
    if off.gpu_count >= 1 and off.hosting != "vgpu-slice":
        return f"{off.gpu_count:g}"
    frac = f"1/{round(1 / off.gpu_count)}" if off.gpu_count < 1 else f"{off.gpu_count:g}"
    mem = f" {off.gpu_memory_bytes / 2**30:g}GiB" if off.gpu_memory_bytes else ""
    return f"{frac} vGPU{mem}"


def _region_groups(
    off: Any, region: str | None, cat: Any
) -> list[tuple[list[str], dict[str, Any]]]:
    """The offering's regions grouped by identical prices, cheapest on-demand (in USD) first."""
    groups: dict[tuple[int, ...], tuple[list[str], dict[str, Any]]] = {}
    for r in off.regions:
        if region and region.lower() not in r.lower():
            continue
        prices = {m: off.price(m, r) for m in dict.fromkeys(p.mode for p in off.prices)}
        key = tuple(id(p) for p in prices.values())
        known = {m: p for m, p in prices.items() if p is not None}
        groups.setdefault(key, ([], known))[0].append(r)

    def order(group: tuple[list[str], dict[str, Any]]) -> tuple[float, str]:
        p = group[1].get("on-demand") or next(iter(group[1].values()), None)
        usd = cat.convert(p.hourly_equivalent, p.currency, "USD") if p is not None else 0.0
        return (usd, group[0][0])

    return sorted(groups.values(), key=order)


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
        typer.Option("--region", help="Only regions containing this text."),
    ] = None,
    max_price: Annotated[
        float | None,
        typer.Option(
            "--max-price",
            help="Only on-demand instance-hour prices at most this (in --currency, USD "
            "by default).",
            min=0,
        ),
    ] = None,
    currency: Annotated[
        str | None,
        typer.Option(
            "--currency",
            help="Convert prices to this currency with the dated FX rates "
            "(default: the table shows each price in its published currency; JSON's "
            "`hourly` is USD).",
        ),
    ] = None,
    wide: WideOpt = False,
) -> None:
    """List cloud GPU offerings with prices per region and billing mode, interconnect and source.

    One table row per offering and group of regions charging the same prices;
    vGPU slices show their fraction of a GPU and its memory.
    """
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.report.payloads import offerings_payload, select_offerings

    cat = load_catalog(catalog)
    target = currency or "USD"
    rows = select_offerings(
        cat,
        gpu=gpu,
        providers=provider or (),
        region=region,
        max_price=max_price,
        currency=target,
    )
    if json_out:
        print_json(offerings_payload(cat, rows, target, region))
        return
    from gpuplan.report.table import Column

    n_prov = len({o.provider for o in rows})
    unit = f"{currency} per instance-hour" if currency else "per instance-hour, as published"
    columns = (
        Column(header="provider"),
        Column(header="instance", shrink=True, min_width=12),
        Column(header="gpu"),
        Column(header="n", justify="right"),
        Column(header="interconnect", priority=4),
        Column(header="net Gbps", justify="right", priority=5),
        Column(header="regions", priority=1, shrink=True, min_width=10),
        Column(header="cur", priority=2),
        Column(header="on-demand", justify="right"),
        Column(header="spot", justify="right", priority=2),
        Column(header="monthly (/h)", justify="right", priority=3),
        Column(header="1y (/h)", justify="right", priority=3),
        Column(header="as_of", priority=6),
    )
    cells = []
    for o in rows:
        groups = _region_groups(o, region, cat) if o.prices else [(list(o.regions), {})]
        for i, (members, prices) in enumerate(groups):
            shown = ", ".join(members[:3]) + (f" +{len(members) - 3}" if len(members) > 3 else "")
            curs = {p.currency for p in prices.values()}
            cur = currency or (curs.pop() if len(curs) == 1 else "mixed")

            convert = bool(currency) or len(curs) > 1

            def amount(mode: str, prices: dict[str, Any] = prices, convert: bool = convert) -> str:
                p = prices.get(mode)
                if p is None:
                    return "-"
                value = p.hourly_equivalent
                if convert:
                    value = cat.convert(value, p.currency, target)
                return f"{value:.3f}" + ("~" if p.derived else "")

            cells.append(
                (
                    o.provider if i == 0 else "",
                    o.instance_type if i == 0 else "",
                    o.gpu if i == 0 else "",
                    _gpus_label(o) if i == 0 else "",
                    o.intra_node if i == 0 else "",
                    (f"{o.inter_node_gbps:g}" if o.inter_node_gbps else "-") if i == 0 else "",
                    shown,
                    cur if prices else "-",
                    *(amount(m) for m in _TABLE_MODES),
                    str(o.as_of) if i == 0 else "",
                )
            )
    print_table(
        columns,
        cells,
        title=f"{len(rows)} offerings from {n_prov} providers ({unit})",
        wide=wide,
    )
    if currency:
        console().print(
            f"converted with FX of {cat.fx.as_of} ({' '.join(cat.fx.source.split())})",
            highlight=False,
        )
    if any(p.derived for o in rows for p in o.prices):
        console().print("~ derived from a published discount rule (see --json)", highlight=False)


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
        typer.Option(
            "--as-of",
            help="Date the prices were read at the source, YYYY-MM-DD. SkyPilot catalogs "
            "record no date, so without it the rows get as_of: unknown and plans warn "
            "that their age is unknown.",
        ),
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
    when = f"as of {date}" if date else "as_of: unknown (pass --as-of DATE to record it)"
    typer.echo(f"wrote {n} offerings from {result.rows_read} rows to {out}, {when}")
    for reason, count in sorted(result.skipped.items()):
        typer.echo(f"  skipped {count}: {reason}")
