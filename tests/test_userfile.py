"""The one reader of user files: what it accepts, and the one-line errors for what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.errors import GpuPlanError, SpecError
from gpuplan.userfile import (
    MAX_DEPTH,
    parse_json,
    parse_yaml,
    read_csv,
    read_json,
    read_text,
    read_yaml,
)


def test_good_yaml_json_and_csv_are_read(tmp_path: Path) -> None:
    y = tmp_path / "a.yaml"
    y.write_bytes("\ufeffmodel: llama-3-8b\nlora: {rank: 8, targets: [q_proj]}\n".encode())
    assert read_yaml(y, what="spec") == {
        "model": "llama-3-8b",
        "lora": {"rank": 8, "targets": ["q_proj"]},
    }
    j = tmp_path / "c.json"
    j.write_text('{"model_type": "llama", "n": [1, 2]}')
    assert read_json(j, what="model") == {"model_type": "llama", "n": [1, 2]}
    c = tmp_path / "t.csv"
    c.write_text('id,spec,note\nx,"{a: 1, b: 2}"\n\ny,z,w\n')
    header, rows = read_csv(c, what="--table")
    assert header == ["id", "spec", "note"]
    assert rows == [
        {"id": "x", "spec": "{a: 1, b: 2}", "note": ""},
        {"id": "y", "spec": "z", "note": "w"},
    ]


def test_nesting_up_to_the_limit_is_fine_and_one_more_is_not() -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_yaml(ok, what="x", path=None) is not None
    assert parse_json(ok, what="x", path=None) is not None
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    for parse in (parse_yaml, parse_json):
        with pytest.raises(GpuPlanError, match="nested more than 100 levels"):
            parse(deep, what="x", path=None)


def test_brackets_inside_json_strings_do_not_count_as_nesting() -> None:
    text = '{"a": "' + "[" * 1000 + '\\"' + "{" * 1000 + '"}'
    assert parse_json(text, what="x", path=None)["a"].startswith("[[")


def test_errors_keep_the_callers_class_and_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_bytes(b"a: 1\nb: \xc3\x28\n")
    with pytest.raises(SpecError, match=r"spec: .*s\.yaml: not UTF-8 text: byte 0xc3 at offset 8"):
        read_text(bad, what="spec", error=SpecError)


def test_anchors_without_aliases_and_quoted_keys_are_allowed() -> None:
    assert parse_yaml("a: &x 1\n'on': 2\n'1': 3\n", what="x", path=None) == {
        "a": 1,
        "on": 2,
        "1": 3,
    }


def test_same_key_in_different_mappings_is_not_a_duplicate() -> None:
    text = "a: {k: 1}\nb: {k: 2}\nc: [{k: 1}, {k: 2}]\n"
    assert parse_yaml(text, what="x", path=None)["c"] == [{"k": 1}, {"k": 2}]
