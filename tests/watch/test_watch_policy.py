"""The idle policy: timer rules and the scenarios from issue 6."""

from __future__ import annotations

import pytest
from watch_helpers import DATA, drive, gpu_csv, series, uuid

from gpuplan.errors import MonitorError
from gpuplan.monitor.policy import IdlePolicy, PolicyConfig
from gpuplan.monitor.readings import GpuSample, HostSignal, Observation, State
from gpuplan.monitor.samplers import busy_gpus, failed_sample, fake_gpu, idle_gpus
from gpuplan.monitor.smi_parse import parse_smi

MIN = 60.0


def smi(utils: list[float | str], apps: str = "", mem: list[float] | None = None) -> GpuSample:
    return parse_smi(gpu_csv(utils, mem), 0, apps, 0)


def stops(decisions: list) -> list[float]:  # type: ignore[type-arg]
    return [d.t_s for d in decisions if d.action == "stop"]


def test_idle_timer_counts_elapsed_time_and_stops_once_at_the_window() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=10 * MIN, interval_s=15, cooldown_s=3600))
    decisions = drive(policy, series(0, 20 * MIN, 15, idle_gpus(2)))
    assert decisions[0].idle_for_s == 0.0  # one reading alone is no evidence of duration
    assert stops(decisions) == [600.0]
    stop = next(d for d in decisions if d.action)
    assert stop.idle_for_s == 600.0 and "stop due" in stop.reason


def test_busy_resets_unknown_freezes() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=10 * MIN, interval_s=15))
    obs = [
        Observation(t_s=0, sample=idle_gpus(1)),
        Observation(t_s=15, sample=idle_gpus(1)),
        Observation(t_s=30, sample=failed_sample("timed out")),
        Observation(t_s=45, sample=failed_sample("timed out")),
        Observation(t_s=60, sample=idle_gpus(1)),
        Observation(t_s=75, sample=busy_gpus(1, [0])),
        Observation(t_s=90, sample=idle_gpus(1)),
    ]
    got = [(d.state, d.idle_for_s) for d in drive(policy, obs)]
    assert got == [
        (State.IDLE, 0.0),
        (State.IDLE, 15.0),
        (State.UNKNOWN, 15.0),  # frozen
        (State.UNKNOWN, 15.0),
        (State.IDLE, 0.0),  # a new run: the unknown stretch is no evidence
        (State.BUSY, 0.0),  # reset
        (State.IDLE, 0.0),
    ]


def test_gap_longer_than_max_gap_restarts_the_run() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=10 * MIN, interval_s=15))
    obs = [Observation(t_s=0, sample=idle_gpus(1)), Observation(t_s=700, sample=idle_gpus(1))]
    decisions = drive(policy, obs)
    assert decisions[1].idle_for_s == 0.0 and decisions[1].action is None
    assert "gap of 700s" in decisions[1].reason


def test_time_going_backwards_is_an_error() -> None:
    policy = IdlePolicy(PolicyConfig())
    state, _ = policy.step(policy.initial_state(), Observation(t_s=10, sample=idle_gpus(1)))
    with pytest.raises(MonitorError, match="backwards"):
        policy.step(state, Observation(t_s=5, sample=idle_gpus(1)))


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"threshold_pct": -5}, "--threshold"),
        ({"threshold_pct": 0}, "--threshold"),
        ({"threshold_pct": 101}, "--threshold"),
        ({"window_s": 0}, "--window"),
        ({"interval_s": float("nan")}, "--interval"),
        ({"cooldown_s": -1}, "--cooldown"),
        ({"min_uptime_s": -1}, "--min-uptime"),
        ({"max_gap_s": 1, "interval_s": 15}, "--max-gap"),
    ],
)
def test_config_errors_name_the_flag(kwargs: dict[str, float], flag: str) -> None:
    with pytest.raises(MonitorError, match=flag):
        PolicyConfig(**kwargs)


def test_host_signals_busy_and_unknown() -> None:
    policy = IdlePolicy(PolicyConfig(window_s=60, interval_s=15))
    cpu_busy = HostSignal(name="cpu", state=State.BUSY, detail="cpu 90% >= 50%")
    hb_unknown = HostSignal(name="heartbeat", state=State.UNKNOWN, detail="cannot stat")
    _, d1 = policy.step(
        policy.initial_state(), Observation(t_s=0, sample=idle_gpus(1), host=(cpu_busy,))
    )
    _, d2 = policy.step(
        policy.initial_state(), Observation(t_s=0, sample=idle_gpus(1), host=(hb_unknown,))
    )
    assert d1.state is State.BUSY and "cpu 90%" in d1.reason
    assert d2.state is State.UNKNOWN


def test_memory_without_visible_process_is_unknown() -> None:
    policy = IdlePolicy(PolicyConfig())
    sample = smi([0.0], mem=[30000])
    _, d = policy.step(policy.initial_state(), Observation(t_s=0, sample=sample))
    assert d.state is State.UNKNOWN and "no process visible" in d.reason
    off = IdlePolicy(PolicyConfig(memory_threshold_mib=None))
    _, d = off.step(off.initial_state(), Observation(t_s=0, sample=sample))
    assert d.state is State.IDLE


# --- scenarios from issue 6 --------------------------------------------------------


def test_scenario_nine_minute_data_loading_gap() -> None:
    """Training at 95%, 9 minutes of 0% while data streams, training again: never a stop."""
    apps = f"{uuid(0)}, 4242, 30000\n"
    train = smi([95.0], apps, mem=[30000])
    loading_with_process = smi([0.0], apps, mem=[30000])
    trace = (
        series(0, 20 * MIN, 15, train)
        + series(20 * MIN, 29 * MIN, 15, loading_with_process)
        + series(29 * MIN, 40 * MIN, 15, train)
    )
    default = drive(IdlePolicy(PolicyConfig(window_s=10 * MIN)), trace)
    assert stops(default) == []
    assert all(d.state is State.BUSY for d in default)  # the process keeps it busy
    # Even deciding on utilization alone, 9 minutes < the 10 minute window.
    util_only = drive(IdlePolicy(PolicyConfig(window_s=10 * MIN, ignore_processes=True)), trace)
    assert stops(util_only) == []
    assert max(d.idle_for_s for d in util_only) == pytest.approx(9 * MIN - 15)


def test_scenario_one_of_eight_gpus_busy() -> None:
    """One busy GPU of eight: the mean (12%) is under 30%, but no GPU is averaged away."""
    one_busy = parse_smi((DATA / "gpu_8x_one_busy.csv").read_text(), 0, "", 0)
    utils = [g.utilization_pct or 0.0 for g in one_busy.gpus]
    assert sum(utils) / len(utils) < 30
    decisions = drive(
        IdlePolicy(PolicyConfig(threshold_pct=30, window_s=10 * MIN)), series(0, 3600, 15, one_busy)
    )
    assert stops(decisions) == []
    assert all(d.state is State.BUSY for d in decisions)
    assert "GPU-1c0e5a3b-0000-4000-8000-000000000004" in decisions[0].reason


def test_scenario_mig_under_load_reads_na() -> None:
    text = (DATA / "gpu_mig_load.csv").read_text()
    loaded = parse_smi(text, 0, (DATA / "apps_mig_load.csv").read_text(), 0)
    idle_mig = parse_smi(text.replace("9870", "55"), 0, "", 0)
    policy = IdlePolicy(PolicyConfig(window_s=10 * MIN, unknown_alert_s=15 * MIN))
    busy = drive(policy, series(0, 3600, 15, loaded))
    assert stops(busy) == [] and all(d.state is State.BUSY for d in busy)
    quiet = drive(policy, series(0, 3600, 15, idle_mig))
    assert stops(quiet) == [] and all(d.state is State.UNKNOWN for d in quiet)
    alerts = [d for d in quiet if d.alert]
    assert alerts and alerts[0].t_s == 15 * MIN and "[N/A]" in (alerts[0].alert or "")


def test_scenario_hung_nvidia_smi() -> None:
    """Idle for 8 minutes, then nvidia-smi times out for 3 minutes, then idle again."""
    idle = smi([0.0, 0.0])
    hung = parse_smi(None, -1, None, -1)
    trace = (
        series(0, 8 * MIN, 15, idle)
        + series(8 * MIN, 11 * MIN, 15, hung)
        + series(11 * MIN, 30 * MIN, 15, idle)
    )
    decisions = drive(IdlePolicy(PolicyConfig(window_s=10 * MIN)), trace)
    assert stops(decisions) == [21 * MIN]  # a fresh full window after the hang, not at 10 min
    assert all(d.state is State.UNKNOWN for d in decisions if 8 * MIN <= d.t_s < 11 * MIN)


def test_scenario_gpu_lost_mid_window() -> None:
    eight = parse_smi((DATA / "gpu_8x_idle.csv").read_text(), 0, "", 0)
    lines = (DATA / "gpu_8x_idle.csv").read_text().splitlines()
    seven = parse_smi("\n".join(lines[:3] + lines[4:]) + "\n", 0, "", 0)
    trace = series(0, 5 * MIN, 15, eight) + series(5 * MIN, 60 * MIN, 15, seven)
    decisions = drive(IdlePolicy(PolicyConfig(window_s=10 * MIN)), trace)
    assert stops(decisions) == []
    lost = [d for d in decisions if d.t_s >= 5 * MIN]
    assert all(d.state is State.UNKNOWN for d in lost)
    assert "GPU-1c0e5a3b-0000-4000-8000-000000000003 missing" in lost[0].reason


def test_scenario_min_uptime_and_cooldown() -> None:
    cfg = PolicyConfig(window_s=10 * MIN, min_uptime_s=30 * MIN, cooldown_s=60 * MIN)
    decisions = drive(IdlePolicy(cfg), series(0, 4 * 3600, 15, idle_gpus(1)))
    assert stops(decisions) == [30 * MIN, 90 * MIN, 150 * MIN, 210 * MIN]
    held = [d for d in decisions if "held: min-uptime" in d.reason]
    assert held and held[0].t_s == 10 * MIN
    assert any("held: cooldown" in d.reason for d in decisions)


def test_unknown_gpu_among_idle_ones_blocks() -> None:
    sample = GpuSample(source="fake", gpus=(fake_gpu(0), fake_gpu(1, None)))
    decisions = drive(IdlePolicy(PolicyConfig(window_s=60)), series(0, 600, 15, sample))
    assert stops(decisions) == [] and decisions[-1].state is State.UNKNOWN
