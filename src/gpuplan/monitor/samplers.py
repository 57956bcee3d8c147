"""Samplers: one interface, several sources of per-GPU readings.

* :class:`SmiSampler` runs ``nvidia-smi`` (argv list, bounded time); the default.
* :class:`~gpuplan.monitor.nvml.NvmlSampler` uses NVML through ``nvidia-ml-py``.
* :class:`~gpuplan.monitor.prometheus.PrometheusSampler` queries dcgm-exporter
  metrics from a Prometheus server.
* :class:`FakeSampler` replays scripted samples (public, for tests).

A sampler never raises for a bad reading: failures come back as a
:class:`GpuSample` with ``error`` set or with ``None`` fields, i.e. *unknown*.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpuplan.monitor.proc import run_bounded
from gpuplan.monitor.readings import GpuReading, GpuSample
from gpuplan.monitor.smi_parse import APPS_QUERY_ARGS, GPU_QUERY_ARGS, parse_smi


@runtime_checkable
class Sampler(Protocol):
    """Anything that can take one sample of every GPU on this machine."""

    def sample(self) -> GpuSample:
        """Take one sample; failures are reported inside the sample, not raised."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RawSmi:
    """The raw outputs of the two nvidia-smi queries: one replay line without ``t``.

    Attributes:
        gpu: stdout of the ``--query-gpu`` command, ``None`` if it timed out.
        gpu_exit: its exit status (-1 when it timed out or could not start).
        apps: stdout of the ``--query-compute-apps`` command, ``None`` if it timed out.
        apps_exit: its exit status (-1 when it timed out or could not start).
    """

    gpu: str | None
    gpu_exit: int
    apps: str | None
    apps_exit: int


class SmiSampler:
    """Sample with the ``nvidia-smi`` command.

    Runs (argv lists, never a shell)::

        nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw \
                   --format=csv,noheader,nounits
        nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits

    Each call is bounded by ``timeout_s``. A timeout is *unknown*, never idle
    (nvidia-smi is slowest when GPUs are busiest). If a killed nvidia-smi does
    not die (uninterruptible sleep), later samples fail fast while it lives
    instead of piling up hung processes.

    Args:
        command: the nvidia-smi program, as an argv prefix (e.g. ``["nvidia-smi"]``).
        timeout_s: bound for each of the two commands, in seconds.
        on_raw: called with the raw outputs of every sample (used by ``--record``).
    """

    def __init__(
        self,
        command: Sequence[str] = ("nvidia-smi",),
        *,
        timeout_s: float = 10.0,
        on_raw: Callable[[RawSmi], None] | None = None,
    ) -> None:
        self.command = tuple(command)
        self.timeout_s = timeout_s
        self.on_raw = on_raw
        self.last_raw: RawSmi | None = None
        self._hung: subprocess.Popen[str] | None = None

    def _run(self, args: Sequence[str]) -> tuple[str | None, int, str | None]:
        if self._hung is not None:
            if self._hung.poll() is None:
                return None, -1, f"an earlier nvidia-smi (pid {self._hung.pid}) is still hung"
            self._hung = None
        result, abandoned = run_bounded([*self.command, *args], self.timeout_s)
        if abandoned is not None:
            self._hung = abandoned
        if result.error is not None:
            return None, -1, result.error
        code = result.exit_code if result.exit_code is not None else -1
        return result.stdout, code, None

    def sample_raw(self) -> tuple[RawSmi, str | None]:
        """Run both queries; return the raw outputs and why, if one failed to run."""
        gpu, gpu_exit, gpu_err = self._run(GPU_QUERY_ARGS)
        if gpu is None:
            # No point querying processes when the GPU query already hung.
            raw = RawSmi(gpu=None, gpu_exit=gpu_exit, apps=None, apps_exit=-1)
            return raw, gpu_err
        apps, apps_exit, apps_err = self._run(APPS_QUERY_ARGS)
        return RawSmi(gpu=gpu, gpu_exit=gpu_exit, apps=apps, apps_exit=apps_exit), apps_err

    def sample(self) -> GpuSample:
        """Take one sample through :func:`~gpuplan.monitor.smi_parse.parse_smi`."""
        raw, run_error = self.sample_raw()
        self.last_raw = raw
        if self.on_raw is not None:
            self.on_raw(raw)
        sample = parse_smi(raw.gpu, raw.gpu_exit, raw.apps, raw.apps_exit)
        if raw.gpu is None and run_error:
            return GpuSample(source=sample.source, gpus=(), error=f"nvidia-smi: {run_error}")
        return sample


class FakeSampler:
    """A scripted sampler for tests and demos (public, like ``httpx.MockTransport``).

    Args:
        samples: samples returned in order; the last one repeats when exhausted
            unless ``repeat_last`` is false (then :class:`IndexError`).
        repeat_last: keep returning the last sample.

    >>> s = FakeSampler([idle_gpus(2)])
    >>> [g.utilization_pct for g in s.sample().gpus]
    [0.0, 0.0]
    """

    def __init__(self, samples: Iterable[GpuSample], *, repeat_last: bool = True) -> None:
        self._samples = list(samples)
        if not self._samples:
            raise ValueError("FakeSampler needs at least one sample")
        self._next = 0
        self.repeat_last = repeat_last
        self.calls = 0

    def push(self, *samples: GpuSample) -> None:
        """Append samples to the script."""
        self._samples.extend(samples)

    def sample(self) -> GpuSample:
        """Return the next scripted sample."""
        self.calls += 1
        if self._next >= len(self._samples):
            if not self.repeat_last:
                raise IndexError("FakeSampler script exhausted")
            return self._samples[-1]
        sample = self._samples[self._next]
        self._next += 1
        return sample


def fake_gpu(
    n: int,
    utilization_pct: float | None = 0.0,
    *,
    pids: Sequence[int] = (),
    memory_used_mib: float = 0.0,
) -> GpuReading:
    """A GPU reading for tests: GPU number ``n`` with given utilization and processes."""
    from gpuplan.monitor.readings import ComputeProcess

    uuid = f"GPU-{n:08d}-0000-0000-0000-000000000000"
    return GpuReading(
        uuid=uuid,
        index=n,
        utilization_pct=utilization_pct,
        memory_used_mib=memory_used_mib,
        memory_total_mib=81559.0,
        power_w=70.0,
        processes=tuple(ComputeProcess(gpu_uuid=uuid, pid=p, used_memory_mib=100.0) for p in pids),
        problem=None if utilization_pct is not None else "utilization.gpu=[N/A]",
    )


def idle_gpus(count: int) -> GpuSample:
    """A sample of ``count`` idle GPUs (0 %, no processes)."""
    return GpuSample(source="fake", gpus=tuple(fake_gpu(i) for i in range(count)))


def busy_gpus(count: int, busy: Sequence[int], utilization_pct: float = 95.0) -> GpuSample:
    """A sample of ``count`` GPUs where the indices in ``busy`` run at ``utilization_pct``."""
    return GpuSample(
        source="fake",
        gpus=tuple(fake_gpu(i, utilization_pct if i in busy else 0.0) for i in range(count)),
    )


def failed_sample(error: str) -> GpuSample:
    """A whole-sample failure (timeout, driver error...)."""
    return GpuSample(source="fake", gpus=(), error=error)
