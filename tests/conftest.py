"""Shared fixtures: paths, the CLI runner, the shared reference folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings
from typer.testing import CliRunner

# CI runs every property test on a fixed seed sequence (reproducible); local runs explore
# new random examples, which is how counterexamples get found and pinned as regressions.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
EXAMPLES = REPO / "examples"

# The GPU ids the built-in catalog must always carry (catalog CLI and offerings tests).
REQUIRED_GPU_IDS = frozenset(
    {
        "T4",
        "A10",
        "A10G",
        "L4",
        "L40S",
        "V100-16GB",
        "V100-32GB",
        "A100-40GB",
        "A100-80GB",
        "A100-80GB-PCIE",
        "H100-SXM",
        "H100-PCIE",
        "H100-NVL",
        "H200",
        "H20",
        "B200",
        "GB200",
        "MI300X",
        "MI325X",
        "RTX-4090",
        "RTX-3090",
        "RTX-A6000",
    }
)


@pytest.fixture
def required_gpu_ids() -> frozenset[str]:
    """The GPU ids the built-in catalog must always carry."""
    return REQUIRED_GPU_IDS


@pytest.fixture
def shared_ref() -> Path:
    """``../shared/reference`` beside the repo; skips the test when it is absent."""
    ref = SHARED / "reference"
    if not ref.is_dir():
        pytest.skip("../shared/reference is not present")
    return ref


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Invoke ``gpuplan ARGS...``; returns the click Result. User config isolated in tmp."""
    from gpuplan.cli.app import app

    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke
