"""First run: the README's command reads well at 80 columns, the answer comes first, the
spec's limits stand unless a flag is given, imported rows carry the right as-of, and
progress shows only on a terminal (issue 15)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from gpuplan.cli.common import progress

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str, tty: int | None = None):  # type: ignore[no-untyped-def]
    """Invoke gpuplan; ``tty`` = a terminal that many columns wide, None = a pipe."""
    from gpuplan.cli.app import app

    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    if tty is None:
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
        monkeypatch.setenv("COLUMNS", "80")
    else:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
        monkeypatch.setenv("COLUMNS", str(tty))
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def table_rows(text: str) -> list[str]:
    return [ln for ln in ANSI.sub("", text).splitlines() if ln.startswith("│")]


def test_readme_first_command_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = run(monkeypatch, tmp_path, "plan", str(EXAMPLES / "llama3-8b-lora.yaml"), tty=80)
    assert result.exit_code == 0, result.output
    lines = ANSI.sub("", result.stdout).splitlines()
    rows = table_rows(result.stdout)
    assert len(rows) == 10  # --top 10, each option on one line
    assert all(len(ln) <= 80 for ln in lines if ln[:1] in "┏┃┡│└")
    # the answer comes first, before the table
    first = next(i for i, ln in enumerate(lines) if ln.startswith("Best: "))
    assert first < next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
    best = " ".join(lines[first : first + 3])
    for part in ("B200", "verda", "spot", "USD", "cheapest"):
        assert part in best
    assert "--wide shows all" in result.stdout


@pytest.mark.parametrize("width", [80, 100, 160])
def test_plan_rows_stay_on_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, width: int
) -> None:
    result = run(monkeypatch, tmp_path, "plan", str(EXAMPLES / "llama3-8b-lora.yaml"), tty=width)
    rows = table_rows(result.stdout)
    assert len(rows) == 10
    assert all(len(r) <= width for r in rows)


def test_wide_and_pipe_keep_every_column(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = str(EXAMPLES / "llama3-8b-lora.yaml")
    for result in (
        run(monkeypatch, tmp_path, "plan", spec, "--wide", tty=80),
        run(monkeypatch, tmp_path, "plan", spec),  # piped: no TTY
    ):
        text = ANSI.sub("", result.stdout)
        assert "per 1M tok" in text
        assert "verda 8A100.40S.176V x1" in text
        assert "hidden to fit" not in text
        assert len(table_rows(result.stdout)) == 10


@pytest.mark.parametrize(
    "args",
    [
        ("catalog", "offerings"),
        ("catalog", "gpus"),
        ("models",),
        ("fit", str(EXAMPLES / "llama3-8b-lora.yaml")),
        ("bill", str(EXAMPLES / "usage-team-8xh100.yaml")),
        ("scale", str(EXAMPLES / "llama3-8b-lora.yaml"), "--gpu", "H100-SXM"),
        ("serve", "plan", str(EXAMPLES / "serve-seed.yaml")),
    ],
)
def test_table_commands_fit_80_columns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = run(monkeypatch, tmp_path, *args, tty=80)
    assert result.exit_code == 0, result.output
    lines = [ln for ln in ANSI.sub("", result.stdout).splitlines() if ln[:1] in "┏┃┡│└"]
    assert lines
    assert all(len(ln) <= 80 for ln in lines)


def test_progress_only_on_a_terminal() -> None:
    tty = io.StringIO()
    with progress("working", out=Console(file=tty, force_terminal=True)):
        pass
    assert "working" in tty.getvalue()
    pipe = io.StringIO()
    with progress("working", out=Console(file=pipe, force_terminal=False)):
        pass
    assert pipe.getvalue() == ""


def test_plan_pipe_has_no_spinner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = run(monkeypatch, tmp_path, "plan", str(EXAMPLES / "llama3-8b-lora.yaml"), "--json")
    assert "planning" not in result.output
    json.loads(result.stdout)


def _pretrain_spec(tmp_path: Path, max_gpus: int) -> Path:
    spec = yaml.safe_load((EXAMPLES / "llama3-8b-lora.yaml").read_text())
    spec["constraints"]["max_gpus"] = max_gpus
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _largest(result) -> int:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    options = json.loads(result.stdout)["options"]
    return max(o["gpus"] for o in options)


def test_spec_max_gpus_stands_without_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Regression: `constraints.max_gpus: 128` was clamped to --max-gpus' default 64."""
    spec = str(_pretrain_spec(tmp_path, 128))
    args = ("plan", spec, "--objective", "time", "--top", "500", "--json")
    assert _largest(run(monkeypatch, tmp_path, *args)) > 64
    # a flag given overrides the spec, both ways
    assert _largest(run(monkeypatch, tmp_path, *args, "--max-gpus", "8")) <= 8
    small = str(_pretrain_spec(tmp_path, 8))
    args = ("plan", small, "--objective", "time", "--top", "500", "--json")
    assert _largest(run(monkeypatch, tmp_path, *args)) <= 8
    assert _largest(run(monkeypatch, tmp_path, *args, "--max-gpus", "16")) == 16


def test_scale_uses_the_spec_max_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = str(_pretrain_spec(tmp_path, 8))
    result = run(monkeypatch, tmp_path, "scale", spec, "--gpu", "H100-SXM", "--json")
    assert max(r["gpus"] for r in json.loads(result.stdout)) == 8
    result = run(
        monkeypatch, tmp_path, "scale", spec, "--gpu", "H100-SXM", "--max-gpus", "16", "--json"
    )
    assert max(r["gpus"] for r in json.loads(result.stdout)) == 16


def test_import_without_date_marks_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared_ref: Path
) -> None:
    src = shared_ref / "skypilot-catalog" / "verda" / "vms.csv"
    out = tmp_path / "verda.yaml"
    result = run(
        monkeypatch, tmp_path, "catalog", "import", "skypilot", str(src), "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "as_of: unknown" in result.stdout
    rows = yaml.safe_load(out.read_text())["offerings"]
    assert {r["as_of"] for r in rows} == {"unknown"}
    assert run(monkeypatch, tmp_path, "catalog", "validate", str(out)).exit_code == 0
    # with --as-of the date is the one given, not the file's
    result = run(
        monkeypatch,
        tmp_path,
        *("catalog", "import", "skypilot", str(src), "--out", str(out), "--as-of", "2026-03-04"),
    )
    assert result.exit_code == 0, result.output
    assert {str(r["as_of"]) for r in yaml.safe_load(out.read_text())["offerings"]} == {"2026-03-04"}


UNKNOWN_ROW = """
offerings:
  - provider: example
    instance_type: ex.1xh100
    regions: [test-1]
    gpu: H100-SXM
    gpu_count: 1
    intra_node: none
    prices:
      - {mode: on-demand, per_hour: 0.01, currency: USD}
    source: imported from a SkyPilot-format catalog
    as_of: unknown
"""


def test_planner_warns_when_price_age_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    over = tmp_path / "over.yaml"
    over.write_text(UNKNOWN_ROW)
    result = run(
        monkeypatch,
        tmp_path,
        *("plan", str(EXAMPLES / "llama3-8b-lora.yaml"), "--catalog", str(over), "--json"),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["options"][0]["provider"] == "example"
    assert data["options"][0]["price_as_of"] == "unknown"
    assert any("price age unknown" in w for w in data["warnings"])
    assert "unknown" in data["provenance"]["price_as_of"]
