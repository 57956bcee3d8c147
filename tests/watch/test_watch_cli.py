"""``gpuplan watch`` on the command line: help, one-line errors, replay, daemon, status."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import DATA, gpu_csv, line

Cli = Callable[..., Any]


def write_jsonl(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def one_line_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


def test_every_command_and_option_has_help() -> None:
    import typer.main

    from gpuplan.cli.watch_cmd import watch_app

    group = typer.main.get_command(watch_app)
    commands = [group, *group.commands.values()]  # type: ignore[attr-defined]
    assert {c.name for c in commands[1:]} == {"status", "fleet"}
    for command in commands:
        assert command.help, command.name
        for param in command.params:
            assert getattr(param, "help", None), f"{command.name} {param.name}"


def test_help_runs(cli: Cli) -> None:
    for args in (["watch", "--help"], ["watch", "status", "--help"], ["watch", "fleet", "--help"]):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert "--" in result.output


def test_replay_contract_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    trace = [line(t, [0.0, 0.0]) for t in range(0, 61, 15)] + [line(75, [0.0, 80.0])]
    path = write_jsonl(tmp_path / "trace.jsonl", trace)
    result = cli("watch", "--replay", str(path), "--window", "1m", "--json")
    assert result.exit_code == 0, result.output
    out = [json.loads(x) for x in result.stdout.splitlines()]
    assert out == [
        {"t": 0.0, "state": "idle", "idle_for_s": 0.0, "action": None},
        {"t": 15.0, "state": "idle", "idle_for_s": 15.0, "action": None},
        {"t": 30.0, "state": "idle", "idle_for_s": 30.0, "action": None},
        {"t": 45.0, "state": "idle", "idle_for_s": 45.0, "action": None},
        {"t": 60.0, "state": "idle", "idle_for_s": 60.0, "action": "stop"},
        {"t": 75.0, "state": "busy", "idle_for_s": 0.0, "action": None},
    ]
    table = cli("watch", "--replay", str(path), "--window", "1m")
    assert table.exit_code == 0 and "stop" in table.stdout


def test_replay_policy_flags_change_the_outcome(cli: Cli, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [line(t, [20.0]) for t in range(0, 901, 15)])
    default = [
        json.loads(x) for x in cli("watch", "--replay", str(path), "--json").stdout.splitlines()
    ]
    assert {o["state"] for o in default} == {"busy"}  # 20 % >= --threshold 10
    loose = cli(
        "watch",
        "--replay",
        str(path),
        "--json",
        "--threshold",
        "25",
        "--min-uptime",
        "12m",
        "--cooldown",
        "1h",
    )
    stops = [json.loads(x)["t"] for x in loose.stdout.splitlines() if json.loads(x)["action"]]
    assert stops == [720.0]


def test_replay_savings(cli: Cli, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [line(t, [0.0]) for t in range(0, 3601, 60)])
    result = cli(
        "watch",
        "--replay",
        str(path),
        "--interval",
        "1m",
        "--savings",
        "--price-per-hour",
        "3.5",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # Stops at 10 min and again after the 30 min cooldown; the off-periods overlap.
    assert report["stops"] == 2 and report["saved_hours"] == pytest.approx(50 / 60, abs=1e-6)
    assert report["saved_money"] == pytest.approx(3.5 * 50 / 60, abs=1e-3)
    text = cli(
        "watch", "--replay", str(path), "--interval", "1m", "--savings", "--price-per-hour", "3.5"
    )
    assert "0.83 h saved" in text.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--window", "10q"], ["--window", "10q"]),
        (["--threshold", "-5"], ["--threshold", "-5"]),
        (["--threshold", "0"], ["--threshold"]),
        (["--cooldown", "soon"], ["--cooldown"]),
        (["--interval", "0s"], ["--interval"]),
        (["--savings"], ["--price-per-hour"]),
        (["--price-per-hour", "2"], ["--price-per-hour"]),
        (["--execute"], ["--execute", "not used with --replay"]),
    ],
)
def test_bad_flags_are_one_line_errors(
    cli: Cli, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [line(0, [0.0])])
    one_line_error(cli("watch", "--replay", str(path), *args), *needles)


def test_unreadable_replay_line_is_a_one_line_error(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line(0, [0.0])) + "\n" + '{"t": 15, "gpu": \n')
    one_line_error(cli("watch", "--replay", str(path), "--json"), "replay line 2", "not JSON")
    one_line_error(
        cli("watch", "--replay", str(tmp_path / "missing.jsonl")), "--replay", "cannot read"
    )


def test_config_file_keys_and_precedence(cli: Cli, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [line(t, [0.0]) for t in range(0, 121, 15)])
    good = tmp_path / "watch.yaml"
    good.write_text("window: 1m\nmin_uptime: 0s\ncommand: sudo shutdown -h now\n")
    out = cli("watch", "--replay", str(path), "--config", str(good), "--json")
    assert [json.loads(x)["t"] for x in out.stdout.splitlines() if json.loads(x)["action"]] == [
        60.0
    ]
    wins = cli("watch", "--replay", str(path), "--config", str(good), "--window", "2m", "--json")
    assert [json.loads(x)["t"] for x in wins.stdout.splitlines() if json.loads(x)["action"]] == [
        120.0
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("windw: 1m\n")
    one_line_error(
        cli("watch", "--replay", str(path), "--config", str(bad)), "windw", "did you mean window"
    )
    unit = tmp_path / "unit.yaml"
    unit.write_text("window: 10q\n")
    one_line_error(cli("watch", "--replay", str(path), "--config", str(unit)), "--window", "10q")


def test_daemon_records_and_replay_reproduces_its_decisions(cli: Cli, tmp_path: Path) -> None:
    """Run the real daemon loop on a fake nvidia-smi, then replay what it recorded."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"gpu": gpu_csv([0.0, 0.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0})
    )
    smi = f"{sys.executable} {DATA / 'fake_nvidia_smi.py'} {script}"
    state = tmp_path / "watch.db"
    record = tmp_path / "rec.jsonl"
    # --max-gap: on a loaded CI machine one sample can take longer than 3 x --interval
    flags = ["--interval", "0.05s", "--window", "0.2s", "--cooldown", "1h", "--max-gap", "10s"]
    result = cli(
        "watch",
        "--nvidia-smi",
        smi,
        "--state",
        str(state),
        "--record",
        str(record),
        "--max-steps",
        "8",
        "--json",
        "--log-level",
        "error",
        "--command",
        f"{sys.executable} -c pass",
        *flags,
    )
    assert result.exit_code == 0, result.output
    live = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(live) == 8
    stops = [x for x in live if x["action"]]
    assert (
        len(stops) == 1 and "recheck_of" in stops[0] and stops[0]["results"][0]["executed"] is False
    )
    replayed = cli("watch", "--replay", str(record), "--json", *flags)
    assert replayed.exit_code == 0, replayed.output
    again = [json.loads(x) for x in replayed.stdout.splitlines()]
    # Every live observation (plus the re-check) was recorded; the states agree line by line.
    assert len(again) == 9
    assert {x["state"] for x in again} == {"idle"}
    assert sum(1 for x in again if x["action"]) == 1

    status = cli("watch", "status", "--state", str(state))
    assert status.exit_code == 0, status.output
    assert "idle: idle for" in status.stdout and "dry run" in status.stdout
    assert "last action: stop" in status.stdout and "would run" in status.stdout
    as_json = json.loads(cli("watch", "status", "--state", str(state), "--json").stdout)
    assert as_json["this_boot"] is True and as_json["last_action"]["status"] == "dry-run"


def test_daemon_config_errors(cli: Cli, tmp_path: Path) -> None:
    state = str(tmp_path / "w.db")
    one_line_error(
        cli("watch", "--state", state, "--execute", "--max-steps", "1"), "--execute", "no action"
    )
    one_line_error(
        cli("watch", "--state", state, "--sampler", "nvm"), "--sampler", "did you mean nvml"
    )
    one_line_error(
        cli(
            "watch",
            "--state",
            state,
            "--sampler",
            "prometheus",
            "--prometheus",
            "http://127.0.0.1:1",
        ),
        "--ignore-processes",
    )
    one_line_error(cli("watch", "--state", state, "--command", "a", "--aws", "stop"), "choose one")
    one_line_error(
        cli(
            "watch",
            "--state",
            state,
            "--aws",
            "stop",
            "--execute",
            "--region",
            "us-east-1",
            "--instance-id",
            "nope",
        ),
        "not an EC2 instance id",
    )
    one_line_error(cli("watch", "--window", "5m", "status"), "--window", "subcommand")


def test_status_without_state(cli: Cli, tmp_path: Path) -> None:
    one_line_error(cli("watch", "status", "--state", str(tmp_path / "none.db")), "no watch state")


def test_fleet_errors(cli: Cli) -> None:
    one_line_error(
        cli("watch", "fleet", "--prometheus", "ftp://x", "--group", "g", "--max-steps", "1"),
        "--prometheus",
    )
    one_line_error(
        cli(
            "watch",
            "fleet",
            "--prometheus",
            "http://127.0.0.1:1",
            "--group",
            "g",
            "--scale-in-below",
            "130",
        ),
        "--scale-in-below",
    )
    one_line_error(
        cli(
            "watch",
            "fleet",
            "--prometheus",
            "http://127.0.0.1:1",
            "--group",
            "g",
            "--metric",
            "GPU_UTIL",
        ),
        "--metric",
    )
