"""``gpuplan watch``: the GPU idle agent, its replay mode, status and fleet mode.

Thin layer over :mod:`gpuplan.monitor`: options are parsed by
:mod:`gpuplan.monitor.config` (errors name the flag and become one line,
exit 2); everything is a dry run unless ``--execute``.

Size note: this module is over the 500-line soft limit because each of the
~60 options carries its own help text; the logic lives in ``gpuplan.monitor``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

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

DURATION = "DURATION"
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
)

Threshold = Annotated[
    str,
    typer.Option(
        "--threshold",
        metavar="PCT",
        help="A GPU is busy at or above this utilization.gpu percent (0 < PCT <= 100).",
    ),
]
Window = Annotated[
    str,
    typer.Option(
        "--window", metavar=DURATION, help="Continuous idle needed before acting (90s, 10m, 2h)."
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


def _echo_json(obj: Any, out: TextIO | None = None) -> None:
    stream = out or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def _setup_logging(level: str) -> None:
    from gpuplan.monitor.config import choice

    name = choice(level, "--log-level", ("debug", "info", "warning", "error"))
    logging.basicConfig(
        level=getattr(logging, name.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM/SIGINT set ``stop`` (a clean exit after the current step)."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _raw_options(ctx: typer.Context, config: Path | None) -> dict[str, Any]:
    """Daemon option values: the command line wins, then --config, then defaults."""
    from gpuplan.monitor.config import DAEMON_DEFAULTS, load_config_file

    from_file = load_config_file(config) if config is not None else {}
    raw: dict[str, Any] = {}
    for key in DAEMON_DEFAULTS:
        param = key.replace("-", "_")
        if key in from_file and not _given(ctx, (param,)):
            raw[key] = from_file[key]
        else:
            raw[key] = ctx.params.get(param)
    return raw


def _given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The names among ``names`` whose value came from the command line (or env)."""
    out = []
    for name in names:
        source = ctx.get_parameter_source(name.replace("-", "_"))
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            out.append(name)
    return out


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
    metric_scale: Annotated[
        str | None,
        typer.Option(
            "--metric-scale",
            metavar="X",
            help="Percent per unit for a metric not in the known list.",
        ),
    ] = None,
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
            "--metrics-port", metavar="PORT", help="Serve Prometheus /metrics on this port."
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
        extra = [n for n in ctx.params if n in _all_flags() and _given(ctx, (n,))]
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
        _run_replay(ctx, raw, replay, json_out=json_out, savings=savings, price=price_per_hour)
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


def _run_replay(
    ctx: typer.Context,
    raw: dict[str, Any],
    path: Path,
    *,
    json_out: bool,
    savings: bool,
    price: str | None,
) -> None:
    from gpuplan.monitor.config import DAEMON_DEFAULTS, number, policy_config
    from gpuplan.monitor.policy import IdlePolicy
    from gpuplan.monitor.replay import (
        cadence_warning,
        compute_savings,
        contract_record,
        load_replay,
        run_replay,
    )

    agent_only = [k for k in _given(ctx, tuple(DAEMON_DEFAULTS)) if k not in _POLICY_KEYS]
    if agent_only:
        raise MonitorError(
            f"--{agent_only[0]}: not used with --replay "
            f"(only policy flags are: {', '.join(_POLICY_KEYS)})"
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
            _echo_json({k: getattr(report, k) for k in report.__dataclass_fields__})
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
            _echo_json(contract_record(decision))
        else:
            act = decision.action or "-"
            typer.echo(
                f"line {line.line_no:>5}  t={decision.t_s:>10.1f}  {decision.state.value:<7}  "
                f"idle_for={decision.idle_for_s:>8.1f}s  {act:<4}  {decision.reason}"
            )


def _run_daemon(raw: dict[str, Any], *, json_out: bool) -> None:
    from gpuplan.monitor.clock import SystemClock, read_boot_id
    from gpuplan.monitor.config import (
        boolean,
        build_plan,
        build_probes,
        build_sampler,
        default_state_path,
        integer,
        policy_config,
    )
    from gpuplan.monitor.daemon import Agent, StepOutcome
    from gpuplan.monitor.policy import IdlePolicy
    from gpuplan.monitor.readings import Observation
    from gpuplan.monitor.samplers import SmiSampler
    from gpuplan.monitor.state import StateStore

    _setup_logging(str(raw["log-level"]))
    execute = boolean(raw["execute"], "--execute")
    clock = SystemClock()
    policy = IdlePolicy(policy_config(raw))
    sampler = build_sampler(raw)
    probes = build_probes(raw, clock)
    plan = build_plan(raw)
    if execute and plan.main is None and plan.notify is None:
        raise MonitorError(
            "--execute: no action configured",
            hint="add --command, --aws, --alibaba, --tencent or --webhook",
        )
    main = plan.main
    if execute and main is not None and hasattr(main, "resolve"):
        main.resolve()  # fail now, not at stop time, when instance metadata is unreachable
    max_steps = (
        None if raw.get("max-steps") is None else integer(raw["max-steps"], "--max-steps", low=1)
    )
    store = StateStore(Path(str(raw["state"])) if raw.get("state") else default_state_path())
    metrics = None
    if raw.get("metrics-port") is not None:
        from gpuplan.monitor.metrics import WatchMetrics

        metrics = WatchMetrics(policy.config.window_s)
        metrics.serve(
            integer(raw["metrics-port"], "--metrics-port", low=0), str(raw["metrics-addr"])
        )
    record_fh = None
    if raw.get("record"):
        try:
            record_fh = Path(str(raw["record"])).open("a", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise MonitorError(f"--record: cannot open {raw['record']}: {exc}") from exc

    def on_observation(obs: Observation) -> None:
        if (
            record_fh is not None
            and isinstance(sampler, SmiSampler)
            and sampler.last_raw is not None
        ):
            r = sampler.last_raw
            line = {
                "t": obs.t_s,
                "gpu": r.gpu,
                "gpu_exit": r.gpu_exit,
                "apps": r.apps,
                "apps_exit": r.apps_exit,
            }
            record_fh.write(json.dumps(line) + "\n")
            record_fh.flush()

    def on_step(outcome: StepOutcome) -> None:
        if json_out:
            _echo_json(outcome.record)

    stop = threading.Event()
    previous = _stop_on_signals(stop)
    settings = {k: v for k, v in raw.items() if k not in ("webhook",)}
    agent = Agent(
        sampler=sampler,
        policy=policy,
        plan=plan,
        clock=clock,
        boot_id=read_boot_id(),
        sleep=stop.wait,
        host_probes=probes,
        store=store,
        metrics=metrics,
        execute=execute,
        settings=settings,
        on_observation=on_observation,
        on_step=on_step,
    )
    try:
        agent.run(max_steps=max_steps, stop=stop)
    finally:
        _restore_signals(previous)
        store.close()
        if record_fh is not None:
            record_fh.close()


@watch_app.command("status")
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
        _echo_json(info)
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


@watch_app.command("fleet")
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
    metric_scale: Annotated[
        str | None,
        typer.Option(
            "--metric-scale",
            metavar="X",
            help="Percent per unit for a metric not in the known list.",
        ),
    ] = None,
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
    execute: Execute = False,
    max_steps: MaxSteps = None,
    json_out: Json = False,
    log_level: LogLevel = "info",
) -> None:
    """Scale a GPU group in by one idle instance at a time (dcgm-exporter data in Prometheus)."""
    from gpuplan.monitor.actions import ActionPlan, CommandAction, PreStopHook, WebhookAction
    from gpuplan.monitor.clock import SystemClock
    from gpuplan.monitor.config import argv_of, duration, integer, number
    from gpuplan.monitor.fleet import FleetAgent, FleetConfig, FleetPolicy, PrometheusFleetSampler
    from gpuplan.monitor.prometheus import PrometheusClient

    _setup_logging(log_level)
    cfg = FleetConfig(
        scale_in_below_pct=number(scale_in_below, "--scale-in-below", low=0, high=100),
        window_s=duration(window, "--window"),
        interval_s=duration(interval, "--interval"),
        cooldown_s=duration(cooldown, "--cooldown"),
        min_size=integer(min_size, "--min-size", low=0),
        warmup_s=duration(warmup, "--warmup"),
    )
    if aws_asg and command:
        raise MonitorError("--aws-asg and --command both given: choose one removal action")
    from gpuplan.monitor.cloud import fleet_cloud_action

    main: Any = fleet_cloud_action(
        alibaba_ess=alibaba_ess,
        tencent_asg=tencent_asg,
        min_size=cfg.min_size,
        region=region,
        alibaba_endpoint=alibaba_endpoint,
        tencent_endpoint=tencent_endpoint,
        other="--aws-asg" if aws_asg else "--command" if command else None,
    )
    if aws_asg:
        from gpuplan.monitor.aws import AsgScaleInAction

        main = AsgScaleInAction(
            min_size=cfg.min_size, group=group, region=region, endpoint_url=aws_endpoint_url
        )
    elif command:
        main = CommandAction(argv_of(command, "--command"))
    if execute and main is None and webhook is None:
        raise MonitorError(
            "--execute: no removal action configured",
            hint="add --aws-asg, --alibaba-ess, --tencent-asg, --command or --webhook",
        )
    plan = ActionPlan(
        pre_stop=PreStopHook(
            argv_of(drain_hook, "--drain-hook"),
            timeout_s=duration(drain_timeout, "--drain-timeout"),
            name="drain-hook",
        )
        if drain_hook
        else None,
        notify=WebhookAction(webhook, event="scale-in") if webhook else None,
        main=main,
    )
    sampler = PrometheusFleetSampler(
        PrometheusClient(prometheus),
        group=group,
        group_label=group_label,
        instance_label=instance_label,
        metric=metric,
        scale=None if metric_scale is None else number(metric_scale, "--metric-scale", low=0),
    )
    stop = threading.Event()
    previous = _stop_on_signals(stop)
    agent = FleetAgent(
        poll=sampler.poll,
        policy=FleetPolicy(cfg),
        plan=plan,
        clock=SystemClock(),
        sleep=stop.wait,
        execute=execute,
        on_decision=_echo_json if json_out else None,
    )
    steps = None if max_steps is None else integer(max_steps, "--max-steps", low=1)
    try:
        agent.run(max_steps=steps, stop=stop)
    finally:
        _restore_signals(previous)


def register(app: typer.Typer) -> None:
    """Add the ``watch`` command group to the top-level app."""
    app.add_typer(watch_app, name="watch")
