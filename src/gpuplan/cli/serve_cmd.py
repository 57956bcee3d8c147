"""``gpuplan serve``: size, price and pack inference services (issue 13)."""

from __future__ import annotations

import typer

from gpuplan.cli.common import print_json

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
