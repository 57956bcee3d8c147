"""``gpuplan watch``: the GPU idle agent, its replay mode, status and fleet mode.

Thin layer over :mod:`gpuplan.monitor`: options are parsed by
:mod:`gpuplan.monitor.config` (errors name the flag and become one line,
exit 2); everything is a dry run unless ``--execute``.

The agent's options live in the one callback below (one parameter per flag);
``status`` and ``fleet`` are in their own modules, the wiring in
:mod:`gpuplan.monitor.agent_setup` and :mod:`gpuplan.monitor.fleet_setup`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any

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
    given,
    run_until_signalled,
    setup_logging,
)
from gpuplan.cli.watch_fleet_cmd import fleet
from gpuplan.cli.watch_replay_cmd import run_replay_cli
from gpuplan.cli.watch_status_cmd import status
from gpuplan.errors import MonitorError

watch_app = typer.Typer(
    name="watch",
    help=(
        "Watch this machine's GPUs and stop it (or scale its group in) when every GPU has been "
        "idle for --window. Dry run unless --execute. Also: --replay a recorded trace, "
        "'status', and 'fleet' mode."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)

_POLICY_KEYS = (
    "threshold",
    "window",
    "interval",
    "min-uptime",
    "cooldown",
    "ignore-processes",
    "memory-threshold-mib",
    "unknown-alert",
    "max-gap",
    "force",
)

Threshold = Annotated[
    str,
    typer.Option(
        "--threshold",
        metavar="PCT",
        help="A GPU is busy at or above this utilization.gpu percent (0 < PCT <= 100).",
    ),
]
Interval = Annotated[
    str,
    typer.Option(
        "--interval", metavar=DURATION, help="Sampling interval (replay: the recording's cadence)."
    ),
]
MinUptime = Annotated[
    str,
    typer.Option(
        "--min-uptime",
        metavar=DURATION,
        help="No action this soon after boot (replay: t counts from boot).",
    ),
]
Cooldown = Annotated[
    str,
    typer.Option(
        "--cooldown", metavar=DURATION, help="No action this soon after the previous one."
    ),
]
IgnoreProcesses = Annotated[
    bool,
    typer.Option(
        "--ignore-processes",
        help="Decide on utilization alone; compute processes do not make a GPU busy.",
    ),
]
MemoryThreshold = Annotated[
    str,
    typer.Option(
        "--memory-threshold-mib",
        metavar="MIB",
        help=(
            "With no visible process, this much used GPU memory makes the GPU unknown "
            "('off' to disable)."
        ),
    ),
]
UnknownAlert = Annotated[
    str,
    typer.Option(
        "--unknown-alert",
        metavar=DURATION,
        help="Raise an alert after readings stay unknown this long.",
    ),
]
MaxGap = Annotated[
    str | None,
    typer.Option(
        "--max-gap",
        metavar=DURATION,
        help="A longer gap between readings restarts the idle clock [default: 3 x --interval].",
    ),
]


def _raw_options(ctx: typer.Context, config: Path | None) -> dict[str, Any]:
    """Daemon option values: the command line wins, then --config, then defaults."""
    from gpuplan.monitor.config import DAEMON_DEFAULTS, load_config_file

    from_file = load_config_file(config) if config is not None else {}
    raw: dict[str, Any] = {}
    for key in DAEMON_DEFAULTS:
        param = key.replace("-", "_")
        if key in from_file and not given(ctx, (param,)):
            raw[key] = from_file[key]
        else:
            raw[key] = ctx.params.get(param)
    return raw


@watch_app.callback(invoke_without_command=True)
def watch(  # noqa: PLR0913 - one parameter per CLI option; the body only dispatches
    ctx: typer.Context,
    threshold: Threshold = "10",
    window: Window = "10m",
    interval: Interval = "15s",
    min_uptime: MinUptime = "0s",
    cooldown: Cooldown = "30m",
    ignore_processes: IgnoreProcesses = False,
    memory_threshold_mib: MemoryThreshold = "1024",
    unknown_alert: UnknownAlert = "15m",
    max_gap: MaxGap = None,
    force: Force = False,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE.jsonl",
            help="Replay recorded nvidia-smi outputs through the parser and policy; no sampling.",
            dir_okay=False,
        ),
    ] = None,
    json_out: Json = False,
    savings: Annotated[
        bool,
        typer.Option(
            "--savings",
            help="With --replay: report the hours and money the policy would have saved.",
        ),
    ] = False,
    price_per_hour: Annotated[
        str | None,
        typer.Option(
            "--price-per-hour",
            metavar="PRICE",
            help="With --savings: the machine's price per hour.",
        ),
    ] = None,
    sampler: Annotated[
        str,
        typer.Option(
            "--sampler",
            metavar="NAME",
            help="Where readings come from: smi (nvidia-smi), nvml (nvidia-ml-py) or prometheus.",
        ),
    ] = "smi",
    nvidia_smi: Annotated[
        str,
        typer.Option(
            "--nvidia-smi",
            metavar="CMD",
            help="The nvidia-smi command (split like a shell, never run by one).",
        ),
    ] = "nvidia-smi",
    sample_timeout: Annotated[
        str,
        typer.Option(
            "--sample-timeout",
            metavar=DURATION,
            help="Bound for each sample; a timeout is unknown, never idle.",
        ),
    ] = "10s",
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus", metavar="URL", help="Prometheus server for --sampler prometheus."
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            metavar="MATCHERS",
            help="Label matchers for this machine's series, e.g. 'Hostname=\"gpu-1\"'.",
        ),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            metavar="NAME",
            help=(
                "dcgm-exporter utilization metric: DCGM_FI_DEV_GPU_UTIL, "
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_PROF_SM_ACTIVE."
            ),
        ),
    ] = "DCGM_FI_DEV_GPU_UTIL",
    metric_scale: MetricScale = None,
    cpu_threshold: Annotated[
        str | None,
        typer.Option(
            "--cpu-threshold",
            metavar="PCT",
            help="Host CPU busy at or above this percent keeps the machine busy.",
        ),
    ] = None,
    heartbeat_file: Annotated[
        str | None,
        typer.Option(
            "--heartbeat-file",
            metavar="PATH",
            help="A lease file; touching it keeps the machine busy for --heartbeat-max-age.",
        ),
    ] = None,
    heartbeat_max_age: Annotated[
        str,
        typer.Option(
            "--heartbeat-max-age",
            metavar=DURATION,
            help="How long one touch of --heartbeat-file holds the machine.",
        ),
    ] = "10m",
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            metavar="CMD",
            help="Stop command, e.g. 'sudo shutdown -h now' (argv, never a shell).",
        ),
    ] = None,
    aws: Annotated[
        str | None,
        typer.Option(
            "--aws",
            metavar="MODE",
            help=(
                "AWS action: stop or terminate this instance, or scale-in (leave its Auto "
                "Scaling group, decrementing desired capacity)."
            ),
        ),
    ] = None,
    min_size: Annotated[
        str,
        typer.Option(
            "--min-size",
            metavar="N",
            help="--aws/--alibaba/--tencent scale-in: never take the group below N instances.",
        ),
    ] = "1",
    asg_name: Annotated[
        str | None,
        typer.Option(
            "--asg-name",
            metavar="NAME",
            help="--aws scale-in: refuse unless the instance is in this group.",
        ),
    ] = None,
    instance_id: Annotated[
        str | None,
        typer.Option(
            "--instance-id",
            metavar="ID",
            help="Instance id (EC2/Alibaba i-..., Tencent ins-...) [default: from instance metadata].",
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(
            "--region", metavar="REGION", help="Cloud region [default: from instance metadata]."
        ),
    ] = None,
    aws_endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--aws-endpoint-url",
            metavar="URL",
            help="AWS endpoint override (VPC endpoint, or a local moto server for tests).",
        ),
    ] = None,
    alibaba: Annotated[
        str | None,
        typer.Option(
            "--alibaba",
            metavar="MODE",
            help=(
                "Alibaba Cloud action: stop this ECS instance (StopCharging: the GPU bill stops, "
                "disks stay) or scale-in (leave its ESS scaling group)."
            ),
        ),
    ] = None,
    tencent: Annotated[
        str | None,
        typer.Option(
            "--tencent",
            metavar="MODE",
            help=(
                "Tencent Cloud action: stop this CVM instance (STOP_CHARGING) or scale-in "
                "(leave its Auto Scaling group)."
            ),
        ),
    ] = None,
    keep_charging: Annotated[
        bool,
        typer.Option(
            "--keep-charging",
            help="--alibaba/--tencent stop: keep the instance's resources and its bill.",
        ),
    ] = False,
    scaling_group: Annotated[
        str | None,
        typer.Option(
            "--scaling-group",
            metavar="GROUP_ID",
            help=(
                "--alibaba/--tencent scale-in: refuse unless the instance is in this group "
                "(required with --alibaba)."
            ),
        ),
    ] = None,
    alibaba_endpoint: Annotated[
        str | None,
        typer.Option(
            "--alibaba-endpoint",
            metavar="URL",
            help="Alibaba Cloud API endpoint override (VPC endpoint, or a local fake for tests).",
        ),
    ] = None,
    tencent_endpoint: Annotated[
        str | None,
        typer.Option(
            "--tencent-endpoint",
            metavar="URL",
            help="Tencent Cloud API endpoint override (VPC endpoint, or a local fake for tests).",
        ),
    ] = None,
    metadata_url: Annotated[
        str | None,
        typer.Option(
            "--metadata-url",
            metavar="URL",
            help="Instance-metadata base URL for --alibaba/--tencent [default: the cloud's].",
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            metavar="URL",
            help="POST the decision as JSON to this URL before the stop action.",
        ),
    ] = None,
    pre_stop: Annotated[
        str | None,
        typer.Option(
            "--pre-stop",
            metavar="CMD",
            help="Command run first (checkpoint, notify); the stop proceeds if it fails.",
        ),
    ] = None,
    pre_stop_timeout: Annotated[
        str, typer.Option("--pre-stop-timeout", metavar=DURATION, help="Time bound for --pre-stop.")
    ] = "5m",
    execute: Execute = False,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="PATH",
            help=(
                "SQLite state file [default: $STATE_DIRECTORY/watch.db, "
                "/var/lib/gpuplan/watch.db as root, else per user]."
            ),
        ),
    ] = None,
    metrics_port: Annotated[
        str | None,
        typer.Option(
            "--metrics-port",
            metavar="PORT",
            help="Serve Prometheus /metrics on this port (0..65535; 0 picks a free one).",
        ),
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option("--metrics-addr", metavar="ADDR", help="Address for --metrics-port.")
    ] = "127.0.0.1",
    record: Annotated[
        str | None,
        typer.Option(
            "--record",
            metavar="FILE.jsonl",
            help="Append every nvidia-smi sample as a --replay line.",
        ),
    ] = None,
    max_steps: MaxSteps = None,
    log_level: LogLevel = "info",
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE.yaml",
            help="YAML file of these options (keys = flag names); command-line flags win.",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Run the idle agent (default), or --replay a trace."""
    if ctx.invoked_subcommand is not None:
        extra = [n for n in ctx.params if n in _all_flags() and given(ctx, (n,))]
        if extra:
            flag = "--" + extra[0].replace("_", "-")
            raise MonitorError(
                f"{flag}: put agent options after 'gpuplan watch', not before a subcommand"
            )
        return
    if (savings or price_per_hour is not None) and replay is None:
        raise MonitorError("--savings/--price-per-hour: only valid with --replay FILE.jsonl")
    raw = _raw_options(ctx, config)
    if replay is not None:
        run_replay_cli(
            ctx,
            raw,
            replay,
            policy_keys=_POLICY_KEYS,
            json_out=json_out,
            savings=savings,
            price=price_per_hour,
        )
    else:
        _run_daemon(raw, json_out=json_out)


def _all_flags() -> set[str]:
    from gpuplan.monitor.config import DAEMON_DEFAULTS

    return {k.replace("-", "_") for k in DAEMON_DEFAULTS} | {
        "replay",
        "json_out",
        "savings",
        "price_per_hour",
        "config",
    }


def _run_daemon(raw: dict[str, Any], *, json_out: bool) -> None:
    from gpuplan.monitor.agent_setup import open_agent

    setup_logging(str(raw["log-level"]))
    stop = threading.Event()
    run = open_agent(
        raw, sleep=stop.wait, on_step=(lambda o: echo_json(o.record)) if json_out else None
    )
    run_until_signalled(stop, lambda: run.agent.run(max_steps=run.max_steps, stop=stop), run.close)


watch_app.command("status")(status)
watch_app.command("fleet")(fleet)


def register(app: typer.Typer) -> None:
    """Add the ``watch`` command group to the top-level app."""
    app.add_typer(watch_app, name="watch")
