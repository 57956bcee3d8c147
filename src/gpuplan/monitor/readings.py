"""Readings: what a sampler saw, per GPU and per host signal, in tri-state form.

Every reading is keyed by GPU UUID (``index`` can change at each boot) and
every value that could not be read is ``None`` with a ``problem`` saying why.
``None`` means *unknown*; it is never read as 0 and never counts as idle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class State(str, Enum):
    """Tri-state verdict for a GPU, a host signal or the whole machine."""

    BUSY = "busy"
    IDLE = "idle"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeProcess:
    """One compute process on a GPU.

    ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory`` equivalent.

    Attributes:
        gpu_uuid: UUID of the physical GPU the process runs on.
        pid: process id as the driver reports it (a *host* PID inside containers).
        used_memory_mib: device memory held by the process in MiB; ``None`` when the
            driver prints ``[N/A]`` or ``[Insufficient Permissions]`` (the process
            still exists and still counts).
    """

    gpu_uuid: str
    pid: int
    used_memory_mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReading:
    """One GPU (or one MIG instance, for Prometheus profiling metrics) at one instant.

    Attributes:
        uuid: the stable key (``GPU-...``; ``GPU-.../GI<n>`` for a MIG instance).
        utilization_pct: ``utilization.gpu`` in percent (0-100); ``None`` = unknown.
        index: ``index`` as printed; only for display, never a key.
        memory_used_mib: ``memory.used`` in MiB; ``None`` = unknown.
        memory_total_mib: ``memory.total`` in MiB; ``None`` = unknown.
        power_w: ``power.draw`` in W; ``None`` = unknown.
        processes: compute processes on this GPU; ``()`` = none, ``None`` = unknown
            (the process query failed or the source has no process list).
        problem: why a field is unknown (first causes, ``; ``-joined), else ``None``.
    """

    uuid: str
    utilization_pct: float | None
    index: int | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    processes: tuple[ComputeProcess, ...] | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    """Everything one sampler call returned.

    Attributes:
        source: which sampler produced it (``nvidia-smi``, ``nvml``, ``prometheus``...).
        gpus: per-GPU readings; may be empty when ``error`` is set.
        error: a whole-sample failure (timeout, non-zero exit, driver error text,
            unparseable output); the whole sample then counts as unknown.
    """

    source: str
    gpus: tuple[GpuReading, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSignal:
    """An optional host-level signal (CPU load, a heartbeat/lease file).

    Attributes:
        name: ``cpu`` or ``heartbeat``.
        state: the probe's verdict with its own threshold applied.
        detail: the value behind the verdict, for logs ("cpu 73% >= 50%").
    """

    name: str
    state: State
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One timestamped input to the idle policy.

    Attributes:
        t_s: seconds on a monotonic clock whose zero is boot (``CLOCK_BOOTTIME``
            in the daemon; the recorded ``t`` in replay).
        sample: the GPU sample taken at ``t_s``.
        host: host signals taken at the same time.
    """

    t_s: float
    sample: GpuSample
    host: tuple[HostSignal, ...] = ()


def to_record(obj: Any) -> Any:
    """Turn readings (dataclasses, enums, tuples) into JSON-ready values.

    >>> to_record(State.IDLE)
    'idle'
    """
    if isinstance(obj, Enum):
        return obj.value
    if hasattr(obj, "__dataclass_fields__"):
        return {k: to_record(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_record(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, frozenset, set)):
        return [to_record(v) for v in obj]
    return obj
