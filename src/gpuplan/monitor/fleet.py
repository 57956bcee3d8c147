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
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import Clock
from gpuplan.monitor.fleet_journal import FleetJournal
from gpuplan.monitor.policy import IdleTimer, advance_timer, require
from gpuplan.monitor.prometheus import (
    PrometheusClient,
    Series,
    label_matcher,
    metric_scale,
    name_matcher,
    prometheus_duration_s,
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


class PrometheusFleetSampler:
    """Poll a group's instances and GPUs from Prometheus.

    Queries ``up{<group>}`` (membership) and its ``timestamp()`` (freshness),
    ``{__name__=~"(?i)<metric>", <group>}`` (utilization) and its
    ``timestamp()``, and ``group by (<instance>, UUID, uuid, GPU_I_ID)`` over
    all DCGM series (GPU inventory), where ``<group>`` is
    ``<group_label>="<group>"``. A sample older than two scrape intervals is
    unknown: the scrape interval is ``scrape_interval_s``, or each target's own
    ``scrapeInterval`` from ``/api/v1/targets`` when it is ``None``.

    Args:
        client: the Prometheus client.
        group: the group name (label value).
        group_label: the label that holds the group name on every series.
        instance_label: the label that names the instance.
        metric: utilization metric.
        scale: percent per unit for metrics outside the known list.
        scrape_interval_s: the scrape interval; ``None`` = ask Prometheus per target.
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
        scrape_interval_s: float | None = None,
    ) -> None:
        self.client = client
        self.group = group
        self.group_label = group_label
        self.selector = label_matcher(group_label, group)
        label_matcher(instance_label, "")  # validates the label name
        self.instance_label = instance_label
        self.metric = metric
        self.scale = metric_scale(metric, scale)
        self.scrape_interval_s = scrape_interval_s

    def _intervals(self) -> dict[str, float]:
        """Scrape interval per instance, from the active targets."""
        out: dict[str, float] = {}
        for target in self.client.active_targets():
            labels = target.get("labels")
            if not isinstance(labels, dict) or labels.get(self.group_label) != self.group:
                continue
            seconds = prometheus_duration_s(target.get("scrapeInterval"))
            name = labels.get(self.instance_label)
            if seconds is not None and isinstance(name, str):
                out[name] = seconds
        return out

    def poll(self, t_s: float) -> FleetObservation:
        """One poll; a failed query makes the whole observation unknown."""
        sel, key = self.selector, self.instance_label
        util_sel = f"{{{name_matcher(self.metric)},{sel}}}"
        try:
            up = self.client.query(f"up{{{sel}}}")
            up_ts = self.client.query(f"timestamp(up{{{sel}}})")
            util = self.client.query(util_sel)
            util_ts = self.client.query(f"timestamp({util_sel})")
            inv = self.client.query(
                f'group by ({key}, UUID, uuid, GPU_I_ID) ({{__name__=~"(?i)dcgm_fi_.+",{sel}}})'
            )
            intervals = {} if self.scrape_interval_s is not None else self._intervals()
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
            interval = self.scrape_interval_s or intervals.get(name)
            error = None
            if name not in up_by:
                error = "no up series (not a scrape target of the group)"
            elif up_by[name] != 1.0:
                error = f"scrape failing (up={up_by[name]})"
            elif interval is None:
                error = "scrape interval unknown (pass --scrape-interval)"
            else:
                error = _staleness(
                    [s for s in up_ts if s.labels.get(key) == name], interval, "scrape"
                ) or _staleness(
                    [s for s in util_ts if s.labels.get(key) == name],
                    interval,
                    "utilization sample",
                )
            in_service = error is None
            if error is None and not gpus:
                error = "no DCGM series"
            out.append(InstanceReading(name=name, gpus=gpus, error=error, in_service=in_service))
        return FleetObservation(t_s=t_s, instances=tuple(out))


def _staleness(stamps: list[Series], interval_s: float, what: str) -> str | None:
    """Why the newest of these samples is too old (> 2 scrape intervals), else ``None``."""
    worst = None
    for s in stamps:
        if s.value is None or s.at is None:
            return f"{what} time unknown"
        age = s.at - s.value
        worst = age if worst is None else max(worst, age)
    if worst is not None and worst > 2 * interval_s:
        return f"last {what} {worst:.0f}s old > 2 x scrape interval {interval_s:g}s"
    return None


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
    """Poll -> fleet policy -> (fresh re-check) -> drain hook -> re-check -> removal.

    Args:
        poll: returns a fleet observation for a monotonic time.
        policy: the fleet policy.
        plan: pre-stop = drain hook, notify = webhook, main = removal; each gets
            the target instance in its context (``{instance}`` in commands).
        clock: time source.
        sleep: how to wait between polls.
        execute: really act; otherwise dry run.
        on_decision: called with every decision record (``--json`` output).
        journal: removals journal; with it, a restart remembers removed instances
            and the cooldown, and no removal runs unless its row can be written.
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
        journal: FleetJournal | None = None,
    ) -> None:
        self.poll = poll
        self.policy = policy
        self.plan = plan
        self.clock = clock
        self.sleep = sleep
        self.execute = execute
        self.on_decision = on_decision
        self.journal = journal
        self.state = policy.initial_state()
        if journal is not None:
            wall, mono = clock.wall(), clock.monotonic()
            last = journal.last_removal_wall()
            self.state = replace(
                self.state,
                removed=journal.removed(wall),
                last_action_s=None if last is None else mono - max(0.0, wall - last),
            )
        self.actions: list[tuple[FleetDecision, tuple[ActionResult, ...]]] = []

    def step(self) -> FleetDecision:
        """One poll, and a removal after fresh re-checks (before and after the hooks) when due."""
        self.state, decision = self.policy.step(self.state, self.poll(self.clock.monotonic()))
        extra: dict[str, Any] = {}
        if decision.action is not None:
            self.state, decision = self.policy.step(self.state, self.poll(self.clock.monotonic()))
            if decision.action is not None and decision.target is not None:
                results, extra = self._remove(decision, decision.target)
                self.actions.append((decision, results))
        record = {**fleet_record(decision), **extra}
        log.info("%s", record.get("aborted", {}).get("reason") or decision.reason)
        if self.on_decision is not None:
            self.on_decision(record)
        return decision

    def _remove(
        self, decision: FleetDecision, target: str
    ) -> tuple[tuple[ActionResult, ...], dict[str, Any]]:
        row = None
        if self.journal is not None:
            try:
                row = self.journal.begin(target, self.clock.wall(), execute=self.execute)
            except (sqlite3.Error, OSError) as exc:
                held = f"the removal could not be journaled ({exc}): {target} kept"
                log.error("ALERT %s", held)
                return (), {"action": None, "aborted": {"target": target, "reason": held}}
        self.state = self.policy.record_action(self.state, decision.t_s, target)
        log.warning(
            "%s due (%s): %s",
            decision.action,
            "EXECUTE" if self.execute else "dry run",
            decision.reason,
        )
        ctx = ActionContext(reason=decision.reason, decision=fleet_record(decision), target=target)
        results = self.plan.run_hooks(ctx, execute=self.execute)
        extra: dict[str, Any] = {}
        status: str | None = None
        if self.plan.has_hooks:
            # The drain hook may run for minutes: look at the target once more.
            why = self.policy.confirm_target(self.poll(self.clock.monotonic()), target)
            if why is not None:
                reason = f"re-check after hooks: {why}; removal aborted"
                log.warning("%s", reason)
                self.state = self.policy.not_removed(self.state, target)
                extra = {"action": None, "aborted": {"target": target, "reason": reason}}
                status = "aborted"
        if status is None:
            main = self.plan.run_main(ctx, execute=self.execute)
            results += main
            if self.execute and main and not main[0].ok:
                # Not removed after all: keep it in the group (the cooldown still holds).
                self.state = self.policy.not_removed(self.state, target)
                status = "failed"
            else:
                status = "done" if self.execute else "dry-run"
        for r in results:
            (log.info if r.ok else log.error)("action %s: %s", r.action, r.detail)
        extra["results"] = to_record(results)
        if self.journal is not None and row is not None:
            try:
                self.journal.finish(row, status)
            except (sqlite3.Error, OSError) as exc:
                log.error("ALERT removal journal: cannot record %s for %s: %s", status, target, exc)
        return results, extra

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
