"""The GPU check scripts (``scripts/gpu-memory-check.py``, ``scripts/gpu-speed-check.py``).

CI has no GPU, so each script runs once with ``--cpu-smoke`` (2-layer models,
seq 32, on CPU): that exercises every code path and the CSV writers. The tests
check that the CSVs have exactly the columns of the validation tables, that
every row's spec is a valid job spec that the estimators accept, and that
without CUDA the scripts stop at once with exit code 3.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpu_check_common as common  # noqa: E402

sys.path.remove(str(SCRIPTS))


def _load_script(name: str) -> Any:
    """Import ``scripts/<name>`` (a hyphenated file name) as a module; imports no torch."""
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), SCRIPTS / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as fh:
        return next(csv.reader(fh))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


# ----------------------------------------------------------------- helpers (no torch)


def test_columns_match_the_validation_tables() -> None:
    assert list(common.MEMORY_COLUMNS) == _header(REPO / "validation" / "memory.csv")
    assert list(common.TRAINING_COLUMNS) == _header(REPO / "validation" / "training.csv")


def test_flow_yaml_round_trips_as_a_job_spec() -> None:
    spec: dict[str, Any] = {
        "model": "llama-3.2-1b",
        "method": "lora",
        "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "v_proj"], "dropout": 0.0},
        "precision": "bf16-true",
        "micro_batch_size": 4,
        "seq_len": 1024,
        "parallelism": {"sharding": "none"},
    }
    text = common.flow_yaml(spec)
    assert text.startswith("{model: llama-3.2-1b, method: lora, lora: {rank: 16")
    assert yaml.safe_load(text) == spec
    assert parse_spec(yaml.safe_load(text)).lora is not None
    assert yaml.safe_load(common.flow_yaml({"a": "x, y: z"})) == {"a": "x, y: z"}


def test_catalog_lookup_by_device_name() -> None:
    entry = common.catalog_gpu("NVIDIA H200")
    assert entry is not None and entry["id"] == "H200"
    assert entry["peak_tflops_dense"]["bf16"] > 900
    assert common.catalog_gpu("NVIDIA H200 NVL") is None  # a different part: no peaks assumed


@pytest.mark.parametrize("size", ["full", "quick"])
def test_gpu_run_specs_are_valid_and_fit_an_h200(size: str) -> None:
    """What the H200 runs will write: valid specs that the estimators accept and fit in 141 GB."""
    from gpuplan.catalog.loader import load_catalog
    from gpuplan.estimate.configure import configure, default_topology
    from gpuplan.estimate.fit import fit

    h200 = load_catalog(use_user=False).gpu("H200")
    memory = _load_script("gpu-memory-check.py")
    plan = memory.configs(size, list(common.TEXT_MODELS))
    assert len({c.key() for c in plan}) == len(plan)
    for cfg in plan:
        spec = parse_spec(yaml.safe_load(common.flow_yaml(cfg.spec())), origin=cfg.key())
        assert fit(spec, h200, 1).memory.fits, cfg.key()
    speed = _load_script("gpu-speed-check.py")
    for work in speed.workloads(size):
        spec = parse_spec(yaml.safe_load(common.flow_yaml(speed.train_spec(work))))
        conf = configure(
            spec, h200, 1, default_topology(h200, 1), with_scaling=False, require_fit=False
        )
        assert conf.time.step_time_s > 0, work


# ----------------------------------------------------------------- the scripts on CPU


@pytest.fixture(scope="module")
def memory_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("mem")
    done = _run("gpu-memory-check.py", "--cpu-smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def speed_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("speed")
    done = _run("gpu-speed-check.py", "--cpu-smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _check_common_fields(row: dict[str, str]) -> None:
    spec = parse_spec(yaml.safe_load(row["spec"]), origin=row["id"])
    assert spec.parallelism != "auto"
    assert row["status"] == "excluded" and row["notes"].startswith("EXCLUDED: --cpu-smoke")
    assert row["count"] == "1"
    assert row["source"].startswith("measured on cpu by scripts/gpu-")
    assert math.isfinite(float(row["measured"])) and float(row["measured"]) > 0


def test_memory_check_writes_memory_rows(memory_out: Path) -> None:
    table = memory_out / "memory.csv"
    assert _header(table) == list(common.MEMORY_COLUMNS)
    rows = _rows(table)
    assert {r["metric"] for r in rows} == {"allocated", "reserved", "device_used"}
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        _check_common_fields(row)
        assert row["unit"] in ("B", "MiB")
        assert (row["metric"] == "device_used") == bool(row["cuda_context_mib"])
    specs = [yaml.safe_load(r["spec"]) for r in rows]
    assert {s["model"] for s in specs} == set(common.TEXT_MODELS)
    assert {s["precision"] for s in specs} == {"fp32", "bf16-mixed", "bf16-true"}
    assert {s["optimizer"] for s in specs} == {"adamw", "sgd"}
    assert {s["activation_checkpointing"] for s in specs} == {"none", "full"}
    assert {s["method"] for s in specs} == {"full", "lora"}
    report = json.loads((memory_out / "memory-check.json").read_text(encoding="utf-8"))
    assert report["environment"]["torch"]
    assert all("error" not in r for r in report["results"]), report["results"]


def test_speed_check_writes_training_gemm_and_hbm_rows(speed_out: Path) -> None:
    table = speed_out / "training.csv"
    assert _header(table) == list(common.TRAINING_COLUMNS)
    rows = _rows(table)
    assert {yaml.safe_load(r["spec"])["model"] for r in rows} == {*common.TEXT_MODELS, "resnet-50"}
    for row in rows:
        _check_common_fields(row)
        assert (row["gpus_per_node"], row["intra_node"]) == ("1", "none")
        spec = yaml.safe_load(row["spec"])
        if spec["model"] == "resnet-50":
            assert (row["metric"], row["unit"]) == ("samples_per_s", "samples/s")
            assert spec["image_size"] > 0
        else:
            assert (row["metric"], row["unit"]) == ("tokens_per_s_per_gpu", "tokens/s/gpu")
            assert spec["seq_len"] > 0
    # ResNet-50: the channels-last bf16 rows say so; the NCHW pair (Lambda's tables' layout)
    # is TF32 and fp16 AMP with SGD + momentum, each with a profiled step in the JSON
    cnn = [yaml.safe_load(r["spec"]) for r in rows if "resnet" in r["id"]]
    assert {(s["precision"], s["cnn_kernels"], s["optimizer"]) for s in cnn} == {
        ("bf16-mixed", "channels-last", "adamw"),
        ("tf32", "eager", "sgd-momentum"),
        ("fp16-mixed", "eager", "sgd-momentum"),
    }
    nchw = [r for r in rows if r["id"].endswith("-nchw")]
    assert len(nchw) == 2 and all("NCHW/NHWC conversions" in r["notes"] for r in nchw)
    gemm = _rows(speed_out / "gemm.csv")
    assert {g["dtype"] for g in gemm} == {"bf16", "fp16", "tf32", "fp32"}
    assert all(float(g["tflops"]) >= 0 and float(g["time_s"]) > 0 for g in gemm)
    # the transformer-layer shapes (short reductions) are timed in bf16 and named
    layers = [g for g in gemm if g["layer"]]
    assert layers and all(g["dtype"] == "bf16" for g in layers)
    hbm = _rows(speed_out / "hbm.csv")
    assert hbm and all(float(h["gb_per_s"]) > 0 for h in hbm)
    report = json.loads((speed_out / "speed-check.json").read_text(encoding="utf-8"))
    assert report["errors"] == []
    layouts = [t["layout_kernels"] for t in report["train"] if not t["channels_last"]]
    assert len(layouts) == 2
    assert all(0.0 <= lay["layout_conversion_share"] <= 1.0 for lay in layouts)


def test_rows_are_accepted_by_the_estimators(memory_out: Path, speed_out: Path) -> None:
    """Appended to the tables with gpu H200, every row is one `gpuplan validate` can predict."""
    from gpuplan.validation import predict_memory, predict_training

    for row in _rows(memory_out / "memory.csv"):
        value, _ = predict_memory(row | {"gpu": "H200"}, REPO)
        assert value > 0, row["id"]
    for row in _rows(speed_out / "training.csv"):
        value, _ = predict_training(row | {"gpu": "H200"}, REPO)
        assert value > 0, row["id"]


@pytest.mark.parametrize("script", ["gpu-memory-check.py", "gpu-speed-check.py"])
def test_without_cuda_exits_3_with_one_line(script: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = _run(script, "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == common.EXIT_NO_CUDA
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--cpu-smoke" in lines[0]
    assert not (tmp_path / "out").exists()


def test_inline_resnet50_has_torchvision_parameter_count() -> None:
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = common.inline_resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision resnet50


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "elementwise_kernel"], "cudnn"),
        (["void pytorch_flash::flash_fwd_kernel<...>", "flash_bwd_dq_dk_dv_loop"], "fused"),
        (["fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "fmha_cutlassB"], "fused"),
        (["ampere_bf16_s16816gemm", "softmax_warp_forward"], None),
    ],
)
def test_sdpa_kernel_names_map_to_the_spec_attention(
    names: list[str], expected: str | None
) -> None:
    """The speed check labels its rows with the attention class SDPA was profiled to run."""
    assert common.attention_class(names) == expected


def test_speed_rows_name_the_profiled_attention_class() -> None:
    speed = _load_script("gpu-speed-check.py")
    work = speed.workloads("smoke")[0]
    assert speed.train_spec(work, "cudnn")["attention"] == "cudnn"
    assert speed.train_spec(work)["attention"] == "fused"


def test_squeeze_check_leaves_the_peak_plus_a_share_of_the_reserve(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The allocator squeeze check, without a GPU: a fake torch records the ballast sizes."""
    mem = _load_script("gpu-memory-check.py")
    gib = 2**30

    class OomError(RuntimeError):
        pass

    ballasts: list[int] = []

    class FakeCuda:
        OutOfMemoryError = OomError

        @staticmethod
        def mem_get_info(device: object) -> tuple[int, int]:
            return 70 * gib, 80 * gib

        @staticmethod
        def reset_accumulated_memory_stats(device: object) -> None:
            pass

        @staticmethod
        def memory_stats(device: object) -> dict[str, int]:
            return {"num_alloc_retries": 3, "num_ooms": 0}

    class FakeTorch:
        cuda = FakeCuda
        uint8 = "uint8"

        @staticmethod
        def empty(n: int, dtype: object, device: object) -> object:
            ballasts.append(n)
            return object()

    class Probe:
        def release(self) -> None:
            pass

    calls = iter(
        [
            {"peak_allocated_bytes": 55 * gib, "peak_reserved_bytes": 56 * gib, "steps_2_3_s": 1.0},
            OomError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        ]
    )

    def fake_measure(*args: object, **kwargs: object) -> dict[str, float]:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got  # type: ignore[return-value]

    monkeypatch.setattr(mem, "measure", fake_measure)
    base = {"peak_allocated_bytes": 20 * gib, "peak_reserved_bytes": 24 * gib}
    out = mem.squeeze(FakeTorch, None, base, "cuda:0", Probe(), use_peft=False)
    # room: the peak plus half the 4 GiB reserve, then the peak plus 256 MiB
    assert ballasts == [70 * gib - 22 * gib, 70 * gib - (20 * gib + 256 * 2**20)]
    assert out[0]["ran"] and out[0]["num_alloc_retries"] == 3
    assert out[0]["reserve_kept_bytes"] == gib
    assert out[1]["ran"] is False and out[1]["error"].startswith("OutOfMemoryError")


def test_the_layout_profile_counts_kernels_by_class() -> None:
    """Only kernels count (an operator's row repeats its kernels' time as children, with no
    self time); conversions, convolutions and batch norm are told apart by name."""
    speed = _load_script("gpu-speed-check.py")
    rows = [
        ("aten::cudnn_convolution", 0.0, 53),  # an operator: its kernels are below
        (
            "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, true>",
            200.0,
            120,
        ),
        ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128", 500.0, 53),
        ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw", 400.0, 52),
        ("cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32>", 450.0, 53),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>", 300.0, 53),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", 150.0, 100),
    ]
    got = speed.classify_kernels(rows)
    assert got["kernel_time_s"] == pytest.approx(2000e-6)
    assert got["layout_conversion_share"] == pytest.approx(0.1)
    assert got["layout_conversion_calls"] == 120
    assert got["convolution_kernel_calls"] == 53 + 52 + 53
    assert got["batchnorm_s"] == pytest.approx(300e-6)
    assert got["nchw_named_kernel_calls"] == 53 + 52 + 53  # two convolution kinds, batch norm
    assert speed.classify_kernels([])["layout_conversion_share"] == 0.0
