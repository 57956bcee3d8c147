"""Build a ready-to-run single-machine agent from raw option values.

This is the wiring behind ``gpuplan watch``: the CLI parses nothing itself,
it passes the flag/config-file values here and runs the :class:`AgentRun`
it gets back. Everything that must fail at start-up (a bad option, an
unreachable instance metadata service with ``--execute``, a second agent on
the same state file) fails here, before the first sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.clock import SystemClock, read_boot_id
from gpuplan.monitor.config import (
    boolean,
    build_plan,
    build_probes,
    build_sampler,
    default_state_path,
    integer,
    policy_config,
    port,
)
from gpuplan.monitor.daemon import Agent, StepOutcome
from gpuplan.monitor.lock import StateLock
from gpuplan.monitor.metrics import WatchMetrics
from gpuplan.monitor.policy import IdlePolicy
from gpuplan.monitor.recorder import ReplayRecorder
from gpuplan.monitor.state import StateStore


@dataclass(slots=True, kw_only=True)
class AgentRun:
    """An agent with the resources it holds open (close them with :meth:`close`).

    Attributes:
        agent: the agent to run.
        max_steps: ``--max-steps`` (``None`` = until stopped).
        store: the state store.
        recorder: the ``--record`` writer, if any.
        closers: further clean-ups, run in reverse order.
    """

    agent: Agent
    max_steps: int | None
    store: StateStore
    recorder: ReplayRecorder | None = None
    closers: list[Callable[[], object]] = field(default_factory=list)

    def close(self) -> None:
        """Close the recorder and the store, then release the state lock."""
        if self.recorder is not None:
            self.recorder.close()
        self.store.close()
        for close in reversed(self.closers):
            close()


def state_path(raw: Mapping[str, Any]) -> Path:
    """The ``--state`` file (or the default one)."""
    return Path(str(raw["state"])) if raw.get("state") else default_state_path()


def open_agent(
    raw: Mapping[str, Any],
    *,
    sleep: Callable[[float], object],
    on_step: Callable[[StepOutcome], None] | None = None,
) -> AgentRun:
    """Validate every option and build the agent (nothing is sampled yet).

    Args:
        raw: option values keyed by flag name (see ``config.DAEMON_DEFAULTS``).
        sleep: how the agent waits between steps (an event's ``wait`` for clean stops).
        on_step: called with each step's outcome (``--json``).

    Raises:
        MonitorError: any invalid option, or a resource that cannot be opened.
    """
    execute = boolean(raw["execute"], "--execute")
    clock = SystemClock()
    policy = IdlePolicy(policy_config(raw))
    sampler = build_sampler(raw)
    probes = build_probes(raw, clock)
    plan = build_plan(raw)
    if execute and plan.main is None and plan.notify is None:
        raise MonitorError(
            "--execute: no action configured",
            hint="add --command, --aws, --alibaba, --tencent or --webhook",
        )
    main = plan.main
    if execute and main is not None and hasattr(main, "resolve"):
        main.resolve()  # fail now, not at stop time, when instance metadata is unreachable
    max_steps = (
        None if raw.get("max-steps") is None else integer(raw["max-steps"], "--max-steps", low=1)
    )
    metrics_port = (
        None if raw.get("metrics-port") is None else port(raw["metrics-port"], "--metrics-port")
    )
    recorder = ReplayRecorder(Path(str(raw["record"])), sampler) if raw.get("record") else None
    path = state_path(raw)
    try:
        lock = StateLock(path).acquire()
    except BaseException:
        if recorder is not None:
            recorder.close()
        raise  # one agent per state file, before the database is opened
    try:
        # A lock held by another program must not stall sampling for long: wait at most a
        # third of an interval per write, then raise the storage alert and retry next step.
        wait_s = min(10.0, max(0.1, policy.config.interval_s / 3))
        store = StateStore(path, timeout_s=wait_s)
    except BaseException:
        lock.release()
        if recorder is not None:
            recorder.close()
        raise
    closers: list[Callable[[], object]] = [lock.release]
    try:
        metrics = None
        if metrics_port is not None:
            metrics = WatchMetrics(policy.config.window_s)
            metrics.serve(metrics_port, str(raw["metrics-addr"]))
        settings = {k: v for k, v in raw.items() if k not in ("webhook",)}
        agent = Agent(
            sampler=sampler,
            policy=policy,
            plan=plan,
            clock=clock,
            boot_id=read_boot_id(),
            sleep=sleep,
            host_probes=probes,
            store=store,
            metrics=metrics,
            execute=execute,
            settings=settings,
            on_observation=recorder,
            on_step=on_step,
            on_storage_alert=lock.note,
        )
    except BaseException:
        store.close()
        lock.release()
        if recorder is not None:
            recorder.close()
        raise
    return AgentRun(
        agent=agent, max_steps=max_steps, store=store, recorder=recorder, closers=closers
    )
