"""``gpuplan watch fleet``: scale a GPU group in by one idle instance at a time.

Thin layer over :mod:`gpuplan.monitor.fleet_setup`; every option is validated
there (errors name the flag and become one line, exit 2).
"""

from __future__ import annotations

import threading
from typing import Annotated

import typer

from gpuplan.cli.watch_common import (
    DURATION,
    Execute,
    Force,
    Json,
    LogLevel,
    MaxSteps,
    MetricScale,
    Window,
    echo_json,
    run_until_signalled,
    setup_logging,
)


def fleet(
    prometheus: Annotated[
        str,
        typer.Option(
            "--prometheus",
            metavar="URL",
            help="Prometheus server that scrapes the group's dcgm-exporters.",
        ),
    ],
    group: Annotated[
        str,
        typer.Option(
            "--group",
            metavar="NAME",
            help="The group: --group-label value on its series (the ASG name with --aws-asg).",
        ),
    ],
    group_label: Annotated[
        str,
        typer.Option(
            "--group-label", metavar="LABEL", help="Label holding the group name on every series."
        ),
    ] = "group",
    instance_label: Annotated[
        str,
        typer.Option(
            "--instance-label",
            metavar="LABEL",
            help="Label naming the instance (an EC2 instance id for --aws-asg).",
        ),
    ] = "instance",
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            metavar="NAME",
            help="Utilization metric (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_PROF_GR_ENGINE_ACTIVE...).",
        ),
    ] = "DCGM_FI_DEV_GPU_UTIL",
    metric_scale: MetricScale = None,
    scale_in_below: Annotated[
        str,
        typer.Option(
            "--scale-in-below",
            metavar="PCT",
            help="Remove an instance once the group mean utilization stays under PCT for --window.",
        ),
    ] = "30",
    window: Window = "10m",
    interval: Annotated[
        str, typer.Option("--interval", metavar=DURATION, help="Polling interval.")
    ] = "30s",
    cooldown: Annotated[
        str, typer.Option("--cooldown", metavar=DURATION, help="At most one removal per cooldown.")
    ] = "10m",
    max_gap: Annotated[
        str | None,
        typer.Option(
            "--max-gap",
            metavar=DURATION,
            help="A longer gap between polls restarts the idle clocks [default: 3 x --interval].",
        ),
    ] = None,
    min_size: Annotated[
        str, typer.Option("--min-size", metavar="N", help="Never go below N instances.")
    ] = "1",
    warmup: Annotated[
        str,
        typer.Option(
            "--warmup",
            metavar=DURATION,
            help="Instances seen for less than this are neither averaged nor removed.",
        ),
    ] = "10m",
    drain_hook: Annotated[
        str | None,
        typer.Option(
            "--drain-hook",
            metavar="CMD",
            help="Run on the chosen instance first; {instance} is replaced by its name.",
        ),
    ] = None,
    drain_timeout: Annotated[
        str, typer.Option("--drain-timeout", metavar=DURATION, help="Time bound for --drain-hook.")
    ] = "5m",
    aws_asg: Annotated[
        bool,
        typer.Option(
            "--aws-asg",
            help=(
                "Remove via terminate-instance-in-auto-scaling-group "
                "--should-decrement-desired-capacity."
            ),
        ),
    ] = False,
    alibaba_ess: Annotated[
        str | None,
        typer.Option(
            "--alibaba-ess",
            metavar="GROUP_ID",
            help="Remove via Alibaba Cloud ESS RemoveInstances from this scaling group.",
        ),
    ] = None,
    tencent_asg: Annotated[
        str | None,
        typer.Option(
            "--tencent-asg",
            metavar="GROUP_ID",
            help="Remove via Tencent Cloud Auto Scaling RemoveInstances from this group.",
        ),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            metavar="CMD",
            help="Removal command instead of --aws-asg; {instance} is replaced.",
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option("--webhook", metavar="URL", help="POST each removal decision as JSON."),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            metavar="REGION",
            help="Region for --aws-asg/--alibaba-ess/--tencent-asg [default: instance metadata].",
        ),
    ] = None,
    aws_endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--aws-endpoint-url", metavar="URL", help="AWS endpoint override (moto for tests)."
        ),
    ] = None,
    alibaba_endpoint: Annotated[
        str | None,
        typer.Option(
            "--alibaba-endpoint", metavar="URL", help="Alibaba Cloud ESS endpoint override."
        ),
    ] = None,
    tencent_endpoint: Annotated[
        str | None,
        typer.Option(
            "--tencent-endpoint",
            metavar="URL",
            help="Tencent Cloud Auto Scaling endpoint override.",
        ),
    ] = None,
    scrape_interval: Annotated[
        str,
        typer.Option(
            "--scrape-interval",
            metavar=DURATION,
            help=(
                "Prometheus' scrape interval for the group; a sample older than twice this "
                "is unknown ('auto': each target's own, from /api/v1/targets)."
            ),
        ),
    ] = "auto",
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="PATH",
            help=(
                "SQLite journal of removals, kept across restarts [default: fleet-GROUP.db "
                "beside the agent's default state file]."
            ),
        ),
    ] = None,
    force: Force = False,
    execute: Execute = False,
    max_steps: MaxSteps = None,
    json_out: Json = False,
    log_level: LogLevel = "info",
) -> None:
    """Scale a GPU group in by one idle instance at a time (dcgm-exporter data in Prometheus)."""
    raw = {key.replace("_", "-"): value for key, value in locals().items()}  # flag -> value
    from gpuplan.monitor.fleet_setup import open_fleet

    setup_logging(log_level)
    stop = threading.Event()
    agent, steps, close = open_fleet(
        raw, sleep=stop.wait, on_decision=echo_json if json_out else None
    )
    run_until_signalled(stop, lambda: agent.run(max_steps=steps, stop=stop), close)
