"""Catalog CLI: listings, filters, validation, SkyPilot import and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

OVERRIDE = """
offerings:
  - provider: example
    instance_type: ex.8xa100
    regions: [test-1]
    gpu: A100-80GB
    gpu_count: 8
    vcpus: 96
    ram_gb: 1152
    intra_node: nvswitch
    inter_node_gbps: 400
    prices:
      - {mode: on-demand, per_hour: 20.0, currency: USD, granularity_s: 1, minimum_s: 60}
      - {mode: spot, per_hour: 8.0, currency: USD, granularity_s: 1, minimum_s: 60}
      - {mode: monthly, per_month: 9000, currency: USD}
    source: https://example.com/pricing
    as_of: 2026-11-01
"""


def test_gpus_json_lists_required_ids(cli, required_gpu_ids: frozenset[str]) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "gpus", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert {r["id"] for r in rows} >= required_gpu_ids
    h100 = next(r for r in rows if r["id"] == "H100-SXM")
    assert "fp8" in h100["precisions"]
    assert "bf16" not in next(r for r in rows if r["id"] == "T4")["precisions"]


def test_offerings_json_counts(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "offerings", "--json")
    rows = json.loads(result.stdout)
    assert len(rows) >= 150
    assert len({r["provider"] for r in rows}) >= 8
    assert all(r["source"] and r["as_of"] for r in rows)
    assert sum(1 for r in rows if "on-demand" in r["hourly"]) >= 100


def test_offering_filters(cli) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(
        cli(
            "catalog",
            "offerings",
            "--json",
            "--gpu",
            "h100",
            "--provider",
            "aws",
            "--max-price",
            "200",
        ).stdout
    )
    assert rows
    assert {r["gpu"] for r in rows} == {"H100-SXM"}
    assert {r["provider"] for r in rows} == {"aws"}
    assert all(r["hourly"]["on-demand"] <= 200 for r in rows)


def test_override_shadows_and_is_used(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "over.yaml"
    path.write_text(OVERRIDE)
    rows = json.loads(
        cli(
            "catalog", "offerings", "--json", "--provider", "example", "--catalog", str(path)
        ).stdout
    )
    assert [r["instance_type"] for r in rows] == ["ex.8xa100"]
    assert rows[0]["hourly"]["monthly"] == pytest.approx(9000 / 730, rel=1e-3)
    assert cli("catalog", "validate", str(path)).exit_code == 0


def test_user_catalog_from_gpuplan_home(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "h"
    home.mkdir()
    (home / "catalog.yaml").write_text(OVERRIDE)
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    from typer.testing import CliRunner

    from gpuplan.cli.app import app

    out = CliRunner().invoke(app, ["catalog", "offerings", "--json", "--provider", "example"])
    assert json.loads(out.stdout)[0]["instance_type"] == "ex.8xa100"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: t.replace("gpu: A100-80GB", "gpu: A100-81GB"), "unknown GPU id 'A100-81GB'"),
        (lambda t: t.replace("per_hour: 20.0", "per_hour: -20.0"), "per_hour"),
        (lambda t: t.replace("vcpus: 96", "vcpus: 96\n    colour: red"), "colour: unknown field"),
        (
            lambda t: t.replace(
                "currency: USD, granularity_s: 1, minimum_s: 60}\n      - {mode: spot",
                "currency: XYZ, granularity_s: 1, minimum_s: 60}\n      - {mode: spot",
            ),
            "XYZ",
        ),
        (lambda t: t.replace("as_of: 2026-11-01", "as_of: 2099-01-01"), "future"),
        (lambda t: t.replace("regions: [test-1]", "regions: [test-1"), "malformed YAML"),
    ],
)
def test_bad_override_one_line_exit_2(cli, tmp_path: Path, mutate, needle) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.yaml"
    path.write_text(mutate(OVERRIDE))
    result = cli("catalog", "offerings", "--catalog", str(path))
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]


def test_unknown_gpu_did_you_mean(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("catalog", "gpus", "--gpu", "H10")
    assert result.exit_code == 2
    assert "did you mean" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("cloud", ["lambda", "gcp"])
def test_import_skypilot(cli, shared_ref: Path, tmp_path: Path, cloud: str) -> None:  # type: ignore[no-untyped-def]
    src = shared_ref / "skypilot-catalog" / "anycloud" / cloud / "vms.csv"
    out = tmp_path / f"{cloud}.yaml"
    result = cli(
        "catalog", "import", "skypilot", str(src), "--out", str(out), "--as-of", "2026-05-20"
    )
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    assert data["offerings"]
    assert cli("catalog", "validate", str(out)).exit_code == 0
    rows = json.loads(
        cli("catalog", "offerings", "--json", "--provider", cloud, "--catalog", str(out)).stdout
    )
    imported = [r for r in rows if "SkyPilot-format" in r["source"]]
    assert imported
    if cloud == "gcp":
        a3 = next(r for r in imported if r["instance_type"] == "a3-highgpu-8g")
        central = next(
            p
            for p in a3["region_prices"]
            if p["region"] == "us-central1" and p["mode"] == "on-demand"
        )
        # host VM ($9.46/h in us-central1) + 8 x H100 row ($33.61/h), per the reference README
        assert central["hourly_equivalent"] == pytest.approx(9.46 + 33.61, abs=0.1)
        assert a3["gpu"] == "H100-SXM"
        assert len({r["instance_type"] for r in imported}) == len(imported)  # one row per type
    for r in imported:
        if "spot" in r["hourly"] and "on-demand" in r["hourly"]:
            assert r["hourly"]["spot"] < r["hourly"]["on-demand"]


def test_import_rejects_non_skypilot_csv(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    result = cli(
        "catalog",
        "import",
        "skypilot",
        str(bad),
        "--out",
        str(tmp_path / "o.yaml"),
        "--provider",
        "gcp",
    )
    assert result.exit_code == 2
    assert "missing column" in result.stderr
    assert not (tmp_path / "o.yaml").exists()


def _walk(command, path=()):  # type: ignore[no-untyped-def]
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _walk(sub, (*path, name))


def test_every_command_and_option_has_help() -> None:
    import typer

    from gpuplan.cli.app import app

    root = typer.main.get_command(app)
    missing = []
    for path, command in _walk(root):
        if not (command.help or command.short_help):
            missing.append(" ".join(path) or "gpuplan")
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "help", None):
                missing.append(f"{' '.join(path)} {param.opts[0]}")
    assert not missing, missing


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("gpuplan ")
