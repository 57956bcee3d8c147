"""Issue 6, "Must never happen": one test per item (AWS items run against moto)."""

from __future__ import annotations

from pathlib import Path

import pytest
from watch_helpers import (
    DATA,
    CountingAction,
    desired,
    drive,
    gpu_csv,
    launch,
    make_group,
    series,
    state_of,
    uuid,
)

from gpuplan.errors import MonitorError, UnknownNameError
from gpuplan.monitor.actions import ActionContext, ActionPlan
from gpuplan.monitor.clock import FakeClock
from gpuplan.monitor.config import DAEMON_DEFAULTS, load_config_file, policy_config
from gpuplan.monitor.daemon import Agent
from gpuplan.monitor.fleet import FleetConfig, FleetObservation, FleetPolicy, InstanceReading
from gpuplan.monitor.policy import IdlePolicy, PolicyConfig
from gpuplan.monitor.readings import GpuSample, Observation
from gpuplan.monitor.samplers import FakeSampler, fake_gpu, idle_gpus
from gpuplan.monitor.smi_parse import parse_smi
from gpuplan.monitor.state import StateStore

WINDOW = 600.0
POLICY = IdlePolicy(PolicyConfig(window_s=WINDOW, interval_s=15, cooldown_s=1800))


def stops(decisions: list) -> list[float]:  # type: ignore[type-arg]
    return [d.t_s for d in decisions if d.action]


def test_never_stop_while_any_gpu_busy_no_averaging() -> None:
    for busy_index in range(8):
        utils = [0.0] * 8
        utils[busy_index] = 11.0  # just above --threshold 10; the mean is 1.4 %
        sample = parse_smi(gpu_csv(utils), 0, "", 0)
        assert stops(drive(POLICY, series(0, 7200, 15, sample))) == []


def test_never_stop_while_a_compute_process_exists() -> None:
    apps = f"{uuid(5)}, 31337, 120\n"
    sample = parse_smi(gpu_csv([0.0] * 8), 0, apps, 0)
    decisions = drive(POLICY, series(0, 7200, 15, sample))
    assert stops(decisions) == []
    assert "pid 31337" in decisions[0].reason


FAILURES = {
    "na": (gpu_csv(["[N/A]", 0.0]), 0, "", 0),
    "not-supported": (gpu_csv(["[Not Supported]", 0.0]), 0, "", 0),
    "unknown-error-token": (gpu_csv([0.0, "[Unknown Error]"]), 0, "", 0),
    "bare-na": (gpu_csv(["N/A", 0.0]), 0, "", 0),
    "blank": (gpu_csv(["", 0.0]), 0, "", 0),
    "timeout": (None, -1, None, -1),
    "apps-timeout": (gpu_csv([0.0, 0.0]), 0, None, -1),
    "apps-error": (gpu_csv([0.0, 0.0]), 0, "Failed to initialize NVML: Unknown Error\n", 255),
    "exit-code": (gpu_csv([0.0, 0.0]), 2, "", 0),
    "driver-gone": (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        9,
        "",
        0,
    ),
    "gpu-lost": ((DATA / "err_gpu_lost_wrapped.txt").read_text(), 15, "", 0),
    "version-mismatch": ("Failed to initialize NVML: Driver/library version mismatch\n", 18, "", 0),
    "garbage": ("\x00\x01 segfault\n", 0, "", 0),
    "empty": ("", 0, "", 0),
    "truncated-row": ("0, " + uuid(0) + ", 0\n", 0, "", 0),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_never_stop_because_data_is_missing_or_unparseable(kind: str) -> None:
    sample = parse_smi(*FAILURES[kind])
    decisions = drive(POLICY, series(0, 7200, 15, sample))
    assert stops(decisions) == []
    assert {d.state.value for d in decisions} == {"unknown"}


def test_never_stop_on_a_sample_count() -> None:
    # 2,000 idle samples in 200 s: many samples, but far less than the 600 s window.
    decisions = drive(POLICY, series(0, 200, 0.1, idle_gpus(1)))
    assert len(decisions) >= 2000 and stops(decisions) == []
    # Sparse samples inside the allowed gap still count elapsed time, not samples.
    sparse = drive(
        IdlePolicy(PolicyConfig(window_s=WINDOW, interval_s=300)),
        series(0, 1000, 300, idle_gpus(1)),
    )
    assert stops(sparse) == [600.0]


def test_never_stop_during_min_uptime() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=WINDOW, min_uptime_s=3600))
    assert stops(drive(policy, series(0, 3599, 15, idle_gpus(1)))) == []
    assert stops(drive(policy, series(0, 3700, 15, idle_gpus(1))))[0] == 3600.0


def test_never_stop_during_cooldown() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=WINDOW, cooldown_s=7200))
    got = stops(drive(policy, series(0, 4 * 3600, 15, idle_gpus(1))))
    assert got[0] == 600.0
    assert all(b - a >= 7200 for a, b in zip(got, got[1:], strict=False))


def test_never_two_actions_where_one_was_due(tmp_path: Path) -> None:
    clock = FakeClock()
    counter = CountingAction()
    store = StateStore(tmp_path / "watch.db")

    def agent() -> Agent:
        return Agent(
            sampler=FakeSampler([idle_gpus(2)]),
            policy=POLICY,
            plan=ActionPlan(main=counter),
            clock=clock,
            boot_id="boot-1",
            sleep=clock.sleep,
            store=store,
            execute=True,
        )

    first = agent()
    first.run(max_steps=int(700 / 15))
    assert len(counter.calls) == 1
    # The agent restarts right after acting (crash, systemd restart): same boot, same state.
    second = agent()
    assert second.resumed
    second.run(max_steps=int(1500 / 15))  # still inside the 30 min cooldown
    assert len(counter.calls) == 1


def test_never_below_the_group_min_size_fleet() -> None:
    policy = FleetPolicy(
        FleetConfig(window_s=60, interval_s=15, cooldown_s=0, min_size=2, warmup_s=0)
    )
    state = policy.initial_state()
    removed = []
    for step in range(200):
        t = step * 15.0
        instances = tuple(
            InstanceReading(name=n, gpus=(fake_gpu(0, 1.0),))
            for n in ("a", "b", "c", "d")
            if n not in removed
        )
        state, decision = policy.step(state, FleetObservation(t_s=t, instances=instances))
        if decision.action:
            assert decision.target is not None
            state = policy.record_action(state, t, decision.target)
            removed.append(decision.target)
    assert len(removed) == 2  # 4 -> 2, never 1
    assert "below --min-size 2" in decision.reason


def test_never_below_min_size_aws(aws: str) -> None:
    from gpuplan.monitor.aws import AsgScaleInAction

    members = make_group(aws, desired=1)
    result = AsgScaleInAction(
        min_size=1, instance_id=members[0], region="us-east-1", endpoint_url=aws
    ).run(ActionContext(reason="idle"), execute=True)
    assert not result.ok and desired(aws) == 1


def test_never_terminate_where_stop_was_configured(aws: str) -> None:
    from gpuplan.monitor.config import build_plan

    iid = launch(aws)
    plan = build_plan(
        {"aws": "stop", "instance-id": iid, "region": "us-east-1", "aws-endpoint-url": aws}
    )
    plan.run(ActionContext(reason="idle"), execute=True)
    assert state_of(aws, iid) == "stopped"


def test_never_silently_default_an_unknown_config_key_or_unit(tmp_path: Path) -> None:
    bad_key = tmp_path / "watch.yaml"
    bad_key.write_text("window: 10m\nthresold: 5\n")
    with pytest.raises(
        UnknownNameError, match="unknown config key 'thresold'; did you mean threshold"
    ):
        load_config_file(bad_key)
    raw = dict(DAEMON_DEFAULTS)
    for key, value, flag in (
        ("window", "10q", "--window"),
        ("cooldown", "5 minutes", "--cooldown"),
        ("threshold", "ten", "--threshold"),
        ("min-uptime", "-5m", "--min-uptime"),
    ):
        with pytest.raises(MonitorError, match=flag):
            policy_config({**raw, key: value})


def test_lost_gpu_is_not_forgotten() -> None:
    """Not in the issue's list, but the same rule: a GPU that vanishes is not 'one fewer GPU'."""
    eight = parse_smi((DATA / "gpu_8x_idle.csv").read_text(), 0, "", 0)
    seven = GpuSample(source="t", gpus=eight.gpus[1:])
    decisions = drive(POLICY, [Observation(t_s=0, sample=eight)] + series(15, 7200, 15, seven))
    assert stops(decisions) == []
