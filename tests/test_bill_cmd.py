"""``gpuplan bill``: the examples run, JSON is complete, bad usage files fail in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES

OVERRIDE = """
billing:
  - provider: testcloud
    granularity_s: 1
    minimum_s: 0
    egress_usd_per_gb: 0.0
    source: test rule
    as_of: 2026-01-01
offerings:
  - provider: testcloud
    instance_type: h100-1x
    regions: [r1]
    gpu: H100-SXM
    gpu_count: 1
    intra_node: none
    prices:
      - {mode: on-demand, per_hour: 1.0, currency: USD}
      - {mode: monthly, per_month: 500.0, currency: USD}
    source: test price page
    as_of: 2026-01-01
"""


def _one_error_line(result: Any, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_team_example_table(cli: Any) -> None:
    result = cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"))
    assert result.exit_code == 0, result.output
    assert "H100-SXM" in result.stdout
    assert "per month" in result.stdout
    assert "auto-stop" in result.stdout
    assert "Why " in result.stdout


def test_team_example_json(cli: Any) -> None:
    result = cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"), "--json", "--currency", "EUR")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["currency"] == "EUR"
    assert data["peak_busy_gpus"] == 8
    assert data["offerings"], "no offering costed"
    costs = [o["best_monthly_cost"] for o in data["offerings"]]
    assert costs == sorted(costs)
    for off in data["offerings"]:
        assert off["provider"] in ("aws", "gcp", "azure", "lambda", "runpod", "vast", "verda",
                                   "nebius")  # fmt: skip
        assert off["strategies"]
        assert off["assumptions"]
        assert any("FX: 1 USD" in a for a in off["assumptions"])
        assert off["fx"][0]["as_of"]


def test_trace_example_needs_a_gpu(cli: Any) -> None:
    _one_error_line(cli("bill", str(EXAMPLES / "usage-trace.csv")), "--gpu")


def test_trace_example_mixes_monthly_and_on_demand(cli: Any) -> None:
    result = cli("bill", str(EXAMPLES / "usage-trace.csv"), "--gpu", "A100-40GB", "--json",
                 "--provider", "tencent")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["busy_gpu_hours_per_month"] > 0
    one_gpu = next(o for o in data["offerings"] if o["instance_type"] == "GT4.4XLARGE96")
    kinds = {s["kind"] for s in one_gpu["strategies"]}
    assert {"on-demand", "on-demand+autostop", "commitment"} <= kinds
    # two GPUs train around the clock: commit those, burst the rest
    assert one_gpu["strategies"][0]["kind"] == "mix"
    assert one_gpu["strategies"][0]["committed_instances"] == 2


def test_override_catalog_hand_computed_mix(cli: Any, tmp_path: Path) -> None:
    # $1/h on demand vs $500/month: the 24x7 GPU is committed ($500), the 10 h x 5 d one
    # bursts: 50 h/week x 730/168 = $217.26. Mix $717.26.
    cat = tmp_path / "cat.yaml"
    cat.write_text(OVERRIDE, encoding="utf-8")
    usage = tmp_path / "u.yaml"
    usage.write_text(
        "gpu: H100-SXM\nproviders: [testcloud]\ndemand:\n"
        "  - {gpus: 1, hours_per_day: 24, days_per_week: 7}\n"
        "  - {gpus: 1, hours_per_day: 10, days_per_week: 5}\n",
        encoding="utf-8",
    )
    result = cli("bill", str(usage), "--catalog", str(cat), "--json")
    assert result.exit_code == 0, result.output
    (off,) = json.loads(result.stdout)["offerings"]
    assert off["best_monthly_cost"] == pytest.approx(500 + 50 * 730 / 168, abs=1e-3)
    assert off["strategies"][0]["committed_instances"] == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpu: H100-SXM\ngpus: [8\n", "malformed YAML"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: 10\ndays_per_week: 5\ncolour: red\n",
         "colour: unknown field"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: -2\ndays_per_week: 5\n", "hours_per_day"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: 20\nidle_hours_per_day: 6\ndays_per_week: 5\n",
         "hours_per_day + idle_hours_per_day"),
        ("gpu: H100-SXM\ndemand:\n  - {gpus: 2, hours_per_day: 24, days_per_week: 9}\n",
         "demand.0.days_per_week"),
        ("gpu: H100-SXM\ngpus: 8\ndays_per_week: 5\n", "hours_per_day: field required"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: 8\ndays_per_week: 5\n"
         "demand: [{gpus: 1, hours_per_day: 1, days_per_week: 1}]\n", "not both"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: 8\ndays_per_week: 5\nautostop_after: soon\n",
         "autostop_after"),
        ("- just a list\n", "expected a mapping"),
        ("gpu: H200X\ngpus: 8\nhours_per_day: 8\ndays_per_week: 5\n", "unknown GPU id"),
        ("gpu: H100-SXM\ngpus: 8\nhours_per_day: 8\ndays_per_week: 5\nproviders: [awz]\n",
         "did you mean aws"),
    ],
)  # fmt: skip
def test_bad_usage_file_is_one_line(cli: Any, tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "usage.yaml"
    path.write_text(text, encoding="utf-8")
    _one_error_line(cli("bill", str(path)), needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("timestamp,gpus_busy\n2026-11-02T00:00Z,1\n", "at least two rows"),
        ("time,gpus_busy\na,1\nb,2\n", "first column must be timestamp"),
        ("timestamp,gpus_busy\nyesterday,1\n2026-11-02T00:00Z,2\n", "row 2: timestamp"),
        ("timestamp,gpus_busy\n2026-11-02T00:00Z,-1\n2026-11-02T01:00Z,2\n", "row 2: gpus_busy"),
        ("timestamp,gpus_busy\n2026-11-02T00:00Z,1.5\n2026-11-02T01:00Z,2\n", "whole number"),
        ("timestamp,gpus_busy,gpus_on\n2026-11-02T00:00Z,3,2\n2026-11-02T01:00Z,2,2\n",
         "gpus_on: fewer than gpus_busy"),
        ("timestamp,gpu0\n2026-11-02T01:00Z,50\n2026-11-02T00:00Z,50\n", "not after"),
        ("timestamp,gpu0\n2026-11-02T00:00Z,150\n2026-11-02T01:00Z,50\n", "row 2: gpu0"),
        ("timestamp,gpus_busy,power\n2026-11-02T00:00Z,1,1\n2026-11-02T01:00Z,1,1\n",
         "unknown column 'power'"),
    ],
)  # fmt: skip
def test_bad_trace_is_one_line(cli: Any, tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text, encoding="utf-8")
    _one_error_line(cli("bill", str(path), "--gpu", "H100-SXM"), needle)


def test_missing_file_and_bad_currency(cli: Any, tmp_path: Path) -> None:
    result = cli("bill", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    _one_error_line(
        cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"), "--currency", "XYZ"), "currency"
    )
    _one_error_line(
        cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"), "--autostop-after", "later"),
        "--autostop-after",
    )


def test_no_matching_offering(cli: Any) -> None:
    _one_error_line(
        cli("bill", str(EXAMPLES / "usage-team-8xh100.yaml"), "--region", "atlantis"),
        "no H100-SXM offering matches",
    )
