"""``gpuplan web``: serve the planning page and JSON API (needs the ``web`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuplan.cli.common import CatalogOpt


def register(app: typer.Typer) -> None:
    """Attach ``web`` to the top-level app."""
    app.command("web")(web_command)


def web_command(
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Address to bind (default: this machine only; see docs/web.md)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = 8000,
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help="SQLite file of shared plans (default: $GPUPLAN_HOME/web.db).",
            dir_okay=False,
        ),
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Serve the planning page, shareable results and the JSON API (OpenAPI docs at /docs)."""
    from gpuplan.errors import GpuPlanError

    try:
        import uvicorn

        from gpuplan.web.app import create_app
    except ImportError as exc:
        from gpuplan.web import INSTALL_HINT

        raise GpuPlanError(
            f"web: needs the web extra ({exc.name} is not installed)", hint=INSTALL_HINT
        ) from None
    typer.echo(f"gpuplan web on http://{host}:{port}/ (Ctrl-C stops)")
    uvicorn.run(create_app(db, catalog), host=host, port=port, log_level="warning")
