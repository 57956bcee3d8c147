"""``gpuplan watch status``: the idle clock, per-GPU verdicts and the last (would-be) stop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from gpuplan.cli.watch_common import echo_json
from gpuplan.errors import MonitorError


def status(
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="PATH",
            help="The agent's SQLite state file [default: as for 'gpuplan watch'].",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the status as one JSON object.")
    ] = False,
) -> None:
    """Show the idle clock, the current verdict per GPU and the reason for any stop."""
    from gpuplan.monitor.clock import read_boot_id
    from gpuplan.monitor.config import default_state_path
    from gpuplan.monitor.state import StateStore
    from gpuplan.units import format_duration

    path = Path(state) if state else default_state_path()
    if not path.exists():
        raise MonitorError(
            f"--state: no watch state at {path}",
            hint="start the agent with 'gpuplan watch' or pass --state",
        )
    store = StateStore(path)
    try:
        st = store.status()
    finally:
        store.close()
    step = st.last_step or {}
    cfg = st.config or {}
    now = time.time()
    age = None if st.updated_wall is None else now - st.updated_wall
    this_boot = st.boot_id is not None and st.boot_id == read_boot_id()
    info = {
        "state_file": str(path),
        "this_boot": this_boot,
        "last_update_age_s": age,
        "state": step.get("state"),
        "idle_for_s": step.get("idle_for_s"),
        "window": cfg.get("window"),
        "execute": bool(cfg.get("execute")),
        "reason": step.get("reason"),
        "alert": step.get("alert"),
        "gpus": step.get("gpus", []),
        "last_action": st.last_action,
    }
    if json_out:
        echo_json(info)
        return
    if not step:
        typer.echo(f"no observation recorded yet in {path}")
        return
    mode = "EXECUTE" if info["execute"] else "dry run"
    when = "?" if age is None else format_duration(max(age, 0.0)) + " ago"
    boot = "" if this_boot else " (recorded in an earlier boot: this machine has rebooted since)"
    typer.echo(
        f"{step['state']}: idle for {format_duration(float(step['idle_for_s']))} "
        f"of a {cfg.get('window', '?')} window ({mode}); last observation {when}{boot}"
    )
    typer.echo(f"reason: {step.get('reason')}")
    if step.get("alert"):
        typer.echo(f"ALERT: {step['alert']}")
    for g in step.get("gpus", []):
        typer.echo(f"  {g['uuid']}: {g['state']} ({g['why']})")
    act = st.last_action
    if act:
        ago = format_duration(max(now - float(act["wall"]), 0.0))
        typer.echo(f"last action: {act['action']} {ago} ago, {act['status']}: {act['reason']}")
        for r in act.get("results", []):
            typer.echo(f"  {r['action']}: {r['detail']}")
