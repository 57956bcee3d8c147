"""Storage faults never end the watch (issue 10, item 4).

A locked database (> 10 s), a full disk, a read-only file system or a corrupt
policy row used to end the agent with a traceback. Now it keeps sampling in
memory, raises an alert (log, /metrics, watch status), retries the write, and
never acts while the write-ahead record cannot be written.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import DATA, CountingAction, gpu_csv

from gpuplan.monitor.actions import ActionPlan
from gpuplan.monitor.clock import FakeClock
from gpuplan.monitor.daemon import Agent
from gpuplan.monitor.metrics import WatchMetrics
from gpuplan.monitor.policy import IdlePolicy, PolicyConfig
from gpuplan.monitor.samplers import FakeSampler, idle_gpus
from gpuplan.monitor.state import StateStore

Cli = Callable[..., Any]
POLICY = IdlePolicy(PolicyConfig(window_s=60, interval_s=15, cooldown_s=1800))


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another program holds an exclusive write lock on the database."""
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        other.execute("COMMIT")
        other.close()


def make(
    store: StateStore, clock: FakeClock, **kw: Any
) -> tuple[Agent, CountingAction, list[str | None]]:
    counter = CountingAction()
    notes: list[str | None] = []
    agent = Agent(
        sampler=FakeSampler([idle_gpus(2)]),
        policy=POLICY,
        plan=ActionPlan(main=counter),
        clock=clock,
        boot_id="b",
        sleep=clock.sleep,
        store=store,
        execute=True,
        on_storage_alert=notes.append,
        **kw,
    )
    return agent, counter, notes


def steps(agent: Agent, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        agent.step()
        clock.sleep(15)


def test_locked_database_keeps_sampling_and_holds_the_action(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    store = StateStore(path, timeout_s=0.05)
    clock = FakeClock()
    metrics = WatchMetrics(60)
    agent, counter, notes = make(store, clock, metrics=metrics)
    steps(agent, clock, 2)
    with locked(path):
        steps(agent, clock, 8)  # due from t = 60 s, but no write-ahead record can be written
        assert counter.calls == []
        assert agent.storage_alert is not None and "locked" in agent.storage_alert
        assert notes and notes[-1] == agent.storage_alert
        assert "gpuplan_watch_storage_alert 1.0" in metrics.render().decode()
        last = agent.step()
        assert last.record["storage_alert"] and last.aborted and "write-ahead" in last.aborted
        assert last.record["action"] is None
        clock.sleep(15)
    outcome = agent.step()  # writable again: buffered steps are written, then the stop runs
    assert len(counter.calls) == 1 and outcome.aborted is None
    assert agent.storage_alert is None and notes[-1] is None
    assert "gpuplan_watch_storage_alert 0.0" in metrics.render().decode()
    rows = store.db.execute("SELECT count(*) FROM steps").fetchone()[0]
    assert rows >= 12  # nothing observed while locked was lost
    st = store.status()
    assert st.last_action is not None and st.last_action["status"] == "done"


class FlakyStore(StateStore):
    """A store whose writes fail like a full disk while ``failing`` names them."""

    failing: set[str]

    def write_steps(self, *args: Any, **kw: Any) -> None:
        if "steps" in self.failing:
            raise sqlite3.OperationalError("database or disk is full")
        super().write_steps(*args, **kw)

    def begin_action(self, *args: Any, **kw: Any) -> int:
        if "action" in self.failing:
            raise OSError(30, "Read-only file system")
        return super().begin_action(*args, **kw)


def test_full_disk_and_read_only_never_end_the_watch(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "w.db")
    store.failing = {"steps"}
    clock = FakeClock()
    agent, counter, _ = make(store, clock)
    steps(agent, clock, 10)  # disk full from the start: no crash, no action
    assert counter.calls == [] and "disk is full" in (agent.storage_alert or "")
    store.failing = {"action"}  # steps can be written again, the action row cannot
    steps(agent, clock, 3)
    assert counter.calls == [] and "Read-only" in (agent.storage_alert or "")
    store.failing = set()
    steps(agent, clock, 1)
    assert len(counter.calls) == 1 and agent.storage_alert is None


@pytest.mark.parametrize(
    "garbage", ["not json", '{"timer": 5}', '{"timer": {}, "last_action_s": "x"}', "[]"]
)
def test_undecodable_stored_state_is_no_state(
    tmp_path: Path, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "w.db"
    clock = FakeClock()
    agent, _, _ = make(StateStore(path), clock)
    steps(agent, clock, 3)
    agent.store.db.execute("UPDATE policy SET state = ?", (garbage,))  # type: ignore[union-attr]
    agent.store.db.execute("UPDATE steps SET record = ?", (garbage,))  # type: ignore[union-attr]
    with caplog.at_level(logging.WARNING, logger="gpuplan.watch"):
        again, _, _ = make(StateStore(path), clock)
    assert not again.resumed and again.state.timer.idle_for_s == 0.0
    assert "stored policy state ignored" in caplog.text
    st = again.store.status()  # type: ignore[union-attr]
    assert st.state is None and st.last_step is None


def test_status_reads_without_creating_files(cli: Cli, tmp_path: Path) -> None:
    script = tmp_path / "smi.json"
    script.write_text(
        json.dumps({"gpu": gpu_csv([0.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0})
    )
    smi = f"{sys.executable} {DATA / 'fake_nvidia_smi.py'} {script}"
    state = tmp_path / "db" / "w.db"
    run = cli(
        "watch",
        "--nvidia-smi",
        smi,
        "--state",
        str(state),
        "--max-steps",
        "2",
        "--interval",
        "10ms",
        "--window",
        "1s",
        "--log-level",
        "error",
    )
    assert run.exit_code == 0, run.output
    before = sorted(p.name for p in state.parent.iterdir())
    assert cli("watch", "status", "--state", str(state)).exit_code == 0
    assert cli("watch", "status", "--state", str(state), "--json").exit_code == 0
    assert sorted(p.name for p in state.parent.iterdir()) == before
    # Corrupt rows are shown as missing, never a traceback.
    db = sqlite3.connect(str(state), isolation_level=None)
    db.execute("UPDATE policy SET state = 'x', config = 'y'")
    db.execute("UPDATE steps SET record = 'z'")
    db.close()
    after = cli("watch", "status", "--state", str(state))
    assert after.exit_code == 0 and "no observation recorded" in after.stdout
    bad = tmp_path / "not.db"
    bad.write_bytes(b"\x00garbage" * 100)
    result = cli("watch", "status", "--state", str(bad))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("not")) == ["not.db"]


def test_cli_agent_survives_a_locked_database(cli: Cli, tmp_path: Path) -> None:
    script = tmp_path / "smi.json"
    script.write_text(
        json.dumps({"gpu": gpu_csv([0.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0})
    )
    smi = f"{sys.executable} {DATA / 'fake_nvidia_smi.py'} {script}"
    state = tmp_path / "w.db"
    common = ["watch", "--nvidia-smi", smi, "--state", str(state), "--json"]
    common += ["--interval", "0.3s", "--window", "1s", "--log-level", "error"]
    assert cli(*common, "--max-steps", "1").exit_code == 0  # creates the database
    with locked(state):
        result = cli(*common, "--max-steps", "3")
    assert result.exit_code == 0, result.output
    records = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(records) == 3 and all("locked" in r["storage_alert"] for r in records)
