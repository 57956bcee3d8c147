"""Optional host signals: CPU load and a heartbeat/lease file.

A probe applies its own threshold and returns a tri-state :class:`HostSignal`.
Busy host signals keep the machine busy (a 12-minute CPU-only preprocessing
phase at 0 % GPU); unknown ones freeze the idle timer like unknown GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gpuplan.errors import MonitorError
from gpuplan.monitor.clock import Clock, SystemClock
from gpuplan.monitor.readings import HostSignal, State


class HostProbe(Protocol):
    """Anything that yields one host signal per observation."""

    def probe(self) -> HostSignal:
        """Read the signal now."""
        ...


class CpuProbe:
    """Whole-host CPU busy percent from ``/proc/stat`` deltas (``top``'s ``%Cpu``).

    The first call has no previous counters and is therefore *unknown*.

    Args:
        busy_pct: at or above this percent the host counts as busy.
        stat_path: the ``/proc/stat`` file (injectable for tests).
    """

    def __init__(self, busy_pct: float, *, stat_path: Path = Path("/proc/stat")) -> None:
        if not 0 < busy_pct <= 100:
            raise MonitorError(f"--cpu-threshold: must be > 0 and <= 100, got {busy_pct:g}")
        self.busy_pct = busy_pct
        self.stat_path = stat_path
        self._prev: tuple[int, int] | None = None

    def _read(self) -> tuple[int, int]:
        first = self.stat_path.read_text(encoding="ascii").splitlines()[0].split()
        if first[0] != "cpu":
            raise ValueError("no aggregate cpu line")
        values = [int(v) for v in first[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values[:8]), idle

    def probe(self) -> HostSignal:
        """CPU busy percent since the previous call."""
        try:
            total, idle = self._read()
        except (OSError, ValueError, IndexError) as exc:
            return HostSignal(
                name="cpu", state=State.UNKNOWN, detail=f"cannot read {self.stat_path}: {exc}"
            )
        prev, self._prev = self._prev, (total, idle)
        if prev is None or total <= prev[0]:
            return HostSignal(
                name="cpu", state=State.UNKNOWN, detail="no previous CPU counters yet"
            )
        busy = 100.0 * (1.0 - (idle - prev[1]) / (total - prev[0]))
        state = State.BUSY if busy >= self.busy_pct else State.IDLE
        sign = ">=" if state is State.BUSY else "<"
        return HostSignal(
            name="cpu", state=state, detail=f"cpu {busy:.0f}% {sign} {self.busy_pct:g}%"
        )


class HeartbeatProbe:
    """A lease file that a training script or a user touches to keep the machine.

    Touched within ``max_age_s`` -> busy. Absent -> idle (nobody holds a lease).
    Unreadable for another reason -> unknown.

    Args:
        path: the file (``touch`` it to hold the machine).
        max_age_s: how long one touch holds the machine, in seconds.
        clock: wall clock source (file times are wall times).
    """

    def __init__(self, path: Path, max_age_s: float, *, clock: Clock | None = None) -> None:
        if max_age_s <= 0:
            raise MonitorError(f"--heartbeat-max-age: must be > 0, got {max_age_s:g}")
        self.path = path
        self.max_age_s = max_age_s
        self.clock = clock or SystemClock()

    def probe(self) -> HostSignal:
        """Age of the heartbeat file against ``max_age_s``."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return HostSignal(name="heartbeat", state=State.IDLE, detail=f"{self.path} absent")
        except OSError as exc:
            return HostSignal(
                name="heartbeat", state=State.UNKNOWN, detail=f"cannot stat {self.path}: {exc}"
            )
        age = self.clock.wall() - mtime
        if age < self.max_age_s:
            return HostSignal(
                name="heartbeat",
                state=State.BUSY,
                detail=f"{self.path} touched {max(age, 0):.0f}s ago",
            )
        return HostSignal(
            name="heartbeat", state=State.IDLE, detail=f"{self.path} last touched {age:.0f}s ago"
        )
