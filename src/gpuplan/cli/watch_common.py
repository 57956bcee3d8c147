"""Plumbing shared by the ``gpuplan watch`` command modules: JSON lines, logging, signals."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, TextIO

import typer

DURATION = "DURATION"

Execute = Annotated[
    bool,
    typer.Option(
        "--execute",
        help="Really act. Without it every action is a dry run that only logs what it would do.",
    ),
]
Json = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON object per decision (replay: the contract output)."
    ),
]
LogLevel = Annotated[
    str,
    typer.Option(
        "--log-level", metavar="LEVEL", help="debug, info, warning or error (logs go to stderr)."
    ),
]
MaxSteps = Annotated[
    str | None,
    typer.Option(
        "--max-steps", metavar="N", help="Stop after N observations (default: run until SIGTERM)."
    ),
]
Window = Annotated[
    str,
    typer.Option(
        "--window",
        metavar=DURATION,
        help="Continuous idle needed before acting (90s, 10m, 2h; the unit is required).",
    ),
]
MetricScale = Annotated[
    str | None,
    typer.Option(
        "--metric-scale",
        metavar="X",
        help="Percent per unit for a metric not in the known list.",
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Accept a --window shorter than 3 x --interval (too few samples to trust).",
    ),
]


def echo_json(obj: Any, out: TextIO | None = None) -> None:
    """Print one JSON object on its own line and flush."""
    stream = out or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def setup_logging(level: str) -> None:
    """Log to stderr at ``--log-level``."""
    from gpuplan.monitor.config import choice

    name = choice(level, "--log-level", ("debug", "info", "warning", "error"))
    logging.basicConfig(
        level=getattr(logging, name.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM/SIGINT set ``stop`` (a clean exit after the current step)."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """Put back the handlers saved by :func:`stop_on_signals`."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def run_until_signalled(
    stop: threading.Event, run: Callable[[], object], close: Callable[[], object]
) -> None:
    """Call ``run`` while SIGTERM/SIGINT set ``stop``; then restore the handlers and ``close``."""
    previous = stop_on_signals(stop)
    try:
        run()
    finally:
        restore_signals(previous)
        close()


def given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The names among ``names`` whose value came from the command line (or env)."""
    out = []
    for name in names:
        source = ctx.get_parameter_source(name.replace("-", "_"))
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            out.append(name)
    return out
