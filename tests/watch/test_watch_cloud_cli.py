"""``gpuplan watch --alibaba/--tencent`` end to end: fake nvidia-smi, real SDKs, loopback APIs.

The daemon's guarantees hold for the cloud actions as for the others: dry run
unless --execute, a fresh re-check before acting, one action per cooldown, and
the action written to the state file before it runs (``watch status`` shows it).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cloud_fakes import (
    ALI_KEY_ID,
    ALI_SECRET,
    TC_SECRET_ID,
    TC_SECRET_KEY,
    FakeCloud,
    Member,
    Metadata,
    running,
    start_alibaba,
    start_metadata,
    start_tencent,
    use_alibaba_env,
)
from watch_helpers import DATA, free_port, gpu_csv

pytest.importorskip("alibabacloud_ecs20140526")
pytest.importorskip("alibabacloud_ess20220222")
pytest.importorskip("tencentcloud.cvm")
pytest.importorskip("tencentcloud.autoscaling")

from gpuplan.monitor.actions import ActionContext, ActionPlan  # noqa: E402
from gpuplan.monitor.clock import FakeClock  # noqa: E402
from gpuplan.monitor.cloud import build_cloud_action  # noqa: E402
from gpuplan.monitor.fleet import (  # noqa: E402
    FleetConfig,
    FleetObservation,
    FleetPolicy,
    InstanceReading,
)
from gpuplan.monitor.fleet_agent import FleetAgent  # noqa: E402
from gpuplan.monitor.samplers import fake_gpu  # noqa: E402

Cli = Callable[..., Any]
ALI_ME = "i-bp67acfmxazb4ph0abcd"
TC_ME, TC_OTHER = "ins-me000001", "ins-other002"
TC_GROUP = "asg-pool0001"
# A slow shared machine may take 0.3 s per fake sample: --max-gap keeps the idle run going.
FAST = [
    "--interval",
    "0.1s",
    "--window",
    "0.5s",
    "--max-gap",
    "1h",
    "--cooldown",
    "1h",
    "--max-steps",
    "9",
]


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeCloud, FakeCloud]]:
    """Fake Alibaba and Tencent APIs, with credentials in the environment only."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(key, raising=False)
    use_alibaba_env(monkeypatch, ALI_KEY_ID, ALI_SECRET)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", TC_SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", TC_SECRET_KEY)
    with running(start_alibaba, FakeCloud()) as ali, running(start_tencent, FakeCloud()) as tc:
        yield ali, tc
    assert ali.problems == [] and tc.problems == []


def idle_smi(tmp_path: Path) -> str:
    script = tmp_path / "smi.json"
    script.write_text(
        json.dumps({"gpu": gpu_csv([0.0, 0.0]), "gpu_exit": 0, "apps": "", "apps_exit": 0})
    )
    return f"{sys.executable} {DATA / 'fake_nvidia_smi.py'} {script}"


def watch_idle(
    cli: Cli, tmp_path: Path, state: Path | str, *flags: str, log_level: str = "error"
) -> Any:
    """``gpuplan watch --json`` on an idle fake GPU with the fast timings; the click Result."""
    return cli(
        "watch",
        "--nvidia-smi",
        idle_smi(tmp_path),
        "--state",
        str(state),
        "--json",
        "--log-level",
        log_level,
        *flags,
        *FAST,
    )


def one_line_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


def live(result: Any) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(x) for x in result.stdout.splitlines()]


def status(cli: Cli, state: Path) -> dict[str, Any]:
    out = cli("watch", "status", "--state", str(state), "--json")
    assert out.exit_code == 0, out.output
    return dict(json.loads(out.stdout))


def test_alibaba_stop_executes_once_per_cooldown_and_never_leaks_the_secret(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud], caplog: pytest.LogCaptureFixture
) -> None:
    ali, _ = clouds
    state = tmp_path / "watch.db"
    caplog.set_level(logging.DEBUG)
    result = watch_idle(
        cli,
        tmp_path,
        str(state),
        "--alibaba",
        "stop",
        "--instance-id",
        ALI_ME,
        "--region",
        "cn-hangzhou",
        "--alibaba-endpoint",
        ali.url,
        "--execute",
        log_level="debug",
    )
    steps = live(result)
    acted = [s for s in steps if s["action"]]
    assert len(acted) == 1 and "recheck_of" in acted[0]  # re-checked, then one action only
    assert acted[0]["results"] == [
        {
            "action": "alibaba-stop",
            "executed": True,
            "ok": True,
            "detail": f"ECS StopInstances {ALI_ME} in cn-hangzhou (StoppedMode=StopCharging): "
            "Running -> Stopping",
        }
    ]
    assert ali.actions() == ["StopInstances"] and ali.stopped == {ALI_ME: "StopCharging"}
    last = status(cli, state)["last_action"]
    assert last["status"] == "done" and last["results"][0]["action"] == "alibaba-stop"
    for text in (result.output, caplog.text, state.read_bytes().decode("utf-8", "replace")):
        assert ALI_SECRET not in text


def test_dry_run_is_the_default_and_calls_no_api(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud]
) -> None:
    ali, tc = clouds
    tc.add_group(TC_GROUP, [TC_ME, TC_OTHER], min_size=0)
    for flags in (
        ["--alibaba", "stop", "--instance-id", ALI_ME, "--region", "cn-hangzhou"]
        + ["--alibaba-endpoint", ali.url],
        ["--tencent", "scale-in", "--instance-id", TC_ME, "--region", "ap-guangzhou"]
        + ["--tencent-endpoint", tc.url],
    ):
        state = tmp_path / f"{flags[0][2:]}.db"
        steps = live(
            watch_idle(
                cli,
                tmp_path,
                str(state),
                *flags,
            )
        )
        acted = [s for s in steps if s["action"]]
        assert len(acted) == 1
        assert acted[0]["results"][0]["executed"] is False
        assert acted[0]["results"][0]["detail"].startswith("dry run: would ")
        assert status(cli, state)["last_action"]["status"] == "dry-run"
    assert ali.calls == [] and tc.calls == []


def test_cloud_options_from_a_config_file(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud]
) -> None:
    ali, _ = clouds
    config = tmp_path / "watch.yaml"
    config.write_text(
        f"alibaba: stop\nkeep-charging: true\ninstance-id: {ALI_ME}\nregion: cn-hangzhou\n"
        f"alibaba-endpoint: {ali.url}\n"
    )
    steps = live(
        watch_idle(
            cli,
            tmp_path,
            str(tmp_path / "w.db"),
            "--config",
            str(config),
        )
    )
    detail = next(s for s in steps if s["action"])["results"][0]["detail"]
    assert detail.startswith("dry run: would call ECS StopInstances") and "KeepCharging" in detail
    assert ali.calls == []


def test_tencent_scale_in_below_min_size_is_a_recorded_refusal(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud]
) -> None:
    _, tc = clouds
    tc.add_group(TC_GROUP, [TC_ME, TC_OTHER], min_size=2)
    for iid in (TC_ME, TC_OTHER):
        tc.members[iid] = Member(group=TC_GROUP, state="IN_SERVICE")
    state = tmp_path / "watch.db"
    steps = live(
        watch_idle(
            cli,
            tmp_path,
            str(state),
            "--tencent",
            "scale-in",
            "--scaling-group",
            TC_GROUP,
            "--min-size",
            "1",
            "--instance-id",
            TC_ME,
            "--region",
            "ap-guangzhou",
            "--tencent-endpoint",
            tc.url,
            "--execute",
        )
    )
    result = next(s for s in steps if s["action"])["results"][0]
    assert result["ok"] is False and "below min size 2" in result["detail"]
    assert "RemoveInstances" not in tc.actions() and tc.removed == []
    assert status(cli, state)["last_action"]["status"] == "failed"


def test_tencent_api_error_is_a_recorded_failure_not_a_traceback(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud], caplog: pytest.LogCaptureFixture
) -> None:
    _, tc = clouds
    caplog.set_level(logging.DEBUG)
    tc.fail["StopInstances"] = (200, "UnauthorizedOperation", "CAM policy denies cvm:StopInstances")
    state = tmp_path / "watch.db"
    steps = live(
        watch_idle(
            cli,
            tmp_path,
            str(state),
            "--tencent",
            "stop",
            "--instance-id",
            TC_ME,
            "--region",
            "ap-guangzhou",
            "--tencent-endpoint",
            tc.url,
            "--execute",
            log_level="debug",
        )
    )
    acted = [s for s in steps if s["action"]]
    assert len(acted) == 1  # a failed stop is not retried within the cooldown
    assert "UnauthorizedOperation" in acted[0]["results"][0]["detail"]
    assert tc.actions() == ["StopInstances"]
    last = status(cli, state)["last_action"]
    assert last["status"] == "failed"
    for text in (json.dumps(steps), caplog.text, state.read_bytes().decode("utf-8", "replace")):
        assert TC_SECRET_KEY not in text


def test_instance_and_region_from_the_metadata_flag(
    cli: Cli, tmp_path: Path, clouds: tuple[FakeCloud, FakeCloud]
) -> None:
    _, tc = clouds
    meta = Metadata(
        pages={
            "/latest/meta-data/instance-id": TC_ME,
            "/latest/meta-data/placement/region": "ap-guangzhou",
        }
    )
    with running(start_metadata, meta):
        live(
            watch_idle(
                cli,
                tmp_path,
                str(tmp_path / "w.db"),
                "--tencent",
                "stop",
                "--metadata-url",
                meta.url,
                "--tencent-endpoint",
                tc.url,
                "--execute",
            )
        )
    assert tc.stopped == {TC_ME: "STOP_CHARGING"}


def test_bad_cloud_options_are_one_line_errors(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = ["--state", str(tmp_path / "w.db"), "--max-steps", "1"]
    ali = ["--instance-id", ALI_ME, "--region", "cn-hangzhou"]
    cases: list[tuple[list[str], tuple[str, ...]]] = [
        (["--alibaba", "stop", "--tencent", "stop"], ("choose one",)),
        (["--aws", "stop", "--alibaba", "stop"], ("--aws and --alibaba", "choose one")),
        (["--alibaba", "stp"], ("--alibaba", "did you mean stop")),
        (["--keep-charging"], ("--keep-charging", "only used with")),
        (["--alibaba", "scale-in", "--keep-charging", *ali], ("--keep-charging",)),
        (["--alibaba", "stop", "--scaling-group", "asg-abcd1234", *ali], ("--scaling-group",)),
        (["--alibaba", "scale-in", "--scaling-group", "pool", *ali], ("not a scaling group id",)),
        (["--alibaba", "scale-in", *ali], ("--scaling-group", "required")),
        (
            ["--tencent-endpoint", "http://127.0.0.1:1", "--alibaba", "stop", *ali],
            ("--tencent-endpoint",),
        ),
        (["--alibaba", "stop", "--alibaba-endpoint", "ftp://x", *ali], ("--alibaba-endpoint",)),
        (["--alibaba", "stop", "--instance-id", "ins-abcd1234"], ("--instance-id", "Alibaba")),
        (["--tencent", "stop", "--instance-id", ALI_ME], ("--instance-id", "Tencent")),
        (["--tencent", "stop", "--region", "Guangzhou!"], ("--region",)),
        (["--metadata-url", "http://127.0.0.1:1"], ("--metadata-url", "only used with")),
    ]
    for flags, needles in cases:
        one_line_error(cli("watch", *state, *flags), *needles)
    unreachable = f"http://127.0.0.1:{free_port()}"
    one_line_error(
        cli("watch", *state, "--tencent", "stop", "--metadata-url", unreachable, "--execute"),
        "instance metadata",
        "--instance-id and --region",
    )


def test_missing_sdk_is_a_one_line_error_with_the_install_hint(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = ["--state", str(tmp_path / "w.db"), "--max-steps", "1"]
    monkeypatch.setitem(sys.modules, "alibabacloud_ecs20140526.client", None)
    monkeypatch.setitem(sys.modules, "tencentcloud.autoscaling.v20180419.autoscaling_client", None)
    one_line_error(
        cli("watch", *state, "--alibaba", "stop"), "not installed", "pip install 'gpuplan[alibaba]'"
    )
    one_line_error(cli("watch", *state, "--tencent", "scale-in"), "pip install 'gpuplan[tencent]'")
    one_line_error(
        cli(
            "watch",
            "fleet",
            "--prometheus",
            "http://127.0.0.1:1",
            "--group",
            "g",
            "--tencent-asg",
            TC_GROUP,
        ),
        "pip install 'gpuplan[tencent]'",
    )


def test_fleet_cloud_options_are_checked(cli: Cli) -> None:
    base = [
        "watch",
        "fleet",
        "--prometheus",
        "http://127.0.0.1:1",
        "--group",
        "g",
        "--max-steps",
        "1",
    ]
    one_line_error(cli(*base, "--alibaba-ess", "pool"), "--alibaba-ess", "not a scaling group id")
    one_line_error(
        cli(*base, "--alibaba-ess", "asg-abcd1234", "--tencent-asg", "asg-abcd1234"), "choose one"
    )
    one_line_error(cli(*base, "--tencent-asg", TC_GROUP, "--aws-asg"), "choose one")
    one_line_error(cli(*base, "--tencent-endpoint", "http://127.0.0.1:1"), "--tencent-endpoint")


def test_fleet_agent_removes_one_idle_instance_through_tencent_auto_scaling(
    clouds: tuple[FakeCloud, FakeCloud],
) -> None:
    _, tc = clouds
    members = ["ins-aaaa0001", "ins-bbbb0002", "ins-cccc0003"]
    tc.add_group(TC_GROUP, members, min_size=1)
    for iid in members:
        tc.members[iid] = Member(group=TC_GROUP, state="IN_SERVICE")

    def poll(t: float) -> FleetObservation:
        alive = [i for i in members if i in tc.members]
        return FleetObservation(
            t_s=t,
            instances=tuple(InstanceReading(name=i, gpus=(fake_gpu(0, 0.0),)) for i in alive),
        )

    cfg = FleetConfig(
        scale_in_below_pct=30, window_s=60, interval_s=10, cooldown_s=3600, min_size=1, warmup_s=0
    )
    action = build_cloud_action(
        "tencent", "scale-in", min_size=1, group=TC_GROUP, region="ap-guangzhou", endpoint=tc.url
    )
    clock = FakeClock()
    agent = FleetAgent(
        poll=poll,
        policy=FleetPolicy(cfg),
        plan=ActionPlan(main=action),
        clock=clock,
        sleep=clock.sleep,
        execute=True,
    )
    agent.run(max_steps=30)  # 300 s: one removal, then the cooldown holds
    assert len(tc.removed) == 1 and tc.removed[0] in members
    assert tc.actions().count("RemoveInstances") == 1
    dry = action.run(ActionContext(reason="r", target=members[0]), execute=False)
    assert dry.ok and not dry.executed
