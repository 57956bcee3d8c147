"""``gpuplan serve``: size, price and pack inference services (issue 13)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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

serve_app = typer.Typer(
    help="Inference services: fit, speed and cost on whole GPUs, MIG slices, vGPU instances "
    "and shared GPUs.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Attach ``serve`` to the top-level app."""
    app.add_typer(serve_app, name="serve")


@serve_app.command("schema")
def schema() -> None:
    """Print the JSON schema of a services file."""
    from gpuplan.serve.spec import serve_json_schema

    print_json(serve_json_schema())


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _num(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.0f} ms"


@serve_app.command("estimate")
def estimate(
    path: Annotated[Path, typer.Argument(help="Services YAML file.", dir_okay=False)],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU id, e.g. H100-SXM, A10.")],
    service: Annotated[
        str | None, typer.Option("--service", help="Service name (needed if the file has several).")
    ] = None,
    count: Annotated[int, typer.Option("--count", min=1, help="GPUs in tensor parallelism.")] = 1,
    slice_: Annotated[
        str | None,
        typer.Option(
            "--slice",
            help="A MIG profile (1g.10gb, 3g.40gb, ...) or a vGPU instance type of the catalog "
            "(e.g. ecs.sgn7i-vws-m8.4xlarge, GN7.LARGE20).",
        ),
    ] = None,
    catalog: CatalogOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Memory, throughput, latency and SLO capacity of one service on one device."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.serve import estimate_service
    from gpuplan.estimate.serve_device import resolve_device
    from gpuplan.serve.spec import load_serve_spec

    spec = load_serve_spec(path)
    svc = spec.service(service)
    cat = load_catalog(catalog)
    device = resolve_device(cat, gpu, count=count, slice=slice_)
    est = estimate_service(svc, device)
    if json_out:
        print_json(est.as_contract())
        return
    m, t, lat = est.memory, est.throughput, est.latency
    lines = [
        f"{svc.name} ({svc.model}) on {device.label}: "
        + ("fits" if est.fits else f"does NOT fit: {est.reason}"),
        f"  memory per {'GPU' if est.kind == 'llm' else 'replica'}: weights {_gib(m['weights_bytes'])}, "
        f"KV cache {_gib(m['kv_cache_bytes'])} ({m['kv_bytes_per_token']:,} B/token), "
        f"activations {_gib(m['activation_bytes'])}, overhead {_gib(m['overhead_bytes'])}, "
        f"total {_gib(m['total_bytes'])} of {_gib(m['capacity_bytes'])}",
    ]
    if est.kind == "llm":
        lines.append(
            f"  max concurrency at {m['max_model_len']:,} tokens per request: "
            f"{m['max_concurrency']:.2f}x"
        )
        lines.append(
            f"  capacity: {_num(t['output_tokens_per_s'], ' output tokens/s', 0)}, "
            f"{_num(t['requests_per_s'], ' requests/s', 2)} at batch {t['batch']}"
        )
        lines.append(
            f"  latency at the load: TTFT {_ms(lat['ttft_s'])} (p99 {_ms(lat['ttft_p99_s'])}), "
            f"TPOT {_ms(lat['tpot_s'])} (p99 {_ms(lat['tpot_p99_s'])})"
        )
    else:
        lines.append(
            f"  capacity: {_num(t['samples_per_s'], ' requests/s', 2)} at batch {t['batch']}"
        )
        lines.append(
            f"  latency at the load: {_ms(lat['latency_s'])} (p99 {_ms(lat['latency_p99_s'])})"
        )
    lines.append(f"  max qps within the SLO: {est.max_qps_within_slo:,.2f}")
    lines.append("  assumptions:")
    lines.extend(f"    - {a}" for a in est.assumptions)
    typer.echo("\n".join(lines))


@serve_app.command("plan")
def plan(
    path: Annotated[Path, typer.Argument(help="Services YAML file.", dir_okay=False)],
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="cost: least monthly cost (packs services onto shared GPUs); "
            "latency: lowest p99 latency per service (no sharing).",
        ),
    ] = "cost",
    currency: Annotated[
        str | None, typer.Option("--currency", help="Currency of costs (default: the file's).")
    ] = None,
    catalog: CatalogOpt = None,
    json_out: JsonOpt = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML report here.")
    ] = None,
    wide: WideOpt = False,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            help="k8s: print Kubernetes manifests (NVIDIA device plugin resources and its "
            "sharing ConfigMap); k8s-hami: HAMi's nvidia.com/gpumem and gpucores for shares.",
        ),
    ] = None,
) -> None:
    """Place every service on a whole GPU, MIG slice, vGPU instance or shared GPU at least cost."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.errors import SpecError
    from gpuplan.planner.flags import serve_objective
    from gpuplan.planner.serve_plan import plan_services
    from gpuplan.report.payloads import serve_plan_payload
    from gpuplan.report.serve_report import (
        gpu_rows,
        rejection_counts,
        render_html,
        service_rows,
        summary_line,
    )
    from gpuplan.serve.spec import load_serve_spec

    goal = serve_objective(objective)
    if export not in (None, "k8s", "k8s-hami"):
        raise SpecError(f"--export: expected k8s or k8s-hami, got {export!r}")
    spec = load_serve_spec(path)
    with progress(f"placing {len(spec.services)} services"):
        result = plan_services(spec, load_catalog(catalog), objective=goal, currency=currency)
    if html is not None:
        html.write_text(render_html(result), encoding="utf-8")
    if export:
        from gpuplan.planner.serve_k8s import manifests, to_yaml

        typer.echo(to_yaml(manifests(result, spec, hami=export == "k8s-hami")), nl=False)
        return
    if json_out:
        print_json(serve_plan_payload(result))
        return
    from gpuplan.report.table import Column

    out = console()
    out.print(summary_line(result))
    cur = result.currency
    print_table(
        (
            Column(header="service", shrink=True, min_width=10),
            Column(header="placement", shrink=True, min_width=16),
            Column(header="replicas", justify="right", priority=2),
            Column(header="latency", priority=1, shrink=True, min_width=12),
            Column(header=f"{cur}/month", justify="right"),
            Column(header="per million", justify="right", priority=3),
            Column(header="why", priority=4, shrink=True, min_width=12),
        ),
        service_rows(result),
        title="services",
        wide=wide,
        out=out,
    )
    if result.shared_gpus:
        print_table(
            (
                Column(header="GPU", shrink=True, min_width=12),
                Column(header="services", shrink=True, min_width=12),
                Column(header="compute", justify="right", priority=1),
                Column(header="memory", justify="right", priority=2),
                Column(header=f"{cur}/month", justify="right"),
            ),
            gpu_rows(result),
            title="shared GPUs",
            wide=wide,
            out=out,
        )
    reasons = "; ".join(f"{n} x {reason}" for reason, n in rejection_counts(result)[:4])
    out.print(
        f"{result.candidates_considered} placements considered; rejected: {reasons or 'none'} "
        f"(--json lists all {len(result.rejected)}); {result.method}"
    )
