"""Shared CLI plumbing: the error boundary, JSON output, option types.

Only the CLI turns a :class:`GpuPlanError` into a one-line message and exit
code 2; library code never prints or exits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from gpuplan.report.table import Column, Layout

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")
]
CatalogOpt = Annotated[
    Path | None,
    typer.Option(
        "--catalog",
        help="Overrides YAML whose rows shadow the built-in catalog (default: $GPUPLAN_HOME/catalog.yaml).",
        dir_okay=False,
    ),
]
WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="Show every table column at full width (default on a terminal: the columns "
        "that fit its width; piped output always gets the full table).",
    ),
]
CurrencyOpt = Annotated[
    str, typer.Option("--currency", help="Currency for prices and costs: USD or CNY.")
]


class State:
    """Global options set by the top-level callback."""

    debug: bool = False


def fail(message: str, *, hint: str | None = None) -> typer.Exit:
    """Print a one-line user error to stderr and return the Exit to raise."""
    text = " ".join(message.split())
    if hint:
        text += f" (hint: {' '.join(hint.split())})"
    typer.echo(f"error: {text}", err=True)
    return typer.Exit(EXIT_USER_ERROR)


def to_jsonable(obj: Any) -> Any:
    """Turn pydantic models, dataclasses, tuples and dates into JSON values."""
    import dataclasses
    import datetime as dt

    from pydantic import BaseModel  # not at start-up: `gpuplan --help` needs no pydantic

    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (dt.date, dt.datetime)):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def print_json(obj: Any) -> None:
    """Write ``obj`` as indented JSON to stdout."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def console() -> Any:
    """A rich console for tables (imported lazily to keep start-up fast)."""
    from rich.console import Console

    return Console()


def print_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    wide: bool = False,
    out: Any = None,
) -> Layout:
    """Print a table that fits the terminal (all columns with ``--wide`` or on a pipe);
    returns the layout used (which columns were shown)."""
    from gpuplan.report.table import fit_columns, render_table

    out = out or console()
    full = wide or not out.is_terminal
    table = render_table(columns, rows, width=out.width, wide=full, title=title)
    layout = fit_columns(columns, rows, out.width, wide=full)
    if not full:
        out.print(table)
        return layout
    need = layout.total
    saved = out.width
    out.width = max(saved, need)  # a pipe gets the whole table, never wrapped at 80
    try:
        out.print(table)
    finally:
        out.width = saved
    return layout


@contextmanager
def progress(message: str, *, out: Any = None) -> Iterator[None]:
    """A spinner on stderr while slow work runs, only when stderr is a terminal."""
    if out is None:
        from rich.console import Console

        out = Console(stderr=True)
    if not out.is_terminal:
        yield
        return
    with out.status(message):
        yield
