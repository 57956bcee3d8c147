"""Job spec parsing: valid specs, --set overrides, and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.errors import SpecError
from gpuplan.spec import apply_overrides, load_spec, parse_spec, spec_json_schema
from gpuplan.units import parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("24h", 86400), ("7d", 604800), ("1.5h", 5400), (30, 30)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("bad", ["10q", "-5m", "h", "", "1e400s"])
def test_bad_durations_name_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match="deadline"):
        parse_duration_s(bad, field="deadline")


def test_full_spec_parses() -> None:
    spec = parse_spec(
        {
            "model": "llama-3-8b",
            "method": "lora",
            "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
            "precision": "bf16-mixed",
            "optimizer": "adamw-8bit",
            "micro_batch_size": 4,
            "global_batch_size": 64,
            "seq_len": 2048,
            "activation_checkpointing": "full",
            "offload": "optimizer",
            "parallelism": {"sharding": "zero3", "tp": 2, "pp": 1},
            "work": {"samples": 10000, "epochs": 3},
            "constraints": {
                "deadline": "7d",
                "budget": 500,
                "currency": "CNY",
                "providers": ["AWS", "alibaba"],
                "compliance": ["mlps-3"],
                "billing": ["spot", "on-demand"],
                "max_gpus": 64,
                "bare_metal_only": True,
            },
        }
    )
    assert spec.constraints.deadline == 7 * 86400
    assert spec.constraints.providers == ("aws", "alibaba")
    assert spec.compute_dtype == "bf16"
    assert spec.parallelism != "auto" and spec.parallelism.tp == 2  # type: ignore[union-attr]


def test_lora_defaults_filled() -> None:
    spec = parse_spec({"model": "gpt2", "method": "qlora"})
    assert spec.lora is not None and spec.lora.rank == 16


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"model": "gpt2", "micro_batch_size": 0}, "micro_batch_size"),
        ({"model": "gpt2", "precision": "fp9"}, "precision"),
        ({"model": "gpt2", "colour": "red"}, "colour: unknown field"),
        ({"model": "gpt2", "constraints": {"deadline": "3 fortnights"}}, "constraints.deadline"),
        ({"model": "gpt2", "parallelism": {"tp": 0}}, "parallelism.tp"),
        ({"model": "gpt2", "parallelism": "manual"}, "parallelism"),
        ({"model": "gpt2", "work": {"tokens": 5, "steps": 2}}, "work"),
        ({"model": "gpt2", "constraints": {"billing": ["weekly"]}}, "constraints.billing"),
        ({"model": "gpt2", "global_batch_size": 10, "micro_batch_size": 3}, "global_batch_size"),
        ({"method": "full"}, "model"),
    ],
)
def test_bad_specs_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    line = info.value.one_line()
    assert "\n" not in line
    assert f"spec: {field}" in line


def test_overrides_nested_and_typed() -> None:
    out = apply_overrides(
        {"model": "gpt2", "lora": {"rank": 4}}, ["lora.alpha=8", "micro_batch_size=16"]
    )
    assert out == {"model": "gpt2", "lora": {"rank": 4, "alpha": 8}, "micro_batch_size": 16}
    with pytest.raises(SpecError, match="--set"):
        apply_overrides({}, ["precision"])


def test_load_spec_file_and_malformed_yaml(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text("model: gpt2\nseq_len: 1024\n")
    assert load_spec(good, ["precision=fp32"]).precision == "fp32"
    bad = tmp_path / "b.yaml"
    bad.write_text("model: [gpt2\n")
    with pytest.raises(SpecError, match="malformed YAML"):
        load_spec(bad)


def test_schema_lists_contract_fields() -> None:
    props = spec_json_schema()["properties"]
    for name in (
        "model",
        "method",
        "lora",
        "precision",
        "optimizer",
        "micro_batch_size",
        "global_batch_size",
        "seq_len",
        "image_size",
        "activation_checkpointing",
        "offload",
        "parallelism",
        "work",
        "constraints",
    ):
        assert name in props


@pytest.mark.parametrize(
    ("text", "expected"), [("1e9", 10**9), ("2.5e9", 2_500_000_000), ("1.0e+9", 10**9)]
)
def test_work_counts_in_scientific_notation(text: str, expected: int) -> None:
    """YAML reads 1e9 and 2.5e9 as strings; a count written so is the whole number it says."""
    import yaml

    data = yaml.safe_load(f"model: gpt2\nseq_len: 128\nwork: {{tokens: {text}}}\n")
    assert parse_spec(data).work.tokens == expected


@pytest.mark.parametrize("text", ["1.5e0", "1e400", "ten"])
def test_work_counts_that_are_not_whole_numbers_are_one_line_errors(text: str) -> None:
    import yaml

    data = yaml.safe_load(f"model: gpt2\nseq_len: 128\nwork: {{tokens: {text}}}\n")
    with pytest.raises(SpecError, match=r"work\.tokens"):
        parse_spec(data)
