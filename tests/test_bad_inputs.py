"""The bad-input sweep: every command that reads a user file or takes options, fed bad input.

Each case must end with exit 2 and exactly one non-empty line on stderr that
starts with ``error:``, no traceback, quickly, and no half-written output file.
The alias-bomb and deep-nesting cases run in a subprocess with a time and memory
limit, so a hang or a blow-up fails the test instead of the CI machine.

The corpus is generated (:func:`file_cases`, :func:`option_cases`); the counts
are in the comment above :data:`CASES` and in the issue-10 report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
GOOD_SPEC = "model: llama-3-8b\nmethod: lora\nseq_len: 2048\nmicro_batch_size: 4\n"
GOOD_REPLAY = json.dumps({"t": 0, "gpu": "", "gpu_exit": 0, "apps": "", "apps_exit": 0}) + "\n"
TABLE_HEADER = "id,status,spec,gpu,count,metric,measured,unit\n"

# Contents shared by every file kind: (name, bytes). ``None`` = the path does not exist;
# ``"DIR"`` = the path is a directory; ``"HUGE"`` = a sparse file over the 10 MiB limit;
# ``"FIFO"`` = a named pipe; ``"LINK"`` = a symlink to nothing; ``"BOMB"``: see alias_bomb().
COMMON: list[tuple[str, bytes | str | None]] = [
    ("missing", None),
    ("directory", "DIR"),
    ("empty", b""),
    ("blank", b"  \n\n\t\n"),
    ("non-utf8", b"model: llama\xff\xfe-3-8b\n"),
    ("latin1", "gpu: H100 \u00e9t\u00e9\n".encode("latin-1")),
    ("nul-bytes", b"model: llama-3-8b\x00\x00\n"),
    ("oversized", "HUGE"),
    ("fifo", "FIFO"),
    ("dangling-symlink", "LINK"),
]

DEEP_YAML = ("[" * 100_000 + "]" * 100_000).encode()
DEEP_BLOCK_YAML = "".join("  " * i + "- \n" for i in range(3000)).encode()
_LEVELS = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
    f"&{cur} [" + ",".join([f"*{prev}"] * 9) + "]"
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True)
]
#: "Billion laughs": 9**9 strings from ~370 bytes, as the value of a field each reader knows.
ALIAS_BOMB = ("[" + ", ".join(_LEVELS) + "]").encode()


def alias_bomb(kind: str) -> bytes:
    """The bomb under a field that ``kind``'s reader looks at (a watch config hung on it)."""
    key = {"spec": b"model: llama-3-8b\nseq_len", "catalog": b"fx", "usage-yaml": b"gpu"}
    return key.get(kind, b"window") + b": " + ALIAS_BOMB + b"\n"


#: Cases that may hang or exhaust memory/stack on a broken reader: run in a subprocess.
HANG_PRONE = {"deep-flow", "deep-block", "alias-bomb", "deep-json", "deep-jsonl", "fifo"}

YAML_BAD: list[tuple[str, bytes | str | None]] = [
    ("deep-flow", DEEP_YAML),
    ("deep-block", DEEP_BLOCK_YAML),
    ("alias-bomb", "BOMB"),
    ("malformed", b"model: [llama\n  x: }\n"),
    ("top-level-scalar", b"42\n"),
    ("top-level-list", b"- a\n- b\n"),
    ("only-comments", b"# nothing here\n"),
    ("duplicate-key", b"gpu: H100-SXM\ngpu: A100-80GB\nmodel: llama-3-8b\nmodel: gpt2\n"),
    ("non-string-key", b"on: true\n1: 2\n"),
    ("complex-key", b"? [a, b]\n: c\n"),
    ("tab-indent", b"model:\n\t- x\n"),
]
JSON_BAD: list[tuple[str, bytes | str | None]] = [
    ("deep-json", ("[" * 100_000 + "]" * 100_000).encode()),
    ("malformed-json", b'{"model_type": "llama",'),
    ("json-list", b"[1, 2]"),
    ("json-duplicate-key", b'{"model_type": "llama", "model_type": "gpt2"}'),
    ("json-nan", b'{"model_type": "llama", "hidden_size": NaN}'),
    ("json-bool-int", b'{"model_type": "llama", "hidden_size": true}'),
]
CSV_TRACE_BAD: list[tuple[str, bytes | str | None]] = [
    ("csv-header-only", b"timestamp,gpus_busy\n"),
    ("csv-ragged", b"timestamp,gpus_busy\n2026-01-01T00:00Z,1,2,3\n2026-01-01T01:00Z\n"),
    ("csv-bad-number", b"timestamp,gpus_busy\n2026-01-01T00:00Z,x\n2026-01-01T01:00Z,1\n"),
    ("csv-huge-field", b'timestamp,gpus_busy\n"' + b"1" * 200_000 + b'",1\n'),
    ("csv-binary-garbage", bytes(range(1, 128)) * 3),
]
TABLE_BAD: list[tuple[str, bytes | str | None]] = [
    ("table-header-only", TABLE_HEADER.encode()),
    ("table-no-columns", b"a,b\n1,2\n"),
    (
        "table-all-excluded",
        (TABLE_HEADER + 'x,excluded,"{model: gpt2}",A100-80GB,1,device_used,1,GiB\n').encode(),
    ),
    (
        "table-measured-zero",
        (
            TABLE_HEADER + 'x,ok,"{model: gpt2, seq_len: 8}",A100-80GB,1,device_used,0,GiB\n'
        ).encode(),
    ),
    (
        "table-measured-text",
        (
            TABLE_HEADER + 'x,ok,"{model: gpt2, seq_len: 8}",A100-80GB,1,device_used,lots,GiB\n'
        ).encode(),
    ),
    (
        "table-bad-count",
        (
            TABLE_HEADER + 'x,ok,"{model: gpt2, seq_len: 8}",A100-80GB,two,device_used,1,GiB\n'
        ).encode(),
    ),
    (
        "table-unknown-unit",
        (
            TABLE_HEADER + 'x,ok,"{model: gpt2, seq_len: 8}",A100-80GB,1,device_used,1,furlongs\n'
        ).encode(),
    ),
    ("table-huge-field", (TABLE_HEADER + '"' + "x" * 200_000 + '",ok\n').encode()),
]
SKYPILOT_BAD: list[tuple[str, bytes | str | None]] = [
    ("vms-wrong-columns", b"a,b\n1,2\n"),
    (
        "vms-ragged",
        b"InstanceType,AcceleratorName,AcceleratorCount,Price,Region\nx,A100,1,1,r,extra\n",
    ),
]
JSONL_BAD: list[tuple[str, bytes | str | None]] = [
    ("deep-jsonl", ("[" * 100_000 + "]" * 100_000 + "\n").encode()),
    ("jsonl-not-json", b"{nope\n"),
    ("jsonl-array", b"[1]\n"),
    ("jsonl-duplicate-key", GOOD_REPLAY.replace('"t": 0', '"t": 0, "t": 1').encode()),
    ("jsonl-comments-only", b"\n\n"),
]
SPEC_WRONG: list[tuple[str, bytes | str | None]] = [
    ("seq-len-true", b"model: llama-3-8b\nseq_len: true\n"),
    ("rank-true", b"model: llama-3-8b\nmethod: lora\nlora: {rank: true}\nseq_len: 512\n"),
    ("mbs-false", b"model: llama-3-8b\nmicro_batch_size: false\nseq_len: 512\n"),
    (
        "batch-over-job",
        b"model: llama-3-8b\nseq_len: 2048\nglobal_batch_size: 1000000000000\n"
        b"work: {tokens: 200000000}\n",
    ),
    (
        "batch-over-samples",
        b"model: gpt2\nseq_len: 1024\nmicro_batch_size: 8\nglobal_batch_size: 64\n"
        b"work: {samples: 10, epochs: 1}\n",
    ),
    ("deadline-zero", b"model: llama-3-8b\nseq_len: 512\nconstraints: {deadline: 0h}\n"),
    ("unknown-field", b"model: llama-3-8b\nsq_len: 512\n"),
    # a model reference is a preset id or a path: a name longer than the system allows, or with
    # a NUL byte, cannot be looked up (``Path.is_file`` raises ENAMETOOLONG)
    ("model-name-too-long", b"model: " + b"x" * 5000 + b"\n"),
    ("model-json-name-too-long", b"model: " + b"x" * 5000 + b".json\n"),
    ("model-name-nul", b'model: "llama\\0-3-8b"\n'),
    ("model-name-no-such-user", b"model: ~nosuchuser-gpuplan/config.json\n"),
]
USAGE_WRONG: list[tuple[str, bytes | str | None]] = [
    ("usage-gpus-true", b"gpu: H100-SXM\ngpus: true\nhours_per_day: 8\ndays_per_week: 5\n"),
]
CATALOG_WRONG: list[tuple[str, bytes | str | None]] = [
    (
        "catalog-count-true",
        b"offerings:\n- {provider: aws, instance_type: x, gpu: A100-80GB, gpu_count: true}\n",
    ),
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One bad input given to one command."""

    kind: str  # the file kind (spec, catalog, ...) or "option"
    name: str  # the bad-input class
    command: str  # a label for the command line
    content: bytes | str | None = None  # the bad file (see COMMON), or None for option cases
    argv: Callable[[Path, Path], list[str]]  # (bad file, work dir) -> argv
    suffix: str = ".yaml"
    outputs: tuple[str, ...] = ()  # files (relative to the work dir) that must not appear

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.name}:{self.command}"


def _spec_file(tmp: Path, text: str = GOOD_SPEC) -> Path:
    path = tmp / "good-spec.yaml"
    path.write_text(text)
    return path


def _replay_file(tmp: Path) -> Path:
    path = tmp / "good.jsonl"
    path.write_text(GOOD_REPLAY)
    return path


SPEC_COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "spec check": lambda f, t: ["spec", "check", str(f)],
    "fit": lambda f, t: ["fit", str(f), "--gpu", "A100-80GB"],
    "estimate": lambda f, t: ["estimate", str(f), "--gpu", "A100-80GB"],
    "plan": lambda f, t: ["plan", str(f), "--html", str(t / "out.html")],
    "scale": lambda f, t: ["scale", str(f), "--gpu", "A100-80GB", "--max-gpus", "2"],
}
CATALOG_COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "catalog gpus --catalog": lambda f, t: ["catalog", "gpus", "--catalog", str(f)],
    "catalog validate": lambda f, t: ["catalog", "validate", str(f)],
    "fit --catalog": lambda f, t: [
        "fit",
        str(_spec_file(t)),
        "--gpu",
        "A100-80GB",
        "--catalog",
        str(f),
    ],
}


def _hf_spec(f: Path, t: Path) -> list[str]:
    spec = _spec_file(t, f"model: {f}\nseq_len: 128\n")
    return ["spec", "check", str(spec)]


def file_cases() -> list[Case]:
    """Every (file kind, bad content, command) combination."""
    cases: list[Case] = []
    for content_set in (COMMON, YAML_BAD, SPEC_WRONG):
        for name, content in content_set:
            for label, argv in SPEC_COMMANDS.items():
                cases.append(
                    Case(
                        kind="spec",
                        name=name,
                        command=label,
                        content=content,
                        argv=argv,
                        outputs=("out.html",),
                    )
                )
    for content_set in (COMMON, YAML_BAD, CATALOG_WRONG):
        for name, content in content_set:
            if name == "only-comments":
                continue  # an overrides file of comments only is a valid (empty) catalog
            for label, argv in CATALOG_COMMANDS.items():
                if content_set is CATALOG_WRONG and label == "catalog validate":
                    continue  # a schema problem is a finding: listed, exit 1 (tested below)
                cases.append(
                    Case(kind="catalog", name=name, command=label, content=content, argv=argv)
                )
    for name, content in [*COMMON, *YAML_BAD, *USAGE_WRONG]:
        cases.append(
            Case(
                kind="usage-yaml",
                name=name,
                command="bill",
                content=content,
                argv=lambda f, t: ["bill", str(f)],
            )
        )
    for name, content in [*COMMON, *CSV_TRACE_BAD]:
        cases.append(
            Case(
                kind="usage-csv",
                name=name,
                command="bill --gpu",
                content=content,
                suffix=".csv",
                argv=lambda f, t: ["bill", str(f), "--gpu", "H100-SXM"],
            )
        )
    for name, content in [*COMMON, *TABLE_BAD]:
        for which in ("memory", "training"):
            cases.append(
                Case(
                    kind="table",
                    name=name,
                    command=f"validate {which}",
                    content=content,
                    suffix=".csv",
                    argv=lambda f, t, w=which: [
                        "validate",
                        w,
                        "--table",
                        str(f),
                        "--max-median",
                        "0.5",
                    ],  # type: ignore[misc]
                )
            )
    for name, content in [*COMMON, *YAML_BAD]:
        if name == "only-comments":
            continue  # a config file of comments only sets no option: valid
        cases.append(
            Case(
                kind="watch-config",
                name=name,
                command="watch --replay --config",
                content=content,
                argv=lambda f, t: ["watch", "--replay", str(_replay_file(t)), "--config", str(f)],
            )
        )
    for name, content in [*COMMON, *JSONL_BAD]:
        cases.append(
            Case(
                kind="replay",
                name=name,
                command="watch --replay",
                content=content,
                suffix=".jsonl",
                argv=lambda f, t: ["watch", "--replay", str(f), "--json"],
            )
        )
    for name, content in [*COMMON, *JSON_BAD]:
        if name == "missing":
            continue  # a missing path is read as a preset name: UnknownNameError, covered elsewhere
        cases.append(
            Case(
                kind="hf-config",
                name=name,
                command="spec check (model: FILE)",
                content=content,
                suffix=".json",
                argv=_hf_spec,
            )
        )
    for name, content in [*COMMON, *SKYPILOT_BAD]:
        cases.append(
            Case(
                kind="skypilot-csv",
                name=name,
                command="catalog import skypilot",
                content=content,
                suffix=".csv",
                argv=lambda f, t: [
                    "catalog",
                    "import",
                    "skypilot",
                    str(f),
                    "--out",
                    str(t / "out.yaml"),
                ],
                outputs=("out.yaml",),
            )
        )
    return cases


def _opt(*args: str) -> Callable[[Path, Path], list[str]]:
    """argv with ``SPEC`` replaced by a good spec, ``USAGE`` by the example usage file."""

    def build(_: Path, tmp: Path) -> list[str]:
        swap = {
            "SPEC": str(_spec_file(tmp)),
            "USAGE": str(REPO / "examples" / "usage-team-8xh100.yaml"),
            "TRACE": str(REPO / "examples" / "usage-trace.csv"),
            "DIR": str(tmp),
            "REPLAY": str(_replay_file(tmp)),
            "STATE": str(tmp / "w.db"),
        }
        return [swap.get(a, a.replace("DIR/", f"{tmp}/", 1)) for a in args]

    return build


OPTIONS: list[tuple[str, Callable[[Path, Path], list[str]], tuple[str, ...]]] = [
    ("missing-option", _opt("scale", "SPEC"), ()),
    ("missing-argument", _opt("fit"), ()),
    ("unknown-option", _opt("fit", "SPEC", "--bogus"), ()),
    ("unknown-command", _opt("nope"), ()),
    ("int-out-of-range", _opt("fit", "SPEC", "--gpus", "0"), ()),
    ("int-not-a-number", _opt("plan", "SPEC", "--top", "ten"), ()),
    ("float-out-of-range", _opt("fit", "SPEC", "--safety-margin", "0.9"), ()),
    ("directory-for-file", _opt("fit", "DIR"), ()),
    ("directory-for-catalog", _opt("catalog", "gpus", "--catalog", "DIR"), ()),
    ("bad-choice-objective", _opt("plan", "SPEC", "--objective", "cheap"), ()),
    ("bad-choice-export", _opt("plan", "SPEC", "--export", "slurm"), ()),
    (
        "bad-choice-fabric",
        _opt("estimate", "SPEC", "--gpu", "A100-80GB", "--fabric", "carrier-pigeon"),
        (),
    ),
    ("bad-set", _opt("fit", "SPEC", "--gpu", "A100-80GB", "--set", "novalue"), ()),
    ("set-bool-for-int", _opt("fit", "SPEC", "--gpu", "A100-80GB", "--set", "seq_len=true"), ()),
    ("set-alias", _opt("fit", "SPEC", "--gpu", "A100-80GB", "--set", "lora=&a [*a]"), ()),
    (
        "gpu-with-offering",
        _opt("estimate", "SPEC", "--gpu", "A100-80GB", "--offering", "aws:p5.48xlarge"),
        (),
    ),
    (
        "count-with-offering",
        _opt("estimate", "SPEC", "--count", "8", "--offering", "aws:p5.48xlarge"),
        (),
    ),
    ("nodes-without-offering", _opt("estimate", "SPEC", "--gpu", "A100-80GB", "--nodes", "2"), ()),
    (
        "inter-node-zero",
        _opt("estimate", "SPEC", "--gpu", "A100-80GB", "--inter-node-gbps", "0"),
        (),
    ),
    ("trace-without-gpu", _opt("fit", "SPEC", "--trace"), ()),
    ("export-with-json", _opt("plan", "SPEC", "--export", "torchrun", "--json"), ()),
    (
        "checkpoint-interval-zero",
        _opt("plan", "SPEC", "--checkpoint-interval", "0m", "--html", "DIR/o.html"),
        ("o.html",),
    ),
    ("checkpoint-interval-bad", _opt("plan", "SPEC", "--checkpoint-interval", "soon"), ()),
    (
        "busy-threshold-range",
        _opt("bill", "TRACE", "--gpu", "H100-SXM", "--busy-threshold", "200"),
        (),
    ),
    ("busy-threshold-with-yaml", _opt("bill", "USAGE", "--busy-threshold", "20"), ()),
    ("trace-without-gpu", _opt("bill", "TRACE"), ()),
    ("autostop-bad", _opt("bill", "USAGE", "--autostop-after", "later"), ()),
    ("bad-currency", _opt("catalog", "offerings", "--currency", "XYZ"), ()),
    ("max-price-negative", _opt("catalog", "offerings", "--max-price", "-1"), ()),
    ("max-under-range", _opt("validate", "memory", "--max-under", "2"), ()),
    (
        "as-of-bad",
        _opt(
            "catalog",
            "import",
            "skypilot",
            "DIR/x.csv",
            "--out",
            "DIR/o.yaml",
            "--as-of",
            "yesterday",
        ),
        ("o.yaml",),
    ),
    (
        "metrics-port-high",
        _opt("watch", "--metrics-port", "70000", "--state", "STATE", "--max-steps", "1"),
        ("w.db",),
    ),
    (
        "metrics-port-negative",
        _opt("watch", "--metrics-port", "-1", "--state", "STATE", "--max-steps", "1"),
        ("w.db",),
    ),
    (
        "metrics-port-text",
        _opt("watch", "--metrics-port", "http", "--state", "STATE", "--max-steps", "1"),
        ("w.db",),
    ),
    ("savings-without-replay", _opt("watch", "--savings"), ()),
    ("replay-directory", _opt("watch", "--replay", "DIR"), ()),
]


def option_cases() -> list[Case]:
    """Bad options and flag combinations (no bad file)."""
    return [
        Case(kind="option", name=name, command=name, argv=argv, outputs=outs)
        for name, argv, outs in OPTIONS
    ]


#: 373 generated cases (337 bad files x commands, 36 bad options); 205 passed before issue 10.
CASES = file_cases() + option_cases()


def _materialise(case: Case, tmp: Path) -> Path:
    path = tmp / f"bad{case.suffix}"
    if case.content is None:
        return path
    if case.content == "BOMB":
        path.write_bytes(alias_bomb(case.kind))
    elif case.content == "FIFO":
        os.mkfifo(path)  # a reader that opens it blocks until a writer comes: never
    elif case.content == "LINK":
        path.symlink_to(tmp / "nowhere")
    elif case.content == "DIR":
        path.mkdir()
    elif case.content == "HUGE":
        with path.open("wb") as fh:
            fh.truncate(11 * 2**20)
    else:
        assert isinstance(case.content, bytes)
        path.write_bytes(case.content)
    return path


def _check(exit_code: int, stderr: str, stdout: str, case: Case, tmp: Path) -> None:
    assert "Traceback" not in stderr + stdout, stderr[-2000:]
    assert exit_code == 2, f"exit {exit_code}; stderr {stderr[-500:]!r}; stdout {stdout[-300:]!r}"
    err = stderr.strip()
    assert err and "\n" not in err, f"not one line: {err[-1000:]!r}"
    assert err.startswith("error: "), err
    for name in case.outputs:
        leftovers = [p.name for p in tmp.iterdir() if p.name.startswith(name)]
        assert not leftovers, f"output written despite the error: {leftovers}"


def _limit_child() -> None:  # pragma: no cover - runs in the child
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_one_line_and_exit_2(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    work = tmp_path / "work"
    work.mkdir()
    bad = _materialise(case, tmp_path)
    argv = case.argv(bad, work)
    if case.name in HANG_PRONE:
        env = {**os.environ, "GPUPLAN_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "gpuplan.cli.app", *argv],
                capture_output=True,
                text=True,
                timeout=float(os.environ.get("GPUPLAN_SWEEP_TIMEOUT_S", "60")),
                env=env,
                preexec_fn=_limit_child,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"hung: {case.id}")
        _check(proc.returncode, proc.stderr, proc.stdout, case, work)
        return
    result = CliRunner().invoke(_app(), argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail(f"{type(result.exception).__name__}: {result.exception}"[:500])
    _check(result.exit_code, result.stderr, result.stdout, case, work)


def _app():  # type: ignore[no-untyped-def]
    from gpuplan.cli.app import app

    return app


def test_the_corpus_is_large_and_covers_every_file_kind() -> None:
    kinds = {c.kind for c in CASES}
    assert kinds == {
        "spec",
        "catalog",
        "usage-yaml",
        "usage-csv",
        "table",
        "watch-config",
        "replay",
        "hf-config",
        "skypilot-csv",
        "option",
    }
    assert len(CASES) > 300


def test_catalog_validate_lists_a_schema_problem_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that parses but breaks the schema is a finding of `catalog validate`, not a usage error."""
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    bad = tmp_path / "c.yaml"
    bad.write_bytes(dict(CATALOG_WRONG)["catalog-count-true"])  # type: ignore[arg-type]
    result = CliRunner().invoke(_app(), ["catalog", "validate", str(bad)])
    assert result.exit_code == 1
    assert "gpu_count: expected a number, got true" in result.stdout


def test_a_gate_over_rows_that_all_failed_does_not_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the estimator could not predict are not errors of 0%: a gate over none of them fails."""
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    table = tmp_path / "t.csv"
    table.write_text(TABLE_HEADER + 'x,ok,"{model: no-such-model}",A100-80GB,1,device_used,1,GiB\n')
    result = CliRunner().invoke(
        _app(), ["validate", "memory", "--table", str(table), "--max-over-50", "0"]
    )
    assert result.exit_code == 1
    assert "none of the 1 rows could be predicted" in result.stderr


def test_an_abort_is_one_line_not_a_traceback(
    cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or a declined prompt raises click's Abort; typer 0.2x keeps it outside the
    vendored click module, which the error boundary must still find."""
    import typer

    import gpuplan.cli.models_cmd as models_cmd

    def abort(_preset_id: str) -> dict[str, Any]:
        raise typer.Abort()

    monkeypatch.setattr(models_cmd, "_row", abort)
    result = cli("models")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: aborted"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``gpuplan fit SPEC --gpu G | head -1``: the reader leaves after one line while the
    breakdown is still being printed; the run ends without a traceback on stderr."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: gpt2\nseq_len: 128\n", encoding="utf-8")
    proc = subprocess.run(
        f"{sys.executable} -m gpuplan.cli.app fit {spec} --gpu H100-SXM | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPUPLAN_HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout.startswith("H100-SXM x1")
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("capability", ["sm_90", "9", "nine.0", ""])
def test_an_unparsable_compute_capability_is_one_line(
    cli,
    tmp_path: Path,
    capability: str,  # type: ignore[no-untyped-def]
) -> None:
    """The speed model reads the compute capability's major version (fp8 layouts, cuDNN
    attention): an override row that is not major.minor is refused at load, naming the field."""
    import yaml

    shipped = Path(__file__).resolve().parents[1] / "src/gpuplan/catalog/data/gpus.yaml"
    rows = yaml.safe_load(shipped.read_text(encoding="utf-8"))["gpus"]
    row = {**next(g for g in rows if g["id"] == "H100-SXM"), "id": "MY-H100", "aliases": []}
    row["compute_capability"] = capability
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"schema_version": "1", "gpus": [row]}), encoding="utf-8")
    spec = Path(__file__).resolve().parents[1] / "examples/llama3-8b-lora.yaml"
    result = cli("estimate", str(spec), "--gpu", "MY-H100", "--catalog", str(path))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "compute_capability" in lines[0], result.stderr


def test_an_unknown_name_is_repeated_only_in_part() -> None:
    """A name can be a whole file's worth of bytes: the error shows its start and its length,
    and skips the did-you-mean search over it."""
    from gpuplan.errors import UnknownNameError
    from gpuplan.models import load_model

    with pytest.raises(UnknownNameError) as info:
        load_model("x" * 100_000)
    line = info.value.one_line()
    assert "(100000 characters)" in line and len(line) < 2_000
    with pytest.raises(UnknownNameError, match="did you mean llama-3-8b"):
        load_model("llama-3-8")
