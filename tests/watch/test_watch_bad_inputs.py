"""Every bad input to `gpuplan watch` gives one line on stderr and exit 2 (issue 10).

A table of inputs a new user gets wrong, across the agent, replay, status and
fleet modes. (YAML hardening and the framework's own usage errors belong to the
common user-file reader and are tested with it.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import line

Cli = Callable[..., Any]
PROM = ["--prometheus", "http://127.0.0.1:1", "--group", "g", "--max-steps", "1"]

AGENT = [
    ["--window", "10"],
    ["--window", "-5m"],
    ["--window", "0s"],
    ["--window", "ten minutes"],
    ["--window", "nan"],
    ["--window", "20s"],  # < 3 x the 15 s interval
    ["--interval", "15"],
    ["--interval", "0s"],
    ["--cooldown", "30"],
    ["--min-uptime", "5"],
    ["--unknown-alert", "900"],
    ["--unknown-alert", "0s"],
    ["--max-gap", "45"],
    ["--max-gap", "5s"],  # < --interval
    ["--sample-timeout", "10"],
    ["--sample-timeout", "0s"],
    ["--pre-stop", "true", "--pre-stop-timeout", "300"],
    ["--pre-stop", "true", "--pre-stop-timeout", "0s"],
    ["--heartbeat-file", "/tmp/x", "--heartbeat-max-age", "600"],
    ["--threshold", "0"],
    ["--threshold", "101"],
    ["--threshold", "ten"],
    ["--memory-threshold-mib", "-1"],
    ["--cpu-threshold", "200"],
    ["--max-steps", "0"],
    ["--max-steps", "1.5"],
    ["--metrics-port", "-1"],
    ["--log-level", "verbose"],
    ["--sampler", "dcgm"],
    ["--nvidia-smi", "'unterminated"],
    ["--command", ""],
    ["--command", "no-such-program-xyz", "--execute"],
    ["--command", "/nonexistent/stop", "--execute"],
    ["--command", "true", "--aws", "stop"],
    ["--aws", "reboot"],
    ["--execute"],
    ["--webhook", "ftp://x"],
    ["--record", "/nonexistent/dir/rec.jsonl", "--nvidia-smi", "true"],
    ["--sampler", "nvml", "--record", "r.jsonl"],
    ["--sampler", "prometheus", "--ignore-processes"],
]
FLEET = [
    ["--window", "600"],
    ["--interval", "30"],
    ["--cooldown", "600"],
    ["--warmup", "600"],
    ["--drain-hook", "true", "--drain-timeout", "300"],
    ["--scrape-interval", "15"],
    ["--scrape-interval", "0s"],
    ["--window", "1m"],  # < 3 x the 30 s interval
    ["--max-gap", "10s"],  # < --interval
    ["--scale-in-below", "0"],
    ["--scale-in-below", "150"],
    ["--min-size", "-1"],
    ["--metric", "GPU_UTIL"],
    ["--metric", "bad name"],
    ["--group-label", "bad-label"],
    ["--aws-asg", "--command", "true"],
    ["--command", "no-such-remover-xyz {instance}", "--execute"],
    ["--execute"],
    ["--webhook", "mailto:x"],
]


def one_line_error(result: Any) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", AGENT, ids=lambda a: " ".join(a))
def test_agent(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    base = ["--state", str(tmp_path / "w.db"), "--max-steps", "1", "--nvidia-smi", "true"]
    one_line_error(cli("watch", *base, *args))  # later flags win over the base ones
    assert not (tmp_path / "w.db").exists()  # refused before the state file was created


@pytest.mark.parametrize("args", FLEET, ids=lambda a: " ".join(a))
def test_fleet(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    one_line_error(cli("watch", "fleet", *PROM, "--state", str(tmp_path / "f.db"), *args))
    assert not (tmp_path / "f.db").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--window", "60"],
        ["--interval", "15"],
        ["--window", "30s"],  # < 3 x 15 s
        ["--command", "true"],  # agent flag, not a policy flag
        ["--savings"],
        ["--price-per-hour", "-1", "--savings"],
    ],
    ids=lambda a: " ".join(a),
)
def test_replay(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(line(0, [0.0])) + "\n")
    one_line_error(cli("watch", "--replay", str(trace), *args))


@pytest.mark.parametrize("content", ["window: 600\n", "interval: 15\n", "force: maybe\n"])
def test_config_file(cli: Cli, tmp_path: Path, content: str) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text(content)
    one_line_error(
        cli("watch", "--config", str(conf), "--state", str(tmp_path / "w.db"), "--max-steps", "1")
    )


def test_status(cli: Cli, tmp_path: Path) -> None:
    one_line_error(cli("watch", "status", "--state", str(tmp_path / "none.db")))
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 200)
    one_line_error(cli("watch", "status", "--state", str(junk)))
    one_line_error(cli("watch", "status", "--state", str(tmp_path)))  # a directory
