"""Hypothesis properties of the idle policy (issue 6)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from watch_helpers import gpu_csv, uuid

from gpuplan.monitor.policy import Decision, IdlePolicy, PolicyConfig
from gpuplan.monitor.readings import GpuSample, Observation, State
from gpuplan.monitor.smi_parse import parse_smi

INTERVAL = 15.0

# Each step is one raw nvidia-smi sample, so the real parser is exercised too.
_KINDS = {
    "idle": lambda: parse_smi(gpu_csv([0.0, 3.0]), 0, "", 0),
    "busy-util": lambda: parse_smi(gpu_csv([0.0, 55.0]), 0, "", 0),
    "busy-proc": lambda: parse_smi(gpu_csv([0.0, 0.0]), 0, f"{uuid(1)}, 99, 10\n", 0),
    "unknown-na": lambda: parse_smi(gpu_csv(["[N/A]", 0.0]), 0, "", 0),
    "unknown-timeout": lambda: parse_smi(None, -1, None, -1),
    "unknown-apps": lambda: parse_smi(gpu_csv([0.0, 0.0]), 0, None, -1),
    "unknown-error": lambda: parse_smi("GPU is lost\n", 15, "", 0),
    "unknown-lost": lambda: parse_smi(gpu_csv([0.0]), 0, "", 0),
}
SAMPLES: dict[str, GpuSample] = {k: f() for k, f in _KINDS.items()}


@st.composite
def traces(draw: st.DrawFn) -> tuple[PolicyConfig, list[Observation]]:
    cfg = PolicyConfig(
        window_s=draw(st.sampled_from([30.0, 60.0, 120.0, 300.0, 600.0])),
        interval_s=INTERVAL,
        min_uptime_s=draw(st.sampled_from([0.0, 100.0, 1000.0])),
        cooldown_s=draw(st.sampled_from([0.0, 200.0, 1800.0])),
    )
    # Runs of one kind of sample, mostly idle, so that stops happen and the properties bite.
    kind = st.one_of(st.just("idle"), st.just("idle"), st.sampled_from(sorted(SAMPLES)))
    gap = st.one_of(
        st.floats(min_value=0.0, max_value=2 * INTERVAL),
        st.floats(min_value=0.0, max_value=2 * INTERVAL),
        st.floats(min_value=0.0, max_value=200.0),
    )
    segments = draw(st.lists(st.tuples(kind, st.integers(1, 60), gap), min_size=1, max_size=8))
    t = draw(st.floats(min_value=0, max_value=2000))
    obs = []
    for name, count, step in segments:
        for k in range(count):
            t += step if k % 3 else step * 0.5  # some jitter inside a run
            obs.append(Observation(t_s=t, sample=SAMPLES[name]))
    return cfg, obs


def run(cfg: PolicyConfig, obs: list[Observation]) -> list[Decision]:
    policy = IdlePolicy(cfg)
    state = policy.initial_state()
    out = []
    for o in obs:
        state, d = policy.step(state, o)
        if d.action:
            state = policy.record_action(state, o.t_s)
        out.append(d)
    return out


FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(traces())
def test_any_window_containing_busy_or_unknown_yields_no_stop(
    trace: tuple[PolicyConfig, list[Observation]],
) -> None:
    cfg, obs = trace
    decisions = run(cfg, obs)
    for i, d in enumerate(decisions):
        if d.action:
            window = [e for e in decisions[: i + 1] if e.t_s >= d.t_s - cfg.window_s]
            assert all(e.state is State.IDLE for e in window), (d, window)


@FAST
@given(traces())
def test_every_stop_is_preceded_by_a_full_window_of_continuous_idle(
    trace: tuple[PolicyConfig, list[Observation]],
) -> None:
    cfg, obs = trace
    decisions = run(cfg, obs)
    for i, d in enumerate(decisions):
        if not d.action:
            continue
        # Walk back through idle decisions with no gap above max_gap until the window is covered.
        j = i
        while decisions[i].t_s - decisions[j].t_s < cfg.window_s:
            assert j > 0, "stop without a full window of evidence"
            assert decisions[j - 1].state is State.IDLE
            assert decisions[j].t_s - decisions[j - 1].t_s <= cfg.effective_max_gap_s
            j -= 1
        assert decisions[i].t_s - decisions[j].t_s >= cfg.window_s


@FAST
@given(traces())
def test_stops_respect_min_uptime_and_cooldown(
    trace: tuple[PolicyConfig, list[Observation]],
) -> None:
    cfg, obs = trace
    times = [d.t_s for d in run(cfg, obs) if d.action]
    assert all(t >= cfg.min_uptime_s for t in times)
    assert all(
        b - a >= max(cfg.cooldown_s, cfg.window_s) for a, b in zip(times, times[1:], strict=False)
    )


@FAST
@given(traces())
def test_policy_is_pure(trace: tuple[PolicyConfig, list[Observation]]) -> None:
    cfg, obs = trace
    assert run(cfg, obs) == run(cfg, obs)


def test_idle_reading_at_the_same_instant_as_a_busy_one_does_not_start_the_run() -> None:
    """Regression (found by the property above): busy and idle readings with one timestamp."""
    cfg = PolicyConfig(window_s=30.0, interval_s=INTERVAL, min_uptime_s=0.0, cooldown_s=0.0)
    obs = [
        Observation(t_s=0.0, sample=SAMPLES["busy-util"]),
        Observation(t_s=0.0, sample=SAMPLES["idle"]),
        Observation(t_s=30.0, sample=SAMPLES["idle"]),
    ]
    decisions = run(cfg, obs)
    assert not any(d.action for d in decisions)
    assert decisions[-1].idle_for_s == 0.0
