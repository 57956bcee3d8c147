"""``gpuplan fit`` and ``gpuplan estimate``: will it fit, and the full per-GPU estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import CatalogOpt, JsonOpt, console, print_json
from gpuplan.cli.spec_cmd import SetOpt

SpecArg = Annotated[
    Path, typer.Argument(help="Job spec YAML (see `gpuplan spec schema`).", dir_okay=False)
]
MarginOpt = Annotated[
    float,
    typer.Option(
        "--safety-margin",
        min=0.0,
        max=0.5,
        help="Fraction of GPU memory kept free when deciding `fits` (default 0.05).",
    ),
]


def register(app: typer.Typer) -> None:
    """Attach ``fit`` and ``estimate`` to the top-level app."""
    app.command("fit")(fit_command)
    app.command("estimate")(estimate_command)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def fit_command(
    spec_path: SpecArg,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="One GPU id; without it, one row per catalog GPU.")
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs the job is spread over.")] = 1,
    trace: Annotated[
        bool, typer.Option("--trace", help="Trace the real PyTorch model (needs the trace extra).")
    ] = False,
    margin: MarginOpt = 0.05,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """Per-GPU peak memory of a training step: does it fit, with what headroom and micro-batch."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.fit import fit
    from gpuplan.spec import load_spec

    spec = load_spec(spec_path, overrides or [])
    cat = load_catalog(catalog)
    if gpu is not None:
        result = fit(spec, cat.gpu(gpu), gpus, margin=margin)
        if trace:
            result = _with_trace(spec, result)
        payload = {
            "gpu": result.gpu.id,
            "count": gpus,
            "strategy": result.strategy.as_contract(),
            "memory": result.as_contract(),
        }
        if json_out:
            print_json(payload)
        else:
            _print_breakdown(result)
        return
    rows = []
    from gpuplan.errors import SpecError

    for g in sorted(cat.gpus, key=lambda g: (g.memory_bytes, g.id)):
        try:
            r = fit(spec, g, gpus, margin=margin)
        except SpecError as exc:
            rows.append({"gpu": g.id, "fits": False, "reason": exc.one_line()})
            continue
        rows.append(
            {
                "gpu": g.id,
                "fits": r.memory.fits,
                "device_used_bytes": round(r.memory.device_used_bytes),
                "capacity_bytes": round(r.memory.capacity_bytes),
                "headroom_bytes": round(r.memory.headroom_bytes),
                "max_micro_batch": r.max_micro_batch,
                "strategy": r.strategy.as_contract(),
            }
        )
    if json_out:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(
        title=f"{spec.model} {spec.method} {spec.precision} mb={spec.micro_batch_size} on {gpus} GPU(s)"
    )
    for col in (
        "GPU",
        "fits",
        "used GiB",
        "capacity GiB",
        "headroom GiB",
        "max micro-batch",
        "strategy / reason",
    ):
        table.add_column(col)
    for row in rows:
        if "reason" in row:
            table.add_row(row["gpu"], "[red]no[/red]", "-", "-", "-", "-", row["reason"])
            continue
        table.add_row(
            row["gpu"],
            "[green]yes[/green]" if row["fits"] else "[red]no[/red]",
            _gib(row["device_used_bytes"]),
            _gib(row["capacity_bytes"]),
            _gib(row["headroom_bytes"]),
            str(row["max_micro_batch"]),
            _strategy_label(row["strategy"]),
        )
    console().print(table)


def _strategy_label(st: dict[str, Any]) -> str:
    parts = [st["sharding"], f"tp{st['tp']}", f"pp{st['pp']}", f"dp{st['dp']}"]
    return " ".join(p for p in parts if p not in ("tp1", "pp1"))


def _with_trace(spec: Any, result: Any) -> Any:
    from gpuplan.trace import trace_fit

    return trace_fit(spec, result)


def _print_breakdown(result: Any) -> None:
    from rich.table import Table

    m = result.memory
    out = console()
    verdict = "[green]fits[/green]" if m.fits else "[red]does not fit[/red]"
    out.print(
        f"{result.gpu.id} x{result.count}: {verdict} - {_gib(m.device_used_bytes)} GiB of "
        f"{_gib(m.capacity_bytes)} GiB ({m.safety_margin:.0%} kept free), headroom "
        f"{_gib(m.headroom_bytes)} GiB, max micro-batch {result.max_micro_batch}"
    )
    out.print(f"strategy: {result.strategy.label()}; peak during {m.peak_phase}; basis: {m.basis}")
    table = Table(title="per-GPU memory")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for key, value in m.details.items():
        if value:
            table.add_row(key, _gib(value))
    table.add_row("[bold]peak allocated[/bold]", _gib(m.peak_allocated_bytes))
    table.add_row("[bold]peak reserved[/bold]", _gib(m.peak_reserved_bytes))
    table.add_row("[bold]device used (nvidia-smi)[/bold]", _gib(m.device_used_bytes))
    out.print(table)
    for a in m.assumptions:
        out.print(f"  assumption: {a}")


def estimate_command(
    spec_path: SpecArg,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU id or alias, e.g. H100-SXM.")],
    count: Annotated[int, typer.Option("--count", min=1, help="Total GPUs.")] = 1,
    margin: MarginOpt = 0.05,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """One configuration: memory per GPU (and, once the speed model lands, time)."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.fit import fit
    from gpuplan.spec import load_spec

    spec = load_spec(spec_path, overrides or [])
    cat = load_catalog(catalog)
    result = fit(spec, cat.gpu(gpu), count, margin=margin)
    payload = {
        "gpu": result.gpu.id,
        "count": count,
        "strategy": result.strategy.as_contract(),
        "memory": result.as_contract(),
        "time": None,
    }
    if json_out:
        print_json(payload)
        return
    _print_breakdown(result)
