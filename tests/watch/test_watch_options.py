"""Option validation shared by the agent and fleet modes (issue 10, item 5).

Every duration needs a unit (a bare number is never defaulted to seconds), the
window must span at least 3 intervals unless --force, and --command's program
is checked at start-up when --execute is given.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import line

from gpuplan.errors import MonitorError
from gpuplan.monitor.config import DAEMON_DEFAULTS, duration, idle_timing, policy_config

Cli = Callable[..., Any]

DURATION_FLAGS = (
    "--window",
    "--interval",
    "--min-uptime",
    "--cooldown",
    "--unknown-alert",
    "--max-gap",
    "--sample-timeout",
    "--heartbeat-max-age",
    "--pre-stop-timeout",
)
FLEET_DURATION_FLAGS = ("--window", "--interval", "--cooldown", "--warmup", "--drain-timeout")


def one_line_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("value", ["10", "0.5", " 10 ", "1e3", 10, 2.5])
def test_bare_numbers_are_rejected(value: object) -> None:
    shown = str(value).strip()
    with pytest.raises(MonitorError, match=rf"--window: '{shown}' has no unit; a unit is required"):
        duration(value, "--window")


def test_units_still_parse() -> None:
    assert duration("10s", "--window") == 10.0
    assert duration("1.5m", "--window") == 90.0
    assert duration("250ms", "--interval") == 0.25


def test_bare_window_on_the_command_line(cli: Cli, tmp_path: Path) -> None:
    """The issue's repro: `--window 10` meant 10 seconds; now it names the flag and the fix."""
    state = str(tmp_path / "w.db")
    one_line_error(
        cli("watch", "--window", "10", "--state", state, "--max-steps", "1"),
        "--window",
        "unit is required",
        "10s",
    )
    assert not (tmp_path / "w.db").exists()  # refused before anything was opened


@pytest.mark.parametrize("flag", DURATION_FLAGS)
def test_every_agent_duration_flag_needs_a_unit(cli: Cli, tmp_path: Path, flag: str) -> None:
    args = ["watch", flag, "60", "--state", str(tmp_path / "w.db"), "--max-steps", "1"]
    args += ["--heartbeat-file", str(tmp_path / "lease")] if flag == "--heartbeat-max-age" else []
    args += ["--pre-stop", "true"] if flag == "--pre-stop-timeout" else []
    one_line_error(cli(*args), flag, "unit is required")


@pytest.mark.parametrize("flag", FLEET_DURATION_FLAGS)
def test_every_fleet_duration_flag_needs_a_unit(cli: Cli, flag: str) -> None:
    args = ["watch", "fleet", "--prometheus", "http://127.0.0.1:1", "--group", "g"]
    args += [flag, "600", "--max-steps", "1"]
    args += ["--drain-hook", "true"] if flag == "--drain-timeout" else []
    one_line_error(cli(*args), flag, "unit is required")


@pytest.mark.parametrize("key", ["window", "interval", "cooldown", "min-uptime", "max_gap"])
def test_config_file_keys_need_a_unit(cli: Cli, tmp_path: Path, key: str) -> None:
    conf = tmp_path / "watch.yaml"
    conf.write_text(f"{key}: 600\n")  # YAML reads this as the int 600
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(line(0, [0.0])) + "\n")
    flag = "--" + key.replace("_", "-")
    one_line_error(
        cli("watch", "--replay", str(trace), "--config", str(conf)), flag, "unit is required"
    )
    one_line_error(
        cli("watch", "--config", str(conf), "--state", str(tmp_path / "w.db")),
        flag,
        "unit is required",
    )


def test_window_of_fewer_than_three_intervals_needs_force(cli: Cli, tmp_path: Path) -> None:
    raw = {**DAEMON_DEFAULTS, "window": "30s", "interval": "15s"}
    with pytest.raises(MonitorError, match="shorter than 3 x --interval"):
        idle_timing(raw)
    assert policy_config({**raw, "force": True}).window_s == 30.0
    assert idle_timing({**raw, "window": "45s"}).window_s == 45.0
    state = str(tmp_path / "w.db")
    one_line_error(
        cli("watch", "--window", "20s", "--state", state, "--max-steps", "1"),
        "--window",
        "3 x --interval",
        "--force",
    )
    one_line_error(
        cli(
            "watch",
            "fleet",
            "--prometheus",
            "http://127.0.0.1:1",
            "--group",
            "g",
            "--window",
            "1m",
            "--interval",
            "30s",
            "--max-steps",
            "1",
        ),
        "--window",
        "--force",
    )
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line(t, [0.0])) + "\n" for t in range(0, 61, 15)))
    one_line_error(cli("watch", "--replay", str(trace), "--window", "30s"), "--window")
    forced = cli("watch", "--replay", str(trace), "--window", "30s", "--force", "--json")
    assert forced.exit_code == 0, forced.output
    assert [json.loads(x)["action"] for x in forced.stdout.splitlines()][2] == "stop"


def test_command_executable_is_checked_at_start_with_execute(cli: Cli, tmp_path: Path) -> None:
    state = str(tmp_path / "w.db")
    base = ["watch", "--state", state, "--max-steps", "1", "--log-level", "error"]
    one_line_error(
        cli(*base, "--command", "no-such-stopper-xyz --now", "--execute"),
        "--command",
        "no-such-stopper-xyz",
        "not found on PATH",
    )
    one_line_error(
        cli(*base, "--command", str(tmp_path / "missing.sh"), "--execute"),
        "--command",
        "not an executable file",
    )
    assert not Path(state).exists()
    fleet = ["watch", "fleet", "--prometheus", "http://127.0.0.1:1", "--group", "g"]
    one_line_error(
        cli(*fleet, "--command", "no-such-remover-xyz {instance}", "--execute", "--max-steps", "1"),
        "--command",
        "not found on PATH",
    )
    # A dry run does not need the program to exist; a real one is accepted.
    assert cli(*base, "--command", "no-such-stopper-xyz", "--nvidia-smi", "true").exit_code == 0
    ok = cli(*base, "--command", f"{sys.executable} -c pass", "--execute", "--nvidia-smi", "true")
    assert ok.exit_code == 0, ok.output
