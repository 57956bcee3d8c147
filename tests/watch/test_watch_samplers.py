"""Samplers: nvidia-smi through a real subprocess (incl. a hang), NVML through a fake module,
host probes, and the fakes themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from watch_helpers import DATA, gpu_csv, uuid

from gpuplan.errors import MonitorError
from gpuplan.monitor.clock import FakeClock, SystemClock, read_boot_id
from gpuplan.monitor.host import CpuProbe, HeartbeatProbe
from gpuplan.monitor.nvml import NvmlSampler
from gpuplan.monitor.proc import run_bounded
from gpuplan.monitor.readings import State
from gpuplan.monitor.samplers import FakeSampler, RawSmi, Sampler, SmiSampler, idle_gpus
from gpuplan.monitor.smi_parse import APPS_QUERY_ARGS, GPU_QUERY_ARGS

FAKE_SMI = DATA / "fake_nvidia_smi.py"


def smi_sampler(tmp_path: Path, timeout_s: float = 5.0, **script: Any) -> tuple[SmiSampler, Path]:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {"gpu": gpu_csv([0.0, 40.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0, **script}
        )
    )
    return SmiSampler([sys.executable, str(FAKE_SMI), str(path)], timeout_s=timeout_s), path


def test_smi_sampler_runs_the_two_queries_as_argv(tmp_path: Path) -> None:
    raws: list[RawSmi] = []
    sampler, script = smi_sampler(tmp_path, apps=f"{uuid(1)}, 77, 10\n")
    sampler.on_raw = raws.append
    assert isinstance(sampler, Sampler)
    sample = sampler.sample()
    assert sample.error is None
    assert [g.utilization_pct for g in sample.gpus] == [0.0, 40.0]
    assert sample.gpus[1].processes and sample.gpus[1].processes[0].pid == 77
    calls = [json.loads(line) for line in Path(str(script) + ".calls").read_text().splitlines()]
    assert calls == [list(GPU_QUERY_ARGS), list(APPS_QUERY_ARGS)]
    assert raws and raws[0].gpu == gpu_csv([0.0, 40.0]) and raws[0].apps_exit == 0


def test_smi_sampler_hung_nvidia_smi_times_out_to_unknown(tmp_path: Path) -> None:
    sampler, _ = smi_sampler(tmp_path, timeout_s=0.3, sleep_gpu=30)
    started = time.monotonic()
    sample = sampler.sample()
    assert time.monotonic() - started < 5
    assert sample.gpus == () and sample.error is not None and "timed out" in sample.error
    assert sampler.last_raw == RawSmi(gpu=None, gpu_exit=-1, apps=None, apps_exit=-1)


def test_smi_sampler_apps_hang_makes_processes_unknown(tmp_path: Path) -> None:
    sampler, _ = smi_sampler(tmp_path, timeout_s=0.3, sleep_apps=30)
    sample = sampler.sample()
    assert sample.error is None and all(g.processes is None for g in sample.gpus)


def test_smi_sampler_missing_binary_and_error_exit(tmp_path: Path) -> None:
    missing = SmiSampler(["/nonexistent/nvidia-smi"], timeout_s=1).sample()
    assert missing.error is not None and "cannot run" in missing.error
    lost = (DATA / "err_gpu_lost_wrapped.txt").read_text()
    sampler, _ = smi_sampler(tmp_path, gpu=lost, gpu_exit=15)
    sample = sampler.sample()
    assert sample.error is not None and "GPU is lost" in sample.error


def test_smi_sampler_refuses_to_pile_up_hung_processes(tmp_path: Path) -> None:
    sampler, script = smi_sampler(tmp_path)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # noqa: S603
    try:
        sampler._hung = stuck  # as left behind by an nvidia-smi that ignored SIGKILL
        sample = sampler.sample()
        assert sample.error is not None and "still hung" in sample.error
        assert not Path(str(script) + ".calls").exists()  # nothing new was started
    finally:
        stuck.kill()
        stuck.wait()
    assert sampler.sample().error is None  # once it is gone, sampling resumes


def test_run_bounded_kills_the_process_group() -> None:
    result, abandoned = run_bounded([sys.executable, "-c", "import time; time.sleep(30)"], 0.2)
    assert result.stdout is None and result.error is not None and abandoned is None


# --- NVML through a fake pynvml module ----------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's naming
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801
    pass


class FakeNvml:
    """The pynvml functions the sampler uses; GPU behaviour is scripted per index."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.inits = 0

    def nvmlInit(self) -> None:  # noqa: N802
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if self.gpus[i].get("lost"):
            raise NVMLError_GpuIsLost("GPU is lost")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:  # noqa: N802
        return uuid(h).encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:  # noqa: N802
        util = self.gpus[h]["util"]
        if util is None:
            raise NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=util, memory=0)

    def nvmlDeviceGetSamples(self, h: int, kind: int, since: int) -> Any:  # noqa: N802
        samples = [s for s in self.gpus[h].get("samples", []) if s[0] > since]
        if not samples:
            raise NVMLError_NotFound("Not Found")
        return 1, [
            SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v)) for ts, v in samples
        ]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:  # noqa: N802
        return SimpleNamespace(used=512 * 2**20, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return 70500

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:  # noqa: N802
        procs = self.gpus[h].get("procs", [])
        if procs is None:
            raise NVMLError_NotSupported("Not Supported")
        return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in procs]


def test_nvml_sampler_reads_and_maps_errors_to_unknown() -> None:
    fake = FakeNvml(
        [
            {"util": 0, "procs": []},
            {"util": None, "procs": [4242]},  # MIG: NotSupported, but a process runs
            {"util": 0, "procs": None},
        ]
    )
    sample = NvmlSampler(fake).sample()
    assert sample.error is None
    a, b, c = sample.gpus
    assert (a.utilization_pct, a.memory_used_mib, a.power_w, a.processes) == (0.0, 512.0, 70.5, ())
    assert b.utilization_pct is None and "NVMLError_NotSupported" in (b.problem or "")
    assert b.processes and b.processes[0].used_memory_mib is None
    assert c.processes is None


def test_nvml_buffered_samples_catch_a_burst_between_polls() -> None:
    fake = FakeNvml([{"util": 0, "procs": [], "samples": [(100, 0), (200, 87), (300, 0)]}])
    sampler = NvmlSampler(fake)
    assert sampler.sample().gpus[0].utilization_pct == 87.0
    assert sampler.sample().gpus[0].utilization_pct == 0.0  # those samples were seen already


def test_nvml_lost_gpu_and_init_failure() -> None:
    lost = NvmlSampler(FakeNvml([{"util": 0}, {"lost": True}])).sample()
    assert lost.gpus == () and lost.error is not None and "GpuIsLost" in lost.error

    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            raise NVMLError("Driver Not Loaded")

    sample = NvmlSampler(NoDriver([])).sample()
    assert sample.error is not None and "init failed" in sample.error


def test_nvml_hang_is_bounded() -> None:
    class Hanging(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:  # noqa: N802
            time.sleep(1.0)
            return 0

    sampler = NvmlSampler(Hanging([]), timeout_s=0.1)
    first = sampler.sample()
    assert first.error is not None and "did not answer" in first.error
    second = sampler.sample()
    assert second.error is not None and "still hung" in second.error


def test_nvml_missing_module_has_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" fail
    with pytest.raises(MonitorError, match=r"gpuplan\[monitor\]"):
        NvmlSampler()


# --- host probes, clocks, fakes -------------------------------------------------------


def test_cpu_probe_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    probe = CpuProbe(50, stat_path=stat)
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert probe.probe().state is State.UNKNOWN  # no previous counters yet
    stat.write_text("cpu  700 0 100 1000 0 0 0 0 0 0\n")
    busy = probe.probe()
    assert busy.state is State.BUSY and "75%" in busy.detail
    stat.write_text("cpu  710 0 100 1990 0 0 0 0 0 0\n")
    assert probe.probe().state is State.IDLE
    stat.write_text("garbage")
    assert probe.probe().state is State.UNKNOWN


def test_heartbeat_probe(tmp_path: Path) -> None:
    clock = FakeClock(wall_start_s=time.time())
    hb = tmp_path / "lease"
    probe = HeartbeatProbe(hb, 600, clock=clock)
    assert probe.probe().state is State.IDLE  # absent: nobody holds a lease
    hb.touch()
    assert probe.probe().state is State.BUSY
    clock.advance(601)
    assert probe.probe().state is State.IDLE
    with pytest.raises(MonitorError, match="--heartbeat-max-age"):
        HeartbeatProbe(hb, 0)


def test_heartbeat_unreadable_is_unknown(tmp_path: Path) -> None:
    probe = HeartbeatProbe(tmp_path / "file" / "below-a-file", 60)
    (tmp_path / "file").write_text("x")
    assert probe.probe().state is State.UNKNOWN


def test_clocks_and_boot_id(tmp_path: Path) -> None:
    clock = SystemClock()
    a = clock.monotonic()
    assert clock.monotonic() >= a > 0
    assert read_boot_id() == read_boot_id()
    assert read_boot_id(tmp_path / "none", FakeClock(100, 1000)).startswith("boottime-")
    fake = FakeClock()
    with pytest.raises(ValueError, match="backwards"):
        fake.advance(-1)
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert len(read_boot_id()) == 36


def test_fake_sampler_script() -> None:
    fake = FakeSampler([idle_gpus(1)], repeat_last=False)
    fake.sample()
    with pytest.raises(IndexError):
        fake.sample()
    with pytest.raises(ValueError, match="at least one"):
        FakeSampler([])
