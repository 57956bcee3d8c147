"""Build a ready-to-run fleet controller from raw option values.

The wiring behind ``gpuplan watch fleet``: the removal action (``--aws-asg``
or ``--command``), the drain hook, the webhook and the Prometheus sampler.
Keys of ``raw`` are the flag names without ``--``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.actions import Action, ActionPlan, CommandAction, PreStopHook, WebhookAction
from gpuplan.monitor.clock import SystemClock
from gpuplan.monitor.config import (
    argv_of,
    boolean,
    check_executable,
    default_state_path,
    duration,
    idle_timing,
    integer,
    number,
)
from gpuplan.monitor.fleet import FleetConfig, FleetPolicy
from gpuplan.monitor.fleet_agent import FleetAgent
from gpuplan.monitor.fleet_journal import FleetJournal
from gpuplan.monitor.fleet_sampler import PrometheusFleetSampler
from gpuplan.monitor.lock import StateLock
from gpuplan.monitor.prometheus import PrometheusClient


def fleet_config(raw: Mapping[str, Any]) -> FleetConfig:
    """The :class:`FleetConfig` from the fleet flags."""
    timing = idle_timing(raw)
    return FleetConfig(
        scale_in_below_pct=number(raw["scale-in-below"], "--scale-in-below", low=0, high=100),
        window_s=timing.window_s,
        interval_s=timing.interval_s,
        cooldown_s=timing.cooldown_s,
        min_size=integer(raw["min-size"], "--min-size", low=0),
        warmup_s=duration(raw["warmup"], "--warmup"),
        max_gap_s=timing.max_gap_s,
    )


def build_fleet_plan(raw: Mapping[str, Any], cfg: FleetConfig) -> ActionPlan:
    """Drain hook -> webhook -> removal (``--aws-asg``, ``--alibaba-ess``, ``--tencent-asg`` or
    ``--command``)."""
    aws_asg = boolean(raw.get("aws-asg", False), "--aws-asg")
    command = raw.get("command")
    if aws_asg and command is not None:
        raise MonitorError("--aws-asg and --command both given: choose one removal action")
    from gpuplan.monitor.cloud import fleet_cloud_action

    main: Action | None = fleet_cloud_action(
        alibaba_ess=_opt_str(raw.get("alibaba-ess")),
        tencent_asg=_opt_str(raw.get("tencent-asg")),
        min_size=cfg.min_size,
        region=_opt_str(raw.get("region")),
        alibaba_endpoint=_opt_str(raw.get("alibaba-endpoint")),
        tencent_endpoint=_opt_str(raw.get("tencent-endpoint")),
        other="--aws-asg" if aws_asg else "--command" if command is not None else None,
    )
    if aws_asg:
        from gpuplan.monitor.aws import AsgScaleInAction

        main = AsgScaleInAction(
            min_size=cfg.min_size,
            group=str(raw["group"]),
            region=_opt_str(raw.get("region")),
            endpoint_url=_opt_str(raw.get("aws-endpoint-url")),
        )
    execute = boolean(raw.get("execute", False), "--execute")
    if command is not None:
        argv = argv_of(command, "--command")
        if execute:
            check_executable(argv, "--command")
        main = CommandAction(argv)
    webhook = raw.get("webhook")
    if execute and main is None and not webhook:
        raise MonitorError(
            "--execute: no removal action configured",
            hint="add --aws-asg, --alibaba-ess, --tencent-asg, --command or --webhook",
        )
    drain = raw.get("drain-hook")
    return ActionPlan(
        pre_stop=PreStopHook(
            argv_of(drain, "--drain-hook"),
            timeout_s=duration(raw.get("drain-timeout", "5m"), "--drain-timeout"),
            name="drain-hook",
        )
        if drain is not None
        else None,
        notify=WebhookAction(str(webhook), event="scale-in") if webhook else None,
        main=main,
    )


def build_fleet_sampler(raw: Mapping[str, Any]) -> PrometheusFleetSampler:
    """The Prometheus poller for the group."""
    scale = raw.get("metric-scale")
    scrape = raw.get("scrape-interval") or "auto"
    scrape_s = None if scrape == "auto" else duration(scrape, "--scrape-interval")
    if scrape_s is not None and scrape_s <= 0:
        raise MonitorError("--scrape-interval: must be > 0")
    return PrometheusFleetSampler(
        PrometheusClient(str(raw["prometheus"])),
        group=str(raw["group"]),
        group_label=str(raw.get("group-label", "group")),
        instance_label=str(raw.get("instance-label", "instance")),
        metric=str(raw.get("metric", "DCGM_FI_DEV_GPU_UTIL")),
        scale=None if scale is None else number(scale, "--metric-scale", low=0),
        scrape_interval_s=scrape_s,
    )


def fleet_state_path(raw: Mapping[str, Any]) -> Path:
    """``--state``, or ``fleet-<group>.db`` beside the agent's default state file."""
    if raw.get("state"):
        return Path(str(raw["state"]))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(raw["group"]))[:100] or "group"
    return default_state_path().with_name(f"fleet-{slug}.db")


def open_fleet(
    raw: Mapping[str, Any],
    *,
    sleep: Callable[[float], object],
    on_decision: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[FleetAgent, int | None, Callable[[], None]]:
    """Validate the fleet flags; return the controller, ``--max-steps`` and a closer.

    The removals journal (``--state``) is locked: one controller per journal.
    """
    cfg = fleet_config(raw)
    plan = build_fleet_plan(raw, cfg)
    sampler = build_fleet_sampler(raw)
    steps = raw.get("max-steps")
    max_steps = None if steps is None else integer(steps, "--max-steps", low=1)
    path = fleet_state_path(raw)
    lock = StateLock(path).acquire()
    try:
        journal = FleetJournal(path, str(raw["group"]))
    except BaseException:
        lock.release()
        raise

    def close() -> None:
        journal.close()
        lock.release()

    agent = FleetAgent(
        poll=sampler.poll,
        policy=FleetPolicy(cfg),
        plan=plan,
        clock=SystemClock(),
        sleep=sleep,
        execute=boolean(raw.get("execute", False), "--execute"),
        on_decision=on_decision,
        journal=journal,
    )
    return agent, max_steps, close


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
