"""The agent loop with FakeSampler/FakeClock: re-check, storage, restart, reboot, metrics."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from watch_helpers import CountingAction, free_port

from gpuplan.monitor.actions import ActionPlan
from gpuplan.monitor.clock import FakeClock
from gpuplan.monitor.daemon import Agent
from gpuplan.monitor.metrics import WatchMetrics
from gpuplan.monitor.policy import IdlePolicy, PolicyConfig
from gpuplan.monitor.readings import State
from gpuplan.monitor.samplers import FakeSampler, busy_gpus, failed_sample, idle_gpus
from gpuplan.monitor.state import StateStore

POLICY = IdlePolicy(PolicyConfig(window_s=600, interval_s=15, cooldown_s=1800))


def make(
    tmp_path: Path, sampler: FakeSampler, clock: FakeClock, boot: str = "boot-1", **kw: object
) -> tuple[Agent, CountingAction, StateStore]:
    counter = CountingAction()
    store = StateStore(tmp_path / "watch.db")
    agent = Agent(
        sampler=sampler,
        policy=POLICY,
        plan=ActionPlan(main=counter),
        clock=clock,
        boot_id=boot,
        sleep=clock.sleep,
        store=store,
        **kw,  # type: ignore[arg-type]
    )
    return agent, counter, store


def test_agent_acts_once_after_the_window_in_dry_run(tmp_path: Path) -> None:
    clock = FakeClock()
    agent, counter, store = make(tmp_path, FakeSampler([idle_gpus(4)]), clock)
    agent.run(max_steps=60)
    assert counter.calls and all(execute is False for _, execute in counter.calls)
    assert len(counter.calls) == 1
    st = store.status()
    assert st.last_action is not None and st.last_action["status"] == "dry-run"
    assert st.last_action["t_s"] == 600.0
    assert st.last_step is not None and st.last_step["readings"][0]["utilization_pct"] == 0.0


def test_fresh_recheck_before_acting_can_cancel(tmp_path: Path) -> None:
    clock = FakeClock()
    idle = [idle_gpus(2)] * 41  # 0..600 s: due at the 41st observation
    sampler = FakeSampler([*idle, busy_gpus(2, [1])])  # the re-check sees a job starting
    agent, counter, _ = make(tmp_path, sampler, clock)
    for _ in range(40):
        agent.step()
        clock.sleep(15)
    last = agent.step()  # t = 600 s: due, and the fresh re-check finds a busy GPU
    assert last.rechecked and last.decision.state is State.BUSY and last.decision.action is None
    assert counter.calls == []
    assert sampler.calls == 42


def test_restart_resumes_and_reboot_starts_fresh(tmp_path: Path) -> None:
    clock = FakeClock()
    agent, counter, store = make(tmp_path, FakeSampler([idle_gpus(1)]), clock)
    agent.run(max_steps=20)  # 285 s idle so far
    assert counter.calls == []
    resumed, counter2, _ = make(tmp_path, FakeSampler([idle_gpus(1)]), clock)
    assert resumed.resumed and resumed.state.timer.idle_for_s == 285.0
    clock.sleep(15)
    resumed.run(max_steps=21)  # the run continues: 300 + 300 = 600 s
    assert len(counter2.calls) == 1
    # Reboot: a new boot id and a clock that starts again near zero.
    rebooted_clock = FakeClock(start_s=5.0)
    rebooted, counter3, _ = make(
        tmp_path, FakeSampler([idle_gpus(1)]), rebooted_clock, boot="boot-2"
    )
    assert not rebooted.resumed
    assert rebooted.state.last_action_s is None and rebooted.state.timer.idle_for_s == 0.0
    rebooted.run(max_steps=10)
    assert counter3.calls == []


def test_sampler_crash_is_unknown(tmp_path: Path) -> None:
    class Boom:
        def sample(self) -> object:
            raise RuntimeError("driver exploded")

    clock = FakeClock()
    agent, counter, _ = make(tmp_path, FakeSampler([idle_gpus(1)]), clock)
    agent.sampler = Boom()  # type: ignore[assignment]
    outcome = agent.step()
    assert outcome.decision.state is State.UNKNOWN and "sampler crashed" in outcome.decision.reason


def test_unknown_alert_is_stored(tmp_path: Path) -> None:
    clock = FakeClock()
    agent, _, store = make(tmp_path, FakeSampler([failed_sample("nvidia-smi timed out")]), clock)
    agent.run(max_steps=62)  # > 15 min of unknown
    st = store.status()
    assert (
        st.last_step is not None and st.last_step["alert"] and "timed out" in st.last_step["alert"]
    )


def test_metrics_endpoint(tmp_path: Path) -> None:
    clock = FakeClock()
    metrics = WatchMetrics(600)
    agent, _, _ = make(tmp_path, FakeSampler([idle_gpus(2)]), clock, metrics=metrics)
    agent.run(max_steps=5)
    port = free_port()
    server = metrics.serve(port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
    finally:
        if isinstance(server, tuple):
            server[0].shutdown()
            server[0].server_close()
    assert "gpuplan_watch_idle_seconds 60.0" in text
    assert 'gpuplan_watch_state{state="idle"} 1.0' in text
    assert (
        'gpuplan_watch_gpu_utilization_percent{uuid="GPU-00000000-0000-0000-0000-000000000000"} 0.0'
        in text
    )
    assert "gpuplan_watch_window_seconds 600.0" in text


def test_metrics_drop_unknown_gpu_utilization() -> None:
    from gpuplan.monitor.readings import GpuSample, Observation
    from gpuplan.monitor.samplers import fake_gpu

    metrics = WatchMetrics(600)
    state = POLICY.initial_state()
    for t, util in ((0.0, 5.0), (15.0, None)):
        sample = GpuSample(source="t", gpus=(fake_gpu(0, util),))
        state, decision = POLICY.step(state, Observation(t_s=t, sample=sample))
        metrics.observe(sample, decision, 0.0)
    text = metrics.render().decode()
    assert "gpuplan_watch_gpu_utilization_percent{" not in text
    assert (
        'gpuplan_watch_gpu_state{state="unknown",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.0'
        in text
    )


def test_json_records_are_serializable(tmp_path: Path) -> None:
    seen: list[str] = []
    clock = FakeClock()
    agent, _, _ = make(
        tmp_path,
        FakeSampler([idle_gpus(1)]),
        clock,
        on_step=lambda o: seen.append(json.dumps(o.record)),
    )
    agent.run(max_steps=3)
    assert len(seen) == 3 and json.loads(seen[-1])["idle_for_s"] == 30.0
