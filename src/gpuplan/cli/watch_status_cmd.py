"""``gpuplan watch status``: the idle clock, per-GPU verdicts and the last (would-be) stop."""

from __future__ import annotations

import sqlite3
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
    from gpuplan.monitor.lock import live_note
    from gpuplan.monitor.state import StateStore
    from gpuplan.units import format_duration

    path = Path(state) if state else default_state_path()
    store = StateStore.open_read_only(path)  # never creates or changes a file
    try:
        st = store.status()
    except sqlite3.Error as exc:
        raise MonitorError(f"--state: cannot read {path}: {exc}") from exc
    finally:
        store.close()
    storage_alert = live_note(path)
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
        "storage_alert": storage_alert,
        "gpus": step.get("gpus", []),
        "last_action": st.last_action,
    }
    if json_out:
        echo_json(info)
        return
    if storage_alert:
        typer.echo(f"ALERT: {storage_alert}")
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
        typer.echo(f"  {g.get('uuid')}: {g.get('state')} ({g.get('why')})")
    act = st.last_action
    if act:
        ago = format_duration(max(now - float(act["wall"] or 0.0), 0.0))
        typer.echo(f"last action: {act['action']} {ago} ago, {act['status']}: {act['reason']}")
        for r in act.get("results", []):
            if isinstance(r, dict):
                typer.echo(f"  {r.get('action')}: {r.get('detail')}")
