"""The idle policy: a pure state machine over timestamped observations.

``IdlePolicy.step(state, observation) -> (state, decision)`` reads no clock,
does no I/O and never mutates its inputs, so the daemon, ``--replay`` and the
property tests all run the very same code.

**Per-GPU verdict** (no averaging across GPUs), in this order:

1. ``busy`` if ``utilization.gpu >= threshold``, or (unless ``ignore_processes``)
   at least one compute process is listed on the GPU;
2. ``unknown`` if utilization is unknown (``[N/A]``, MIG, error token...), or
   (unless ``ignore_processes``) the process list is unknown, or
   ``memory.used >= memory_threshold_mib`` while no process is visible (the
   container/host-PID blind spot);
3. ``idle`` otherwise.

**Machine state**: ``busy`` if any GPU or host signal is busy; else ``unknown``
if the sample failed (timeout, non-zero exit, error text, parse failure),
listed no GPU, lacks a GPU seen earlier in this boot (lost GPU), or any GPU or
host signal is unknown; else ``idle``.

**The idle timer** (``idle_for_s``) is the length of the current run of idle
observations, measured on the observation clock ``t_s`` (never by counting
samples). A run starts at the ``t_s`` of its first idle observation, so one
observation alone never reaches a window > 0.

* It **resets** to 0 on every ``busy`` observation.
* It **freezes** on an ``unknown`` observation: ``idle_for_s`` keeps the value of
  the last idle observation and does not advance, and no action is taken. The
  run is over: the next idle observation starts a new run at 0, because an
  unknown stretch is no evidence of idleness. After ``unknown_alert_s`` of
  continuous unknown the decision carries an ``alert``.
* A gap longer than ``max_gap_s`` (default ``3 * interval_s``) between two
  observations is missing evidence: the run restarts at the later observation.
* After an action the run restarts (a second action needs a fresh full window).

**An action is due** on an idle observation when ``idle_for_s >= window_s``, the
observation is at least ``min_uptime_s`` after boot (``t_s`` counts from boot),
and no action was recorded within ``cooldown_s``. Hence every observation in the
``window_s`` before a due decision was idle, with no gap above ``max_gap_s``.
The caller re-checks with a fresh observation (``step`` again) and then calls
:meth:`IdlePolicy.record_action` before acting, which makes at most one action
per cooldown.

**Re-check after hooks.** A pre-stop hook or a webhook may run for minutes,
so when either ran the caller takes one more observation immediately before
the main action and passes it to :meth:`IdlePolicy.confirm_after_hooks`: the
action proceeds only if that observation is idle; otherwise it is aborted
(the cooldown recorded before the hooks still holds, so hooks run at most once
per cooldown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpuplan.errors import MonitorError
from gpuplan.monitor.readings import GpuReading, HostSignal, Observation, State

ACTION_STOP = "stop"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """Policy knobs; every duration in seconds, every threshold in its unit.

    Attributes:
        threshold_pct: a GPU is busy at or above this ``utilization.gpu`` percent.
        window_s: continuous idle needed before acting.
        interval_s: the sampling interval (daemon) / expected recording cadence.
        min_uptime_s: no action before this many seconds after boot.
        cooldown_s: no action within this many seconds after the last one.
        ignore_processes: decide on utilization alone (processes do not count).
        memory_threshold_mib: with no visible process, this much used memory makes
            the GPU unknown; ``None`` disables the cross-check.
        unknown_alert_s: continuous unknown longer than this raises an alert.
        max_gap_s: a longer gap between observations restarts the idle run;
            ``None`` means ``3 * interval_s``.
    """

    threshold_pct: float = 10.0
    window_s: float = 600.0
    interval_s: float = 15.0
    min_uptime_s: float = 0.0
    cooldown_s: float = 1800.0
    ignore_processes: bool = False
    memory_threshold_mib: float | None = 1024.0
    unknown_alert_s: float = 900.0
    max_gap_s: float | None = None

    def __post_init__(self) -> None:
        """Validate every field; errors name the CLI flag."""
        require(
            0 < self.threshold_pct <= 100,
            "--threshold",
            "must be > 0 and <= 100",
            self.threshold_pct,
        )
        require(self.window_s > 0, "--window", "must be > 0", self.window_s)
        require(self.interval_s > 0, "--interval", "must be > 0", self.interval_s)
        require(self.min_uptime_s >= 0, "--min-uptime", "must be >= 0", self.min_uptime_s)
        require(self.cooldown_s >= 0, "--cooldown", "must be >= 0", self.cooldown_s)
        require(self.unknown_alert_s > 0, "--unknown-alert", "must be > 0", self.unknown_alert_s)
        if self.memory_threshold_mib is not None:
            require(
                self.memory_threshold_mib >= 0,
                "--memory-threshold-mib",
                "must be >= 0",
                self.memory_threshold_mib,
            )
        if self.max_gap_s is not None:
            require(
                self.max_gap_s >= self.interval_s,
                "--max-gap",
                "must be >= --interval",
                self.max_gap_s,
            )

    @property
    def effective_max_gap_s(self) -> float:
        """The gap (s) above which the idle run restarts."""
        return self.max_gap_s if self.max_gap_s is not None else 3.0 * self.interval_s


def require(ok: bool, flag: str, rule: str, value: float) -> None:
    """Raise a :class:`MonitorError` naming ``flag`` unless ``ok`` (NaN never passes)."""
    if not ok or (isinstance(value, float) and math.isnan(value)):
        raise MonitorError(f"{flag}: {rule}, got {value:g}")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleTimer:
    """The idle clock, shared by the host policy and the fleet policy.

    Attributes:
        run_start_s: ``t_s`` of the first observation of the current idle run.
        last_t_s: ``t_s`` of the previous observation.
        idle_for_s: the last reported idle duration (held while unknown).
        unknown_since_s: start of the current unknown stretch.
    """

    run_start_s: float | None = None
    last_t_s: float | None = None
    idle_for_s: float = 0.0
    unknown_since_s: float | None = None


def advance_timer(
    timer: IdleTimer, t_s: float, state: State, max_gap_s: float
) -> tuple[IdleTimer, str | None]:
    """Move the idle clock to ``t_s`` given the machine ``state`` there.

    Args:
        timer: the clock before this observation.
        t_s: the observation time; must not be earlier than ``timer.last_t_s``.
        state: the machine state at ``t_s``.
        max_gap_s: a larger gap since the previous observation restarts the run.

    Returns:
        The new clock and a note when a gap restarted the run.

    Raises:
        MonitorError: if time went backwards.
    """
    if not math.isfinite(t_s):
        raise MonitorError(f"observation time must be finite, got {t_s}")
    note = None
    run_start = timer.run_start_s
    if timer.last_t_s is not None:
        if t_s < timer.last_t_s:
            raise MonitorError(f"observation time went backwards: {t_s:g} < {timer.last_t_s:g}")
        gap = t_s - timer.last_t_s
        if gap > max_gap_s and run_start is not None:
            run_start = None
            note = (
                f"gap of {gap:g}s since the previous reading > {max_gap_s:g}s: idle run restarted"
            )
    if state is State.BUSY:
        return IdleTimer(last_t_s=t_s), note
    if state is State.UNKNOWN:
        since = timer.unknown_since_s if timer.unknown_since_s is not None else t_s
        return (
            IdleTimer(last_t_s=t_s, idle_for_s=timer.idle_for_s, unknown_since_s=since),
            note,
        )
    if (
        run_start is None
        and timer.last_t_s == t_s
        and (timer.unknown_since_s is not None or timer.run_start_s is None)
    ):
        # a busy or unknown reading carries this same timestamp: the idle run cannot start
        # at an instant that also has non-idle evidence, so it starts at the next reading
        return IdleTimer(last_t_s=t_s, idle_for_s=0.0), note
    start = run_start if run_start is not None else t_s
    return IdleTimer(run_start_s=start, last_t_s=t_s, idle_for_s=t_s - start), note


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuVerdict:
    """The policy's verdict on one GPU, with the evidence in words.

    Attributes:
        uuid: the GPU.
        state: busy, idle or unknown.
        why: the reading behind it ("utilization 87% >= 10%").
    """

    uuid: str
    state: State
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyState:
    """Everything the policy remembers between observations (persisted per boot).

    Attributes:
        timer: the idle clock.
        last_action_s: ``t_s`` of the last recorded action.
        known_gpus: UUIDs seen this boot; one missing later is a lost GPU.
    """

    timer: IdleTimer = field(default_factory=IdleTimer)
    last_action_s: float | None = None
    known_gpus: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of one observation.

    Attributes:
        t_s: observation time (seconds since boot / recorded clock).
        state: machine state.
        idle_for_s: the idle clock after this observation.
        action: ``"stop"`` when an action is due now, else ``None``.
        reason: one line explaining the state and the (non-)action.
        gpus: per-GPU verdicts.
        host: host signals that were part of the observation.
        alert: set while the machine has been unknown for too long.
        sample_error: the whole-sample failure, if any.
    """

    t_s: float
    state: State
    idle_for_s: float
    action: str | None
    reason: str
    gpus: tuple[GpuVerdict, ...] = ()
    host: tuple[HostSignal, ...] = ()
    alert: str | None = None
    sample_error: str | None = None


def classify_gpu(reading: GpuReading, config: PolicyConfig) -> GpuVerdict:
    """Verdict for one GPU (busy evidence first, then unknowns, then idle).

    >>> cfg = PolicyConfig()
    >>> classify_gpu(GpuReading(uuid="GPU-1", utilization_pct=None, processes=()), cfg).state
    <State.UNKNOWN: 'unknown'>
    """
    util = reading.utilization_pct
    thr = config.threshold_pct
    if util is not None and util >= thr:
        return GpuVerdict(
            uuid=reading.uuid, state=State.BUSY, why=f"utilization {util:g}% >= {thr:g}%"
        )
    procs = reading.processes
    if not config.ignore_processes and procs:
        pids = ",".join(str(p.pid) for p in procs[:4]) + (",..." if len(procs) > 4 else "")
        return GpuVerdict(
            uuid=reading.uuid,
            state=State.BUSY,
            why=f"{len(procs)} compute process(es) (pid {pids})",
        )
    if util is None:
        why = reading.problem or "utilization unknown"
        return GpuVerdict(uuid=reading.uuid, state=State.UNKNOWN, why=f"utilization unknown: {why}")
    if not config.ignore_processes:
        if procs is None:
            return GpuVerdict(
                uuid=reading.uuid,
                state=State.UNKNOWN,
                why=f"process list unknown{': ' + reading.problem if reading.problem else ''}",
            )
        mem, limit = reading.memory_used_mib, config.memory_threshold_mib
        if limit is not None and mem is not None and mem >= limit:
            return GpuVerdict(
                uuid=reading.uuid,
                state=State.UNKNOWN,
                why=f"{mem:g} MiB in use but no process visible (container PID namespace?)",
            )
    tail = "" if config.ignore_processes else ", no compute process"
    return GpuVerdict(
        uuid=reading.uuid, state=State.IDLE, why=f"utilization {util:g}% < {thr:g}%{tail}"
    )


class IdlePolicy:
    """The idle state machine (see the module docstring for the exact rules).

    Args:
        config: the policy knobs.
    """

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def initial_state(self) -> PolicyState:
        """The state of a freshly booted machine."""
        return PolicyState()

    def classify(
        self, state: PolicyState, obs: Observation
    ) -> tuple[State, tuple[GpuVerdict, ...], list[str]]:
        """Machine state at ``obs`` with per-GPU verdicts and the reasons in words."""
        verdicts = tuple(classify_gpu(g, self.config) for g in obs.sample.gpus)
        seen = {v.uuid for v in verdicts}
        missing = sorted(state.known_gpus - seen) if obs.sample.error is None else []
        busy = [f"{v.uuid} {v.why}" for v in verdicts if v.state is State.BUSY]
        busy += [f"{h.name}: {h.detail}" for h in obs.host if h.state is State.BUSY]
        if busy:
            return State.BUSY, verdicts, busy
        unknown: list[str] = []
        if obs.sample.error is not None:
            unknown.append(obs.sample.error)
        elif not verdicts:
            unknown.append("no GPU listed")
        unknown += [f"{uuid} missing from the sample (lost GPU?)" for uuid in missing]
        unknown += [f"{v.uuid} {v.why}" for v in verdicts if v.state is State.UNKNOWN]
        unknown += [f"{h.name}: {h.detail}" for h in obs.host if h.state is State.UNKNOWN]
        if unknown:
            return State.UNKNOWN, verdicts, unknown
        return State.IDLE, verdicts, [v.why for v in verdicts[:1]]

    def step(self, state: PolicyState, obs: Observation) -> tuple[PolicyState, Decision]:
        """Feed one observation; return the new state and the decision.

        Args:
            state: the policy state before ``obs``.
            obs: the observation (its ``t_s`` must not go backwards).

        Returns:
            ``(new_state, decision)``; ``decision.action == "stop"`` when due.
            The action is *not* recorded: call :meth:`record_action` when acting.
        """
        cfg = self.config
        machine, verdicts, why = self.classify(state, obs)
        timer, note = advance_timer(state.timer, obs.t_s, machine, cfg.effective_max_gap_s)
        known = state.known_gpus | {v.uuid for v in verdicts}
        new_state = replace(state, timer=timer, known_gpus=known)
        action: str | None = None
        alert = None
        if machine is State.BUSY:
            reason = "busy: " + "; ".join(why[:3])
        elif machine is State.UNKNOWN:
            reason = "unknown (timer frozen): " + "; ".join(why[:3])
            since = timer.unknown_since_s if timer.unknown_since_s is not None else obs.t_s
            if obs.t_s - since >= cfg.unknown_alert_s:
                alert = f"unknown for {obs.t_s - since:g}s: " + "; ".join(why[:3])
        else:
            reason, action = self._idle_reason(state, timer.idle_for_s, obs.t_s)
        if note:
            reason = f"{reason} ({note})"
        decision = Decision(
            t_s=obs.t_s,
            state=machine,
            idle_for_s=timer.idle_for_s,
            action=action,
            reason=reason,
            gpus=verdicts,
            host=obs.host,
            alert=alert,
            sample_error=obs.sample.error,
        )
        return new_state, decision

    def _idle_reason(
        self, state: PolicyState, idle_for_s: float, t_s: float
    ) -> tuple[str, str | None]:
        cfg = self.config
        clock = f"idle {idle_for_s:g}s of {cfg.window_s:g}s window"
        if idle_for_s < cfg.window_s:
            return clock, None
        if t_s < cfg.min_uptime_s:
            return f"{clock}; held: min-uptime, {cfg.min_uptime_s - t_s:g}s left", None
        last = state.last_action_s
        if last is not None and t_s - last < cfg.cooldown_s:
            return f"{clock}; held: cooldown, {cfg.cooldown_s - (t_s - last):g}s left", None
        return f"{clock}; stop due", ACTION_STOP

    def confirm_after_hooks(
        self, state: PolicyState, obs: Observation
    ) -> tuple[PolicyState, Decision]:
        """The last word before the main action, after the hooks ran.

        Args:
            state: the state after :meth:`record_action` (taken before the hooks).
            obs: a fresh observation taken after the hooks finished.

        Returns:
            ``(new_state, decision)``: ``decision.action == "stop"`` when ``obs`` is
            idle (the action proceeds), else ``None`` (the action is aborted).
        """
        machine, _, why = self.classify(state, obs)
        new_state, decision = self.step(state, obs)
        if machine is State.IDLE:
            reason = f"re-check after hooks: still idle ({'; '.join(why[:1])}); stop proceeds"
            return new_state, replace(decision, action=ACTION_STOP, reason=reason)
        reason = f"re-check after hooks found {machine.value}: stop aborted ({decision.reason})"
        return new_state, replace(decision, action=None, reason=reason)

    def record_action(self, state: PolicyState, t_s: float) -> PolicyState:
        """Record an action at ``t_s``: starts the cooldown and restarts the idle run."""
        timer = replace(state.timer, run_start_s=None, idle_for_s=0.0)
        return replace(state, timer=timer, last_action_s=t_s)
