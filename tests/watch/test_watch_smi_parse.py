"""nvidia-smi parsing: own small fixtures, then golden tests over every shared sample."""

from __future__ import annotations

from pathlib import Path

import pytest
from watch_helpers import DATA, SAMPLES

from gpuplan.monitor.policy import PolicyConfig, classify_gpu
from gpuplan.monitor.readings import State
from gpuplan.monitor.smi_parse import (
    explain_failure,
    parse_cell,
    parse_compute_apps,
    parse_gpu_query,
    parse_smi,
    parse_table,
)

CFG = PolicyConfig()


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("45", 45.0),
        ("45 %", 45.0),
        ("81559 MiB", 81559.0),
        ("69.85 W", 69.85),
        (" 0 ", 0.0),
        ("[N/A]", None),
        ("[Not Supported]", None),
        ("[Unknown Error]", None),
        ("[Insufficient Permissions]", None),
        ("[Requested functionality has been deprecated]", None),
        ("N/A", None),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("-1", None),
        ("1e3", None),
        ("0x10", None),
    ],
)
def test_cell_never_reads_a_token_as_a_number(text: str, value: float | None) -> None:
    assert parse_cell(text).value == value


def test_eight_idle_gpus() -> None:
    gpus, error = parse_gpu_query(read("gpu_8x_idle.csv"), 0)
    assert error is None
    assert len(gpus) == 8
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.utilization_pct == 0.0 and g.memory_total_mib == 81559.0 for g in gpus)
    assert gpus[0].power_w == pytest.approx(69.85)


def test_one_of_eight_busy_is_found_per_gpu() -> None:
    sample = parse_smi(read("gpu_8x_one_busy.csv"), 0, "", 0)
    states = [classify_gpu(g, CFG).state for g in sample.gpus]
    assert states.count(State.BUSY) == 1
    assert states[4] is State.BUSY


def test_mig_na_is_unknown_but_processes_make_it_busy() -> None:
    gpus, _ = parse_gpu_query(read("gpu_mig_load.csv"), 0)
    assert gpus[0].utilization_pct is None
    assert "utilization.gpu=[N/A]" in (gpus[0].problem or "")
    no_procs = parse_smi(read("gpu_mig_load.csv"), 0, "", 0)
    assert classify_gpu(no_procs.gpus[0], CFG).state is State.UNKNOWN
    loaded = parse_smi(read("gpu_mig_load.csv"), 0, read("apps_mig_load.csv"), 0)
    procs = loaded.gpus[0].processes
    assert procs is not None and [p.pid for p in procs] == [4242, 4250]
    assert procs[1].used_memory_mib is None  # [Insufficient Permissions]: still a process
    assert classify_gpu(loaded.gpus[0], CFG).state is State.BUSY


def test_odd_tokens_are_all_unknown_never_zero() -> None:
    gpus, error = parse_gpu_query(read("gpu_odd_tokens.csv"), 0)
    assert error is None
    utils = [g.utilization_pct for g in gpus]
    assert utils == [None, None, None, None, None, None, None, 3.0]
    assert gpus[7].memory_used_mib is None and gpus[7].power_w is None
    for g in gpus[:7]:
        assert classify_gpu(g, CFG).state is State.UNKNOWN


def test_header_and_units_parse_like_nounits() -> None:
    gpus, error = parse_gpu_query(read("gpu_header_units.csv"), 0, fields=None)
    assert error is None
    assert gpus[0].utilization_pct == 45.0
    assert gpus[0].memory_used_mib == 1200.0
    assert gpus[0].power_w == 120.5


@pytest.mark.parametrize(
    ("stdout", "code", "needle"),
    [
        (None, -1, "timed out"),
        ("0, GPU-1c0e5a3b-0000-4000-8000-000000000000, 0, 0, 81559, 69.85\n", 1, "exited 1"),
        ("", 0, "no GPUs"),
        ("No devices were found\n", 6, "no GPU devices"),
    ],
)
def test_whole_command_failures(stdout: str | None, code: int, needle: str) -> None:
    gpus, error = parse_gpu_query(stdout, code)
    assert gpus == ()
    assert error is not None and needle in error


def test_wrapped_gpu_lost_message() -> None:
    _, error = parse_gpu_query(read("err_gpu_lost_wrapped.txt"), 15)
    assert error is not None and "GPU is lost" in error


def test_a_good_row_next_to_error_text_is_not_trusted() -> None:
    gpus, error = parse_gpu_query(read("gpu_row_then_error.txt"), 0)
    assert gpus == ()
    assert error is not None and "Unknown Error" in error


def test_bad_and_duplicate_uuids() -> None:
    _, error = parse_gpu_query("0, 00000000:3B:00.0, 0, 0, 1, 1\n", 0)
    assert error is not None and "not a GPU UUID" in error
    row = "0, GPU-1c0e5a3b-0000-4000-8000-000000000000, 0, 0, 1, 1\n"
    _, error = parse_gpu_query(row + row, 0)
    assert error is not None and "duplicate" in error


def test_compute_apps_variants() -> None:
    assert parse_compute_apps("", 0) == ((), None)
    assert parse_compute_apps("No running processes found\n", 0) == ((), None)
    procs, error = parse_compute_apps(None, -1)
    assert procs is None and error is not None and "timed out" in error
    procs, error = parse_compute_apps("GPU-1c0e5a3b-0000-4000-8000-000000000000, [N/A], 10\n", 0)
    assert procs is None and error is not None and "pid" in error
    procs, error = parse_compute_apps("whatever\n", 9)
    assert procs is None and error is not None and "exited 9" in error


def test_apps_failure_makes_processes_unknown_not_empty() -> None:
    sample = parse_smi(read("gpu_8x_idle.csv"), 0, None, -1)
    assert sample.error is None
    assert all(g.processes is None for g in sample.gpus)
    assert all(classify_gpu(g, CFG).state is State.UNKNOWN for g in sample.gpus)
    ignoring = PolicyConfig(ignore_processes=True)
    assert all(classify_gpu(g, ignoring).state is State.IDLE for g in sample.gpus)


def test_process_on_unlisted_gpu_is_unknown() -> None:
    apps = "GPU-ffffffff-0000-4000-8000-000000000000, 77, 100\n"
    sample = parse_smi(read("gpu_8x_idle.csv"), 0, apps, 0)
    assert sample.error is not None and "did not list" in sample.error


def test_explain_failure_falls_back_to_the_text() -> None:
    assert explain_failure("Segmentation fault") == "unparseable output: 'Segmentation fault'"


# --- golden tests over ../shared/reference/nvidia-smi-samples --------------------------

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
# file -> (kind, fields or None (header), expectation)
#   kind "gpu": expected utilization.gpu per row (None = unknown) for the GPU parser
#   kind "table": expected {field: value} of the first row from the generic table parser
#   kind "apps": expected pids
#   kind "error": the GPU parser must refuse the whole output; value = substring of the reason
_FIELDS_9 = None  # the derived noheader files use the 9-field query below
NINE = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "power.draw",
    "temperature.gpu",
)
I3 = (
    "memory.total",
    "memory.free",
    "memory.used",
    "temperature.gpu",
    "fan.speed",
    "utilization.gpu",
    "utilization.memory",
)
MEGAMINER = (
    "gpu_name",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "fan.speed",
    "pstate",
    "clocks.current.graphics",
    "clocks.current.memory",
    "power.max_limit",
    "power.default_limit",
)
GOLDEN: dict[str, tuple[str, tuple[str, ...] | None, object]] = {
    "captures/h100-80gb-hbm3_590.48.01_query-gpu-all-fields_idle.csv": ("gpu", None, [0.0]),
    "captures/h100-80gb-hbm3_590.48.01_query-gpu-all-fields_load.csv": ("gpu", None, [100.0]),
    "captures/h100-mig_590.48.01_query-gpu-all-fields_load.csv": ("gpu", None, [None]),
    "captures/h100-80gb-hbm3_590.48.01_query-compute-apps_load.csv": (
        "apps",
        None,
        [11327, 11328, 11345],
    ),
    "captures/h100-mig_590.48.01_query-compute-apps_load.csv": (
        "apps",
        None,
        [21180, 21181, 21198],
    ),
    "captures/l40s_595.80_query-compute-apps_idle.csv": ("apps", None, []),
    "captures/h100-80gb-hbm3_590.48.01_nvidia-smi_load.txt": ("error", None, "unparseable"),
    "captures/h100-mig_590.48.01_nvidia-smi_load.txt": ("error", None, "unparseable"),
    "captures/l40s_595.80_nvidia-smi_idle.txt": ("error", None, "unparseable"),
    "captures/h100-80gb-hbm3_590.48.01_dmon_load.txt": ("error", None, "unparseable"),
    "captures/l40s_595.80_dmon_idle.txt": ("error", None, "unparseable"),
    "captures/h100-mig_590.48.01_pmon_load.txt": ("error", None, "unparseable"),
    "captures/h100-mig_590.48.01_list-gpus.txt": ("error", None, "unparseable"),
    "derived/query-gpu-9fields_h100_idle_noheader_nounits.csv": ("gpu", NINE, [0.0]),
    "derived/query-gpu-9fields_h100_idle_with-header-units.csv": ("gpu", None, [0.0]),
    "derived/query-gpu-9fields_h100_load_noheader_nounits.csv": ("gpu", NINE, [100.0]),
    "derived/query-gpu-9fields_h100_load_with-header-units.csv": ("gpu", None, [100.0]),
    "derived/query-gpu-9fields_h100-mig_load_noheader_nounits.csv": ("gpu", NINE, [None]),
    "derived/query-gpu-9fields_h100-mig_load_with-header-units.csv": ("gpu", None, [None]),
    "derived/query-gpu-9fields_l40s_idle_noheader_nounits.csv": ("gpu", NINE, [100.0]),
    "derived/query-gpu-9fields_l40s_idle_with-header-units.csv": ("gpu", None, [100.0]),
    "derived/query-gpu-9fields_all-captures.tsv": ("tsv", None, None),
    "issues/i3pystatus-pr776_noheader-nounits_NA.csv": (
        "table",
        I3,
        {"fan.speed": None, "utilization.gpu": 0.0, "memory.total": 2004.0},
    ),
    "issues/i3pystatus-pr776_noheader-nounits_NotSupported.csv": (
        "table",
        I3,
        {"fan.speed": None, "utilization.gpu": 0.0},
    ),
    "issues/megaminer-235_noheader_gtx770.csv": (
        "table",
        MEGAMINER,
        {"utilization.gpu": None, "power.draw": None, "fan.speed": 52.0},
    ),
    "issues/tuxclocker-15_utilization-gpu_header.csv": ("table", None, {"utilization.gpu": None}),
    "issues/polybar-scripts-42_loop_noheader-nounits.csv": (
        "table",
        ("temperature.gpu", "utilization.gpu", "utilization.memory"),
        {"utilization.gpu": 6.0},
    ),
    "issues/zabbix-nvidia-smi-multi-gpu-9_fan-speed_noheader-nounits.csv": (
        "table",
        ("fan.speed",),
        {"fan.speed": None},
    ),
    "issues/err_device-handle-unknown-error.txt": ("error", None, "device handle"),
    "issues/err_driver-not-communicating.txt": ("error", None, "cannot reach the NVIDIA driver"),
    "issues/err_gpu-is-lost.txt": ("error", None, "GPU is lost"),
    "issues/err_nvml-driver-library-version-mismatch.txt": ("error", None, "version mismatch"),
    "issues/err_pynvml_gpu-is-lost_traceback.txt": ("error", None, "GPU is lost"),
}


def _shared_files(kind_dir: str) -> list[str]:
    if not SAMPLES.is_dir():
        return []
    return sorted(
        str(p.relative_to(SAMPLES)) for p in (SAMPLES / kind_dir).glob("*") if p.is_file()
    )


def _skip_without_samples() -> None:
    if not SAMPLES.is_dir():
        pytest.skip("../shared/reference/nvidia-smi-samples is not present")


def test_every_smi_sample_has_a_golden_expectation() -> None:
    _skip_without_samples()
    files = _shared_files("captures") + _shared_files("derived") + _shared_files("issues")
    missing = sorted(set(files) - set(GOLDEN))
    assert not missing, f"add golden expectations for {missing}"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_smi_sample(name: str) -> None:
    _skip_without_samples()
    path: Path = SAMPLES / name
    if not path.exists():
        pytest.skip(f"{name} not in this copy of the samples")
    text = path.read_text()
    kind, fields, expected = GOLDEN[name]
    if kind == "gpu":
        gpus, error = parse_gpu_query(text, 0, fields=fields)
        assert error is None, error
        assert [g.uuid for g in gpus] == [GPU0]
        assert [g.utilization_pct for g in gpus] == expected
        for g in gpus:
            assert classify_gpu(g, CFG).state is not State.IDLE or g.utilization_pct == 0.0
    elif kind == "apps":
        procs, error = parse_compute_apps(text, 0, fields=fields)
        assert error is None, error
        assert procs is not None and [p.pid for p in procs] == expected
        assert all(p.gpu_uuid == GPU0 for p in procs)
    elif kind == "table":
        rows, error = parse_table(text, fields)
        assert error is None, error
        assert isinstance(expected, dict)
        for field, value in expected.items():
            assert rows[0][field].value == value, field
    elif kind == "error":
        gpus, error = parse_gpu_query(text, 0)
        assert gpus == ()
        assert error is not None and str(expected) in error, error
        sample = parse_smi(text, 0, "", 0)
        assert sample.error is not None
    else:  # the derived TSV: every capture row, both variants, parses to the stated state
        for row in text.splitlines()[1:]:
            capture, state, header, with_units, nounits = row.split("\t")
            by_header, err1 = parse_gpu_query(header + "\n" + with_units + "\n", 0, fields=None)
            by_fields, err2 = parse_gpu_query(nounits + "\n", 0, fields=NINE)
            assert err1 is None and err2 is None, capture
            assert by_header == by_fields, capture
            util = by_header[0].utilization_pct
            if "mig" in capture:
                assert util is None, capture
            else:
                assert util is not None, capture
