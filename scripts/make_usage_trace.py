"""Write examples/usage-trace.csv: one synthetic week of per-GPU utilization for 8 GPUs.

Deterministic (no randomness): GPUs 0-1 train around the clock; GPUs 2-7 are busy
on weekdays 09:00-19:00 UTC, left up idle until 01:00, and off otherwise. Hourly
samples from Monday 2026-11-02 00:00 UTC. Run: ``python scripts/make_usage_trace.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

START = dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc)
OUT = Path(__file__).resolve().parents[1] / "examples" / "usage-trace.csv"


def utilization(gpu: int, hour: int) -> str:
    """Utilization percent of ``gpu`` in hour ``hour`` of the week; '' when it is off."""
    wobble = (gpu * 7 + hour * 13) % 9  # a fixed 0..8 pattern so the numbers look measured
    if gpu < 2:
        return str(90 + wobble)
    day, h = divmod(hour, 24)
    weekday = day < 5
    if weekday and 9 <= h < 19:
        return str(85 + wobble)
    if (weekday and h >= 19) or (0 < day <= 5 and h < 1):
        return str(wobble % 3)  # up but idle
    return ""


def main() -> None:
    """Write the CSV."""
    lines = ["timestamp," + ",".join(f"gpu{g}" for g in range(8))]
    for hour in range(7 * 24):
        stamp = (START + dt.timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(stamp + "," + ",".join(utilization(g, hour) for g in range(8)))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
