"""Tencent Cloud actions: the real SDK against a loopback fake of CVM and Auto Scaling."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cloud_fakes import (
    TC_SECRET_ID,
    TC_SECRET_KEY,
    FakeCloud,
    Member,
    Metadata,
    running,
    start_metadata,
    start_tencent,
)

pytest.importorskip("tencentcloud.cvm")
pytest.importorskip("tencentcloud.autoscaling")

from gpuplan.monitor.actions import ActionContext  # noqa: E402
from gpuplan.monitor.cloud import build_cloud_action  # noqa: E402
from gpuplan.monitor.tencent import TencentScaleInAction, TencentStopAction  # noqa: E402

CTX = ActionContext(reason="idle 600s of 600s window; stop due")
ME, OTHER, THIRD = "ins-me000001", "ins-other002", "ins-third003"
REGION = "ap-guangzhou"
GROUP = "asg-pool0001"


@pytest.fixture
def tc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from the environment only (the SDK's default chain reads them first)."""
    for key in (
        "TENCENTCLOUD_SESSION_TOKEN",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", TC_SECRET_ID)
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", TC_SECRET_KEY)


@pytest.fixture
def tc(tc_env: None) -> Iterator[FakeCloud]:
    """A fake CVM + AS endpoint; every test ends with no failed parameter check."""
    with running(start_tencent, FakeCloud()) as cloud:
        yield cloud
    assert cloud.problems == []


def in_service(cloud: FakeCloud, gid: str, members: list[str], *, min_size: int) -> None:
    cloud.add_group(gid, members, min_size=min_size)
    for iid in members:
        cloud.members[iid] = Member(group=gid, state="IN_SERVICE")


def test_stop_defaults_to_stop_charging_and_dry_run_calls_nothing(tc: FakeCloud) -> None:
    action = TencentStopAction(instance_id=ME, region=REGION, endpoint=tc.url)
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed and "STOP_CHARGING" in dry.detail
    assert tc.calls == []
    done = action.run(CTX, execute=True)
    assert done.ok and done.executed, done.detail
    assert tc.actions() == ["StopInstances"] and tc.stopped == {ME: "STOP_CHARGING"}


def test_keep_charging(tc: FakeCloud) -> None:
    action = build_cloud_action(
        "tencent", "stop", keep_charging=True, instance_id=ME, region=REGION, endpoint=tc.url
    )
    assert action.run(CTX, execute=True).ok
    assert tc.stopped == {ME: "KEEP_CHARGING"}


def test_api_error_is_a_failed_result_without_the_secret(tc: FakeCloud) -> None:
    tc.fail["StopInstances"] = (200, "AuthFailure.UnauthorizedOperation", "CAM denied")
    result = TencentStopAction(instance_id=ME, region=REGION, endpoint=tc.url).run(
        CTX, execute=True
    )
    assert not result.ok and result.executed
    assert "AuthFailure.UnauthorizedOperation: CAM denied" in result.detail
    assert "req-err" in result.detail and TC_SECRET_KEY not in result.detail


def test_a_hung_api_is_abandoned_after_the_call_timeout(tc: FakeCloud) -> None:
    tc.delay["StopInstances"] = 1.5
    action = TencentStopAction(instance_id=ME, region=REGION, endpoint=tc.url)
    action.call_timeout_s = 0.3
    started = time.monotonic()
    result = action.run(CTX, execute=True)
    assert time.monotonic() - started < 1.2
    assert not result.ok and "did not answer within 0.3 s" in result.detail
    time.sleep(1.6)  # let the abandoned call finish before the fake shuts down


def test_instance_and_region_from_metadata(tc: FakeCloud) -> None:
    meta = Metadata(
        pages={"/latest/meta-data/instance-id": ME, "/latest/meta-data/placement/region": REGION}
    )
    with running(start_metadata, meta):
        action = TencentStopAction(endpoint=tc.url, metadata_url=meta.url)
        assert action.resolve() == (ME, REGION)
        assert action.run(CTX, execute=True).ok
    assert tc.stopped == {ME: "STOP_CHARGING"}


def test_scale_in_removes_only_this_instance(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER, THIRD], min_size=1)
    action = TencentScaleInAction(min_size=1, instance_id=ME, region=REGION, endpoint=tc.url)
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed and "RemoveInstances" in dry.detail
    assert tc.calls == []
    result = action.run(CTX, execute=True)
    assert result.ok and result.executed, result.detail
    assert tc.actions() == [
        "DescribeAutoScalingInstances",
        "DescribeAutoScalingGroups",
        "RemoveInstances",
    ]
    assert tc.removed == [ME] and "3 -> 2 in service" in result.detail
    assert tc.calls[-1][1] == {"AutoScalingGroupId": GROUP, "InstanceIds": [ME]}


def test_scale_in_refuses_below_min_size(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER], min_size=2)
    result = TencentScaleInAction(min_size=0, instance_id=ME, region=REGION, endpoint=tc.url).run(
        CTX, execute=True
    )
    assert not result.ok and not result.executed and "below min size 2" in result.detail
    flag = TencentScaleInAction(min_size=3, instance_id=OTHER, region=REGION, endpoint=tc.url)
    assert "below min size 3" in flag.run(CTX, execute=True).detail
    assert "RemoveInstances" not in tc.actions() and tc.removed == []


def test_a_stopped_member_leaves_the_in_service_count_unchanged(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER, THIRD], min_size=2)
    tc.members[ME] = Member(group=GROUP, state="STOPPED")
    result = TencentScaleInAction(min_size=0, instance_id=ME, region=REGION, endpoint=tc.url).run(
        CTX, execute=True
    )
    assert result.ok and "2 -> 2 in service" in result.detail, result.detail
    tc.members[OTHER] = Member(group=GROUP, state="TERMINATING")
    leaving = TencentScaleInAction(
        min_size=0, instance_id=OTHER, region=REGION, endpoint=tc.url
    ).run(CTX, execute=True)
    assert not leaving.ok and "already TERMINATING" in leaving.detail
    assert tc.removed == [ME]


def test_scale_in_refuses_wrong_group_protected_and_loner(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER, THIRD], min_size=0)
    wrong = TencentScaleInAction(
        min_size=0, group="asg-other999", instance_id=ME, region=REGION, endpoint=tc.url
    ).run(CTX, execute=True)
    assert not wrong.ok and "not 'asg-other999'" in wrong.detail
    tc.members[OTHER] = Member(group=GROUP, state="IN_SERVICE", protected=True)
    protected = TencentScaleInAction(
        min_size=0, instance_id=OTHER, region=REGION, endpoint=tc.url
    ).run(CTX, execute=True)
    assert not protected.ok and "protected from scale-in" in protected.detail
    loner = TencentScaleInAction(
        min_size=0, instance_id="ins-lonely01", region=REGION, endpoint=tc.url
    ).run(CTX, execute=True)
    assert not loner.ok and "not in any Auto Scaling group" in loner.detail
    assert "RemoveInstances" not in tc.actions() and tc.removed == []


def test_remove_error_is_a_failed_result(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER], min_size=0)
    tc.fail["RemoveInstances"] = (200, "ResourceInsufficient.InServiceInstanceBelowMinSize", "x")
    result = TencentScaleInAction(min_size=0, instance_id=ME, region=REGION, endpoint=tc.url).run(
        CTX, execute=True
    )
    assert not result.ok and result.executed
    assert "ResourceInsufficient.InServiceInstanceBelowMinSize" in result.detail


def test_fleet_target_is_checked_and_removed(tc: FakeCloud) -> None:
    in_service(tc, GROUP, [ME, OTHER, THIRD], min_size=2)
    action = build_cloud_action(
        "tencent", "scale-in", min_size=1, group=GROUP, region=REGION, endpoint=tc.url
    )
    first = action.run(ActionContext(reason="group mean 4%", target=OTHER), execute=True)
    assert first.ok, first.detail
    again = action.run(ActionContext(reason="r", target=THIRD), execute=True)
    assert not again.ok and "below min size 2" in again.detail
    bad = action.run(ActionContext(reason="r", target="10.0.0.7:9400"), execute=True)
    assert not bad.ok and "not an instance id of Tencent Cloud" in bad.detail
    assert tc.removed == [OTHER]
