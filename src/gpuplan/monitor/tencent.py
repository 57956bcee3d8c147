"""Tencent Cloud actions through the official SDKs (extra ``tencent``).

* :class:`TencentStopAction` stops this CVM instance with ``StopInstances`` and
  ``StoppedMode=STOP_CHARGING`` (no charge while stopped: the compute bill
  stops, the cloud disks stay), or ``KEEP_CHARGING`` when asked.
* :class:`TencentScaleInAction` removes *this* instance from its Auto Scaling
  group with ``RemoveInstances``, after checking with
  ``DescribeAutoScalingInstances`` that it is in the group, in service and not
  protected from scale-in, and with ``DescribeAutoScalingGroups`` that the
  group's in-service count stays at or above its ``MinSize`` (and ``--min-size``).

A dry run calls no API at all. Credentials come from
``tencentcloud.common.credential.DefaultCredentialProvider`` (environment
``TENCENTCLOUD_SECRET_ID``/``TENCENTCLOUD_SECRET_KEY``, the
``~/.tencentcloud/credentials`` profile, the CVM role) and are never logged.
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
    CALL_TIMEOUT_S,
    TENCENT,
    CloudTarget,
    load_sdk,
    parse_endpoint,
)

_CVM = ("tencentcloud.cvm.v20170312", "cvm_client", "CvmClient")
_AS = ("tencentcloud.autoscaling.v20180419", "autoscaling_client", "AutoscalingClient")
_LEAVING = ("TERMINATING", "DETACHING", "REMOVING")


class _TencentBase(CloudActionBase):
    def __init__(
        self,
        service: tuple[str, str, str],
        *,
        instance_id: str | None,
        region: str | None,
        endpoint: str | None,
        metadata_url: str | None,
    ) -> None:
        package, module, _ = service
        load_sdk(f"{package}.{module}", TENCENT)  # fail at start-up, not at stop time
        self._service = service
        self.where = CloudTarget(
            TENCENT, instance_id=instance_id, region=region, metadata_url=metadata_url
        )
        self.endpoint = None if endpoint is None else parse_endpoint(endpoint, "--tencent-endpoint")
        self._clients: dict[str, Any] = {}
        self.call_timeout_s = CALL_TIMEOUT_S

    def client(self, region: str) -> Any:
        """An SDK client for ``region`` with the default credential chain; cached."""
        if region not in self._clients:
            package, module, cls = self._service
            client_mod = load_sdk(f"{package}.{module}", TENCENT)
            cred_mod = load_sdk("tencentcloud.common.credential", TENCENT)
            http_mod = load_sdk("tencentcloud.common.profile.http_profile", TENCENT)
            profile_mod = load_sdk("tencentcloud.common.profile.client_profile", TENCENT)
            http = http_mod.HttpProfile(reqTimeout=15)
            if self.endpoint is not None:
                scheme, host = self.endpoint
                http = http_mod.HttpProfile(protocol=scheme, endpoint=host, reqTimeout=15)
            credentials = cred_mod.DefaultCredentialProvider().get_credentials()
            self._clients[region] = getattr(client_mod, cls)(
                credentials, region, profile_mod.ClientProfile(httpProfile=http)
            )
        return self._clients[region]

    def models(self) -> Any:
        """The SDK's request models."""
        return load_sdk(f"{self._service[0]}.models", TENCENT)


def _request(models: Any, name: str, **fields: Any) -> Any:
    request = getattr(models, name)()
    for key, value in fields.items():
        setattr(request, key, value)
    return request


class TencentStopAction(_TencentBase, CloudStopBase):
    """Stop this CVM instance (``tccli cvm StopInstances --StoppedMode STOP_CHARGING``).

    Args:
        keep_charging: stop with ``KEEP_CHARGING`` instead of ``STOP_CHARGING``.
        instance_id: the instance, or ``None`` to read it from metadata.
        region: its region, or ``None`` to read it from metadata.
        endpoint: CVM endpoint override (``http://127.0.0.1:PORT`` in tests).
        metadata_url: metadata base URL override.
    """

    name = "tencent-stop"

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
            _CVM,
            instance_id=instance_id,
            region=region,
            endpoint=endpoint,
            metadata_url=metadata_url,
        )
        self.stopped_mode = "KEEP_CHARGING" if keep_charging else "STOP_CHARGING"

    def _describe_stop(self, iid: str, region: str) -> str:
        return f"CVM StopInstances {iid} in {region} (StoppedMode={self.stopped_mode})"

    def _stop_call(self, iid: str, region: str) -> Callable[[], Any]:
        request = _request(
            self.models(),
            "StopInstancesRequest",
            InstanceIds=[iid],
            StoppedMode=self.stopped_mode,
        )
        return lambda: self.client(region).StopInstances(request)

    def _stop_outcome(self, answer: Any, iid: str, call: str) -> tuple[bool, str]:
        return True, f"{call}: accepted (request id {answer.RequestId})"


class TencentScaleInAction(_TencentBase, CloudScaleInBase):
    """Remove one instance from its Auto Scaling group.

    ``tccli as RemoveInstances --AutoScalingGroupId G --InstanceIds '["ID"]'``
    after ``DescribeAutoScalingInstances`` and ``DescribeAutoScalingGroups``
    (``InServiceInstanceCount - 1 >= max(MinSize, min_size)``, the rule the API
    itself enforces for an enabled group). Instances Auto Scaling created are
    terminated; instances added by hand leave the group and keep running.

    Args:
        min_size: never go below this many in-service instances (the group's
            ``MinSize`` is also a floor).
        group: the group id; ``None`` = the group the instance is in.
        instance_id: the instance, or ``None`` for this one (metadata); fleet
            mode passes the target in the context instead.
        region: the region, or ``None`` for metadata.
        endpoint: Auto Scaling endpoint override.
        metadata_url: metadata base URL override.
    """

    name = "tencent-scale-in"
    group_noun = "Auto Scaling group"

    def __init__(
        self,
        *,
        min_size: int,
        group: str | None = None,
        instance_id: str | None = None,
        region: str | None = None,
        endpoint: str | None = None,
        metadata_url: str | None = None,
    ) -> None:
        if min_size < 0:
            raise MonitorError(f"--min-size: must be >= 0, got {min_size}")
        super().__init__(
            _AS,
            instance_id=instance_id,
            region=region,
            endpoint=endpoint,
            metadata_url=metadata_url,
        )
        self.min_size = min_size
        self.group = group

    def _plan(self, iid: str, region: str) -> ScaleInPlan:
        """``(group, detail, "")`` when allowed, ``(None, why-not, "")`` otherwise."""
        models, client = self.models(), self.client(region)
        found = client.DescribeAutoScalingInstances(
            _request(models, "DescribeAutoScalingInstancesRequest", InstanceIds=[iid])
        )
        rows = [r for r in found.AutoScalingInstanceSet or [] if r.InstanceId == iid]
        if not rows:
            return None, f"refused: {iid} is not in any Auto Scaling group in {region}", ""
        me = rows[0]
        group = str(me.AutoScalingGroupId)
        if self.group is not None and group != self.group:
            return (
                None,
                f"refused: {iid} is in Auto Scaling group {group!r}, not {self.group!r}",
                "",
            )
        if me.ProtectedFromScaleIn:
            return None, f"refused: {iid} is protected from scale-in", ""
        if me.LifeCycleState in _LEAVING:
            return None, f"refused: {iid} is already {me.LifeCycleState} in {group}", ""
        groups = client.DescribeAutoScalingGroups(
            _request(models, "DescribeAutoScalingGroupsRequest", AutoScalingGroupIds=[group])
        )
        rows = [g for g in groups.AutoScalingGroupSet or [] if g.AutoScalingGroupId == group]
        if not rows:
            return None, f"refused: Auto Scaling group {group} not found in {region}", ""
        in_service = int(rows[0].InServiceInstanceCount or 0)
        left = in_service - (1 if me.LifeCycleState == "IN_SERVICE" else 0)
        floor = max(self.min_size, int(rows[0].MinSize))
        if left < floor:
            return (
                None,
                f"refused: {group} has {in_service} instance(s) in service; removing {iid} "
                f"would go below min size {floor}",
                "",
            )
        desired = rows[0].DesiredCapacity
        detail = (
            f"{group}: remove {iid}, {in_service} -> {left} in service "
            f"(desired {desired}, min {floor})"
        )
        return group, detail, ""

    def _describe_scale_in(self, iid: str, region: str) -> str:
        which = self.group or "its Auto Scaling group"
        return (
            f"dry run: would check {which} in {region} (DescribeAutoScalingInstances, "
            f"DescribeAutoScalingGroups; min size {self.min_size}) and call AS "
            f"RemoveInstances {iid}"
        )

    def _remove_call(self, iid: str, region: str, group: str, policy: str) -> Callable[[], Any]:
        request = _request(
            self.models(), "RemoveInstancesRequest", AutoScalingGroupId=group, InstanceIds=[iid]
        )
        return lambda: self.client(region).RemoveInstances(request)

    def _activity(self, answer: Any) -> object:
        return answer.ActivityId
