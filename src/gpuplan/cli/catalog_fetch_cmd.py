"""``gpuplan catalog fetch PROVIDER``: refresh prices from a provider's own price API."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuplan.cli.common import CatalogOpt


def fetch(
    provider: Annotated[
        str,
        typer.Argument(
            help="alibaba, tencent, aws, azure or gcp.", metavar="PROVIDER", show_default=False
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Overrides YAML to write (atomically).", dir_okay=False)
    ],
    region: Annotated[
        list[str] | None,
        typer.Option(
            "--region",
            help="Provider region id, e.g. cn-hangzhou, ap-guangzhou, us-east-1, eastus, "
            "us-central1 (repeatable; default: every region the catalog lists).",
        ),
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="Only offerings of this GPU id or alias (repeatable)."),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help="Base URL replacing the provider's public endpoint (a proxy, a test "
            "server; aws: both pricing and ec2).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Per-request timeout, seconds.", min=0.1)
    ] = 20.0,
    retries: Annotated[
        int,
        typer.Option(
            "--retries", help="Retries of a throttled request (backoff 1, 2, 4 s...).", min=0
        ),
    ] = 4,
    currency: Annotated[
        str | None,
        typer.Option(
            "--currency",
            help="tencent: your account's currency (CNY on the China site, USD "
            "international; default CNY); azure: currencyCode to ask (default USD).",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="GPUPLAN_GCP_API_KEY",
            show_envvar=True,
            help="gcp: a Cloud Billing API key (default: Application Default Credentials).",
        ),
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Fetch live prices with your own credentials into an overrides file (--catalog reads it).

    Providers: alibaba (ECS DescribePrice, DescribeSpotPriceHistory,
    DescribeAvailableResource), tencent (CVM InquiryPriceRunInstances,
    DescribeZoneInstanceConfigInfos), aws (pricing GetProducts, ec2
    DescribeSpotPriceHistory), azure (Retail Prices API, no credentials), gcp
    (Cloud Billing Catalog API). Credentials come from each SDK's standard chain
    and are never written. Each price's source is api:PROVIDER:ACTION, its as_of
    the fetch date. Instance types are the ones the catalog describes; see
    docs/catalog.md for the permissions each provider needs.
    """
    from gpuplan.catalog.fetch import FetchRequest, fetch_overrides
    from gpuplan.catalog.fetch.writer import header_comment
    from gpuplan.catalog.skypilot import dump_catalog_file, write_atomically

    req = FetchRequest(
        regions=tuple(region or ()),
        gpus=tuple(gpu or ()),
        endpoint=endpoint,
        timeout_s=timeout,
        max_retries=retries,
        currency=currency.upper() if currency else None,
        api_key=api_key,
    )
    files = [catalog] if catalog is not None else []
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"{provider} prices", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(
                    task, completed=done, total=total or None, description=f"{provider} {what}"
                )

            result = fetch_overrides(provider, req, catalog_files=files, progress=progress)
    else:
        result = fetch_overrides(provider, req, catalog_files=files)
    text = header_comment(provider, result.outcome, now=req.now) + dump_catalog_file(result.catalog)
    write_atomically(out, text)
    n_prices = len(result.outcome.quotes)
    typer.echo(
        f"wrote {len(result.catalog.offerings)} offerings ({n_prices} prices from "
        f"{len({q.region for q in result.outcome.quotes})} regions) to {out}"
    )
    unpriced = sorted(set(result.outcome.regions_asked) - {q.region for q in result.outcome.quotes})
    if unpriced:
        typer.echo(f"  no price for the types asked in: {', '.join(unpriced)}")
    for line in result.outcome.skipped:
        typer.echo(f"  skipped: {line}")


def register(app: Any) -> None:
    """Attach ``fetch`` to the ``catalog`` group."""
    app.command("fetch")(fetch)
