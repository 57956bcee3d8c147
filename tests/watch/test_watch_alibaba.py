"""Alibaba Cloud actions: the real SDK against a loopback fake of ECS and ESS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cloud_fakes import (
    ALI_KEY_ID,
    ALI_SECRET,
    FakeCloud,
    Member,
    Metadata,
    running,
    start_alibaba,
    start_metadata,
    use_alibaba_env,
)

pytest.importorskip("alibabacloud_ecs20140526")
pytest.importorskip("alibabacloud_ess20220222")

from gpuplan.monitor.actions import ActionContext  # noqa: E402
from gpuplan.monitor.alibaba import AlibabaStopAction, EssScaleInAction  # noqa: E402
from gpuplan.monitor.cloud import build_cloud_action  # noqa: E402

CTX = ActionContext(reason="idle 600s of 600s window; stop due")
ME = "i-bp67acfmxazb4ph0abcd"
OTHER = "i-bp67acfmxazb4ph0zzzz"
THIRD = "i-bp67acfmxazb4ph0yyyy"
REGION = "cn-hangzhou"
GROUP = "asg-bp18p2yfxow2dloq1234"


@pytest.fixture
def ali_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from the environment only (the SDK's default chain reads them first)."""
    use_alibaba_env(monkeypatch, ALI_KEY_ID, ALI_SECRET)


@pytest.fixture
def ali(ali_env: None) -> Iterator[FakeCloud]:
    """A fake ECS + ESS endpoint; every test ends with no failed parameter check."""
    with running(start_alibaba, FakeCloud()) as cloud:
        yield cloud
    assert cloud.problems == []


def test_stop_defaults_to_stop_charging_and_dry_run_calls_nothing(ali: FakeCloud) -> None:
    action = AlibabaStopAction(instance_id=ME, region=REGION, endpoint=ali.url)
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed
    assert "StopInstances" in dry.detail and "StopCharging" in dry.detail and ME in dry.detail
    assert ali.calls == []
    done = action.run(CTX, execute=True)
    assert done.ok and done.executed, done.detail
    assert ali.actions() == ["StopInstances"]
    assert ali.stopped == {ME: "StopCharging"}
    assert "Running -> Stopping" in done.detail


def test_keep_charging(ali: FakeCloud) -> None:
    action = build_cloud_action(
        "alibaba", "stop", keep_charging=True, instance_id=ME, region=REGION, endpoint=ali.url
    )
    assert action.run(CTX, execute=True).ok
    assert ali.stopped == {ME: "KeepCharging"}


def test_api_error_is_a_failed_result_without_the_secret(ali: FakeCloud) -> None:
    ali.fail["StopInstances"] = (403, "Forbidden.RAM", "User not authorized to operate")
    result = AlibabaStopAction(instance_id=ME, region=REGION, endpoint=ali.url).run(
        CTX, execute=True
    )
    assert not result.ok and result.executed
    assert "Forbidden.RAM" in result.detail and "not authorized" in result.detail
    assert ALI_SECRET not in result.detail and "\n" not in result.detail


def test_instance_and_region_from_hardened_metadata(ali: FakeCloud) -> None:
    meta = Metadata(
        pages={"/latest/meta-data/instance-id": ME, "/latest/meta-data/region-id": REGION},
        token="tok-123",
    )
    with running(start_metadata, meta):
        action = AlibabaStopAction(endpoint=ali.url, metadata_url=meta.url)
        assert action.resolve() == (ME, REGION)
        assert action.run(CTX, execute=True).ok
    assert ali.stopped == {ME: "StopCharging"}


def test_scale_in_removes_only_this_instance(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER, THIRD], min_size=1)
    action = EssScaleInAction(
        min_size=1, group=GROUP, instance_id=ME, region=REGION, endpoint=ali.url
    )
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed and "RemoveInstances" in dry.detail
    assert ali.calls == []
    result = action.run(CTX, execute=True)
    assert result.ok and result.executed, result.detail
    assert ali.actions() == ["DescribeScalingInstances", "DescribeScalingGroups", "RemoveInstances"]
    assert ali.removed == [ME]
    assert "3 -> 2" in result.detail and "asa-fake0001" in result.detail
    remove = ali.calls[-1][1]
    assert remove["ScalingGroupId"] == GROUP and remove["RemovePolicy"] == "release"


def test_recycle_groups_keep_the_disks(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER], min_size=0, policy="recycle")
    result = EssScaleInAction(
        min_size=0, group=GROUP, instance_id=ME, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert result.ok, result.detail
    assert ali.calls[-1][1]["RemovePolicy"] == "recycle"


def test_scale_in_refuses_below_the_group_min_size(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER], min_size=2)
    result = EssScaleInAction(
        min_size=0, group=GROUP, instance_id=ME, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert not result.ok and not result.executed
    assert "below min size 2" in result.detail
    assert "RemoveInstances" not in ali.actions() and ali.removed == []


def test_scale_in_refuses_below_the_flag_min_size(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER], min_size=0)
    result = EssScaleInAction(
        min_size=2, group=GROUP, instance_id=ME, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert not result.ok and "below min size 2" in result.detail
    assert ali.removed == []


def test_scale_in_refuses_the_wrong_group_a_loner_and_a_protected_instance(
    ali: FakeCloud,
) -> None:
    ali.add_group(GROUP, [ME, OTHER, THIRD], min_size=0)
    wrong = EssScaleInAction(
        min_size=0, group="asg-someothergroup1", instance_id=ME, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert not wrong.ok and "not in scaling group 'asg-someothergroup1'" in wrong.detail
    ali.members[OTHER] = Member(group=GROUP, state="Protected")
    protected = EssScaleInAction(
        min_size=0, group=GROUP, instance_id=OTHER, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert not protected.ok and "Protected" in protected.detail
    loner = EssScaleInAction(
        min_size=0,
        group=GROUP,
        instance_id="i-bp67acfmxazb4ph0none",
        region=REGION,
        endpoint=ali.url,
    ).run(CTX, execute=True)
    assert not loner.ok and "not in scaling group" in loner.detail
    assert "RemoveInstances" not in ali.actions() and ali.removed == []


def test_describe_error_is_a_refusal_not_a_traceback(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER], min_size=0)
    ali.fail["DescribeScalingGroups"] = (403, "Forbidden.RAM", "no ess:DescribeScalingGroups")
    result = EssScaleInAction(
        min_size=0, group=GROUP, instance_id=ME, region=REGION, endpoint=ali.url
    ).run(CTX, execute=True)
    assert not result.ok and not result.executed
    assert "Forbidden.RAM" in result.detail and ALI_SECRET not in result.detail
    assert ali.removed == []


def test_fleet_target_is_checked_and_removed(ali: FakeCloud) -> None:
    ali.add_group(GROUP, [ME, OTHER, THIRD], min_size=2)
    action = build_cloud_action(
        "alibaba", "scale-in", min_size=1, group=GROUP, region=REGION, endpoint=ali.url
    )
    first = action.run(ActionContext(reason="group mean 4%", target=OTHER), execute=True)
    assert first.ok, first.detail
    again = action.run(ActionContext(reason="r", target=THIRD), execute=True)
    assert not again.ok and "below min size 2" in again.detail
    bad = action.run(ActionContext(reason="r", target="127.0.0.1:9400"), execute=True)
    assert not bad.ok and "not an instance id of Alibaba Cloud" in bad.detail
    assert ali.removed == [OTHER]
