"""Leave-one-source-out error: source groups, per-fold refits, the validate report and gates."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from gpuplan import holdout
from gpuplan.errors import GpuPlanError
from gpuplan.estimate import calibration
from gpuplan.estimate import overheads as ovh
from gpuplan.validation import predict_memory, source_of

REPO = Path(__file__).resolve().parents[1]
FIELDS = (
    "id,status,spec,gpu,count,metric,measured,unit,cuda_context_mib,source,what_was_measured,notes"
)
SPEC = "{model: gpt2, method: full, precision: bf16-mixed, micro_batch_size: 2, seq_len: 512}"


@pytest.mark.parametrize(
    ("source", "group"),
    [
        (
            "github.com/mosaicml/llm-foundry : scripts/train/benchmarking/README.md (commit 8c8dd48f)",
            "github.com/mosaicml/llm-foundry",
        ),
        (
            "github.com/mlcommons/training_results_v4.0 (commit 6fe95437) : NVIDIA/results/eos/x",
            "mlcommons:NVIDIA",
        ),
        (
            "github.com/mlcommons/training_results_v3.0 (commit 63e326c4) : Dell/results/XE8545/y",
            "mlcommons:Dell",
        ),
        ("The Llama 3 Herd of Models (arXiv:2407.21783, 2024-07), Table 4", "arXiv:2407.21783"),
        (
            'huggingface.co/mosaicml/mpt-7b model card ("trained on 440 A100-40GBs")',
            "github.com/mosaicml/llm-foundry",
        ),
        (
            "LLaMA-Factory wiki (github.com/hiyouga/LLaMA-Factory/wiki/x), as",
            "github.com/hiyouga/LLaMA-Factory",
        ),
        ("a lab notebook (2026)", "a lab notebook"),
    ],
)
def test_source_groups(source: str, group: str) -> None:
    assert source_of({"source": source}) == group


def _write(path: Path, rows: list[tuple[str, str, str, float]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS.split(","))
        w.writeheader()
        for rid, source, metric, measured in rows:
            w.writerow(
                {
                    "id": rid,
                    "status": "ok",
                    "spec": SPEC,
                    "gpu": "A100-80GB",
                    "count": "1",
                    "metric": metric,
                    "measured": f"{measured:.0f}",
                    "unit": "B",
                    "cuda_context_mib": "",
                    "source": source,
                    "what_was_measured": "test",
                    "notes": "",
                }
            )
    return path


def _probe(metric: str, fraction: float) -> float:
    row = {"id": "p", "spec": SPEC, "gpu": "A100-80GB", "count": "1", "metric": metric}
    with holdout.reserve_fraction(fraction):
        return predict_memory(row, REPO)[0]


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """Two sources whose reserved memory matches reserve fractions 0.10 and 0.20."""
    (tmp_path / "validation").mkdir()
    a, b = _probe("reserved", 0.10), _probe("reserved", 0.20)
    return _write(
        tmp_path / "validation" / "memory.csv",
        [
            ("a1", "github.com/x/a", "reserved", a),
            ("a2", "github.com/x/a", "reserved", a),
            ("b1", "github.com/y/b", "reserved", b),
            ("b2", "github.com/y/b", "reserved", b),
        ],
    )


def test_memory_folds_refit_without_the_held_out_source(table: Path) -> None:
    before = ovh.ALLOCATOR_RESERVE_FRACTION
    loso = holdout.memory_loso(table)
    assert before == ovh.ALLOCATOR_RESERVE_FRACTION  # restored
    name = "overheads.ALLOCATOR_RESERVE_FRACTION"
    # each source is predicted with the fraction the other source implies
    assert loso.fold_params["github.com/x/a"][name] == pytest.approx(0.20)
    assert loso.fold_params["github.com/y/b"][name] == pytest.approx(0.10)
    errors = {r.id: r.error for r in loso.report.rows}
    assert errors["a1"] is not None and errors["a1"] > 0.05  # over: fitted on b
    assert errors["b1"] is not None and errors["b1"] < -0.05  # under: fitted on a
    (const,) = loso.constants
    assert const.name == name and len(const.rows) == 4


def test_validate_reports_loso_constants_and_coverage(cli, table: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "memory", "--table", str(table), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["loso"]["summary"]["rows"] == 4
    assert data["loso"]["summary"]["median_abs_error"] > data["summary"]["median_abs_error"]
    (const,) = data["fitted_constants"]
    assert const["fitted_on_rows"] == 4 and set(const["rows"]) == {"a1", "a2", "b1", "b2"}
    assert {"inside", "inside_held_out", "median_half_width", "rows"} <= set(data["coverage"])


def test_loso_gates(cli, table: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "memory", "--table", str(table), "--max-loso-median", "0.001")
    assert r.exit_code == 1
    assert "leave-one-source-out" in r.stderr
    ok = cli("validate", "memory", "--table", str(table), "--max-loso-median", "5")
    assert ok.exit_code == 0
    narrow = cli("validate", "memory", "--table", str(table), "--max-width", "0")
    assert narrow.exit_code == 1 and "--max-width" in narrow.stderr
    assert cli("validate", "memory", "--table", str(table), "--max-width", "10").exit_code == 0
    # two sources that disagree: each one's rows fall outside bounds fitted on the other
    held = cli("validate", "memory", "--table", str(table), "--min-held-out-coverage", "0.99")
    assert held.exit_code == 1 and "--min-held-out-coverage" in held.stderr
    ok = cli("validate", "memory", "--table", str(table), "--min-held-out-coverage", "0")
    assert ok.exit_code == 0


def test_max_coverage_gate(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Bounds that hold every row are wider than the 80% they claim: --max-coverage says so."""
    (tmp_path / "validation").mkdir()
    agree = _probe("reserved", ovh.ALLOCATOR_RESERVE_FRACTION)  # both sources on the model
    table = _write(
        tmp_path / "validation" / "memory.csv",
        [(f"{s}{i}", f"github.com/x/{s}", "reserved", agree) for s in "ab" for i in (1, 2)],
    )
    cov = json.loads(cli("validate", "memory", "--table", str(table), "--json").output)["coverage"]
    assert cov["inside"] == cov["inside_held_out"] == 1.0
    wide = cli("validate", "memory", "--table", str(table), "--max-coverage", "0.85")
    assert wide.exit_code == 1 and "above --max-coverage 85%" in wide.stderr
    assert cli("validate", "memory", "--table", str(table), "--max-coverage", "1").exit_code == 0
    held = cli("validate", "memory", "--table", str(table), "--max-held-out-coverage", "0.85")
    assert held.exit_code == 1 and "above --max-held-out-coverage 85%" in held.stderr
    ok = cli("validate", "memory", "--table", str(table), "--max-held-out-coverage", "1")
    assert ok.exit_code == 0


def test_training_without_stored_folds_says_so(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "validation").mkdir()
    table = tmp_path / "validation" / "training.csv"
    lines = (REPO / "validation" / "training.csv").read_text().splitlines()
    ok_row = next(ln for ln in lines[1:] if ",ok," in ln)  # an empty table is an error of its own
    table.write_text(lines[0] + "\n" + ok_row + "\n")
    assert holdout.training_loso(table) is None
    r = cli("validate", "training", "--table", str(table), "--max-loso-median", "0.5")
    assert r.exit_code == 1
    assert "no stored folds" in r.stderr
    short = cli("validate", "training", "--table", str(table), "--max-loso-time-under", "1")
    assert short.exit_code == 1 and "no stored folds" in short.stderr
    # the in-sample gate needs no folds: a row of a preset model, so its share is 0% or 100%
    preset = next(ln for ln in lines[1:] if ",ok," in ln and "training_configs" not in ln)
    table.write_text(lines[0] + "\n" + preset + "\n")
    ok = cli("validate", "training", "--table", str(table), "--max-time-under", "1", "--json")
    assert ok.exit_code == 0
    assert json.loads(ok.output)["summary"]["time_under_predicted_over_10pct"] in (0, 1)


def test_stored_folds_cover_the_training_table() -> None:
    loso = holdout.training_loso(REPO / "validation" / "training.csv")
    assert loso is not None
    assert loso.stale == ""
    assert all(r.source for r in loso.report.rows)
    names = {c.name for c in loso.constants}
    assert names >= {"Ampere.step_overhead", "Hopper.gemm_fp8"}
    # a constant held at its prior (it raised its rows' LOSO error) is not listed as fitted,
    # nor is one held at a measurement (Ampere's GEMM level: its best matmul)
    assert "Hopper.gemm" not in names
    assert "Ampere.gemm" not in names
    # every listed constant earns its place: fitting it lowers its rows' LOSO error
    assert all(c.helps for c in loso.constants)


def test_efficiencies_with_sets_flattened_names() -> None:
    base = calibration.efficiencies()
    effs = holdout.efficiencies_with(base, {"Hopper.gemm": 0.3, "overlap.tensor_parallel": 0.1})
    assert holdout.param_value(effs, "Hopper.gemm") == 0.3
    assert holdout.param_value(effs, "overlap.tensor_parallel") == 0.1
    assert holdout.param_value(base, "Hopper.gemm") != 0.3 or base.archs["Hopper"].gemm == 0.3
    cnn = holdout.efficiencies_with(base, {"cnn.step_overhead": 0.3})
    assert holdout.param_value(cnn, "cnn.step_overhead") == 0.3
    assert cnn.archs == base.archs and cnn.overlap == base.overlap
    compiled = holdout.efficiencies_with(base, {"compiled.step_overhead": 0.2})
    assert holdout.param_value(compiled, "compiled.step_overhead") == 0.2
    assert compiled.cnn == base.cnn


def test_efficiencies_in_use_puts_back_what_was_in_use() -> None:
    base = calibration.efficiencies()
    outer = holdout.efficiencies_with(base, {"Hopper.gemm": 0.3})
    inner = holdout.efficiencies_with(base, {"Hopper.gemm": 0.4})
    calibration.use_efficiencies(outer)
    try:
        with calibration.efficiencies_in_use(inner):
            assert calibration.efficiencies().archs["Hopper"].gemm == 0.4
        # a nested use (the fit script's attention shares) leaves the fit's trial in place
        assert calibration.efficiencies().archs["Hopper"].gemm == 0.3
    finally:
        calibration.use_efficiencies(None)
    assert calibration.efficiencies() == base


@pytest.mark.parametrize("value", [1.8, -0.1])
def test_efficiencies_with_refuses_a_share_outside_0_1(value: float) -> None:
    # a fold's cuDNN attention at 1.8 of peak once came out of the grid fit unchecked
    with pytest.raises(GpuPlanError, match=r"Hopper\.attention_cudnn = .*\[0, 1\]"):
        holdout.efficiencies_with(calibration.efficiencies(), {"Hopper.attention_cudnn": value})


def test_stored_folds_stay_below_the_measured_attention_ceiling() -> None:
    # scripts/fit_efficiency.py ATTENTION_CEILING: FlashAttention-2 reaches 35% of H100 peak
    data = yaml.safe_load((REPO / "validation" / "loso_efficiency.yaml").read_text())
    for source, fold in data["sources"].items():
        assert fold["params"].get("Hopper.attention", 0.0) <= 0.35, source


def test_quantile_interpolates() -> None:
    assert holdout.quantile([0.0, 1.0], 0.5) == 0.5
    assert holdout.quantile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert holdout.quantile([3.0, 1.0, 2.0], 1.0) == 3.0


def test_bounds_are_the_interpolated_percentiles() -> None:
    """Interpolated, not ranks rounded outward: a class's width comes from the pooled floor,
    not from the rounding (13 evenly spaced rows: 1.2 and 10.8, not 1 and 11)."""
    values = [float(i) for i in range(13)]
    band = holdout._band(values)
    assert (band["lo"], band["hi"]) == (0.0, pytest.approx(10.8))  # lo held at 0: contains 0
    shifted = holdout._band([v - 6.0 for v in values])
    assert shifted["lo"] == pytest.approx(-4.8) and shifted["hi"] == pytest.approx(4.8)


def test_class_bounds_pool_small_classes() -> None:
    residuals = [("lora", f"s{i % 2}", 0.01 * i) for i in range(10)] + [("qlora", "s", 0.5)] * 3
    table = holdout.class_bounds(residuals)
    assert table["classes"]["qlora"] == {"pooled": True, "rows": 3, "sources": 1}
    assert table["classes"]["lora"]["rows"] == 10
    lo, hi = holdout.band_of(table, "lora")
    lora = table["classes"]["lora"]
    assert lora["own_lo"] == 0.0 and lora["own_hi"] == pytest.approx(0.081)  # contains 0
    assert lo == 0.0 and hi == table["pooled"]["hi"] == 0.5  # the pooled band is the floor
    pooled = (table["pooled"]["lo"], table["pooled"]["hi"])
    assert holdout.band_of(table, "qlora") == holdout.band_of(table, "no-such-class") == pooled


def test_bounds_round_outward_so_edge_rows_stay_inside() -> None:
    """A percentile that falls on a rank puts that row on the edge; rounding the stored edge to
    the nearest 4th decimal would move it inward past the row (-0.08034 -> -0.0803)."""
    values = [-0.5, -0.08034] + [0.001 * i for i in range(7)] + [0.11716, 0.5]  # edges: ranks 1, 9
    band = holdout._band(values)
    assert band["lo"] <= -0.08034 and band["hi"] >= 0.11716
    assert band["lo"] == pytest.approx(-0.0804) and band["hi"] == pytest.approx(0.1172)


def test_a_class_upper_edge_is_never_below_the_pooled_one() -> None:
    """A class's rows come from a few sources; the pooled upper edge (all of them) is its
    floor, and the class keeps its own wider tail (more memory or time than estimated is what
    costs a run)."""
    narrow = [("lora", f"s{i % 2}", 0.001 * i) for i in range(10)]
    wide = [("cnn", f"t{i % 3}", -0.3 + 0.06 * i) for i in range(11)]
    table = holdout.class_bounds(narrow + wide)
    pooled = table["pooled"]
    lora = table["classes"]["lora"]
    assert lora["own_lo"] == 0.0 and lora["own_hi"] == pytest.approx(0.0081)
    assert lora["hi"] == pooled["hi"]
    cnn = table["classes"]["cnn"]
    assert cnn["hi"] == max(cnn["own_hi"], pooled["hi"]) > 0


def test_a_class_lower_edge_is_its_own_shrunk_toward_the_pooled_one() -> None:
    """(s * own + k * pooled) / (s + k) over the class's s sources, k = 2, rounded down: half
    the pooled edge at two sources, less of it at more."""
    narrow = [("lora", f"s{i % 2}", 0.001 * i) for i in range(10)]  # own lo 0, 2 sources
    wide = [("cnn", f"t{i % 6}", -0.3 + 0.06 * i) for i in range(11)]  # 6 sources
    table = holdout.class_bounds(narrow + wide)
    plo = table["pooled"]["lo"]
    assert plo < 0
    lora, cnn = table["classes"]["lora"], table["classes"]["cnn"]
    assert lora["lo"] == pytest.approx(plo / 2, abs=1e-4) and lora["lo"] <= plo / 2
    want = (6 * cnn["own_lo"] + 2 * plo) / 8
    assert want - 1e-4 <= cnn["lo"] <= want
    assert holdout.band_of(table, "lora") == (lora["lo"], lora["hi"])


def test_class_bounds_pool_a_class_of_one_source() -> None:
    """Enough rows, all from one source: that source's spread is no interval for another."""
    residuals = [("tp-pp", "one", 0.001 * i) for i in range(8)] + [
        ("lora", f"s{i % 3}", 0.05 * i) for i in range(12)
    ]
    table = holdout.class_bounds(residuals)
    assert table["classes"]["tp-pp"] == {"pooled": True, "rows": 8, "sources": 1}
    assert table["classes"]["lora"]["sources"] == 3
    assert holdout.band_of(table, "tp-pp") == holdout.band_of(table, "no-such-class")
