"""``gpuplan watch --replay``: recorded nvidia-smi outputs through the parser and policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuplan.cli.watch_common import echo_json, given
from gpuplan.errors import MonitorError


def run_replay_cli(
    ctx: typer.Context,
    raw: dict[str, Any],
    path: Path,
    *,
    policy_keys: tuple[str, ...],
    json_out: bool,
    savings: bool,
    price: str | None,
) -> None:
    """Replay a recorded trace through the parser and policy and print the decisions."""
    from gpuplan.monitor.config import DAEMON_DEFAULTS, number, policy_config
    from gpuplan.monitor.policy import IdlePolicy
    from gpuplan.monitor.replay import (
        cadence_warning,
        compute_savings,
        contract_record,
        load_replay,
        run_replay,
    )

    agent_only = [k for k in given(ctx, tuple(DAEMON_DEFAULTS)) if k not in policy_keys]
    if agent_only:
        raise MonitorError(
            f"--{agent_only[0]}: not used with --replay "
            f"(only policy flags are: {', '.join(policy_keys)})"
        )
    if savings and price is None:
        raise MonitorError("--price-per-hour: required with --savings")
    if price is not None and not savings:
        raise MonitorError("--price-per-hour: only valid with --savings")
    policy = IdlePolicy(policy_config(raw))
    lines = load_replay(path)
    warning = cadence_warning(lines, policy)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    results = list(run_replay(lines, policy))
    if savings:
        assert price is not None  # noqa: S101 - checked above
        report = compute_savings(results, number(price, "--price-per-hour", low=0))
        if json_out:
            echo_json({k: getattr(report, k) for k in report.__dataclass_fields__})
        else:
            typer.echo(
                f"{report.stops} stop(s) over {report.trace_hours:.2f} h of trace "
                f"({report.idle_hours:.2f} h idle): {report.saved_hours:.2f} h saved = "
                f"{report.saved_money:.2f} at {report.price_per_hour:g}/h; "
                f"{report.resumed_after_stop} stop(s) later needed a restart"
            )
        return
    for line, decision in results:
        if json_out:
            echo_json(contract_record(decision))
        else:
            act = decision.action or "-"
            typer.echo(
                f"line {line.line_no:>5}  t={decision.t_s:>10.1f}  {decision.state.value:<7}  "
                f"idle_for={decision.idle_for_s:>8.1f}s  {act:<4}  {decision.reason}"
            )
