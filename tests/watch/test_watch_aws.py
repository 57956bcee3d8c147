"""AWS actions against a real local moto server (boto3 is not mocked)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from watch_helpers import REGION, client, desired, free_port, launch, make_group, state_of

from gpuplan.errors import ActionError, UnknownNameError
from gpuplan.monitor.actions import ActionContext
from gpuplan.monitor.aws import AsgScaleInAction, AwsStopAction, instance_metadata
from gpuplan.monitor.config import build_plan

CTX = ActionContext(reason="idle 600s of 600s window; stop due")


def test_stop_via_instance_metadata(aws: str, imds: Callable[[str, str], str]) -> None:
    iid = launch(aws)
    action = AwsStopAction("stop", endpoint_url=aws, imds_url=imds(iid, REGION))
    dry = action.run(CTX, execute=False)
    assert dry.ok and not dry.executed and iid in dry.detail
    assert state_of(aws, iid) == "running"
    result = action.run(CTX, execute=True)
    assert result.ok and result.executed, result.detail
    assert state_of(aws, iid) == "stopped"


def test_never_terminate_where_stop_was_configured(aws: str) -> None:
    iid = launch(aws)
    plan = build_plan(
        {"aws": "stop", "instance-id": iid, "region": REGION, "aws-endpoint-url": aws}
    )
    assert isinstance(plan.main, AwsStopAction) and plan.main.mode == "stop"
    results = plan.run(CTX, execute=True)
    assert [r.ok for r in results] == [True]
    assert state_of(aws, iid) == "stopped"  # not "terminated", and the instance still exists
    again = plan.run(CTX, execute=True)  # stopping a stopped instance never escalates
    assert state_of(aws, iid) == "stopped", again
    with pytest.raises(UnknownNameError, match="did you mean stop"):
        build_plan({"aws": "stp"})


def test_terminate_only_when_configured(aws: str) -> None:
    iid = launch(aws)
    result = AwsStopAction("terminate", instance_id=iid, region=REGION, endpoint_url=aws).run(
        CTX, execute=True
    )
    assert result.ok
    assert state_of(aws, iid) in ("shutting-down", "terminated")


def test_scale_in_removes_this_instance_and_decrements(
    aws: str, imds: Callable[[str, str], str]
) -> None:
    members = make_group(aws, desired=3)
    me = members[0]
    action = AsgScaleInAction(
        min_size=1, group="gpu-pool", endpoint_url=aws, imds_url=imds(me, REGION)
    )
    dry = action.run(CTX, execute=False)
    assert dry.ok and "desired 3 -> 2" in dry.detail and desired(aws) == 3
    result = action.run(CTX, execute=True)
    assert result.ok, result.detail
    assert desired(aws) == 2
    assert state_of(aws, me) in ("shutting-down", "terminated")
    others = [i for i in members if i != me]
    assert all(state_of(aws, i) == "running" for i in others)


def test_never_below_min_size(aws: str) -> None:
    members = make_group(aws, desired=2)
    first = AsgScaleInAction(min_size=1, instance_id=members[0], region=REGION, endpoint_url=aws)
    assert first.run(CTX, execute=True).ok
    assert desired(aws) == 1
    second = AsgScaleInAction(min_size=1, instance_id=members[1], region=REGION, endpoint_url=aws)
    result = second.run(CTX, execute=True)
    assert not result.ok and not result.executed
    assert "below min size 1" in result.detail
    assert desired(aws) == 1 and state_of(aws, members[1]) == "running"


def test_asg_min_size_is_also_a_floor(aws: str) -> None:
    members = make_group(aws, desired=2, min_size=2)
    result = AsgScaleInAction(
        min_size=0, instance_id=members[0], region=REGION, endpoint_url=aws
    ).run(CTX, execute=True)
    assert not result.ok and "below min size 2" in result.detail
    assert desired(aws) == 2


def test_scale_in_protection_and_wrong_group(aws: str) -> None:
    members = make_group(aws, desired=3)
    client(aws, "autoscaling").set_instance_protection(
        InstanceIds=[members[0]], AutoScalingGroupName="gpu-pool", ProtectedFromScaleIn=True
    )
    protected = AsgScaleInAction(
        min_size=1, instance_id=members[0], region=REGION, endpoint_url=aws
    )
    assert "protected" in protected.run(CTX, execute=True).detail
    wrong = AsgScaleInAction(
        min_size=1, group="other", instance_id=members[1], region=REGION, endpoint_url=aws
    )
    assert "not 'other'" in wrong.run(CTX, execute=True).detail
    loner = launch(aws)
    alone = AsgScaleInAction(min_size=0, instance_id=loner, region=REGION, endpoint_url=aws)
    assert "not in any Auto Scaling group" in alone.run(CTX, execute=True).detail
    assert desired(aws) == 3


def test_unreachable_metadata_is_an_action_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ActionError, match="instance metadata"):
        instance_metadata(url, timeout_s=0.5)
    result = AwsStopAction("stop", imds_url=url).run(CTX, execute=True)
    assert not result.ok and not result.executed


def test_fleet_target_needs_no_instance_metadata(aws: str) -> None:
    members = make_group(aws, desired=3)
    action = AsgScaleInAction(min_size=2, group="gpu-pool", region=REGION, endpoint_url=aws)
    result = action.run(
        ActionContext(reason="group mean 4% < 30%", target=members[1]), execute=True
    )
    assert result.ok, result.detail
    assert desired(aws) == 2 and state_of(aws, members[1]) in ("shutting-down", "terminated")
    again = action.run(ActionContext(reason="r", target=members[2]), execute=True)
    assert not again.ok and "below min size 2" in again.detail
    bad = action.run(ActionContext(reason="r", target="127.0.0.1:9400"), execute=True)
    assert not bad.ok and "not an EC2 instance id" in bad.detail
