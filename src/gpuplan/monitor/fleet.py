"""Fleet mode: scale a GPU group in by one idle instance, from Prometheus data.

The seed article's rule, made safe: when the group's mean GPU utilization
stays below ``scale_in_below_pct`` for ``window_s`` (the same idle clock as the
single-machine policy, on elapsed time), remove **one** instance: the least
utilized one that has had no unknown reading during the window and is past
its warm-up, after running the drain hook on it, never below ``min_size``, at
most one per ``cooldown_s``.

Membership comes from Prometheus' ``up`` series for the group (service
discovery), readings from dcgm-exporter series. An instance whose scrape
fails (``up == 0``), that has no DCGM series, or whose GPUs read unknown is
unknown: it is left out of the mean and is never removed. Instances seen for
less than ``warmup_s`` are left out of the mean too (a fresh node idles while
it sets up). No known reading at all makes the group unknown (timer frozen).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import Clock
from gpuplan.monitor.policy import IdleTimer, advance_timer, require
from gpuplan.monitor.prometheus import (
    PrometheusClient,
    label_matcher,
    metric_scale,
    name_matcher,
    readings_from_series,
)
from gpuplan.monitor.readings import GpuReading, State, to_record

ACTION_SCALE_IN = "scale-in"
log = logging.getLogger("gpuplan.watch.fleet")


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
        error: why the whole instance is unknown (scrape down, no series).
    """

    name: str
    gpus: tuple[GpuReading, ...]
    error: str | None = None


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
        state: ``unknown`` if any reading is unknown, ``idle`` if eligible for
            removal, else ``busy`` (warming up, recently unknown).
        mean_pct: its mean GPU utilization, when known.
        why: the reason in words.
    """

    name: str
    state: State
    mean_pct: float | None
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetState:
    """What the fleet policy remembers.

    Attributes:
        timer: the group's low-utilization clock.
        last_action_s: time of the last removal.
        first_seen: when each instance was first seen.
        last_unknown: when each instance last had an unknown reading.
        removed: instances already removed (ignored while they drain away).
    """

    timer: IdleTimer = field(default_factory=IdleTimer)
    last_action_s: float | None = None
    first_seen: Mapping[str, float] = field(default_factory=dict)
    last_unknown: Mapping[str, float] = field(default_factory=dict)
    removed: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetDecision:
    """The outcome of one poll.

    Attributes:
        t_s: poll time.
        state: ``idle`` (mean below the threshold), ``busy`` or ``unknown``.
        mean_pct: group mean utilization over known, warmed-up instances.
        idle_for_s: how long the mean has stayed below the threshold.
        size: instances in the group (not counting ones already removed).
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
        last_unknown = dict(state.last_unknown)
        verdicts: list[InstanceVerdict] = []
        known_utils: list[float] = []
        candidates: list[tuple[float, str]] = []
        present = [i for i in obs.instances if i.name not in state.removed]
        for inst in present:
            first_seen.setdefault(inst.name, t)
            utils = [g.utilization_pct for g in inst.gpus]
            bad = inst.error or (None if inst.gpus else "no GPU series")
            if bad is None and any(u is None for u in utils):
                bad = next(
                    g.problem or "utilization unknown"
                    for g in inst.gpus
                    if g.utilization_pct is None
                )
            if bad is not None:
                last_unknown[inst.name] = t
                verdicts.append(
                    InstanceVerdict(name=inst.name, state=State.UNKNOWN, mean_pct=None, why=bad)
                )
                continue
            values = [u for u in utils if u is not None]
            mean = _mean(values)
            assert mean is not None  # noqa: S101 - gpus is non-empty here
            if t - first_seen[inst.name] < cfg.warmup_s:
                verdicts.append(
                    InstanceVerdict(
                        name=inst.name, state=State.BUSY, mean_pct=mean, why="warming up"
                    )
                )
                continue
            known_utils.extend(values)
            seen_unknown = last_unknown.get(inst.name)
            if seen_unknown is not None and t - seen_unknown < cfg.window_s:
                why = f"had an unknown reading {t - seen_unknown:g}s ago"
                verdicts.append(
                    InstanceVerdict(name=inst.name, state=State.BUSY, mean_pct=mean, why=why)
                )
                continue
            candidates.append((mean, inst.name))
            verdicts.append(
                InstanceVerdict(
                    name=inst.name, state=State.IDLE, mean_pct=mean, why=f"mean {mean:.1f}%"
                )
            )
        group_mean = _mean(known_utils)
        if obs.error is not None or group_mean is None:
            group_state = State.UNKNOWN
        else:
            group_state = State.IDLE if group_mean < cfg.scale_in_below_pct else State.BUSY
        timer, note = advance_timer(state.timer, t, group_state, cfg.effective_max_gap_s)
        new_state = replace(state, timer=timer, first_seen=first_seen, last_unknown=last_unknown)
        size = len(present)
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
                        target = min(candidates)[1]
                        action = ACTION_SCALE_IN
                        reason += (
                            f"; scale-in due: remove {target} (mean {min(candidates)[0]:.1f}%)"
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

    def _held(
        self, state: FleetState, t: float, size: int, candidates: list[tuple[float, str]]
    ) -> str | None:
        cfg = self.config
        if state.last_action_s is not None and t - state.last_action_s < cfg.cooldown_s:
            return f"cooldown, {cfg.cooldown_s - (t - state.last_action_s):g}s left"
        if size - 1 < cfg.min_size:
            return f"size {size} - 1 would go below --min-size {cfg.min_size}"
        if not candidates:
            return "no eligible instance (all unknown, warming up, or recently unknown)"
        return None

    def record_action(self, state: FleetState, t_s: float, target: str) -> FleetState:
        """Record a removal: the cooldown starts, the clock restarts, ``target`` is dropped."""
        timer = replace(state.timer, run_start_s=None, idle_for_s=0.0)
        return replace(state, timer=timer, last_action_s=t_s, removed=state.removed | {target})


class PrometheusFleetSampler:
    """Poll a group's instances and GPUs from Prometheus.

    Queries ``up{<group>}`` (membership), ``{__name__=~"(?i)<metric>", <group>}``
    (utilization) and ``group by (<instance>, UUID, uuid, GPU_I_ID)`` over all
    DCGM series (GPU inventory), where ``<group>`` is ``<group_label>="<group>"``.

    Args:
        client: the Prometheus client.
        group: the group name (label value).
        group_label: the label that holds the group name on every series.
        instance_label: the label that names the instance.
        metric: utilization metric.
        scale: percent per unit for metrics outside the known list.
    """

    def __init__(
        self,
        client: PrometheusClient,
        *,
        group: str,
        group_label: str = "group",
        instance_label: str = "instance",
        metric: str = "DCGM_FI_DEV_GPU_UTIL",
        scale: float | None = None,
    ) -> None:
        self.client = client
        self.selector = label_matcher(group_label, group)
        label_matcher(instance_label, "")  # validates the label name
        self.instance_label = instance_label
        self.metric = metric
        self.scale = metric_scale(metric, scale)

    def poll(self, t_s: float) -> FleetObservation:
        """One poll; a failed query makes the whole observation unknown."""
        sel, key = self.selector, self.instance_label
        try:
            up = self.client.query(f"up{{{sel}}}")
            util = self.client.query(f"{{{name_matcher(self.metric)},{sel}}}")
            inv = self.client.query(
                f'group by ({key}, UUID, uuid, GPU_I_ID) ({{__name__=~"(?i)dcgm_fi_.+",{sel}}})'
            )
        except MonitorError as exc:
            return FleetObservation(t_s=t_s, instances=(), error=exc.message)
        up_by = {s.labels.get(key, ""): s.value for s in up}
        names = sorted((set(up_by) | {s.labels.get(key, "") for s in util}) - {""})
        if not names:
            return FleetObservation(t_s=t_s, instances=(), error=f"no targets with {sel}")
        out = []
        for name in names:
            gpus = readings_from_series(
                [s for s in util if s.labels.get(key) == name],
                [s.labels for s in inv if s.labels.get(key) == name],
                self.scale,
            )
            error = None
            if name in up_by and up_by[name] != 1.0:
                error = f"scrape failing (up={up_by[name]})"
            elif not gpus:
                error = "no DCGM series"
            out.append(InstanceReading(name=name, gpus=gpus, error=error))
        return FleetObservation(t_s=t_s, instances=tuple(out))


def fleet_record(decision: FleetDecision) -> dict[str, Any]:
    """A JSON-ready record of a fleet decision."""
    return {
        "t": decision.t_s,
        "state": decision.state.value,
        "mean_pct": decision.mean_pct,
        "idle_for_s": decision.idle_for_s,
        "size": decision.size,
        "action": decision.action,
        "target": decision.target,
        "reason": decision.reason,
        "instances": to_record(decision.instances),
    }


class FleetAgent:
    """Poll -> fleet policy -> (fresh re-check) -> drain hook + removal.

    Args:
        poll: returns a fleet observation for a monotonic time.
        policy: the fleet policy.
        plan: pre-stop = drain hook, notify = webhook, main = removal; each gets
            the target instance in its context (``{instance}`` in commands).
        clock: time source.
        sleep: how to wait between polls.
        execute: really act; otherwise dry run.
        on_decision: called with every decision record (``--json`` output).
    """

    def __init__(
        self,
        *,
        poll: Callable[[float], FleetObservation],
        policy: FleetPolicy,
        plan: ActionPlan,
        clock: Clock,
        sleep: Callable[[float], object] = time.sleep,
        execute: bool = False,
        on_decision: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.poll = poll
        self.policy = policy
        self.plan = plan
        self.clock = clock
        self.sleep = sleep
        self.execute = execute
        self.on_decision = on_decision
        self.state = policy.initial_state()
        self.actions: list[tuple[FleetDecision, tuple[ActionResult, ...]]] = []

    def step(self) -> FleetDecision:
        """One poll, and a removal after a fresh re-check when due."""
        self.state, decision = self.policy.step(self.state, self.poll(self.clock.monotonic()))
        if decision.action is not None:
            self.state, decision = self.policy.step(self.state, self.poll(self.clock.monotonic()))
            if decision.action is not None and decision.target is not None:
                self.state = self.policy.record_action(self.state, decision.t_s, decision.target)
                record = fleet_record(decision)
                log.warning(
                    "%s due (%s): %s",
                    decision.action,
                    "EXECUTE" if self.execute else "dry run",
                    decision.reason,
                )
                ctx = ActionContext(reason=decision.reason, decision=record, target=decision.target)
                results = self.plan.run(ctx, execute=self.execute)
                main = results[-1] if results and self.plan.main is not None else None
                if self.execute and main is not None and not main.ok:
                    # Not removed after all: keep it in the group (the cooldown still holds).
                    self.state = replace(self.state, removed=self.state.removed - {decision.target})
                for r in results:
                    (log.info if r.ok else log.error)("action %s: %s", r.action, r.detail)
                self.actions.append((decision, results))
        record = fleet_record(decision)
        log.info("%s", decision.reason)
        if self.on_decision is not None:
            self.on_decision(record)
        return decision

    def run(self, *, max_steps: int | None = None, stop: threading.Event | None = None) -> int:
        """Poll every ``interval_s`` until ``stop`` or ``max_steps``; return the steps taken."""
        steps = 0
        while stop is None or not stop.is_set():
            started = self.clock.monotonic()
            self.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
            self.sleep(max(0.0, self.policy.config.interval_s - (self.clock.monotonic() - started)))
        return steps
