"""Parse ``nvidia-smi`` CSV query output; every odd value becomes *unknown*.

The agent runs exactly two queries (the replay contract records their raw
stdout)::

    nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw \
               --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits

Format facts (``shared/reference/nvidia-smi-samples/README.md``): cells are
joined by ``", "``; ``nounits`` strips ``%``/``MiB``/``W`` from numbers but not
the bracketed tokens ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``,
``[Insufficient Permissions]``...; some fields print a bare ``N/A``. Whole-command
failures print prose ("GPU is lost", "couldn't communicate with the NVIDIA
driver", "Driver/library version mismatch"). None of these is ever a number.
The parser also accepts a header line and unit suffixes so that captures made
with ``--format=csv`` parse the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuplan.monitor.readings import ComputeProcess, GpuReading, GpuSample

GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
)
APPS_QUERY_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")
GPU_QUERY_ARGS: tuple[str, ...] = (
    "--query-gpu=" + ",".join(GPU_QUERY_FIELDS),
    "--format=csv,noheader,nounits",
)
APPS_QUERY_ARGS: tuple[str, ...] = (
    "--query-compute-apps=" + ",".join(APPS_QUERY_FIELDS),
    "--format=csv,noheader,nounits",
)

_NUMBER_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(?:\s*(%|MiB|KiB|GiB|W|MHz|C|mW))?$")
_UUID_RE = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z-]+$")
_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")
_KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("gpu is lost", "GPU is lost (fell off the bus; reboot needed)"),
    ("couldn't communicate with the nvidia driver", "cannot reach the NVIDIA driver"),
    ("driver/library version mismatch", "NVML driver/library version mismatch"),
    ("unable to determine the device handle", "cannot get a GPU device handle"),
    ("failed to initialize nvml", "NVML failed to initialize"),
    ("no devices were found", "no GPU devices were found"),
    ("nvmlerror", "NVML error"),
    ("unknown error", "driver reported Unknown Error"),
)
_NO_PROCESSES = "no running processes found"


@dataclass(frozen=True, slots=True)
class Cell:
    """One CSV cell: its text and, if it is a clean number, its value.

    Attributes:
        text: the cell as printed, stripped.
        value: the number (unit suffix removed), or ``None`` when not a number.
    """

    text: str
    value: float | None


def parse_cell(text: str) -> Cell:
    """Parse one cell; bracketed tokens, ``N/A``, blanks and junk give ``value=None``.

    >>> parse_cell("45 %").value
    45.0
    >>> parse_cell("[N/A]").value is None
    True
    >>> parse_cell("nan").value is None
    True
    """
    stripped = text.strip()
    match = _NUMBER_RE.match(stripped)
    return Cell(stripped, float(match.group(1)) if match else None)


def known_failure(text: str) -> str | None:
    """The known driver/NVML failure anywhere in ``text``, with the line that shows it.

    >>> known_failure("Failed to initialize NVML: Driver/library version mismatch")
    "NVML driver/library version mismatch: 'Failed to initialize NVML: Driver/library version mismatch'"
    """
    for needle, reason in _KNOWN_FAILURES:
        for line in text.splitlines():
            if needle in line.lower():
                return f"{reason}: {' '.join(line.split())[:120]!r}"
    return None


def explain_failure(text: str) -> str:
    """Map nvidia-smi/NVML error prose to a short reason (for logs and status).

    >>> explain_failure("Segmentation fault")
    "unparseable output: 'Segmentation fault'"
    """
    known = known_failure(text)
    if known is not None:
        return known
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"unparseable output: {first[:80]!r}" if first else "empty output"


def parse_table(
    text: str, fields: Sequence[str] | None = None
) -> tuple[tuple[dict[str, Cell], ...], str | None]:
    """Split CSV query output into rows of named cells.

    Args:
        text: stdout of an ``nvidia-smi --query-...`` command.
        fields: the queried field names, for ``noheader`` output. ``None`` means the
            first line is a header (``utilization.gpu [%]`` -> ``utilization.gpu``).

    Returns:
        ``(rows, error)``; ``error`` is set (and ``rows`` empty) when any line does
        not have the expected number of cells, so no row is ever misattributed.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            return (), "empty output (no header)"
        fields = [_HEADER_UNIT_RE.sub("", h).strip() for h in lines[0].split(",")]
        lines = lines[1:]
    names = tuple(fields)
    rows: list[dict[str, Cell]] = []
    for number, line in enumerate(lines, start=1):
        cells = line.split(",")
        if len(cells) != len(names):
            reason = known_failure(text) or f"unparseable output: {line.strip()[:80]!r}"
            return (), f"{reason} (line {number}: {len(cells)} cells, expected {len(names)})"
        rows.append({name: parse_cell(cell) for name, cell in zip(names, cells, strict=True)})
    return tuple(rows), None


def _pct(cell: Cell | None, field: str, problems: list[str]) -> float | None:
    if cell is None:
        problems.append(f"{field} not queried")
        return None
    if cell.value is None or not 0.0 <= cell.value <= 100.0:
        problems.append(f"{field}={cell.text or '(blank)'}")
        return None
    return cell.value


def _num(cell: Cell | None, field: str, problems: list[str]) -> float | None:
    if cell is None:
        return None
    if cell.value is None:
        problems.append(f"{field}={cell.text or '(blank)'}")
    return cell.value


def parse_gpu_query(
    stdout: str | None,
    exit_code: int | None,
    *,
    fields: Sequence[str] | None = GPU_QUERY_FIELDS,
) -> tuple[tuple[GpuReading, ...], str | None]:
    """Parse ``--query-gpu`` output into per-GPU readings (processes unset).

    Args:
        stdout: raw stdout; ``None`` when the command timed out.
        exit_code: exit status; non-zero makes the whole sample unknown.
        fields: queried fields for headerless output, ``None`` if there is a header.

    Returns:
        ``(readings, error)``. With ``error`` set the readings are empty and the
        whole sample is unknown: a timeout, a non-zero exit, error prose, no rows,
        a row with a bad or duplicate UUID, or any malformed line.
    """
    if stdout is None:
        return (), "nvidia-smi --query-gpu produced no output (timed out)"
    if exit_code != 0:
        return (), f"nvidia-smi --query-gpu exited {exit_code}: {explain_failure(stdout)}"
    rows, error = parse_table(stdout, fields)
    if error:
        return (), error
    if not rows:
        return (), "nvidia-smi listed no GPUs"
    readings: list[GpuReading] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        uuid_cell = row.get("uuid")
        uuid = uuid_cell.text if uuid_cell else ""
        if not _UUID_RE.match(uuid):
            return (), f"row {number}: uuid={uuid or '(missing)'} is not a GPU UUID"
        if uuid in seen:
            return (), f"row {number}: duplicate uuid {uuid}"
        seen.add(uuid)
        problems: list[str] = []
        index_cell = row.get("index")
        index = (
            int(index_cell.value)
            if index_cell and index_cell.value is not None and index_cell.value.is_integer()
            else None
        )
        readings.append(
            GpuReading(
                uuid=uuid,
                index=index,
                utilization_pct=_pct(row.get("utilization.gpu"), "utilization.gpu", problems),
                memory_used_mib=_num(row.get("memory.used"), "memory.used", problems),
                memory_total_mib=_num(row.get("memory.total"), "memory.total", problems),
                power_w=_num(row.get("power.draw"), "power.draw", problems),
                problem="; ".join(problems) or None,
            )
        )
    return tuple(readings), None


def parse_compute_apps(
    stdout: str | None,
    exit_code: int | None,
    *,
    fields: Sequence[str] | None = APPS_QUERY_FIELDS,
) -> tuple[tuple[ComputeProcess, ...] | None, str | None]:
    """Parse ``--query-compute-apps`` output.

    Args:
        stdout: raw stdout; ``None`` when the command timed out.
        exit_code: exit status.
        fields: queried fields for headerless output, ``None`` if there is a header.

    Returns:
        ``(processes, error)``: ``processes`` is ``()`` when none run and ``None``
        (with ``error``) when the list is unknown. A process whose memory prints
        ``[N/A]``/``[Insufficient Permissions]`` still counts; a bad PID or a bad
        line makes the whole list unknown.
    """
    if stdout is None:
        return None, "nvidia-smi --query-compute-apps produced no output (timed out)"
    if exit_code != 0:
        return (
            None,
            f"nvidia-smi --query-compute-apps exited {exit_code}: {explain_failure(stdout)}",
        )
    if stdout.strip().lower().rstrip(".") == _NO_PROCESSES:
        return (), None
    rows, error = parse_table(stdout, fields)
    if error:
        return None, error
    processes: list[ComputeProcess] = []
    for number, row in enumerate(rows, start=1):
        uuid_cell, pid_cell = row.get("gpu_uuid"), row.get("pid")
        uuid = uuid_cell.text if uuid_cell else ""
        if not _UUID_RE.match(uuid):
            return None, f"process row {number}: gpu_uuid={uuid or '(missing)'} is not a GPU UUID"
        if pid_cell is None or pid_cell.value is None or not pid_cell.value.is_integer():
            return None, f"process row {number}: pid={pid_cell.text if pid_cell else '(missing)'}"
        memory = row.get("used_memory") or row.get("used_gpu_memory")
        processes.append(
            ComputeProcess(
                gpu_uuid=uuid,
                pid=int(pid_cell.value),
                used_memory_mib=memory.value if memory else None,
            )
        )
    return tuple(processes), None


def parse_smi(
    gpu_stdout: str | None,
    gpu_exit: int | None,
    apps_stdout: str | None,
    apps_exit: int | None,
) -> GpuSample:
    """Combine the two raw query outputs into one :class:`GpuSample`.

    This is the one parser the daemon (``SmiSampler``) and ``--replay`` share.
    A GPU's ``processes`` is ``None`` (unknown) when the process query failed;
    a process on a GPU missing from the GPU list makes the whole sample unknown.
    """
    gpus, error = parse_gpu_query(gpu_stdout, gpu_exit)
    if error:
        return GpuSample(source="nvidia-smi", gpus=(), error=error)
    processes, apps_error = parse_compute_apps(apps_stdout, apps_exit)
    if processes is None:
        marked = tuple(
            _with(g, processes=None, extra=f"processes unknown: {apps_error}") for g in gpus
        )
        return GpuSample(source="nvidia-smi", gpus=marked)
    known = {g.uuid for g in gpus}
    stray = sorted({p.gpu_uuid for p in processes} - known)
    if stray:
        return GpuSample(
            source="nvidia-smi",
            gpus=(),
            error=f"compute process on GPU {stray[0]} that --query-gpu did not list",
        )
    by_uuid = {g.uuid: tuple(p for p in processes if p.gpu_uuid == g.uuid) for g in gpus}
    return GpuSample(
        source="nvidia-smi",
        gpus=tuple(_with(g, processes=by_uuid[g.uuid]) for g in gpus),
    )


def _with(
    reading: GpuReading,
    *,
    processes: tuple[ComputeProcess, ...] | None,
    extra: str | None = None,
) -> GpuReading:
    problem = "; ".join(p for p in (reading.problem, extra) if p) or None
    return replace(reading, processes=processes, problem=problem)
