"""Turn raw option values (CLI flags or a YAML config file) into watch objects.

Every value is parsed here with an error that names its flag; nothing falls
back to a default silently: an unknown config key or an unknown duration unit
(``10q``) is an error. Keys in a config file are the long flag names without
``--`` (``min-uptime: 5m``; ``min_uptime`` is accepted too).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError, UnknownNameError
from gpuplan.monitor.actions import ActionPlan, CommandAction, PreStopHook, WebhookAction
from gpuplan.monitor.clock import Clock
from gpuplan.monitor.host import CpuProbe, HeartbeatProbe, HostProbe
from gpuplan.monitor.policy import PolicyConfig
from gpuplan.monitor.samplers import RawSmi, Sampler, SmiSampler
from gpuplan.units import parse_duration_s

# Options a config file may set, with their defaults (the CLI uses the same defaults).
DAEMON_DEFAULTS: dict[str, Any] = {
    "threshold": "10",
    "window": "10m",
    "interval": "15s",
    "min-uptime": "0s",
    "cooldown": "30m",
    "ignore-processes": False,
    "memory-threshold-mib": "1024",
    "unknown-alert": "15m",
    "max-gap": None,
    "sampler": "smi",
    "nvidia-smi": "nvidia-smi",
    "sample-timeout": "10s",
    "prometheus": None,
    "selector": None,
    "metric": "DCGM_FI_DEV_GPU_UTIL",
    "metric-scale": None,
    "cpu-threshold": None,
    "heartbeat-file": None,
    "heartbeat-max-age": "10m",
    "command": None,
    "aws": None,
    "min-size": 1,
    "asg-name": None,
    "instance-id": None,
    "region": None,
    "aws-endpoint-url": None,
    "alibaba": None,
    "tencent": None,
    "keep-charging": False,
    "scaling-group": None,
    "alibaba-endpoint": None,
    "tencent-endpoint": None,
    "metadata-url": None,
    "webhook": None,
    "pre-stop": None,
    "pre-stop-timeout": "5m",
    "execute": False,
    "state": None,
    "metrics-port": None,
    "metrics-addr": "127.0.0.1",
    "record": None,
    "max-steps": None,
    "log-level": "info",
    "force": False,
}
SAMPLERS = ("smi", "nvml", "prometheus")
AWS_MODES = ("stop", "terminate", "scale-in")


_BARE_NUMBER = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")
MIN_INTERVALS_PER_WINDOW = 3


def duration(value: Any, flag: str) -> float:
    """Seconds from ``90s``/``10m``/``24h``/``7d``; the unit is required.

    A bare number (``10``, or ``10`` in a config file) is an error: it is
    never defaulted to seconds.

    >>> duration("10m", "--window")
    600.0
    """
    bare = isinstance(value, (int, float)) and not isinstance(value, bool)
    if bare or (isinstance(value, str) and _BARE_NUMBER.match(value)):
        shown = str(value).strip()
        raise MonitorError(
            f"{flag}: {shown!r} has no unit; a unit is required, e.g. {shown}s or {shown}m "
            "(ms, s, m, min, h, d, w)"
        )
    try:
        return parse_duration_s(value, field=flag)
    except ValueError as exc:
        raise MonitorError(str(exc)) from exc


def number(value: Any, flag: str, *, low: float | None = None, high: float | None = None) -> float:
    """A finite number within ``[low, high]`` (either bound optional).

    >>> number("30", "--scale-in-below", low=0, high=100)
    30.0
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        result = float(value)
    except (TypeError, ValueError):
        raise MonitorError(f"{flag}: expected a number, got {value!r}") from None
    if not math.isfinite(result):
        raise MonitorError(f"{flag}: expected a finite number, got {value!r}")
    if low is not None and result < low:
        raise MonitorError(f"{flag}: must be >= {low:g}, got {value}")
    if high is not None and result > high:
        raise MonitorError(f"{flag}: must be <= {high:g}, got {value}")
    return result


def integer(value: Any, flag: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer (``>= low`` and ``<= high``)."""
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise MonitorError(f"{flag}: expected an integer, got {value!r}")
    result = int(str(value).strip())
    if low is not None and result < low:
        raise MonitorError(f"{flag}: must be >= {low}, got {result}")
    if high is not None and result > high:
        raise MonitorError(f"{flag}: must be <= {high}, got {result}")
    return result


def port(value: Any, flag: str) -> int:
    """A TCP port number, 0..65535 (0: any free port)."""
    return integer(value, flag, low=0, high=65535)


def choice(value: Any, flag: str, allowed: tuple[str, ...]) -> str:
    """One of ``allowed`` (with a did-you-mean error otherwise)."""
    if not isinstance(value, str) or value not in allowed:
        raise UnknownNameError("value", str(value), allowed, field=flag)
    return value


def argv_of(value: Any, flag: str) -> tuple[str, ...]:
    """An argv list from a string (split like a shell, but never run by one) or a list."""
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise MonitorError(f"{flag}: cannot split {value!r}: {exc}") from exc
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        argv = list(value)
    else:
        raise MonitorError(f"{flag}: expected a command string or a list of strings, got {value!r}")
    if not argv:
        raise MonitorError(f"{flag}: empty command")
    return tuple(argv)


def boolean(value: Any, flag: str) -> bool:
    """A YAML/CLI boolean."""
    if isinstance(value, bool):
        return value
    raise MonitorError(f"{flag}: expected true or false, got {value!r}")


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML config file of daemon options; unknown keys are errors.

    Raises:
        MonitorError: unreadable or not a mapping.
        UnknownNameError: a key that is not a daemon option (with suggestions).
    """
    from gpuplan.userfile import read_yaml

    data = read_yaml(path, what="--config", error=MonitorError, mapping=False)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MonitorError(f"--config: {path} must be a mapping of option: value")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        if name not in DAEMON_DEFAULTS:
            raise UnknownNameError(
                "config key", str(key), DAEMON_DEFAULTS, field=f"--config {path}"
            )
        out[name] = value
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleTiming:
    """The idle-policy timing options shared by the single-machine and fleet modes.

    Attributes:
        window_s: ``--window``: continuous idle needed before acting.
        interval_s: ``--interval``: sampling / polling interval.
        cooldown_s: ``--cooldown``: no action this soon after the previous one.
        max_gap_s: ``--max-gap`` (``None`` = 3 x interval).
    """

    window_s: float
    interval_s: float
    cooldown_s: float
    max_gap_s: float | None


def idle_timing(raw: Mapping[str, Any]) -> IdleTiming:
    """Validate ``--window``, ``--interval``, ``--cooldown`` and ``--max-gap`` (both modes).

    Every value needs a unit; the window must hold at least
    :data:`MIN_INTERVALS_PER_WINDOW` intervals (a window of one or two samples
    is one unlucky reading away from a wrong stop) unless ``--force``.

    Raises:
        MonitorError: naming the flag.
    """
    window = duration(raw["window"], "--window")
    interval = duration(raw["interval"], "--interval")
    cooldown = duration(raw["cooldown"], "--cooldown")
    max_gap = raw.get("max-gap")
    force = boolean(raw.get("force", False), "--force")
    shortest = MIN_INTERVALS_PER_WINDOW * interval * (1 - 1e-9)  # 150ms = 3 x 50ms exactly
    if interval > 0 and window < shortest and not force:
        raise MonitorError(
            f"--window: {raw['window']} is shorter than {MIN_INTERVALS_PER_WINDOW} x --interval "
            f"{raw['interval']}, too few samples to call the machine idle",
            hint=f"use --window {MIN_INTERVALS_PER_WINDOW * interval:g}s or more, or add --force",
        )
    return IdleTiming(
        window_s=window,
        interval_s=interval,
        cooldown_s=cooldown,
        max_gap_s=None if max_gap is None else duration(max_gap, "--max-gap"),
    )


def policy_config(raw: Mapping[str, Any]) -> PolicyConfig:
    """The :class:`PolicyConfig` from raw option values (keys = flag names)."""
    memory = raw.get("memory-threshold-mib")
    timing = idle_timing(raw)
    return PolicyConfig(
        threshold_pct=number(raw["threshold"], "--threshold", low=0, high=100),
        window_s=timing.window_s,
        interval_s=timing.interval_s,
        min_uptime_s=duration(raw["min-uptime"], "--min-uptime"),
        cooldown_s=timing.cooldown_s,
        ignore_processes=boolean(raw.get("ignore-processes", False), "--ignore-processes"),
        memory_threshold_mib=(
            None
            if memory is None or str(memory).lower() == "off"
            else number(memory, "--memory-threshold-mib", low=0)
        ),
        unknown_alert_s=duration(raw.get("unknown-alert", "15m"), "--unknown-alert"),
        max_gap_s=timing.max_gap_s,
    )


def check_executable(argv: tuple[str, ...], flag: str) -> None:
    """Fail at start-up, not at stop time, when ``argv[0]`` cannot be run.

    Raises:
        MonitorError: the program is not on ``PATH`` or not an executable file.
    """
    program = argv[0]
    if "{instance}" in program:
        return  # fleet mode: known only per target
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise MonitorError(f"{flag}: {program!r} is not an executable file")
    elif shutil.which(program) is None:
        raise MonitorError(
            f"{flag}: {program!r} not found on PATH", hint="give the program's full path"
        )


def build_sampler(
    raw: Mapping[str, Any], *, on_raw: Callable[[RawSmi], None] | None = None
) -> Sampler:
    """The sampler named by ``--sampler`` with its options."""
    kind = choice(raw["sampler"], "--sampler", SAMPLERS)
    timeout = duration(raw["sample-timeout"], "--sample-timeout")
    if timeout <= 0:
        raise MonitorError("--sample-timeout: must be > 0")
    if kind == "smi":
        return SmiSampler(
            argv_of(raw["nvidia-smi"], "--nvidia-smi"), timeout_s=timeout, on_raw=on_raw
        )
    if raw.get("record"):
        raise MonitorError(
            "--record: only the nvidia-smi sampler can record replay lines (--sampler smi)"
        )
    if kind == "nvml":
        from gpuplan.monitor.nvml import NvmlSampler

        return NvmlSampler(timeout_s=timeout)
    from gpuplan.monitor.prometheus import PrometheusClient, PrometheusSampler

    if not raw.get("prometheus"):
        raise MonitorError("--prometheus: the prometheus sampler needs the server URL")
    if not boolean(raw.get("ignore-processes", False), "--ignore-processes"):
        raise MonitorError(
            "--sampler prometheus: DCGM metrics carry no process list, "
            "so every GPU would stay unknown",
            hint="add --ignore-processes to decide on utilization alone",
        )
    scale = raw.get("metric-scale")
    return PrometheusSampler(
        PrometheusClient(str(raw["prometheus"]), timeout_s=timeout),
        str(raw.get("selector") or ""),
        metric=str(raw["metric"]),
        scale=None if scale is None else number(scale, "--metric-scale", low=0),
    )


def build_probes(raw: Mapping[str, Any], clock: Clock) -> list[HostProbe]:
    """Host probes for ``--cpu-threshold`` and ``--heartbeat-file``."""
    probes: list[HostProbe] = []
    if raw.get("cpu-threshold") is not None:
        probes.append(CpuProbe(number(raw["cpu-threshold"], "--cpu-threshold", low=0, high=100)))
    if raw.get("heartbeat-file"):
        probes.append(
            HeartbeatProbe(
                Path(str(raw["heartbeat-file"])),
                duration(raw["heartbeat-max-age"], "--heartbeat-max-age"),
                clock=clock,
            )
        )
    return probes


def build_plan(raw: Mapping[str, Any], *, event: str = "idle-stop") -> ActionPlan:
    """The action plan from ``--command``/``--aws``/``--alibaba``/``--tencent``, ``--webhook``
    and ``--pre-stop``."""
    from gpuplan.monitor.cloud import cloud_action_from_raw

    given = [k for k in ("command", "aws", "alibaba", "tencent") if raw.get(k) is not None]
    if len(given) > 1:
        raise MonitorError(f"--{given[0]} and --{given[1]} both given: choose one stop action")
    main: Any = cloud_action_from_raw(raw)
    if raw.get("command") is not None:
        argv = argv_of(raw["command"], "--command")
        if boolean(raw.get("execute", False), "--execute"):
            check_executable(argv, "--command")
        main = CommandAction(argv)
    elif raw.get("aws") is not None:
        from gpuplan.monitor.aws import AsgScaleInAction, AwsStopAction

        mode = choice(raw["aws"], "--aws", AWS_MODES)
        iid, region = _opt_str(raw.get("instance-id")), _opt_str(raw.get("region"))
        endpoint = _opt_str(raw.get("aws-endpoint-url"))
        if mode == "scale-in":
            main = AsgScaleInAction(
                min_size=integer(raw.get("min-size", 1), "--min-size", low=0),
                group=_opt_str(raw.get("asg-name")),
                instance_id=iid,
                region=region,
                endpoint_url=endpoint,
            )
        else:
            main = AwsStopAction(
                "stop" if mode == "stop" else "terminate",
                instance_id=iid,
                region=region,
                endpoint_url=endpoint,
            )
    notify = WebhookAction(str(raw["webhook"]), event=event) if raw.get("webhook") else None
    pre = None
    if raw.get("pre-stop") is not None:
        pre = PreStopHook(
            argv_of(raw["pre-stop"], "--pre-stop"),
            timeout_s=duration(raw.get("pre-stop-timeout", "5m"), "--pre-stop-timeout"),
        )
    return ActionPlan(pre_stop=pre, notify=notify, main=main)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def default_state_path() -> Path:
    """The default state file.

    ``$STATE_DIRECTORY/watch.db`` under systemd (``StateDirectory=``),
    ``/var/lib/gpuplan/watch.db`` as root, else the per-user state directory.
    """
    env = os.environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":")[0]) / "watch.db"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/gpuplan/watch.db")
    from platformdirs import user_state_dir

    return Path(user_state_dir("gpuplan")) / "watch.db"
