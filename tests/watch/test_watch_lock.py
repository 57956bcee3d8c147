"""One agent per state file (issue 10, item 3).

A systemd unit plus a manual `sudo gpuplan watch` on the same --state both acted
inside one cooldown. The second agent is now refused with one line naming the
PID that holds the lock, and a killed holder (even kill -9) never blocks a restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import DATA, gpu_csv

from gpuplan.errors import MonitorError
from gpuplan.monitor.lock import StateLock, live_note, lock_path

Cli = Callable[..., Any]
SRC = Path(__file__).resolve().parents[2] / "src"


def test_second_lock_names_the_holder(tmp_path: Path) -> None:
    state = tmp_path / "sub" / "watch.db"
    with StateLock(state):
        assert lock_path(state).read_text().strip() == str(os.getpid())
        with pytest.raises(MonitorError, match=rf"pid {os.getpid()}\b.*only one agent"):
            StateLock(state).acquire()
    StateLock(state).acquire().release()  # released on exit


def start_agent(tmp_path: Path, state: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "smi.json"
    script.write_text(
        json.dumps({"gpu": gpu_csv([0.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0})
    )
    smi = f"{sys.executable} {DATA / 'fake_nvidia_smi.py'} {script}"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "gpuplan.cli.app", "watch", "--nvidia-smi", smi]
        + ["--state", str(state), "--interval", "1s", "--window", "1h", "--log-level", "error"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    lock = lock_path(state)
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_text().strip() == str(proc.pid):
            return proc
        assert proc.poll() is None, "the first agent exited"
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the first agent never took the lock")


def one_line_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


def test_two_agents_on_one_state_file(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "watch.db"
    first = start_agent(tmp_path, state)
    try:
        second = cli("watch", "--state", str(state), "--nvidia-smi", "true", "--max-steps", "1")
        one_line_error(second, "--state", f"pid {first.pid}", "only one agent")
        # watch status only reads: it is never refused by the lock.
        assert cli("watch", "status", "--state", str(state)).exit_code == 0
    finally:
        first.send_signal(signal.SIGKILL)  # no clean-up at all: the kernel drops the lock
        first.wait(timeout=30)
    again = cli(
        "watch",
        "--state",
        str(state),
        "--nvidia-smi",
        "true",
        "--max-steps",
        "1",
        "--log-level",
        "error",
    )
    assert again.exit_code == 0, again.output


def test_storage_alert_reaches_watch_status_through_the_lock_file(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "watch.db"
    ran = cli("watch", "--state", str(state), "--nvidia-smi", "true", "--max-steps", "1")
    assert ran.exit_code == 0, ran.output
    assert live_note(state) is None
    with StateLock(state) as lock:  # stands in for a running agent whose writes fail
        lock.note("state file cannot be written (OperationalError: database is locked)")
        assert live_note(state) is not None
        text = cli("watch", "status", "--state", str(state))
        assert "ALERT: state file cannot be written" in text.stdout
        as_json = json.loads(cli("watch", "status", "--state", str(state), "--json").stdout)
        assert "database is locked" in as_json["storage_alert"]
        lock.note(None)
        assert live_note(state) is None
    lock_path(state).write_text("123\nstale alert\n")
    assert live_note(state) is None  # nobody holds the lock: no agent, no alert
