"""The fleet controller loop: poll -> policy -> re-checks -> drain hook -> removal."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuplan.monitor.actions import ActionContext, ActionPlan, ActionResult
from gpuplan.monitor.clock import Clock, run_every
from gpuplan.monitor.fleet import FleetDecision, FleetObservation, FleetPolicy
from gpuplan.monitor.fleet_journal import FleetJournal
from gpuplan.monitor.readings import to_record

log = logging.getLogger("gpuplan.watch.fleet")


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
        return run_every(
            self.step,
            interval_s=self.policy.config.interval_s,
            clock=self.clock,
            sleep=self.sleep,
            max_steps=max_steps,
            stop=stop,
        )
