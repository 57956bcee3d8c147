"""``gpuplan fit`` and ``gpuplan estimate``: will it fit, and the full per-GPU estimate."""

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
from gpuplan.estimate.margin import DEFAULT_SAFETY_MARGIN

SpecArg = Annotated[
    Path, typer.Argument(help="Job spec YAML (see `gpuplan spec schema`).", dir_okay=False)
]
MarginOpt = Annotated[
    float,
    typer.Option(
        "--safety-margin",
        min=0.0,
        max=0.5,
        help="Fraction of the memory the device reports (nvidia-smi memory.total) kept free "
        f"when deciding `fits` (default {DEFAULT_SAFETY_MARGIN}: the calibrated bounds give the "
        "`fits`/`tight`/`no` verdict instead).",
    ),
]


def register(app: typer.Typer) -> None:
    """Attach ``fit`` and ``estimate`` to the top-level app."""
    app.command("fit")(fit_command)
    app.command("estimate")(estimate_command)
    app.command("scale")(scale_command)


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
    margin: MarginOpt = DEFAULT_SAFETY_MARGIN,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    wide: WideOpt = False,
) -> None:
    """Per-GPU peak memory of a training step: does it fit, with what headroom and micro-batch."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.errors import SpecError
    from gpuplan.estimate.fit import fit, pinned_framework
    from gpuplan.report.payloads import fit_payload, fit_rows
    from gpuplan.spec import load_spec

    if trace and gpu is None:
        raise SpecError("--trace: needs --gpu (the table of every GPU is analytic only)")
    spec = load_spec(spec_path, overrides or [])
    if trace:
        # the tracer runs Transformers' model code: the analytic side reads the spec the same
        spec = pinned_framework(spec)
    cat = load_catalog(catalog)
    if gpu is not None:
        result = fit(spec, cat.gpu(gpu), gpus, margin=margin)
        if trace:
            result = _with_trace(spec, result)
        payload = fit_payload(result, gpus)
        if json_out:
            print_json(payload)
        else:
            _print_breakdown(result)
        return
    rows = fit_rows(spec, cat, gpus, margin=margin)
    if json_out:
        print_json(rows)
        return
    from gpuplan.report.table import Column

    columns = (
        Column(header="GPU"),
        Column(header="verdict"),
        Column(header="used GiB", justify="right"),
        Column(header="80% range GiB", priority=3, justify="right"),
        Column(header="capacity GiB", priority=2, justify="right"),
        Column(header="headroom GiB", priority=1, justify="right"),
        Column(header="max micro-batch", priority=4, justify="right"),
        Column(header="strategy / reason", priority=1, shrink=True, min_width=12),
    )
    cells: list[tuple[str, ...]] = []
    for row in rows:
        if "reason" in row:
            cells.append((row["gpu"], "[red]no[/red]", "-", "-", "-", "-", "-", row["reason"]))
            continue
        cells.append(
            (
                row["gpu"],
                _VERDICT_STYLE[row["verdict"]],
                _gib(row["device_used_bytes"]),
                "-".join(_gib(v) for v in row["device_used_bounds_bytes"]),
                _gib(row["capacity_bytes"]),
                _gib(row["headroom_bytes"]),
                str(row["max_micro_batch"]),
                _strategy_label(row["strategy"]),
            )
        )
    print_table(
        columns,
        cells,
        title=f"{spec.model} {spec.method} {spec.precision} mb={spec.micro_batch_size} "
        f"on {gpus} GPU(s)",
        wide=wide,
    )


_VERDICT_STYLE = {
    "fits": "[green]fits[/green]",
    "tight": "[yellow]tight[/yellow]",
    "no": "[red]no[/red]",
}
"""How the table shows a verdict: `tight` fits by the estimate, not by its upper bound."""


def _strategy_label(st: dict[str, Any]) -> str:
    parts = [st["sharding"], f"tp{st['tp']}", f"pp{st['pp']}", f"dp{st['dp']}"]
    return " ".join(p for p in parts if p not in ("tp1", "pp1"))


def _with_trace(spec: Any, result: Any) -> Any:
    from gpuplan.trace import trace_fit

    with progress(f"tracing {spec.model} with PyTorch"):
        return trace_fit(spec, result)


def _print_breakdown(result: Any) -> None:
    from rich.table import Table

    m = result.memory
    out = console()
    verdict = {
        "fits": "[green]fits[/green]",
        "tight": "[yellow]tight[/yellow] (the estimate fits, its 80% upper bound does not)",
        "no": "[red]does not fit[/red]",
    }[result.verdict]
    lo, hi = result.bounds()["device_used_bytes"]
    out.print(
        f"{result.gpu.id} x{result.count}: {verdict} - {_gib(m.device_used_bytes)} GiB "
        f"(80% range {_gib(lo)}-{_gib(hi)}) of {_gib(m.capacity_bytes)} GiB "
        f"({m.capacity_basis}; {m.safety_margin:.0%} kept free), headroom "
        f"{_gib(m.headroom_bytes)} GiB, max micro-batch {result.max_micro_batch}"
    )
    out.print(f"strategy: {result.strategy.label()}; peak during {m.peak_phase}; basis: {m.basis}")
    if m.pipeline_stages:
        stages = ", ".join(f"{p.stage} {_gib(p.device_used_bytes)} GiB" for p in m.pipeline_stages)
        out.print(f"pipeline stages (device used): {stages}; the table is the {m.pipeline_stage}")
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


GpnOpt = Annotated[
    int | None,
    typer.Option("--gpus-per-node", min=1, help="GPUs per node (default 8, or the count)."),
]
IntraOpt = Annotated[
    str | None,
    typer.Option(
        "--intra-node",
        help="Intra-node link: nvswitch, nvlink (no switch: every GPU of an SXM board, bridged "
        "pairs of PCIe cards), pcie (default: the GPU's usual board).",
    ),
]
InterOpt = Annotated[
    float | None, typer.Option("--inter-node-gbps", min=0, help="Network per node, Gbit/s.")
]
FabricOpt = Annotated[
    str | None, typer.Option("--fabric", help="Inter-node fabric: ib, roce, efa, ethernet.")
]
OfferingOpt = Annotated[
    str | None,
    typer.Option(
        "--offering",
        help="PROVIDER:INSTANCE from the catalog; takes GPU, node size and network from it.",
    ),
]
NodesOpt = Annotated[
    int | None, typer.Option("--nodes", min=1, help="Nodes of --offering (default 1).")
]


def estimate_command(
    spec_path: SpecArg,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU id or alias, e.g. H100-SXM.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Total GPUs (default 1).")
    ] = None,
    gpus_per_node: GpnOpt = None,
    intra_node: IntraOpt = None,
    inter_node_gbps: InterOpt = None,
    fabric: FabricOpt = None,
    offering: OfferingOpt = None,
    nodes: NodesOpt = None,
    margin: MarginOpt = DEFAULT_SAFETY_MARGIN,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """One configuration: per-GPU memory, step time, throughput, MFU, scaling and time-to-train."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.configure import configure
    from gpuplan.estimate.hardware import resolve_hardware
    from gpuplan.report.payloads import estimate_payload
    from gpuplan.spec import load_spec

    spec = load_spec(spec_path, overrides or [])
    cat = load_catalog(catalog)
    gspec, n, topo = resolve_hardware(
        cat, gpu, count, gpus_per_node, intra_node, inter_node_gbps, fabric, offering, nodes
    )
    conf = configure(spec, gspec, n, topo, margin=margin)
    payload = estimate_payload(conf, gspec, n, topo)
    if json_out:
        print_json(payload)
        return
    _print_breakdown(conf.fit)
    _print_time(conf)


def _print_time(conf: Any) -> None:
    from rich.table import Table

    from gpuplan.units import format_duration

    t = conf.time
    out = console()
    table = Table(
        title=f"step time on {conf.topology.gpus} GPU(s) ({conf.topology.intra_node}"
        + (
            f", {conf.topology.inter_node_gbps:g} Gbit/s {conf.topology.fabric}"
            if conf.topology.nodes > 1 and conf.topology.inter_node_gbps
            else ""
        )
        + ")"
    )
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in t.parts.items():
        if value > 0:
            table.add_row(key, f"{value:.3f}", f"{value / t.step_time_s:.0%}")
    table.add_row("[bold]step[/bold]", f"{t.step_time_s:.3f}", "100%")
    out.print(table)
    b = conf.time_bounds()
    out.print(
        f"80% range: step {b['step_time_s'][0]:.3f}-{b['step_time_s'][1]:.3f} s"
        + (
            f", time to train {format_duration(b['time_to_train_s'][0])}"
            f"-{format_duration(b['time_to_train_s'][1])}"
            if b["time_to_train_s"]
            else ""
        )
    )
    tok = (
        f"{t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f}/GPU), "
        if t.tokens_per_s
        else ""
    )
    out.print(
        f"throughput: {tok}{t.samples_per_s:,.1f} samples/s; MFU {t.mfu:.1%}; exposed communication "
        f"{t.comm_fraction:.0%} of the step; scaling efficiency {t.scaling_efficiency:.0%}"
    )
    if t.time_to_train_s is not None:
        out.print(
            f"time to train: {format_duration(t.time_to_train_s)} ({t.gpu_hours:,.0f} GPU-hours)"
            + (f", of which evaluation {format_duration(t.eval_s)}" if t.eval_s else "")
        )
    else:
        out.print("time to train: give `work` in the spec ({tokens}, {samples, epochs} or {steps})")
    for a in t.assumptions:
        out.print(f"  assumption: {a}")


def scale_command(
    spec_path: SpecArg,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU id or alias.")],
    max_gpus: Annotated[
        int | None,
        typer.Option(
            "--max-gpus",
            min=1,
            help="Largest count to try, powers of two (default: the spec's "
            "constraints.max_gpus, else 64).",
        ),
    ] = None,
    inter_node_gbps: Annotated[
        float,
        typer.Option("--inter-node-gbps", min=1, help="Network per node for multi-node counts."),
    ] = 400.0,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    wide: WideOpt = False,
) -> None:
    """Throughput and scaling efficiency at 1, 2, 4 ... GPUs for each interconnect."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.scale import scale_table
    from gpuplan.spec import load_spec

    spec = load_spec(spec_path, overrides or [])
    cat = load_catalog(catalog)
    limit = max_gpus or spec.constraints.max_gpus or 64
    rows = scale_table(spec, cat.gpu(gpu), max_gpus=limit, inter_node_gbps=inter_node_gbps)
    if json_out:
        print_json(rows)
        return
    from gpuplan.report.table import Column

    columns = (
        Column(header="GPUs", justify="right"),
        Column(header="interconnect"),
        Column(header="samples/s", justify="right", priority=2),
        Column(header="tokens/s/GPU", justify="right"),
        Column(header="MFU", justify="right", priority=3),
        Column(header="scaling eff.", justify="right"),
        Column(header="comm share", justify="right", priority=1),
        Column(header="strategy", priority=4, shrink=True, min_width=10),
    )
    cells: list[tuple[str, ...]] = []
    for r in rows:
        if r.get("error"):
            cells.append((str(r["gpus"]), r["interconnect"], "-", "-", "-", "-", "-", r["error"]))
            continue
        tpg = r["tokens_per_s_per_gpu"]
        cells.append(
            (
                str(r["gpus"]),
                r["interconnect"],
                f"{r['samples_per_s']:,.1f}",
                f"{tpg:,.0f}" if tpg else "-",
                f"{r['mfu']:.1%}",
                f"{r['scaling_efficiency']:.0%}",
                f"{r['comm_fraction']:.0%}",
                r["strategy"],
            )
        )
    print_table(
        columns,
        cells,
        title=f"scaling of {spec.model} on {cat.gpu(gpu).id} "
        "(per-GPU throughput vs the smallest count)",
        wide=wide,
    )
