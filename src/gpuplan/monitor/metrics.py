"""Prometheus ``/metrics`` for the watch agent (``prometheus-client``, extra ``monitor``).

Series (all prefixed ``gpuplan_watch_``):

* ``gpu_utilization_percent{uuid}``: last utilization (absent while unknown);
* ``gpu_state{uuid,state}``: 1 for the GPU's current verdict, else 0;
* ``state{state}``: 1 for the machine's current state, else 0;
* ``idle_seconds`` / ``window_seconds``: the idle clock and its target;
* ``unknown_alert``: 1 while an unknown-too-long alert is raised;
* ``storage_alert``: 1 while the state file cannot be written (no action then);
* ``decisions_total{action}``: due decisions (``stop``/``scale-in``) seen;
* ``actions_total{action,executed,ok}``: action steps run;
* ``last_observation_timestamp_seconds``: wall time of the last observation.

A private registry is used, never the process-global one.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.actions import ActionResult
from gpuplan.monitor.policy import Decision
from gpuplan.monitor.readings import GpuSample, State


def _client() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise MonitorError(
            "--metrics-port needs prometheus-client, which is not installed",
            hint="pip install 'gpuplan[monitor]'",
        ) from exc


class WatchMetrics:
    """The agent's metrics in a private registry.

    Args:
        window_s: the policy window, exported as ``window_seconds``.
    """

    def __init__(self, window_s: float) -> None:
        pc = _client()
        self._pc = pc
        self.registry = pc.CollectorRegistry()
        reg = self.registry
        p = "gpuplan_watch_"
        self.util = pc.Gauge(
            p + "gpu_utilization_percent", "GPU utilization.gpu (%)", ["uuid"], registry=reg
        )
        self.gpu_state = pc.Gauge(
            p + "gpu_state", "1 for the GPU's current verdict", ["uuid", "state"], registry=reg
        )
        self.state = pc.Gauge(
            p + "state", "1 for the machine's current state", ["state"], registry=reg
        )
        self.idle = pc.Gauge(p + "idle_seconds", "Current idle clock (s)", registry=reg)
        self.window = pc.Gauge(p + "window_seconds", "Idle window before acting (s)", registry=reg)
        self.alert = pc.Gauge(
            p + "unknown_alert", "1 while readings were unknown too long", registry=reg
        )
        self.storage = pc.Gauge(
            p + "storage_alert",
            "1 while the state file cannot be written (no action is taken then)",
            registry=reg,
        )
        self.decisions = pc.Counter(
            p + "decisions", "Decisions with an action due", ["action"], registry=reg
        )
        self.actions = pc.Counter(
            p + "actions", "Action steps run", ["action", "executed", "ok"], registry=reg
        )
        self.last = pc.Gauge(
            p + "last_observation_timestamp_seconds",
            "Wall time of the last observation",
            registry=reg,
        )
        self.window.set(window_s)
        self._uuids: set[str] = set()
        self._with_util: set[str] = set()

    def observe(self, sample: GpuSample, decision: Decision, wall: float) -> None:
        """Update the gauges from one step."""
        for s in State:
            self.state.labels(state=s.value).set(1.0 if decision.state is s else 0.0)
        self.idle.set(decision.idle_for_s)
        self.alert.set(1.0 if decision.alert else 0.0)
        self.last.set(wall)
        seen = set()
        for g in sample.gpus:
            seen.add(g.uuid)
            if g.utilization_pct is not None:
                self.util.labels(uuid=g.uuid).set(g.utilization_pct)
                self._with_util.add(g.uuid)
        for uuid in self._with_util - {
            g.uuid for g in sample.gpus if g.utilization_pct is not None
        }:
            self.util.remove(uuid)
            self._with_util.discard(uuid)
        verdicts = {v.uuid: v.state for v in decision.gpus}
        for uuid in seen | self._uuids:
            for s in State:
                current = verdicts.get(uuid, State.UNKNOWN)
                self.gpu_state.labels(uuid=uuid, state=s.value).set(1.0 if current is s else 0.0)
        self._uuids |= seen
        if decision.action:
            self.decisions.labels(action=decision.action).inc()

    def storage_alert(self, failing: bool) -> None:
        """Raise or clear the storage alert."""
        self.storage.set(1.0 if failing else 0.0)

    def record_actions(self, results: tuple[ActionResult, ...]) -> None:
        """Count action steps."""
        for r in results:
            self.actions.labels(
                action=r.action, executed=str(r.executed).lower(), ok=str(r.ok).lower()
            ).inc()

    def render(self) -> bytes:
        """The exposition text (what ``/metrics`` serves)."""
        return bytes(self._pc.generate_latest(self.registry))

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Start the ``/metrics`` HTTP server in a daemon thread; return the server."""
        try:
            result = self._pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise MonitorError(f"--metrics-port: cannot listen on {addr}:{port}: {exc}") from exc
        return result
