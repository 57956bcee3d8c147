"""The --replay contract (library level; the CLI is exercised in test_watch_cli.py)."""

from __future__ import annotations

import json

import pytest
from watch_helpers import gpu_csv, line, uuid

from gpuplan.errors import MonitorError
from gpuplan.monitor.policy import IdlePolicy, PolicyConfig
from gpuplan.monitor.replay import (
    cadence_warning,
    compute_savings,
    contract_record,
    parse_replay_line,
    read_replay,
    run_replay,
)


def jsonl(lines: list[dict[str, object]]) -> list[str]:
    return [json.dumps(x) for x in lines]


def replay(lines: list[dict[str, object]], **cfg: float) -> list[dict[str, object]]:
    policy = IdlePolicy(PolicyConfig(**cfg))  # type: ignore[arg-type]
    return [contract_record(d) for _, d in run_replay(read_replay(jsonl(lines)), policy)]


def test_contract_shape_and_stop_line() -> None:
    trace = [line(t, [0.0, 0.0]) for t in range(0, 700, 15)]
    out = replay(trace, window_s=600)
    assert len(out) == len(trace)
    assert all(list(o) == ["t", "state", "idle_for_s", "action"] for o in out)
    assert out[0] == {"t": 0.0, "state": "idle", "idle_for_s": 0.0, "action": None}
    assert isinstance(out[0]["t"], float)
    stops = [o for o in out if o["action"] is not None]
    assert stops == [{"t": 600.0, "state": "idle", "idle_for_s": 600.0, "action": "stop"}]
    assert out[41] == {"t": 615.0, "state": "idle", "idle_for_s": 0.0, "action": None}


def test_states_busy_unknown_idle() -> None:
    out = replay(
        [
            line(0, [0.0, 50.0]),
            line(15, [0.0, 0.0], procs=[(1, 77)]),
            line(30, None, gpu_exit=-1, apps=None, apps_exit=-1),
            line(45, ["[N/A]", 0.0]),
            line(60, [0.0, 0.0]),
        ]
    )
    assert [o["state"] for o in out] == ["busy", "busy", "unknown", "unknown", "idle"]


def test_blank_lines_are_ignored() -> None:
    text = jsonl([line(0, [0.0])]) + ["", "   "] + jsonl([line(15, [0.0])])
    assert [x.line_no for x in read_replay(text)] == [1, 4]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "replay line 1: not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**line(0, [0.0]), "host": "x"}), "unknown key 'host'"),
        (
            json.dumps({k: v for k, v in line(0, [0.0]).items() if k != "apps_exit"}),
            "missing key 'apps_exit'",
        ),
        (json.dumps({**line(0, [0.0]), "t": "soon"}), "t: expected a number"),
        (json.dumps({**line(0, [0.0]), "t": -1}), "t: expected a number"),
        (json.dumps({**line(0, [0.0]), "t": True}), "t: expected a number"),
        (json.dumps({**line(0, [0.0]), "gpu_exit": "0"}), "gpu_exit: expected an integer"),
        (json.dumps({**line(0, [0.0]), "gpu_exit": 0.5}), "gpu_exit: expected an integer"),
        (json.dumps({**line(0, [0.0]), "gpu": 42}), "gpu: expected the raw stdout"),
    ],
)
def test_bad_lines_name_the_line_and_field(text: str, needle: str) -> None:
    with pytest.raises(MonitorError, match=needle.replace("[", r"\[")):
        parse_replay_line(text, 1)


def test_time_must_not_go_backwards() -> None:
    with pytest.raises(MonitorError, match="replay line 2: t: 5 is earlier"):
        read_replay(jsonl([line(10, [0.0]), line(5, [0.0])]))


def test_replay_is_all_or_nothing() -> None:
    with pytest.raises(MonitorError, match="replay line 3"):
        read_replay(jsonl([line(0, [0.0]), line(15, [0.0])]) + ["oops"])


def test_savings() -> None:
    busy = [line(t, [90.0]) for t in range(0, 3600, 60)]
    idle = [line(t, [0.0]) for t in range(3600, 3600 + 7200 + 1, 60)]
    back = [line(t, [80.0]) for t in range(10860, 11400, 60)]
    policy = IdlePolicy(PolicyConfig(window_s=600, interval_s=60, cooldown_s=3600))
    results = list(run_replay(read_replay(jsonl(busy + idle + back)), policy))
    report = compute_savings(results, 4.0)
    # Stops at 1h10m; the machine would stay off until the job came back at 3h01m.
    assert report.stops >= 1 and report.resumed_after_stop == 1
    assert report.saved_hours == pytest.approx((10860 - 4200) / 3600, abs=1e-6)
    assert report.saved_money == pytest.approx(report.saved_hours * 4.0, abs=1e-3)
    with pytest.raises(MonitorError, match="--price-per-hour"):
        compute_savings(results, -1)
    assert compute_savings([], 1.0).saved_hours == 0


def test_cadence_warning() -> None:
    lines = read_replay(jsonl([line(t, [0.0]) for t in range(0, 600, 60)]))
    assert cadence_warning(lines, IdlePolicy(PolicyConfig(interval_s=15))) is not None
    assert cadence_warning(lines, IdlePolicy(PolicyConfig(interval_s=60))) is None


def test_replay_uses_the_real_parser_on_raw_text() -> None:
    raw = {
        "t": 0,
        "gpu": gpu_csv([0.0]) + "garbage line\n",
        "gpu_exit": 0,
        "apps": "",
        "apps_exit": 0,
    }
    assert replay([raw])[0]["state"] == "unknown"
    apps = {
        "t": 0,
        "gpu": gpu_csv([0.0]),
        "gpu_exit": 0,
        "apps": f"{uuid(0)}, 1, [N/A]\n",
        "apps_exit": 0,
    }
    assert replay([apps])[0]["state"] == "busy"
