"""NVML sampler through ``nvidia-ml-py`` (module ``pynvml``, extra ``monitor``).

Per GPU it reads (nvidia-smi equivalents in brackets):

* ``nvmlDeviceGetUUID`` [``uuid``], the key;
* ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen)``, the
  driver's buffered utilization samples since the previous poll, and
  ``nvmlDeviceGetUtilizationRates().gpu`` [``utilization.gpu``]; the *maximum*
  is used, so a short kernel burst between two polls still counts as busy;
* ``nvmlDeviceGetMemoryInfo`` [``memory.used``/``memory.total``] in bytes -> MiB;
* ``nvmlDeviceGetPowerUsage`` [``power.draw``] in mW -> W;
* ``nvmlDeviceGetComputeRunningProcesses`` [``--query-compute-apps``].

Every ``NVMLError_*`` (``NotSupported`` under MIG, ``GpuIsLost``, ``Unknown``...)
turns the affected field into *unknown*. An in-process NVML call cannot be
killed, so each sample runs in a worker thread bounded by ``timeout_s``; while
a timed-out call is still stuck, later samples fail fast as unknown.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.readings import ComputeProcess, GpuReading, GpuSample

MIB = 2**20
_LIFECYCLE_ERRORS = frozenset(
    {
        "NVMLError_GpuIsLost",
        "NVMLError_Uninitialized",
        "NVMLError_DriverNotLoaded",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_GpuNotFound",
    }
)


def load_pynvml() -> Any:
    """Import ``pynvml`` or raise a :class:`MonitorError` with the install hint."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise MonitorError(
            "the NVML sampler needs nvidia-ml-py, which is not installed",
            hint="pip install 'gpuplan[monitor]', or use --sampler smi",
        ) from exc


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class NvmlSampler:
    """Sample through NVML.

    Args:
        nvml: the ``pynvml`` module, or a fake with the same functions (tests).
        timeout_s: bound for one whole sample, in seconds.
    """

    def __init__(self, nvml: Any | None = None, *, timeout_s: float = 10.0) -> None:
        self.nvml = nvml if nvml is not None else load_pynvml()
        self.timeout_s = timeout_s
        self._initialized = False
        self._last_seen_us: dict[str, int] = {}
        self._worker: threading.Thread | None = None

    def sample(self) -> GpuSample:
        """Take one bounded sample; a stuck NVML call makes it unknown."""
        if self._worker is not None and self._worker.is_alive():
            return GpuSample(source="nvml", gpus=(), error="an earlier NVML call is still hung")
        box: list[GpuSample] = []

        def work() -> None:
            box.append(self._collect())

        worker = threading.Thread(target=work, name="gpuplan-nvml", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive() or not box:
            self._worker = worker
            return GpuSample(
                source="nvml", gpus=(), error=f"NVML did not answer within {self.timeout_s:g}s"
            )
        return box[0]

    def _collect(self) -> GpuSample:
        nv = self.nvml
        try:
            if not self._initialized:
                nv.nvmlInit()
                self._initialized = True
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001 - every NVML failure is "unknown"
            self._initialized = False
            return GpuSample(source="nvml", gpus=(), error=f"NVML init failed: {_err(exc)}")
        readings: list[GpuReading] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nv.nvmlDeviceGetUUID(handle)
            except Exception as exc:  # noqa: BLE001
                if type(exc).__name__ in _LIFECYCLE_ERRORS:
                    self._initialized = False
                return GpuSample(source="nvml", gpus=(), error=f"GPU {index}: {_err(exc)}")
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            readings.append(self._device(handle, uuid, index))
        return GpuSample(source="nvml", gpus=tuple(readings))

    def _device(self, handle: Any, uuid: str, index: int) -> GpuReading:
        nv = self.nvml
        problems: list[str] = []
        util = self._utilization(handle, uuid, problems)
        used = total = power = None
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            used, total = mem.used / MIB, mem.total / MIB
        except Exception as exc:  # noqa: BLE001
            problems.append(f"memory: {_err(exc)}")
        try:
            power = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception as exc:  # noqa: BLE001
            problems.append(f"power: {_err(exc)}")
        processes: tuple[ComputeProcess, ...] | None
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            processes = tuple(
                ComputeProcess(
                    gpu_uuid=uuid,
                    pid=int(p.pid),
                    used_memory_mib=(
                        None if getattr(p, "usedGpuMemory", None) is None else p.usedGpuMemory / MIB
                    ),
                )
                for p in procs
            )
        except Exception as exc:  # noqa: BLE001
            processes = None
            problems.append(f"processes: {_err(exc)}")
        return GpuReading(
            uuid=uuid,
            index=index,
            utilization_pct=util,
            memory_used_mib=used,
            memory_total_mib=total,
            power_w=power,
            processes=processes,
            problem="; ".join(problems) or None,
        )

    def _utilization(self, handle: Any, uuid: str, problems: list[str]) -> float | None:
        nv = self.nvml
        try:
            current = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"utilization: {_err(exc)}")
            return None
        values = [current]
        try:
            _, samples = nv.nvmlDeviceGetSamples(
                handle, nv.NVML_GPU_UTILIZATION_SAMPLES, self._last_seen_us.get(uuid, 0)
            )
            for s in samples:
                values.append(float(s.sampleValue.uiVal))
                self._last_seen_us[uuid] = max(self._last_seen_us.get(uuid, 0), int(s.timeStamp))
        except Exception:  # noqa: BLE001, S110 - NotFound = no new samples; current stands
            pass
        if not all(0.0 <= v <= 100.0 for v in values):
            problems.append(f"utilization out of range: {values}")
            return None
        return max(values)
