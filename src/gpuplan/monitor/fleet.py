"""Fleet mode: scale a GPU group in by one idle instance, from Prometheus data.

The seed article's rule, made safe: when the group's mean GPU utilization
stays below ``scale_in_below_pct`` for ``window_s`` (the same idle clock as the
single-machine policy, on elapsed time), remove **one** instance, after running
the drain hook on it, never below ``min_size``, at most one per ``cooldown_s``.

**Which instance: chosen by the whole window.** Each instance has its own idle
clock: it is idle at a poll when every one of its GPUs is below
``scale_in_below_pct``; a busy poll resets its clock, an unknown one freezes it
and ends the run, a gap restarts it. An instance is a candidate only when its
clock has run for the whole window and it is past its warm-up. Candidates are
ranked by their highest utilization over the window, then by the longest idle
time, then by name. (Choosing by the utilization at one poll removed an
instance at 70 % all window that dipped to 0 % for one scrape, a checkpoint
save, and kept one that was idle all along.)

**What counts.** Membership comes from Prometheus' ``up`` series for the group
(service discovery), readings from dcgm-exporter series. The group's size
(for ``min_size``) counts only instances whose scrape succeeds, with a fresh
sample, and that were not removed by this controller; removals are journaled
(see :mod:`gpuplan.monitor.fleet_journal`), so after a restart an instance
already removed is never counted nor chosen again. An instance whose scrape
fails (``up == 0``), whose samples are older than two scrape intervals, that
has no DCGM series, or whose GPUs read unknown is unknown: it is left out of the
mean and is never removed. Instances seen for less than ``warmup_s`` are left
out of the mean too (a fresh node idles while it sets up). No known reading at
all makes the group unknown (timer frozen).

The controller loop is :mod:`gpuplan.monitor.fleet_agent`, the Prometheus
poller :mod:`gpuplan.monitor.fleet_sampler`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpuplan.monitor.policy import IdleTimer, advance_timer, require
from gpuplan.monitor.readings import GpuReading, State

ACTION_SCALE_IN = "scale-in"


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """Fleet knobs (durations in seconds).

    Attributes:
        scale_in_below_pct: group mean utilization (%) under which the clock runs.
        window_s: how long the mean must stay below before removing one instance.
        interval_s: polling interval.
        cooldown_s: no removal within this long after the previous one.
        min_size: never go below this many instances.
        warmup_s: instances seen for less than this are neither averaged nor removed.
        max_gap_s: a longer gap between polls restarts the clock (``None`` = 3 x interval).
    """

    scale_in_below_pct: float = 30.0
    window_s: float = 600.0
    interval_s: float = 30.0
    cooldown_s: float = 600.0
    min_size: int = 1
    warmup_s: float = 600.0
    max_gap_s: float | None = None

    def __post_init__(self) -> None:
        """Validate every field; errors name the CLI flag."""
        require(
            0 < self.scale_in_below_pct <= 100,
            "--scale-in-below",
            "must be > 0 and <= 100",
            self.scale_in_below_pct,
        )
        require(self.window_s > 0, "--window", "must be > 0", self.window_s)
        require(self.interval_s > 0, "--interval", "must be > 0", self.interval_s)
        require(self.cooldown_s >= 0, "--cooldown", "must be >= 0", self.cooldown_s)
        require(self.min_size >= 0, "--min-size", "must be >= 0", self.min_size)
        require(self.warmup_s >= 0, "--warmup", "must be >= 0", self.warmup_s)
        if self.max_gap_s is not None:
            require(
                self.max_gap_s >= self.interval_s,
                "--max-gap",
                "must be >= --interval",
                self.max_gap_s,
            )

    @property
    def effective_max_gap_s(self) -> float:
        """The gap (s) above which the clock restarts."""
        return self.max_gap_s if self.max_gap_s is not None else 3.0 * self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceReading:
    """One instance's GPUs at one poll.

    Attributes:
        name: the instance label value (an EC2 id for AWS scale-in).
        gpus: its GPU readings.
        error: why the whole instance is unknown (scrape down, stale, no series).
        in_service: its scrape succeeds with a fresh sample (it counts in the size).
    """

    name: str
    gpus: tuple[GpuReading, ...]
    error: str | None = None
    in_service: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetObservation:
    """One poll of the group.

    Attributes:
        t_s: monotonic time of the poll.
        instances: per-instance readings.
        error: the whole poll failed (Prometheus unreachable...).
    """

    t_s: float
    instances: tuple[InstanceReading, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceVerdict:
    """How the policy saw one instance.

    Attributes:
        name: the instance.
        state: ``unknown`` if any reading is unknown, ``idle`` if every GPU is
            below the threshold now, else ``busy``.
        mean_pct: its mean GPU utilization, when known.
        why: the reason in words.
        idle_for_s: its own idle clock.
        max_pct: its highest utilization over the window (known polls only).
        candidate: idle for the whole window and past warm-up: may be removed.
    """

    name: str
    state: State
    mean_pct: float | None
    why: str
    idle_for_s: float = 0.0
    max_pct: float | None = None
    candidate: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetState:
    """What the fleet policy remembers.

    Attributes:
        timer: the group's low-utilization clock.
        last_action_s: time of the last removal.
        first_seen: when each instance was first seen.
        timers: each instance's own idle clock.
        peaks: each instance's ``(t, max GPU utilization)`` polls within the window.
        removed: instances already removed (never counted nor chosen again).
    """

    timer: IdleTimer = field(default_factory=IdleTimer)
    last_action_s: float | None = None
    first_seen: Mapping[str, float] = field(default_factory=dict)
    timers: Mapping[str, IdleTimer] = field(default_factory=dict)
    peaks: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetDecision:
    """The outcome of one poll.

    Attributes:
        t_s: poll time.
        state: ``idle`` (mean below the threshold), ``busy`` or ``unknown``.
        mean_pct: group mean utilization over known, warmed-up instances.
        idle_for_s: how long the mean has stayed below the threshold.
        size: instances in service (scrape succeeds, fresh, not already removed).
        action: ``"scale-in"`` when due.
        target: the instance to remove when due.
        instances: per-instance verdicts.
        reason: one line.
    """

    t_s: float
    state: State
    mean_pct: float | None
    idle_for_s: float
    size: int
    action: str | None
    target: str | None
    instances: tuple[InstanceVerdict, ...]
    reason: str


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class FleetPolicy:
    """The fleet scale-in state machine (pure; see the module docstring).

    Args:
        config: the knobs.
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config

    def initial_state(self) -> FleetState:
        """A fresh state (every instance starts its warm-up when first seen)."""
        return FleetState()

    def step(self, state: FleetState, obs: FleetObservation) -> tuple[FleetState, FleetDecision]:
        """Feed one poll; return the new state and the decision (action not recorded)."""
        cfg, t = self.config, obs.t_s
        first_seen = dict(state.first_seen)
        timers = dict(state.timers)
        peaks = dict(state.peaks)
        verdicts: list[InstanceVerdict] = []
        known_utils: list[float] = []
        present = [i for i in obs.instances if i.name not in state.removed]
        for inst in present:
            first_seen.setdefault(inst.name, t)
            verdict, values = self._instance(inst, t, first_seen[inst.name], timers, peaks)
            verdicts.append(verdict)
            if values is not None and t - first_seen[inst.name] >= cfg.warmup_s:
                known_utils.extend(values)
        group_mean = _mean(known_utils)
        if obs.error is not None or group_mean is None:
            group_state = State.UNKNOWN
        else:
            group_state = State.IDLE if group_mean < cfg.scale_in_below_pct else State.BUSY
        timer, note = advance_timer(state.timer, t, group_state, cfg.effective_max_gap_s)
        new_state = replace(state, timer=timer, first_seen=first_seen, timers=timers, peaks=peaks)
        size = sum(1 for i in present if i.in_service)
        candidates = sorted(
            (v for v in verdicts if v.candidate), key=lambda v: (v.max_pct, -v.idle_for_s, v.name)
        )
        action = target = None
        if group_state is State.UNKNOWN:
            reason = f"unknown: {obs.error or 'no known, warmed-up instance'}"
        else:
            assert group_mean is not None  # noqa: S101
            sign = "<" if group_state is State.IDLE else ">="
            reason = f"group mean {group_mean:.1f}% {sign} {cfg.scale_in_below_pct:g}%"
            if group_state is State.IDLE:
                reason += f", low for {timer.idle_for_s:g}s of {cfg.window_s:g}s"
                if timer.idle_for_s >= cfg.window_s:
                    held = self._held(state, t, size, candidates)
                    if held:
                        reason += f"; held: {held}"
                    else:
                        best = candidates[0]
                        target, action = best.name, ACTION_SCALE_IN
                        reason += (
                            f"; scale-in due: remove {target} (idle {best.idle_for_s:g}s, "
                            f"at most {best.max_pct:.1f}% over the window)"
                        )
        if note:
            reason += f" ({note})"
        return new_state, FleetDecision(
            t_s=t,
            state=group_state,
            mean_pct=group_mean,
            idle_for_s=timer.idle_for_s,
            size=size,
            action=action,
            target=target,
            instances=tuple(verdicts),
            reason=reason,
        )

    def _instance(
        self,
        inst: InstanceReading,
        t: float,
        first_seen: float,
        timers: dict[str, IdleTimer],
        peaks: dict[str, tuple[tuple[float, float], ...]],
    ) -> tuple[InstanceVerdict, list[float] | None]:
        """Advance one instance's clock and window; return its verdict and known values."""
        cfg = self.config
        utils = [g.utilization_pct for g in inst.gpus]
        bad = inst.error or (None if inst.gpus else "no GPU series")
        if bad is None and any(u is None for u in utils):
            bad = next(
                g.problem or "utilization unknown" for g in inst.gpus if g.utilization_pct is None
            )
        old = timers.get(inst.name, IdleTimer())
        kept = tuple(p for p in peaks.get(inst.name, ()) if p[0] > t - cfg.window_s)
        if bad is not None:
            timers[inst.name], _ = advance_timer(old, t, State.UNKNOWN, cfg.effective_max_gap_s)
            peaks[inst.name] = kept
            verdict = InstanceVerdict(
                name=inst.name,
                state=State.UNKNOWN,
                mean_pct=None,
                why=bad,
                idle_for_s=timers[inst.name].idle_for_s,
            )
            return verdict, None
        values = [u for u in utils if u is not None]
        top = max(values)
        own = State.IDLE if top < cfg.scale_in_below_pct else State.BUSY
        timer, _ = advance_timer(old, t, own, cfg.effective_max_gap_s)
        timers[inst.name] = timer
        kept += ((t, top),)
        peaks[inst.name] = kept
        window_max = max(p[1] for p in kept)
        mean = _mean(values)
        assert mean is not None  # noqa: S101 - gpus is non-empty here
        warming = t - first_seen < cfg.warmup_s
        candidate = own is State.IDLE and timer.idle_for_s >= cfg.window_s and not warming
        if warming:
            why = "warming up"
        elif own is State.BUSY:
            why = f"a GPU at {top:g}% >= {cfg.scale_in_below_pct:g}%"
        elif candidate:
            why = f"idle for the whole window (at most {window_max:g}%)"
        else:
            why = f"idle for {timer.idle_for_s:g}s of the {cfg.window_s:g}s window"
        verdict = InstanceVerdict(
            name=inst.name,
            state=own,
            mean_pct=mean,
            why=why,
            idle_for_s=timer.idle_for_s,
            max_pct=window_max,
            candidate=candidate and inst.in_service,
        )
        return verdict, values

    def _held(
        self, state: FleetState, t: float, size: int, candidates: list[InstanceVerdict]
    ) -> str | None:
        cfg = self.config
        if state.last_action_s is not None and t - state.last_action_s < cfg.cooldown_s:
            return f"cooldown, {cfg.cooldown_s - (t - state.last_action_s):g}s left"
        if size - 1 < cfg.min_size:
            return f"size {size} - 1 would go below --min-size {cfg.min_size}"
        if not candidates:
            return "no instance idle for the whole window (others busy, unknown or warming up)"
        return None

    def confirm_target(self, obs: FleetObservation, target: str) -> str | None:
        """The last word after the drain hook: ``None`` if ``target`` may go, else why not.

        ``target`` must still be listed, in service, with every GPU known and below
        ``scale_in_below_pct`` in this fresh poll.
        """
        if obs.error is not None:
            return f"poll failed: {obs.error}"
        inst = next((i for i in obs.instances if i.name == target), None)
        if inst is None or not inst.in_service:
            return f"{target} is no longer in service"
        if inst.error is not None or not inst.gpus:
            return f"{target} is unknown: {inst.error or 'no GPU series'}"
        utils = [g.utilization_pct for g in inst.gpus]
        if any(u is None for u in utils):
            return f"{target} has a GPU with unknown utilization"
        top = max(u for u in utils if u is not None)
        if top >= self.config.scale_in_below_pct:
            return f"{target} has a GPU at {top:g}% >= {self.config.scale_in_below_pct:g}%"
        return None

    def record_action(self, state: FleetState, t_s: float, target: str) -> FleetState:
        """Record a removal: the cooldown starts, the clock restarts, ``target`` is dropped."""
        timer = replace(state.timer, run_start_s=None, idle_for_s=0.0)
        return replace(state, timer=timer, last_action_s=t_s, removed=state.removed | {target})

    def not_removed(self, state: FleetState, target: str) -> FleetState:
        """Undo the removal of ``target`` (it failed or was aborted); the cooldown holds."""
        return replace(state, removed=state.removed - {target})
