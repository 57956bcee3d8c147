"""``gpuplan validate``: the error summary and the CI gates on it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpuplan.validation import predict_memory

REPO = Path(__file__).resolve().parents[1]
FIELDS = (
    "id,status,spec,gpu,count,metric,measured,unit,cuda_context_mib,source,what_was_measured,notes"
)
SPEC = "{model: gpt2, method: full, precision: bf16-mixed, micro_batch_size: 2, seq_len: 512}"


def _row(rid: str, measured_bytes: float) -> dict[str, str]:
    return {
        "id": rid,
        "status": "ok",
        "spec": SPEC,
        "gpu": "A100-80GB",
        "count": "1",
        "metric": "allocated",
        "measured": f"{measured_bytes:.0f}",
        "unit": "B",
        "cuda_context_mib": "",
        "source": "synthetic test row",
        "what_was_measured": "test",
        "notes": "",
    }


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """Two rows: one measured exactly as predicted, one measured 2.5x the prediction."""
    predicted, _ = predict_memory(_row("probe", 1.0), REPO)
    path = tmp_path / "memory.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS.split(","))
        w.writeheader()
        w.writerow(_row("exact", predicted))
        w.writerow(_row("low", predicted * 2.5))
    return path


def test_summary_counts_under_predictions(cli, table: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "memory", "--table", str(table), "--json")
    assert r.exit_code == 0
    s = json.loads(r.output)["summary"]
    assert s["rows"] == 2
    assert s["under_predicted_over_10pct"] == 1
    assert s["rows_over_50pct"] == 1
    assert s["worst_id"] == "low"
    assert s["worst_abs_error"] == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("--max-under", "0.6"), 0, ""),
        (("--max-under", "0.4"), 1, "1 of 2 rows predicted >10% below"),
        (("--max-over-50", "1"), 0, ""),
        (("--max-over-50", "0"), 1, "1 rows off by more than 50%"),
        (("--max-median", "0.2"), 1, "exceeds --max-median"),
    ],
)
def test_gates_exit_1(cli, table: Path, args: tuple[str, ...], code: int, needle: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "memory", "--table", str(table), *args)
    assert r.exit_code == code
    assert needle in (r.stderr if code else r.output) or not needle


def test_refused_rows_lists_layouts_that_ran_but_do_not_fit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A row whose stated layout ran is a false "does not fit" when the memory model refuses
    it; `validate training --max-refused` gates on their number."""
    from gpuplan.validation import refused_rows

    header = (
        "id,status,spec,gpu,count,gpus_per_node,intra_node,inter_node_gbps,fabric,metric,"
        "measured,unit,source,what_was_measured,notes\n"
    )
    fits = (
        'small,ok,"{model: llama-3-8b, method: lora, precision: bf16-true, seq_len: 512, '
        'micro_batch_size: 1, parallelism: {sharding: none}}",H100-SXM,1,1,none,,,'
        "tokens_per_s_per_gpu,1000,tokens/s/gpu,test,test,test\n"
    )
    refused = (
        'huge,ok,"{model: llama-3-70b, method: full, precision: bf16-mixed, seq_len: 8192, '
        'micro_batch_size: 8, parallelism: {sharding: none}}",A10G,1,1,none,,,'
        "tokens_per_s_per_gpu,10,tokens/s/gpu,test,test,test\n"
    )
    (tmp_path / "validation").mkdir()
    table = tmp_path / "validation" / "t.csv"
    table.write_text(header + fits + refused, encoding="utf-8")
    got = refused_rows(table)
    assert [r.id for r in got] == ["huge"]
    assert got[0].device_used_bytes > got[0].capacity_bytes


def _result(metric: str, predicted: float, measured: float):  # type: ignore[no-untyped-def]
    from gpuplan.validation import RowResult

    return RowResult(
        id=f"{metric}-{predicted}",
        metric=metric,
        predicted=predicted,
        measured=measured,
        error=(predicted - measured) / measured,
    )


def test_time_error_inverts_speed_metrics() -> None:
    """A speed predicted 25% high is a time predicted 20% short: the plan runs over. A time
    metric keeps its own sign; memory rows have no time error."""
    assert _result("tokens_per_s_per_gpu", 125.0, 100.0).time_error == pytest.approx(-0.2)
    assert _result("samples_per_s", 80.0, 100.0).time_error == pytest.approx(0.25)
    assert _result("time_to_train_s", 80.0, 100.0).time_error == pytest.approx(-0.2)
    assert _result("allocated", 80.0, 100.0).time_error is None


def test_time_under_count_is_the_dangerous_direction() -> None:
    """`under_predicted_over_10pct` counts values below the measurement whatever they measure
    (for a speed, a pessimistic plan); `time_under_predicted_over_10pct` counts the runs that
    take more than 10% longer than predicted, speed and time metrics alike."""
    from gpuplan.validation import Report

    rows = (
        _result("tokens_per_s_per_gpu", 130.0, 100.0),  # speed high: time 23% short
        _result("tokens_per_s_per_gpu", 70.0, 100.0),  # speed low: pessimistic
        _result("time_to_train_s", 70.0, 100.0),  # time 30% short
        _result("time_to_train_s", 105.0, 100.0),
    )
    report = Report(table="t", rows=rows, excluded=())
    s = report.summary()
    assert s["under_predicted_over_10pct"] == 2
    assert s["time_under_predicted_over_10pct"] == 2
    assert report.gate_failures(max_time_under=0.5) == []
    assert (
        "2 of 4 rows have their run time predicted >10% short"
        in (report.gate_failures(max_time_under=0.25)[0])
    )
    memory = Report(table="m", rows=(_result("allocated", 80.0, 100.0),), excluded=())
    assert memory.summary()["time_under_predicted_over_10pct"] is None


def test_by_source_weighs_each_source_once() -> None:
    """One large source cannot set the median over sources: three rows of source a at 2%,
    one of b at 20%, one of c at 10% give a row median of 2% but a source median of 10%; a
    row that failed (no error) is left out of its source."""
    import dataclasses

    from gpuplan.validation import Report

    def row(src: str, pred: float) -> object:
        return dataclasses.replace(_result("tokens_per_s_per_gpu", pred, 100.0), source=src)

    failed = dataclasses.replace(_result("tokens_per_s_per_gpu", 0.0, 100.0), error=None)
    rows = (row("a", 102), row("a", 98), row("a", 102), row("b", 120), row("c", 90), failed)
    report = Report(table="t", rows=rows, excluded=())  # type: ignore[arg-type]
    groups = report.by_source()
    assert [(g["source"], g["rows"]) for g in groups] == [("a", 3), ("b", 1), ("c", 1)]
    assert groups[0]["median_abs_error"] == pytest.approx(0.02)
    assert report.median_abs_error == pytest.approx(0.02)
    assert report.summary()["median_of_source_medians"] == pytest.approx(0.10)


def test_validate_json_lists_the_loso_error_by_source(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("validate", "training", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    groups = data["loso"]["by_source"]
    assert sum(g["rows"] for g in groups) == sum(
        1 for r in data["loso"]["rows"] if r["error"] is not None
    )
    assert [g["rows"] for g in groups] == sorted((g["rows"] for g in groups), reverse=True)
    assert data["loso"]["summary"]["median_of_source_medians"] > 0


@pytest.fixture
def traced_table(tmp_path: Path) -> Path:
    """The H200 GPT-2 checkpointed rows (three metrics of one run) and a QLoRA row."""
    (tmp_path / "validation").mkdir()
    lines = (REPO / "validation" / "memory.csv").read_text(encoding="utf-8").splitlines()
    keep = [
        ln
        for ln in lines[1:]
        if ln.startswith("h200-memcheck-20261204-gpt2-full-bf16-mixed-adamw-ckpt-")
        or ln.startswith("llamafactory-llama2-7b-hf-4bit,")
    ]
    assert len(keep) == 4
    path = tmp_path / "validation" / "memory.csv"
    path.write_text("\n".join([lines[0], *keep]) + "\n", encoding="utf-8")
    return path


def test_validate_memory_trace(cli, traced_table: Path) -> None:  # type: ignore[no-untyped-def]
    """--trace runs the traced estimate on the rows it can trace, within 3% here, and lists
    the others with the tracer's reason."""
    pytest.importorskip("transformers")
    r = cli("validate", "memory", "--trace", "--table", str(traced_table), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert {row["metric"] for row in data["rows"]} == {"allocated", "reserved", "device_used"}
    assert all(abs(row["error"]) < 0.03 for row in data["rows"])
    (skipped,) = data["not_traced"]
    assert skipped["id"] == "llamafactory-llama2-7b-hf-4bit" and "qlora" in skipped["reason"]
    tight = cli("validate", "memory", "--trace", "--table", str(traced_table), "--max-median", "0")
    assert tight.exit_code == 1 and "traced" in tight.stderr


def test_validate_memory_trace_refuses_the_analytic_gates(cli, traced_table: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "memory", "--trace", "--table", str(traced_table), "--min-coverage", "0.8")
    assert r.exit_code == 2
    assert "--min-coverage" in r.stderr and "--trace" in r.stderr
