"""The watch loop: sampler -> policy -> (fresh re-check) -> actions, forever.

Time comes only from the injected :class:`~gpuplan.monitor.clock.Clock` and
``sleep``, so tests drive hours of agent time in milliseconds with
:class:`~gpuplan.monitor.clock.FakeClock`. Every step is stored (SQLite) with
the readings behind it; actions are written *before* they run.

**Storage faults never end the watch.** When the state file cannot be written
(locked by another program, disk full, read-only file system), the agent keeps
sampling with its state in memory, buffers the step records (newest
:data:`MAX_PENDING_STEPS`), raises a storage alert (log, ``/metrics``
``gpuplan_watch_storage_alert``, the ``on_storage_alert`` callback that
``watch status`` reads through the lock file) and retries the write at every
step. It never acts while the write-ahead record cannot be written: the action
stays due and is retried once the file is writable again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import Clock, run_every
from gpuplan.monitor.host import HostProbe
from gpuplan.monitor.metrics import WatchMetrics
from gpuplan.monitor.policy import Decision, IdlePolicy, PolicyState
from gpuplan.monitor.readings import GpuSample, HostSignal, Observation, State, to_record
from gpuplan.monitor.samplers import Sampler
from gpuplan.monitor.state import StateStore

log = logging.getLogger("gpuplan.watch")
STORAGE_ERRORS = (sqlite3.Error, OSError)
MAX_PENDING_STEPS = 10_000


def decision_record(decision: Decision, obs: Observation) -> dict[str, Any]:
    """A JSON-ready record of a decision with the readings that led to it."""
    return {
        "t": obs.t_s,
        "state": decision.state.value,
        "idle_for_s": decision.idle_for_s,
        "action": decision.action,
        "reason": decision.reason,
        "alert": decision.alert,
        "gpus": to_record(decision.gpus),
        "host": to_record(decision.host),
        "sample_error": decision.sample_error,
        "readings": to_record(obs.sample.gpus),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """What one loop step did.

    Attributes:
        decision: the final decision (the re-check's, when one was made).
        record: the stored record.
        results: action results (empty unless an action ran).
        rechecked: whether a due decision triggered a fresh re-check.
        aborted: why the action was aborted after its hooks ran (the re-check
            after the hooks found the machine no longer idle), else ``None``.
    """

    decision: Decision
    record: dict[str, Any]
    results: tuple[ActionResult, ...] = ()
    rechecked: bool = False
    aborted: str | None = None


class Agent:
    """The single-machine idle agent.

    Args:
        sampler: where GPU readings come from.
        policy: the idle policy.
        plan: what to run when an action is due.
        clock: monotonic (since boot) and wall time.
        boot_id: this boot's id (the stored state is only reused in the same boot).
        sleep: how to wait between steps (``FakeClock.sleep`` in tests).
        host_probes: optional CPU / heartbeat probes.
        store: SQLite store, or ``None`` to keep nothing on disk.
        metrics: Prometheus metrics, or ``None``.
        execute: really act; otherwise every action is a dry run.
        settings: the effective settings, stored for ``watch status``.
        on_observation: called with every observation (``--record``).
        on_step: called with every step's outcome (``--json`` output).
        on_storage_alert: called with the storage alert text when it is raised or
            changes, and with ``None`` when it clears.
    """

    def __init__(
        self,
        *,
        sampler: Sampler,
        policy: IdlePolicy,
        plan: ActionPlan,
        clock: Clock,
        boot_id: str,
        sleep: Callable[[float], object] = time.sleep,
        host_probes: Sequence[HostProbe] = (),
        store: StateStore | None = None,
        metrics: WatchMetrics | None = None,
        execute: bool = False,
        settings: dict[str, Any] | None = None,
        on_observation: Callable[[Observation], None] | None = None,
        on_step: Callable[[StepOutcome], None] | None = None,
        on_storage_alert: Callable[[str | None], None] | None = None,
    ) -> None:
        self.sampler = sampler
        self.policy = policy
        self.plan = plan
        self.clock = clock
        self.boot_id = boot_id
        self.sleep = sleep
        self.host_probes = tuple(host_probes)
        self.store = store
        self.metrics = metrics
        self.execute = execute
        self.settings = settings or {}
        self.on_observation = on_observation
        self.on_step = on_step
        self.on_storage_alert = on_storage_alert
        self.storage_alert: str | None = None
        self._pending: deque[tuple[float, dict[str, Any]]] = deque(maxlen=MAX_PENDING_STEPS)
        self._pending_finish: list[tuple[int, str, list[dict[str, Any]], str]] = []
        self._unloaded = False
        self._write_ahead_failing = False
        saved = None
        if store is not None:
            try:
                saved = store.load_policy(boot_id)
            except STORAGE_ERRORS as exc:
                self._unloaded = True  # merged in once the file can be read (keeps the cooldown)
                self._storage_failed(exc)
        self.state: PolicyState = saved if saved is not None else policy.initial_state()
        self.resumed = saved is not None
        self._last_state: State | None = None
        self._alerting = False

    def observe(self) -> Observation:
        """Take one observation now (a sampler crash becomes an unknown sample)."""
        t_s = self.clock.monotonic()
        try:
            sample = self.sampler.sample()
        except Exception as exc:  # noqa: BLE001 - a crashing sampler is "unknown", never idle
            sample = GpuSample(
                source="sampler", gpus=(), error=f"sampler crashed: {type(exc).__name__}: {exc}"
            )
        host: list[HostSignal] = []
        for probe in self.host_probes:
            try:
                host.append(probe.probe())
            except Exception as exc:  # noqa: BLE001
                host.append(
                    HostSignal(name="probe", state=State.UNKNOWN, detail=f"probe crashed: {exc}")
                )
        obs = Observation(t_s=t_s, sample=sample, host=tuple(host))
        if self.on_observation is not None:
            self.on_observation(obs)
        return obs

    def step(self) -> StepOutcome:
        """Observe, decide, and (after a fresh re-check) act."""
        obs = self.observe()
        self.state, decision = self.policy.step(self.state, obs)
        record = decision_record(decision, obs)
        results: tuple[ActionResult, ...] = ()
        rechecked = False
        aborted = None
        if decision.action is not None:
            rechecked = True
            self._persist(record)
            fresh = self.observe()
            self.state, confirm = self.policy.step(self.state, fresh)
            first = record
            record = decision_record(confirm, fresh)
            record["recheck_of"] = {"t": first["t"], "reason": first["reason"]}
            decision = confirm
            if confirm.action is None:
                log.warning(
                    "re-check before acting found %s; no action: %s",
                    confirm.state.value,
                    confirm.reason,
                )
            else:
                results, aborted = self._act(confirm, record)
        self._persist(record)
        if self.storage_alert is not None:
            record["storage_alert"] = self.storage_alert
        self._log(decision, record)
        if self.metrics is not None:
            self.metrics.observe(obs.sample, decision, self.clock.wall())
            self.metrics.record_actions(results)
        outcome = StepOutcome(
            decision=decision, record=record, results=results, rechecked=rechecked, aborted=aborted
        )
        if self.on_step is not None:
            self.on_step(outcome)
        return outcome

    def _act(
        self, decision: Decision, record: dict[str, Any]
    ) -> tuple[tuple[ActionResult, ...], str | None]:
        """Write-ahead, run the hooks, re-check, then the main action (or abort).

        Returns:
            The action results and the abort reason (``None`` when not aborted).
        """
        assert decision.action is not None  # noqa: S101 - caller checked
        before = self.state
        self.state = self.policy.record_action(self.state, decision.t_s)
        action_id = None
        if self.store is not None:
            # Write-ahead: a crash from here on cannot cause a second action. No record, no action.
            try:
                self._flush()
                action_id = self.store.begin_action(
                    self.boot_id,
                    decision.t_s,
                    self.clock.wall(),
                    decision.action,
                    execute=self.execute,
                    reason=decision.reason,
                    record=record,
                )
                self._write_ahead_failing = False
                self._storage_ok()
            except STORAGE_ERRORS as exc:
                self.state = before  # still due: retried once the file is writable
                self._write_ahead_failing = True
                self._storage_failed(exc)
                why = f"write-ahead record could not be written ({exc}): {decision.action} held"
                log.error("%s", why)
                record["action"] = None
                record["aborted"] = {"action": decision.action, "reason": why}
                return (), why
        log.warning(
            "%s due (%s): %s; readings: %s",
            decision.action,
            "EXECUTE" if self.execute else "dry run",
            decision.reason,
            json.dumps(record["readings"]),
        )
        ctx = ActionContext(reason=decision.reason, decision=record)
        results = self.plan.run_hooks(ctx, execute=self.execute)
        aborted = None
        if self.plan.has_hooks:
            # The hooks may have run for minutes: one more sample, immediately before acting.
            post = self.observe()
            self.state, after = self.policy.confirm_after_hooks(self.state, post)
            record["after_hooks"] = decision_record(after, post)
            if after.action is None:
                aborted = after.reason
                record["action"] = None
                record["aborted"] = {"action": decision.action, "reason": after.reason}
                log.warning("%s", after.reason)
        if aborted is None:
            results += self.plan.run_main(ctx, execute=self.execute)
        for r in results:
            (log.info if r.ok else log.error)("action %s: %s", r.action, r.detail)
        record["results"] = to_record(results)
        if self.store is not None and action_id is not None:
            if aborted is not None:
                status = "aborted"
            elif not self.execute:
                status = "dry-run"
            else:
                status = "done" if all(r.ok for r in results) else "failed"
            finish = (action_id, status, record["results"], aborted or "")
            try:
                self.store.finish_action(*finish[:3], note=finish[3])
            except STORAGE_ERRORS as exc:
                self._pending_finish.append(finish)
                self._storage_failed(exc)
        return results, aborted

    def _persist(self, record: dict[str, Any]) -> None:
        """Store a step record and the policy state; a failure raises the storage alert."""
        if self.store is None:
            return
        if not self._pending or self._pending[-1][1] is not record:
            self._pending.append((self.clock.wall(), record))
        try:
            self._flush()
        except STORAGE_ERRORS as exc:
            self._storage_failed(exc)

    def _flush(self) -> None:
        """Write everything buffered, then the policy state (raises on a storage fault)."""
        store = self.store
        if store is None:
            return
        if self._unloaded:
            saved = store.load_policy(self.boot_id)
            if saved is not None:
                self.state = _merge_saved(self.state, saved)
            self._unloaded = False
        while self._pending_finish:
            action_id, status, results, note = self._pending_finish[0]
            store.finish_action(action_id, status, results, note=note)
            self._pending_finish.pop(0)
        store.write_steps(
            self.boot_id, list(self._pending), self.state, self.settings, self.clock.wall()
        )
        written = len(self._pending)
        self._pending.clear()
        self._storage_ok(written)

    def _storage_ok(self, written: int = 0) -> None:
        # An action row that could not be written keeps the alert up until one can be.
        if self.storage_alert is not None and not self._write_ahead_failing:
            log.warning(
                "state file writable again: %d buffered step(s) written; alert cleared", written
            )
            self._set_storage_alert(None)

    def _storage_failed(self, exc: BaseException) -> None:
        path = self.store.path if self.store is not None else "?"
        alert = (
            f"state file {path} cannot be written ({type(exc).__name__}: {exc}); "
            "sampling continues in memory, no action until it can be written"
        )
        if alert != self.storage_alert:
            log.error("ALERT %s", alert)
        self._set_storage_alert(alert)

    def _set_storage_alert(self, alert: str | None) -> None:
        changed = alert != self.storage_alert
        self.storage_alert = alert
        if self.metrics is not None:
            self.metrics.storage_alert(alert is not None)
        if changed and self.on_storage_alert is not None:
            self.on_storage_alert(alert)

    def _log(self, decision: Decision, record: dict[str, Any]) -> None:
        changed = decision.state is not self._last_state
        self._last_state = decision.state
        (log.info if changed else log.debug)(
            "%s idle_for=%.0fs: %s; readings: %s",
            decision.state.value,
            decision.idle_for_s,
            decision.reason,
            json.dumps(record["readings"]),
        )
        if decision.alert and not self._alerting:
            log.warning("ALERT %s", decision.alert)
        self._alerting = decision.alert is not None

    def run(self, *, max_steps: int | None = None, stop: threading.Event | None = None) -> int:
        """Loop every ``interval_s`` until ``stop`` is set or ``max_steps`` ran.

        Returns:
            The number of steps taken.
        """
        log.info(
            "watch started (%s, boot %s, %s; plan: %s)",
            "EXECUTE" if self.execute else "dry run",
            self.boot_id,
            "resumed saved state" if self.resumed else "fresh state",
            self.plan.describe(),
        )
        return run_every(
            self.step,
            interval_s=self.policy.config.interval_s,
            clock=self.clock,
            sleep=self.sleep,
            max_steps=max_steps,
            stop=stop,
        )


def _merge_saved(current: PolicyState, saved: PolicyState) -> PolicyState:
    """Keep the later of the two last actions (the cooldown) and every GPU seen."""
    last = [t for t in (current.last_action_s, saved.last_action_s) if t is not None]
    return replace(
        current,
        last_action_s=max(last) if last else None,
        known_gpus=current.known_gpus | saved.known_gpus,
    )
