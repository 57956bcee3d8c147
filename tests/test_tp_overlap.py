"""Which tensor-parallel collectives a GEMM hides (spec ``parallelism.tp_comm_overlap``)."""

from __future__ import annotations

import pytest

from gpuplan.catalog.loader import load_catalog
from gpuplan.estimate.calibration import efficiencies
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.speed import tp_exposed_time
from gpuplan.spec import SpecError, parse_spec


def _spec(overlap: str, checkpointing: str = "none", framework: str = "megatron") -> dict:
    return {
        "model": "llama-3.1-70b",
        "precision": "bf16-mixed",
        "seq_len": 4096,
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "activation_checkpointing": checkpointing,
        "framework": framework,
        "parallelism": {"sharding": "zero1", "tp": 8, "tp_comm_overlap": overlap},
    }


def _time(spec: dict):  # type: ignore[no-untyped-def]
    gpu = load_catalog(use_user=False).gpu("H100-SXM")
    return configure(parse_spec(spec), gpu, 8, default_topology(gpu, 8), require_fit=False).time


def test_exposed_time_by_mode() -> None:
    # 3 s of collectives, 1 s of them in backward, 80% of an overlapped one hidden
    assert tp_exposed_time("none", 3.0, 1.0, 0.8) == pytest.approx(3.0)
    assert tp_exposed_time("backward", 3.0, 1.0, 0.8) == pytest.approx(2.2)
    assert tp_exposed_time("pipelined", 3.0, 1.0, 0.8) == pytest.approx(0.6)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_backward_mode_hides_only_the_backward_reductions(checkpointing: str) -> None:
    """Forward passes: one, or two with full recompute; the backward has as many collectives
    as one forward (Megatron's column-parallel input-gradient all-reduces)."""
    none = _time(_spec("none", checkpointing)).parts["tp comm exposed"]
    backward = _time(_spec("backward", checkpointing)).parts["tp comm exposed"]
    pipelined = _time(_spec("pipelined", checkpointing)).parts["tp comm exposed"]
    overlap = efficiencies().overlap["tensor_parallel"]
    passes = 3 if checkpointing == "full" else 2
    assert none > backward > pipelined > 0
    assert backward == pytest.approx(none * (1 - overlap / passes), rel=1e-6)
    assert pipelined == pytest.approx(none * (1 - overlap), rel=1e-6)


def test_auto_is_the_engines_own() -> None:
    """auto: overlapped as Transformer Engine's userbuffers under megatron; waited on under
    torchtitan's DTensor plan."""
    overlapped = _time(_spec("pipelined")).parts["tp comm exposed"]
    assert _time(_spec("auto")).parts["tp comm exposed"] == pytest.approx(overlapped)
    titan = {**_spec("auto", framework="torchtitan"), "parallelism": {"sharding": "fsdp", "tp": 8}}
    waited = {**titan, "parallelism": {**titan["parallelism"], "tp_comm_overlap": "none"}}
    assert _time(titan).parts["tp comm exposed"] == pytest.approx(
        _time(waited).parts["tp comm exposed"]
    )


def test_the_assumption_says_which_collectives_wait() -> None:
    lines = _time(_spec("backward")).assumptions
    assert any("forward and recompute ones waited on" in a for a in lines)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        parse_spec(_spec("always"))


def test_the_cli_names_the_field_and_exits_2(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from gpuplan.cli.app import app

    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "model: llama-3.1-8b\nseq_len: 2048\nmicro_batch_size: 1\n"
        "parallelism: {tp: 2, tp_comm_overlap: sometimes}\n"
    )
    result = CliRunner().invoke(app, ["fit", str(spec), "--gpu", "H100-SXM", "--gpus", "2"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tp_comm_overlap" in lines[0], result.stderr
