"""dcgm-exporter pages and Prometheus series -> per-GPU readings (golden over shared pages)."""

from __future__ import annotations

import pytest
from watch_helpers import DATA, SAMPLES

from gpuplan.errors import MonitorError, UnknownNameError
from gpuplan.monitor.prometheus import (
    Series,
    gpu_key,
    label_matcher,
    metric_scale,
    readings_from_series,
    sample_from_exposition,
)

UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def test_own_page_third_gpu_without_metric_is_unknown() -> None:
    sample = sample_from_exposition((DATA / "dcgm_two_gpus.prom").read_text(), UTIL)
    assert sample.error is None
    got = {g.uuid[-1]: g.utilization_pct for g in sample.gpus}
    assert got == {"0": 3.0, "1": 0.0, "2": None}
    assert all(g.processes is None for g in sample.gpus)


def test_metric_names_and_scales() -> None:
    assert metric_scale(UTIL) == 1.0
    assert metric_scale(GR.lower()) == 100.0
    assert metric_scale("my_util_ratio", 100.0) == 100.0
    with pytest.raises(
        UnknownNameError,
        match="--metric: unknown utilization metric 'DCGM_FI_DEV_GPU_UTILL'; did you mean",
    ):
        metric_scale("DCGM_FI_DEV_GPU_UTILL")
    with pytest.raises(MonitorError, match="--metric-scale"):
        metric_scale(UTIL, -1.0)


def test_series_edge_cases() -> None:
    a = {"UUID": "GPU-a"}
    b = {"uuid": "GPU-b", "GPU_I_ID": "3"}
    readings = readings_from_series(
        [Series(a, float("nan")), Series(b, 0.5), Series({"UUID": "GPU-c"}, 150.0)],
        [a, b, {"UUID": "GPU-b"}, {"UUID": "GPU-c"}],
        100.0,
    )
    got = {g.uuid: g.utilization_pct for g in readings}
    # NaN and out-of-range are unknown; the MIG parent GPU-b is represented by its instance.
    assert got == {"GPU-a": None, "GPU-b/GI3": 50.0, "GPU-c": None}
    assert gpu_key({"gpu": "0"}) is None


def test_duplicate_series_for_one_gpu_is_unknown() -> None:
    a = {"UUID": "GPU-a"}
    readings = readings_from_series([Series(a, 0.0), Series(dict(a, job="x"), 90.0)], [a], 1.0)
    assert readings[0].utilization_pct is None


def test_label_matcher_escapes() -> None:
    assert label_matcher("group", 'a"b\\c') == 'group="a\\"b\\\\c"'
    with pytest.raises(MonitorError):
        label_matcher("bad-label", "x")


GPU_A = "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"
GOLDEN: dict[str, tuple[str, dict[str, float | None] | str]] = {
    "dcgm-exporter-250_v100_bare-metal.prom": (
        UTIL,
        {
            GPU_A: 0.0,
            "GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5": None,
            "GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba": None,
            "GPU-bd94f0f5-8c2f-bc95-74ad-5f99fdc33d01": None,
        },
    ),
    "dcgm-exporter-272_a100-mig_old-namespace-labels.prom": (
        GR,
        {
            "GPU-ed1353d6-52ba-8793-7230-4d5d3eb68167/GI1": 0.0,
            "GPU-ed1353d6-52ba-8793-7230-4d5d3eb68167/GI2": 0.0,
            "GPU-6043e4b2-feaa-8010-34c7-61d1a01576bb/GI1": 0.0,
        },
    ),
    "dcgm-exporter-317_a30-mig_gr-engine-active_excerpt1.prom": (
        GR,
        {
            **{f"GPU-265c9814-6156-355b-e589-ff2064894f16/GI{i}": 0.0 for i in (3, 4, 5, 6)},
            "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49/GI3": 0.0,
        },
    ),
    "dcgm-exporter-317_a30-mig_vgpu-license_excerpt2.prom": (
        GR,
        {
            **{f"GPU-265c9814-6156-355b-e589-ff2064894f16/GI{i}": None for i in (3, 4, 5, 6)},
            **{f"GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49/GI{i}": None for i in (3, 4)},
        },
    ),
    "dcgm-exporter-58_titan-v_k8s-mode_empty-pod-labels.prom": (
        UTIL,
        {
            "GPU-55274b56-9033-f166-7723-77088b0ff94d": None,
            "GPU-dad58a68-8239-6bb7-1f07-539b85fabfee": None,
            "GPU-a29d2dc7-d18a-858c-a87b-f81eb1384333": None,
            "GPU-4b2cedc3-89f9-dde9-ce2f-3b8d40dbe531": None,
            "GPU-58fae45b-e5a5-0c62-d478-8ff7c485e74e": None,
        },
    ),
    "fake-gpu-operator-93_SIMULATED_sorted-labels.prom": (
        UTIL,
        {
            "GPU-00b0279e-9a2e-56e3-90e2-52d8551d6031": None,
            "GPU-bdf06b03-d5d7-5b41-932e-5fdd2ef59ddc": None,
            "GPU-cc0557e3-8fbd-51f0-b7d3-7a548c581d7f": None,
            "GPU-ef912753-2d5d-55ba-8ab5-dd7a82f54876": None,
        },
    ),
    "gpu-monitoring-tools-138_early-labels.prom": (
        UTIL,
        {"GPU-6bf47ca9-ad3e-15db-beed-1079a7d74116": 44.0},
    ),
    "gpu-operator-472_series-as-shown-in-prometheus-ui.txt": (UTIL, "error"),
    "upstream_etc_default-counters.csv": (UTIL, "error"),
}


def test_every_dcgm_sample_has_a_golden_expectation() -> None:
    folder = SAMPLES / "dcgm-exporter"
    if not folder.is_dir():
        pytest.skip("../shared/reference/nvidia-smi-samples is not present")
    missing = sorted({p.name for p in folder.iterdir()} - set(GOLDEN))
    assert not missing, f"add golden expectations for {missing}"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_dcgm_page(name: str) -> None:
    path = SAMPLES / "dcgm-exporter" / name
    if not path.exists():
        pytest.skip("../shared/reference/nvidia-smi-samples is not present")
    metric, expected = GOLDEN[name]
    sample = sample_from_exposition(path.read_text(), metric)
    if expected == "error":
        assert sample.error is not None
        assert sample.gpus == ()
        return
    assert sample.error is None, sample.error
    assert {g.uuid: g.utilization_pct for g in sample.gpus} == expected


def test_mig_page_with_whole_gpu_metric_is_unknown() -> None:
    path = SAMPLES / "dcgm-exporter" / "dcgm-exporter-317_a30-mig_gr-engine-active_excerpt1.prom"
    if not path.exists():
        pytest.skip("../shared/reference/nvidia-smi-samples is not present")
    sample = sample_from_exposition(path.read_text(), UTIL)
    assert sample.gpus and all(g.utilization_pct is None for g in sample.gpus)
