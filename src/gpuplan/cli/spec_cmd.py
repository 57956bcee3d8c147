"""``gpuplan spec``: the job-spec schema and a validator for spec files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuplan.cli.common import JsonOpt, print_json

spec_app = typer.Typer(help="Job specs: the YAML description of a workload.", no_args_is_help=True)

SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a spec field, e.g. --set precision=bf16-mixed (repeatable)."
    ),
]


def register(app: typer.Typer) -> None:
    """Attach ``spec`` to the top-level app."""
    app.add_typer(spec_app, name="spec")


@spec_app.command("schema")
def schema() -> None:
    """Print the JSON schema of the job spec."""
    from gpuplan.spec import spec_json_schema

    print_json(spec_json_schema())


@spec_app.command("check")
def check(
    path: Annotated[Path, typer.Argument(help="Job spec YAML file.", dir_okay=False)],
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a job spec (and its model reference) and print it normalised."""
    from gpuplan.models import load_model
    from gpuplan.spec import load_spec

    spec = load_spec(path, overrides or [])
    model = load_model(spec.model)
    if json_out:
        print_json({"spec": spec, "model": model.id})
        return
    typer.echo(f"{path}: valid ({model.id}, {spec.method}, {spec.precision}, {spec.optimizer})")
