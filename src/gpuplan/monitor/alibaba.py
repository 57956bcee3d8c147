"""Alibaba Cloud actions through the official SDKs (extra ``alibaba``).

* :class:`AlibabaStopAction` stops this ECS instance with ``StopInstances``
  and ``StoppedMode=StopCharging`` (economical mode: the GPU, vCPU and memory
  bill stops, the disks stay), or ``KeepCharging`` when asked.
* :class:`EssScaleInAction` removes *this* instance from its Auto Scaling (ESS)
  scaling group with ``RemoveInstances`` and ``DecreaseDesiredCapacity=true``,
  after checking with ``DescribeScalingInstances`` that it is in the group and
  in service, and with ``DescribeScalingGroups`` that the group stays at or
  above its ``MinSize`` (and ``--min-size``).

A dry run calls no API at all: it says what it would call. Credentials come
from the ``alibabacloud_credentials`` default chain (environment
``ALIBABA_CLOUD_ACCESS_KEY_ID``/``ALIBABA_CLOUD_ACCESS_KEY_SECRET``, the
``~/.alibabacloud/credentials`` file, the ECS RAM role) and are never logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuplan.errors import MonitorError
from gpuplan.monitor.cloud_action_base import (
    CloudActionBase,
    CloudScaleInBase,
    CloudStopBase,
    ScaleInPlan,
)
from gpuplan.monitor.cloud_meta import (
    ALIBABA,
    CALL_TIMEOUT_S,
    CloudTarget,
    load_sdk,
    parse_endpoint,
)

_ECS = "alibabacloud_ecs20140526"
_ESS = "alibabacloud_ess20220222"
# ESS lifecycle states from which RemoveInstances takes an instance out of service.
_REMOVABLE = ("InService", "Stopped")


class _AlibabaBase(CloudActionBase):
    def __init__(
        self,
        sdk: str,
        *,
        instance_id: str | None,
        region: str | None,
        endpoint: str | None,
        metadata_url: str | None,
    ) -> None:
        load_sdk(f"{sdk}.client", ALIBABA)  # fail at start-up, not at stop time
        self._sdk = sdk
        self.where = CloudTarget(
            ALIBABA, instance_id=instance_id, region=region, metadata_url=metadata_url
        )
        self.endpoint = None if endpoint is None else parse_endpoint(endpoint, "--alibaba-endpoint")
        self._clients: dict[str, Any] = {}
        self.call_timeout_s = CALL_TIMEOUT_S

    def client(self, region: str) -> Any:
        """An SDK client for ``region`` with the default credential chain; cached."""
        if region not in self._clients:
            client_mod = load_sdk(f"{self._sdk}.client", ALIBABA)
            config_mod = load_sdk("alibabacloud_tea_openapi.models", ALIBABA)
            cred_mod = load_sdk("alibabacloud_credentials.client", ALIBABA)
            config = config_mod.Config(
                credential=cred_mod.Client(),
                region_id=region,
                connect_timeout=5000,
                read_timeout=15000,
            )
            if self.endpoint is not None:
                config.protocol, config.endpoint = self.endpoint
            self._clients[region] = client_mod.Client(config)
        return self._clients[region]

    def models(self) -> Any:
        """The SDK's request models."""
        return load_sdk(f"{self._sdk}.models", ALIBABA)


class AlibabaStopAction(_AlibabaBase, CloudStopBase):
    """Stop this ECS instance (``aliyun ecs StopInstances --StoppedMode StopCharging``).

    Args:
        keep_charging: stop with ``KeepCharging`` (keeps the instance's
            resources and its bill) instead of ``StopCharging``.
        instance_id: the instance, or ``None`` to read it from metadata.
        region: its region, or ``None`` to read it from metadata.
        endpoint: ECS endpoint override (``http://127.0.0.1:PORT`` in tests, a VPC endpoint).
        metadata_url: metadata base URL override.
    """

    name = "alibaba-stop"

    def __init__(
        self,
        *,
        keep_charging: bool = False,
        instance_id: str | None = None,
        region: str | None = None,
        endpoint: str | None = None,
        metadata_url: str | None = None,
    ) -> None:
        super().__init__(
            _ECS,
            instance_id=instance_id,
            region=region,
            endpoint=endpoint,
            metadata_url=metadata_url,
        )
        self.stopped_mode = "KeepCharging" if keep_charging else "StopCharging"

    def _describe_stop(self, iid: str, region: str) -> str:
        return f"ECS StopInstances {iid} in {region} (StoppedMode={self.stopped_mode})"

    def _stop_call(self, iid: str, region: str) -> Callable[[], Any]:
        request = self.models().StopInstancesRequest(
            region_id=region, instance_id=[iid], stopped_mode=self.stopped_mode
        )
        return lambda: self.client(region).stop_instances(request).body.to_map()

    def _stop_outcome(self, answer: Any, iid: str, call: str) -> tuple[bool, str]:
        answers = answer.get("InstanceResponses", {}).get("InstanceResponse", [])
        mine = next((a for a in answers if a.get("InstanceId") == iid), None)
        if mine is None:
            return False, f"{call}: no answer for {iid} (request id {answer.get('RequestId')})"
        if str(mine.get("Code")) != "200":
            return False, f"{call}: {mine.get('Code')}: {mine.get('Message')}"
        return True, f"{call}: {mine.get('PreviousStatus')} -> {mine.get('CurrentStatus')}"


class EssScaleInAction(_AlibabaBase, CloudScaleInBase):
    """Remove one instance from its ESS scaling group, decreasing the desired capacity.

    ``aliyun ess RemoveInstances --ScalingGroupId G --InstanceIds.1 ID
    --DecreaseDesiredCapacity true``, after ``DescribeScalingInstances`` (is it
    in group G, in service?) and ``DescribeScalingGroups`` (``TotalCapacity - 1
    >= max(MinSize, min_size)``). Instances of a group whose ``ScalingPolicy``
    is ``recycle`` are removed with ``RemovePolicy=recycle`` (economical-mode
    stop, disks kept); otherwise ESS releases them.

    Args:
        min_size: never go below this many instances (the group's ``MinSize`` is also a floor).
        group: the scaling group id (``asg-...``); ESS looks instances up by group.
        instance_id: the instance, or ``None`` for this one (metadata); fleet
            mode passes the target in the context instead.
        region: the region, or ``None`` for metadata.
        endpoint: ESS endpoint override.
        metadata_url: metadata base URL override.
    """

    name = "alibaba-scale-in"
    group_noun = "scaling group"

    def __init__(
        self,
        *,
        min_size: int,
        group: str,
        instance_id: str | None = None,
        region: str | None = None,
        endpoint: str | None = None,
        metadata_url: str | None = None,
    ) -> None:
        if min_size < 0:
            raise MonitorError(f"--min-size: must be >= 0, got {min_size}")
        super().__init__(
            _ESS,
            instance_id=instance_id,
            region=region,
            endpoint=endpoint,
            metadata_url=metadata_url,
        )
        self.min_size = min_size
        self.group = group

    def _plan(self, iid: str, region: str) -> ScaleInPlan:
        """``(group, detail, remove_policy)`` when allowed, ``(None, why-not, "")`` otherwise."""
        models, client = self.models(), self.client(region)
        group = self.group
        found = client.describe_scaling_instances(
            models.DescribeScalingInstancesRequest(
                region_id=region, scaling_group_id=group, instance_ids=[iid]
            )
        ).body.to_map()
        rows = [
            r
            for r in found.get("ScalingInstances", [])
            if r.get("InstanceId") == iid and r.get("ScalingGroupId") in (None, group)
        ]
        if not rows:
            return None, f"refused: {iid} is not in scaling group {group!r} in {region}", ""
        state = str(rows[0].get("LifecycleState"))
        if state not in _REMOVABLE:
            return None, f"refused: {iid} is {state} in {group}, not InService", ""
        groups = client.describe_scaling_groups(
            models.DescribeScalingGroupsRequest(region_id=region, scaling_group_ids=[group])
        ).body.to_map()
        rows = [g for g in groups.get("ScalingGroups", []) if g.get("ScalingGroupId") == group]
        if not rows:
            return None, f"refused: scaling group {group} not found in {region}", ""
        total, group_min = int(rows[0]["TotalCapacity"]), int(rows[0]["MinSize"])
        floor = max(self.min_size, group_min)
        if total - 1 < floor:
            return (
                None,
                f"refused: {group} has {total} instance(s); removing one would go below "
                f"min size {floor}",
                "",
            )
        policy = "recycle" if rows[0].get("ScalingPolicy") == "recycle" else "release"
        detail = (
            f"{group}: remove {iid} (RemovePolicy={policy}), {total} -> {total - 1} "
            f"instance(s) (min {floor})"
        )
        return group, detail, policy

    def _describe_scale_in(self, iid: str, region: str) -> str:
        return (
            f"dry run: would check {self.group} in {region} (DescribeScalingInstances, "
            f"DescribeScalingGroups; min size {self.min_size}) and call ESS "
            f"RemoveInstances {iid} with DecreaseDesiredCapacity=true"
        )

    def _remove_call(self, iid: str, region: str, group: str, policy: str) -> Callable[[], Any]:
        request = self.models().RemoveInstancesRequest(
            region_id=region,
            scaling_group_id=group,
            instance_ids=[iid],
            decrease_desired_capacity=True,
            remove_policy=policy,
        )
        return lambda: self.client(region).remove_instances(request).body.to_map()

    def _activity(self, answer: Any) -> object:
        return answer.get("ScalingActivityId")
