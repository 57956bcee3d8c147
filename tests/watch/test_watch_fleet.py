"""Fleet policy and agent (pure; the Prometheus path is in test_watch_prometheus.py)."""

from __future__ import annotations

from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import FakeClock
from gpuplan.monitor.fleet import (
    FleetConfig,
    FleetObservation,
    FleetPolicy,
    InstanceReading,
)
from gpuplan.monitor.fleet_agent import FleetAgent
from gpuplan.monitor.readings import State
from gpuplan.monitor.samplers import fake_gpu

CFG = FleetConfig(
    scale_in_below_pct=30, window_s=600, interval_s=30, cooldown_s=1200, min_size=1, warmup_s=0
)


def inst(name: str, *utils: float | None, error: str | None = None) -> InstanceReading:
    return InstanceReading(
        name=name, gpus=tuple(fake_gpu(i, u) for i, u in enumerate(utils)), error=error
    )


def run(
    policy: FleetPolicy, frames: list[tuple[float, tuple[InstanceReading, ...]]]
) -> list[tuple[float, str]]:
    state = policy.initial_state()
    removed = []
    for t, instances in frames:
        state, d = policy.step(state, FleetObservation(t_s=t, instances=instances))
        if d.action and d.target:
            state = policy.record_action(state, t, d.target)
            removed.append((t, d.target))
    return removed


def every(
    step: float, t0: float, t1: float, instances: tuple[InstanceReading, ...]
) -> list[tuple[float, tuple[InstanceReading, ...]]]:
    return [(t0 + k * step, instances) for k in range(int((t1 - t0) / step))]


def test_low_mean_for_the_window_removes_the_least_utilized() -> None:
    group = (inst("a", 10, 20), inst("b", 2, 0), inst("c", 50, 40))  # mean 20.3 % < 30 %
    removed = run(FleetPolicy(CFG), every(30, 0, 900, group))
    assert removed == [(600.0, "b")]


def test_high_mean_never_removes_even_with_an_idle_instance() -> None:
    group = (inst("a", 90, 95), inst("b", 0, 0), inst("c", 80, 70))
    assert run(FleetPolicy(CFG), every(30, 0, 3600, group)) == []


def test_one_removal_per_cooldown() -> None:
    group = (inst("a", 1), inst("b", 2), inst("c", 3), inst("d", 4))
    removed = run(FleetPolicy(CFG), every(30, 0, 3000, group))
    assert [t for t, _ in removed] == [600.0, 1800.0]
    assert [n for _, n in removed] == ["a", "b"]


def test_never_removes_an_instance_with_unknown_readings() -> None:
    unknown_now = (inst("a", None, 0), inst("b", 5), inst("c", 20))
    removed = run(FleetPolicy(CFG), every(30, 0, 900, unknown_now))
    assert removed == [(600.0, "b")]  # "a" looks idlest on its known GPU but is unknown
    # An instance unknown a minute ago is not eligible either, even if it reads 0 now.
    frames = every(30, 0, 570, (inst("a", 0), inst("b", 5), inst("c", 20)))
    frames += [(570.0, (inst("a", error="scrape failing (up=0)"), inst("b", 5), inst("c", 20)))]
    frames += every(30, 600, 900, (inst("a", 0), inst("b", 5), inst("c", 20)))
    removed = run(FleetPolicy(CFG), frames)
    assert removed and removed[0][1] == "b"


def test_warmup_instances_are_neither_averaged_nor_removed() -> None:
    cfg = FleetConfig(window_s=600, interval_s=30, cooldown_s=0, min_size=0, warmup_s=900)
    frames = every(30, 0, 1200, (inst("old", 50),))
    frames = [(t, (*i, inst("new", 0))) if t >= 600 else (t, i) for t, i in frames]
    policy = FleetPolicy(cfg)
    state = policy.initial_state()
    decisions = []
    for t, instances in frames:
        state, d = policy.step(state, FleetObservation(t_s=t, instances=instances))
        decisions.append(d)
    # Everything warms up at first: no known instance, so the group is unknown, never idle.
    assert all(d.state is State.UNKNOWN for d in decisions if d.t_s < 900)
    # "new" idles at 0 % from t=600, but while warming up it does not pull the mean under 30 %.
    assert all(d.state is State.BUSY for d in decisions if d.t_s >= 900)
    assert all(d.action is None for d in decisions)


def test_prometheus_failure_freezes_the_group_clock() -> None:
    policy = FleetPolicy(CFG)
    state = policy.initial_state()
    state, d = policy.step(state, FleetObservation(t_s=0, instances=(inst("a", 1), inst("b", 1))))
    state, d = policy.step(
        state, FleetObservation(t_s=30, instances=(), error="connection refused")
    )
    assert d.state is State.UNKNOWN and d.action is None and "connection refused" in d.reason


class Recording:
    def __init__(self, name: str, log: list[str], ok: bool = True) -> None:
        self.name, self.log, self.ok = name, log, ok

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        self.log.append(f"{self.name}:{ctx.target}")
        return ActionResult(action=self.name, executed=execute, ok=self.ok, detail="")


def test_agent_rechecks_drains_then_removes_and_keeps_a_failed_target() -> None:
    clock = FakeClock()
    log: list[str] = []
    group = (inst("a", 5), inst("b", 1), inst("c", 9))
    polls: list[float] = []

    def poll(t: float) -> FleetObservation:
        polls.append(t)
        return FleetObservation(
            t_s=t, instances=tuple(i for i in group if f"remove:{i.name}" not in log)
        )

    plan = ActionPlan(pre_stop=Recording("drain", log), main=Recording("remove", log, ok=False))
    agent = FleetAgent(
        poll=poll, policy=FleetPolicy(CFG), plan=plan, clock=clock, sleep=clock.sleep, execute=True
    )
    agent.run(max_steps=21)  # 0..600 s
    assert log == ["drain:b", "remove:b"]
    assert len(polls) == 23  # the due poll was re-checked, and the target again after the drain
    assert "b" not in agent.state.removed  # removal failed: still counted in the group
