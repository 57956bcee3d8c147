"""Top-level ``gpuplan`` command: registers the command groups and the error boundary.

Each command group lives in its own ``cli/<name>_cmd.py`` module that exposes
``register(app)``; heavy imports stay inside the command functions so that
``gpuplan --help`` starts fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from gpuplan import __version__
from gpuplan.cli import (
    bill_cmd,
    catalog_cmd,
    fit_cmd,
    models_cmd,
    plan_cmd,
    serve_cmd,
    spec_cmd,
    validate_cmd,
    watch_cmd,
    web_cmd,
)
from gpuplan.cli.common import EXIT_USER_ERROR, State
from gpuplan.errors import GpuPlanError


def _click_exceptions() -> Any:
    """click's exception classes: vendored inside typer since 0.2x, plain click before."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - older typer on top of click
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def _abort_class(cx: Any) -> type[BaseException]:
    """click's ``Abort`` (Ctrl-C, a declined prompt): in click's exceptions module, or, where
    typer vendors click (0.2x), in ``typer.exceptions``. A missing one must not turn every
    other exception into an AttributeError in the ``except`` clause that names it."""
    abort = getattr(cx, "Abort", None)
    if abort is None:
        from typer import exceptions as typer_exceptions

        abort = typer_exceptions.Abort
    return abort


class _Group(TyperGroup):
    """The error boundary: GpuPlanError becomes one line on stderr and exit 2 (unless --debug).

    Usage errors from click (missing option, bad choice, out-of-range number,
    a directory for a file, unknown option) are one line too, naming the
    command and pointing at its ``--help``, instead of click's three lines.
    """

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        cx = _click_exceptions()
        abort = _abort_class(cx)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except cx.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except cx.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "gpuplan"
            text = " ".join(exc.format_message().split())
            typer.echo(f"error: {where}: {text} (hint: {where} --help)", err=True)
            sys.exit(EXIT_USER_ERROR)
        except cx.ClickException as exc:
            typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(exc.exit_code)
        except abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GpuPlanError as exc:
            if State.debug:
                raise
            typer.echo(f"error: {exc.one_line()}", err=True)
            raise typer.Exit(EXIT_USER_ERROR) from None


app = typer.Typer(
    name="gpuplan",
    cls=_Group,
    help=(
        "Will my model fit on this GPU, how long will training take, what will it cost on each "
        "cloud, and is a machine I pay for sitting idle?"
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """gpuplan: plan GPU training jobs from real models, datasheets and published prices."""
    State.debug = debug


for _module in (
    plan_cmd,
    catalog_cmd,
    models_cmd,
    spec_cmd,
    fit_cmd,
    bill_cmd,
    validate_cmd,
    watch_cmd,
    serve_cmd,
    web_cmd,
):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    app(args=argv)


if __name__ == "__main__":
    main()
