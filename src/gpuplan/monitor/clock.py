"""Clocks and boot identity: the only places the watch agent reads time.

The policy works on a *monotonic* clock whose zero is boot, so an NTP step
or a time-zone change can never shorten an idle window. :class:`FakeClock`
is public so tests (ours and yours) need no monkeypatching.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class Clock(Protocol):
    """Where the agent gets time from."""

    def monotonic(self) -> float:
        """Seconds since boot, never going backwards."""
        ...

    def wall(self) -> float:
        """Unix time in seconds (only for display and file ages)."""
        ...


class SystemClock:
    """The real clock: ``CLOCK_BOOTTIME`` (counts suspend) where available."""

    def monotonic(self) -> float:
        """Seconds since boot (``CLOCK_BOOTTIME``, else ``time.monotonic``)."""
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        if boottime is not None:
            return time.clock_gettime(boottime)
        return time.monotonic()

    def wall(self) -> float:
        """Unix time in seconds."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to; its :meth:`sleep` advances it.

    Args:
        start_s: initial monotonic time (seconds since the fake boot).
        wall_start_s: initial wall time.

    >>> clock = FakeClock()
    >>> clock.sleep(15)
    >>> clock.monotonic()
    15.0
    """

    def __init__(self, start_s: float = 0.0, wall_start_s: float = 1_700_000_000.0) -> None:
        self._mono = float(start_s)
        self._wall = float(wall_start_s)

    def monotonic(self) -> float:
        """Current fake monotonic time."""
        return self._mono

    def wall(self) -> float:
        """Current fake wall time."""
        return self._wall

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards")
        self._mono += seconds
        self._wall += seconds

    def sleep(self, seconds: float) -> None:
        """Drop-in for ``time.sleep``: advances instead of waiting."""
        self.advance(max(0.0, seconds))


def read_boot_id(path: Path = BOOT_ID_PATH, clock: Clock | None = None) -> str:
    """Return an id that changes at every boot.

    Linux: the kernel's random ``boot_id``. Elsewhere: the boot time (wall
    minus uptime) rounded to 10 s, which is stable within one boot.
    """
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        text = ""
    if text:
        return text
    clk = clock or SystemClock()
    return f"boottime-{round((clk.wall() - clk.monotonic()) / 10) * 10}"


def run_every(
    step: Callable[[], object],
    *,
    interval_s: float,
    clock: Clock,
    sleep: Callable[[float], object],
    max_steps: int | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Call ``step`` every ``interval_s`` (less the step's own time) until ``stop`` or ``max_steps``.

    Returns:
        The number of steps taken.
    """
    steps = 0
    while stop is None or not stop.is_set():
        started = clock.monotonic()
        step()
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
        sleep(max(0.0, interval_s - (clock.monotonic() - started)))
    return steps
