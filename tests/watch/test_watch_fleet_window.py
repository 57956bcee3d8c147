"""Fleet mode chooses by the whole window (issue 10, item 2).

The old controller removed the instance with the lowest utilization *at the
re-check poll*: an instance at 70 % all window that dipped to 0 % for one
scrape (a checkpoint save) was removed while one idle all along was kept.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from watch_helpers import serve

from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import FakeClock
from gpuplan.monitor.fleet import (
    FleetConfig,
    FleetObservation,
    FleetPolicy,
    InstanceReading,
)
from gpuplan.monitor.fleet_agent import FleetAgent
from gpuplan.monitor.fleet_journal import FleetJournal
from gpuplan.monitor.fleet_sampler import PrometheusFleetSampler
from gpuplan.monitor.prometheus import PrometheusClient, prometheus_duration_s
from gpuplan.monitor.samplers import fake_gpu

CFG = FleetConfig(
    scale_in_below_pct=30, window_s=600, interval_s=30, cooldown_s=1200, min_size=1, warmup_s=0
)


def inst(name: str, *utils: float | None, error: str | None = None, up: bool = True) -> Any:
    return InstanceReading(
        name=name,
        gpus=tuple(fake_gpu(i, u) for i, u in enumerate(utils)),
        error=error,
        in_service=up,
    )


def first_removal(policy: FleetPolicy, frames: list[tuple[float, tuple[Any, ...]]]) -> Any:
    state = policy.initial_state()
    for t, instances in frames:
        state, d = policy.step(state, FleetObservation(t_s=t, instances=instances))
        if d.action:
            return t, d.target
    return None


def test_a_dip_at_the_due_poll_does_not_pick_a_busy_instance() -> None:
    """The issue's repro: 'a' runs at 70 % and dips to 0 % for one scrape; 'z' idles all along."""
    steady = (inst("a", 70), inst("b", 10), inst("c", 10), inst("z", 0))
    dip = (inst("a", 0), inst("b", 10), inst("c", 10), inst("z", 0))
    frames = [(30.0 * k, steady) for k in range(20)] + [(600.0, dip), (630.0, dip)]
    assert first_removal(FleetPolicy(CFG), frames) == (600.0, "z")  # was "a" (0 % < ..., ties)


def test_a_candidate_must_be_idle_for_the_whole_window() -> None:
    # The group mean is under 30 % all along; 'late' runs at 40 % and idles from t=300 only.
    early = (inst("late", 40), inst("b", 20), inst("x", 25))
    later = (inst("late", 0), inst("b", 20), inst("x", 25))
    frames = [(30.0 * k, early) for k in range(10)] + [(30.0 * k, later) for k in range(10, 40)]
    # At 600 s 'late' reads 0 % but has 300 s of idle: 'b' (idle, at most 20 %) goes.
    assert first_removal(FleetPolicy(CFG), frames) == (600.0, "b")


def _cfg() -> dict[str, Any]:
    return {
        "scale_in_below_pct": 30,
        "window_s": 600,
        "interval_s": 30,
        "cooldown_s": 1200,
        "min_size": 1,
        "warmup_s": 0,
    }


def test_rank_by_window_max_then_idle_time() -> None:
    frames = [(30.0 * k, (inst("x", 3 if k == 5 else 0), inst("y", 1))) for k in range(25)]
    assert first_removal(FleetPolicy(CFG), frames) == (600.0, "y")  # x peaked at 3 %
    # Same peak: the one idle longer goes first (y was busy at first).
    frames = [(30.0 * k, (inst("x", 1), inst("y", 80 if k < 3 else 1))) for k in range(40)]
    policy = FleetPolicy(FleetConfig(**{**_cfg(), "window_s": 300}))
    state = policy.initial_state()
    for t, instances in frames:
        state, d = policy.step(state, FleetObservation(t_s=t, instances=instances))
        if d.action:
            assert d.target == "x"
            break
    else:
        pytest.fail("no removal")


def test_only_instances_in_service_count_toward_min_size() -> None:
    group = (inst("a", 0), inst("b", 0), inst("c", error="scrape failing (up=0)", up=False))
    cfg = FleetConfig(**{**_cfg(), "min_size": 2})
    assert first_removal(FleetPolicy(cfg), [(30.0 * k, group) for k in range(40)]) is None
    policy = FleetPolicy(cfg)
    state = policy.initial_state()
    state, d = policy.step(state, FleetObservation(t_s=0, instances=group))
    assert d.size == 2


class Remover:
    name = "remove"

    def __init__(self) -> None:
        self.targets: list[str] = []

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        assert ctx.target is not None
        self.targets.append(ctx.target)
        return ActionResult(action=self.name, executed=execute, ok=True, detail="removed")


def test_after_a_restart_a_removed_instance_is_never_counted(tmp_path: Path) -> None:
    group = (inst("a", 0), inst("b", 1), inst("c", 2))  # 'a' keeps reporting while it drains
    cfg = FleetConfig(**{**_cfg(), "min_size": 2, "cooldown_s": 60})
    clock = FakeClock()
    remover = Remover()
    journal = FleetJournal(tmp_path / "fleet.db", "pool")
    agent = FleetAgent(
        poll=lambda t: FleetObservation(t_s=t, instances=group),
        policy=FleetPolicy(cfg),
        plan=ActionPlan(main=remover),
        clock=clock,
        sleep=clock.sleep,
        execute=True,
        journal=journal,
    )
    agent.run(max_steps=21)
    assert remover.targets == ["a"]
    journal.close()
    clock.sleep(3600)  # restart an hour later: the cooldown is over, 'a' still scraped
    again = FleetAgent(
        poll=lambda t: FleetObservation(t_s=t, instances=group),
        policy=FleetPolicy(cfg),
        plan=ActionPlan(main=remover),
        clock=clock,
        sleep=clock.sleep,
        execute=True,
        journal=FleetJournal(tmp_path / "fleet.db", "pool"),
    )
    assert again.state.removed == {"a"}
    decisions = []
    again.on_decision = decisions.append
    again.run(max_steps=40)
    assert remover.targets == ["a"]  # b and c are the group now: min-size 2 holds
    assert {d["size"] for d in decisions} == {2}


def test_cooldown_survives_a_restart(tmp_path: Path) -> None:
    group = (inst("a", 0), inst("b", 1), inst("c", 2), inst("d", 3))
    clock = FakeClock()
    remover = Remover()

    def agent() -> FleetAgent:
        return FleetAgent(
            poll=lambda t: FleetObservation(t_s=t, instances=group),
            policy=FleetPolicy(CFG),
            plan=ActionPlan(main=remover),
            clock=clock,
            sleep=clock.sleep,
            execute=True,
            journal=FleetJournal(tmp_path / "fleet.db", "pool"),
        )

    agent().run(max_steps=21)
    assert remover.targets == ["a"]
    agent().run(max_steps=25)  # 12 more minutes: a full window, but inside the 20 min cooldown
    assert remover.targets == ["a"]


def test_target_busy_after_the_drain_hook_is_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    remover = Remover()
    busy = {"now": False}

    class Drain:
        name = "drain-hook"

        def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
            busy["now"] = True  # a job lands on the node while it drains
            return ActionResult(action=self.name, executed=execute, ok=True, detail="drained")

    def poll(t: float) -> FleetObservation:
        b = inst("b", 95 if busy["now"] else 0)
        return FleetObservation(t_s=t, instances=(inst("a", 20), b, inst("c", 25)))

    journal = FleetJournal(tmp_path / "fleet.db", "pool")
    records: list[dict[str, Any]] = []
    agent = FleetAgent(
        poll=poll,
        policy=FleetPolicy(CFG),
        plan=ActionPlan(pre_stop=Drain(), main=remover),
        clock=clock,
        sleep=clock.sleep,
        execute=True,
        journal=journal,
        on_decision=records.append,
    )
    agent.run(max_steps=21)
    assert remover.targets == []
    aborted = [r for r in records if r.get("aborted")]
    assert len(aborted) == 1 and "95% >= 30%" in aborted[0]["aborted"]["reason"]
    assert "b" not in agent.state.removed
    assert journal.removed(clock.wall()) == frozenset()


# --- freshness against a fake Prometheus HTTP API --------------------------------------


class FakeProm:
    """Answers the fleet sampler's queries from per-instance settings."""

    def __init__(self) -> None:
        self.now = time.time()
        self.nodes: dict[str, dict[str, Any]] = {}
        self.intervals: dict[str, str] = {}

    def vector(self, query: str) -> list[dict[str, Any]]:
        out = []
        for name, n in self.nodes.items():
            base = {"group": "pool", "instance": name}
            if query.startswith("up{"):
                out.append({"metric": base, "value": [self.now, str(n["up"])]})
            elif query.startswith("timestamp(up{"):
                out.append({"metric": base, "value": [self.now, str(self.now - n["age"])]})
            elif query.startswith("timestamp({"):
                out.append(
                    {
                        "metric": {**base, "UUID": "GPU-1"},
                        "value": [self.now, str(self.now - n["age"])],
                    }
                )
            elif query.startswith("{__name__"):
                out.append(
                    {"metric": {**base, "UUID": "GPU-1"}, "value": [self.now, str(n["util"])]}
                )
            elif query.startswith("group by"):
                out.append({"metric": {**base, "UUID": "GPU-1"}, "value": [self.now, "1"]})
        return out


@pytest.fixture
def prom() -> Iterator[tuple[str, FakeProm]]:
    fake = FakeProm()

    def factory(_: object) -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlparse(self.path)
                if url.path == "/api/v1/targets":
                    data: Any = {
                        "activeTargets": [
                            {"labels": {"group": "pool", "instance": n}, "scrapeInterval": i}
                            for n, i in fake.intervals.items()
                        ]
                    }
                else:
                    q = urllib.parse.parse_qs(url.query)["query"][0]
                    data = {"resultType": "vector", "result": fake.vector(q)}
                body = json.dumps({"status": "success", "data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    server, _ = serve(factory)  # type: ignore[arg-type]
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()
    server.server_close()


def test_stale_samples_are_unknown_and_not_in_service(prom: tuple[str, FakeProm]) -> None:
    url, fake = prom
    fake.nodes = {
        "fresh": {"up": 1, "age": 10, "util": 0},
        "stale": {"up": 1, "age": 95, "util": 0},  # > 2 x 30 s: Prometheus lost the target
        "down": {"up": 0, "age": 5, "util": 0},
        "nointerval": {"up": 1, "age": 5, "util": 0},
    }
    fake.intervals = {"fresh": "30s", "stale": "30s", "down": "30s"}
    sampler = PrometheusFleetSampler(PrometheusClient(url), group="pool")
    by = {i.name: i for i in sampler.poll(0.0).instances}
    assert by["fresh"].error is None and by["fresh"].in_service
    assert not by["stale"].in_service and "95s old > 2 x scrape interval 30s" in by["stale"].error
    assert not by["down"].in_service and "up=0" in by["down"].error
    assert "scrape interval unknown" in by["nointerval"].error
    fixed = PrometheusFleetSampler(PrometheusClient(url), group="pool", scrape_interval_s=60)
    by = {i.name: i for i in fixed.poll(0.0).instances}
    assert by["stale"].error is None and by["nointerval"].error is None


def test_prometheus_durations() -> None:
    assert prometheus_duration_s("15s") == 15.0
    assert prometheus_duration_s("1m30s") == 90.0
    assert prometheus_duration_s("1x") is None and prometheus_duration_s(None) is None


def test_fleet_cli_dry_run_journal_and_lock(cli: Any, tmp_path: Path, prom: Any) -> None:
    url, fake = prom
    fake.nodes = {n: {"up": 1, "age": 1, "util": u} for n, u in (("a", 0), ("b", 5), ("c", 9))}
    fake.intervals = {n: "15s" for n in fake.nodes}
    state = tmp_path / "fleet.db"
    args = ["watch", "fleet", "--prometheus", url, "--group", "pool", "--state", str(state)]
    args += ["--interval", "50ms", "--window", "150ms", "--warmup", "0s", "--cooldown", "1h"]
    args += ["--max-gap", "10s", "--max-steps", "8", "--json", "--log-level", "error"]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    records = [json.loads(x) for x in result.stdout.splitlines()]
    removals = [r for r in records if r["action"]]
    assert [r["target"] for r in removals] == ["a"] and removals[0]["results"] == []
    rows = FleetJournal(state, "pool").db.execute("SELECT instance, status FROM removals")
    assert rows.fetchall() == [("a", "dry-run")]
    from gpuplan.monitor.lock import StateLock

    with StateLock(state):
        again = cli(*args)
    assert again.exit_code == 2 and "only one agent" in again.stderr
