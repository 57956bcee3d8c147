"""``gpuplan watch --replay``: recorded nvidia-smi outputs through the same parser and policy.

Input (contract), one JSON object per line; blank lines are ignored::

    {"t": 0.0, "gpu": "<raw stdout of nvidia-smi --query-gpu=index,uuid,utilization.gpu,
      memory.used,memory.total,power.draw --format=csv,noheader,nounits>" | null,
     "gpu_exit": 0, "apps": "<raw stdout of nvidia-smi --query-compute-apps=gpu_uuid,pid,
      used_memory --format=csv,noheader,nounits>" | null, "apps_exit": 0}

``t`` is seconds on the recorded monotonic clock, whose zero is boot (so
``--min-uptime`` compares against ``t``); it must not decrease. ``null``
output means the command timed out. Any other key, a missing key or a wrong
type is an error naming the line and the key: nothing is silently defaulted.

Output (contract), one JSON object per input line::

    {"t": 0.0, "state": "busy|idle|unknown", "idle_for_s": 0.0, "action": null}

with ``"action": "stop"`` on the line where the agent would act. There is no
fresh re-check in replay (the next recorded line is the next evidence), and
each stop is recorded as if executed (cooldown starts, the idle run restarts).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.policy import Decision, IdlePolicy
from gpuplan.monitor.readings import Observation, State
from gpuplan.monitor.samplers import RawSmi
from gpuplan.monitor.smi_parse import parse_smi

REPLAY_KEYS: tuple[str, ...] = ("t", "gpu", "gpu_exit", "apps", "apps_exit")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayLine:
    """One validated input line.

    Attributes:
        line_no: 1-based line number in the file.
        t_s: the recorded time (seconds since boot on the recorded clock).
        raw: the two raw query outputs.
    """

    line_no: int
    t_s: float
    raw: RawSmi


def _fail(line_no: int, message: str) -> MonitorError:
    return MonitorError(f"replay line {line_no}: {message}")


def _int(obj: dict[str, Any], key: str, line_no: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(line_no, f"{key}: expected an integer exit status, got {value!r}")
    return value


def _text(obj: dict[str, Any], key: str, line_no: int) -> str | None:
    value = obj[key]
    if value is not None and not isinstance(value, str):
        raise _fail(
            line_no,
            f"{key}: expected the raw stdout as a string or null, got {type(value).__name__}",
        )
    return value


def parse_replay_line(text: str, line_no: int) -> ReplayLine:
    """Validate one input line.

    Raises:
        MonitorError: naming the line and the field.
    """
    from gpuplan.errors import GpuPlanError
    from gpuplan.userfile import parse_json

    try:
        obj = parse_json(text, what="", path=None, error=MonitorError)
    except GpuPlanError as exc:
        problem = exc.message.removeprefix(": ").replace("not valid JSON", "not JSON")
        raise _fail(line_no, problem) from None
    if not isinstance(obj, dict):
        raise _fail(line_no, f"expected a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in REPLAY_KEYS:
            raise _fail(line_no, f"unknown key {key!r} (allowed: {', '.join(REPLAY_KEYS)})")
    for key in REPLAY_KEYS:
        if key not in obj:
            raise _fail(line_no, f"missing key {key!r}")
    t = obj["t"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise _fail(line_no, f"t: expected a number of seconds >= 0, got {t!r}")
    raw = RawSmi(
        gpu=_text(obj, "gpu", line_no),
        gpu_exit=_int(obj, "gpu_exit", line_no),
        apps=_text(obj, "apps", line_no),
        apps_exit=_int(obj, "apps_exit", line_no),
    )
    return ReplayLine(line_no=line_no, t_s=float(t), raw=raw)


def read_replay(lines: Iterable[str]) -> list[ReplayLine]:
    """Validate every line (all or nothing) and check that ``t`` never decreases."""
    out: list[ReplayLine] = []
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        line = parse_replay_line(text, line_no)
        if out and line.t_s < out[-1].t_s:
            raise _fail(
                line_no, f"t: {line.t_s:g} is earlier than the previous line's {out[-1].t_s:g}"
            )
        out.append(line)
    return out


def load_replay(path: Path) -> list[ReplayLine]:
    """Read and validate a replay file."""
    from gpuplan.userfile import read_text

    lines = read_replay(read_text(path, what="--replay", error=MonitorError).splitlines())
    if not lines:
        raise MonitorError(f"--replay: {path}: no lines to replay")
    return lines


def run_replay(
    lines: Iterable[ReplayLine], policy: IdlePolicy
) -> Iterator[tuple[ReplayLine, Decision]]:
    """Feed lines through :func:`parse_smi` and the policy, on the recorded clock."""
    state = policy.initial_state()
    for line in lines:
        sample = parse_smi(line.raw.gpu, line.raw.gpu_exit, line.raw.apps, line.raw.apps_exit)
        state, decision = policy.step(state, Observation(t_s=line.t_s, sample=sample))
        if decision.action is not None:
            state = policy.record_action(state, line.t_s)
        yield line, decision


def contract_record(decision: Decision) -> dict[str, Any]:
    """The output object for one line: exactly ``t``, ``state``, ``idle_for_s``, ``action``."""
    return {
        "t": float(decision.t_s),
        "state": decision.state.value,
        "idle_for_s": round(float(decision.idle_for_s), 6),
        "action": decision.action,
    }


def cadence_warning(lines: list[ReplayLine], policy: IdlePolicy) -> str | None:
    """A warning when the recording's cadence exceeds the gap the policy tolerates."""
    gaps = [b.t_s - a.t_s for a, b in zip(lines, lines[1:], strict=False)]
    if not gaps:
        return None
    median = statistics.median(gaps)
    limit = policy.config.effective_max_gap_s
    if median > limit:
        return (
            f"recorded interval ~{median:g}s exceeds the {limit:g}s gap the policy accepts "
            f"(3 x --interval): every gap restarts the idle run; pass --interval {median:g}s"
        )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Savings:
    """What the policy would have saved on a trace (``--savings``).

    A stop is assumed to keep the machine off until the next *busy* line (the
    user came back and restarted it) or the end of the trace; overlapping
    off-periods are counted once.

    Attributes:
        trace_hours: time covered by the trace.
        idle_hours: time between consecutive idle lines.
        stops: number of stop decisions.
        resumed_after_stop: busy lines that ended an off-period (a restart was needed).
        saved_hours: machine hours not billed.
        price_per_hour: the price used.
        saved_money: ``saved_hours * price_per_hour``.
    """

    trace_hours: float
    idle_hours: float
    stops: int
    resumed_after_stop: int
    saved_hours: float
    price_per_hour: float
    saved_money: float


def compute_savings(results: list[tuple[ReplayLine, Decision]], price_per_hour: float) -> Savings:
    """Savings of the decisions from :func:`run_replay` at ``price_per_hour``."""
    if not math.isfinite(price_per_hour) or price_per_hour < 0:
        raise MonitorError(f"--price-per-hour: must be a number >= 0, got {price_per_hour:g}")
    if not results:
        return Savings(
            trace_hours=0,
            idle_hours=0,
            stops=0,
            resumed_after_stop=0,
            saved_hours=0,
            price_per_hour=price_per_hour,
            saved_money=0,
        )
    times = [d.t_s for _, d in results]
    states = [d.state for _, d in results]
    idle_s = sum(
        b - a
        for a, b, s, s2 in zip(times, times[1:], states, states[1:], strict=False)
        if s is State.IDLE and s2 is State.IDLE
    )
    intervals: list[tuple[float, float]] = []
    resumes: set[int] = set()
    for i, (_, d) in enumerate(results):
        if d.action is None:
            continue
        nxt = next((j for j in range(i + 1, len(results)) if states[j] is State.BUSY), None)
        if nxt is not None:
            resumes.add(nxt)
        intervals.append((d.t_s, times[-1] if nxt is None else times[nxt]))
    saved_s = 0.0
    covered_to = -math.inf
    for start, end in sorted(intervals):  # union of the off-periods
        saved_s += max(0.0, end - max(start, covered_to))
        covered_to = max(covered_to, end)
    hours = saved_s / 3600.0
    return Savings(
        trace_hours=round((times[-1] - times[0]) / 3600.0, 6),
        idle_hours=round(idle_s / 3600.0, 6),
        stops=len(intervals),
        resumed_after_stop=len(resumes),
        saved_hours=round(hours, 6),
        price_per_hour=price_per_hour,
        saved_money=round(hours * price_per_hour, 4),
    )
