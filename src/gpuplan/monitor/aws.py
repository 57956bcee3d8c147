"""AWS actions through boto3 (extra ``aws``): stop, terminate, or scale in.

* :class:`AwsStopAction` stops *or* terminates this instance, exactly as
  configured: a ``stop`` action can only ever call ``StopInstances``.
* :class:`AsgScaleInAction` removes *this* instance from its Auto Scaling
  group with ``TerminateInstanceInAutoScalingGroup`` and
  ``ShouldDecrementDesiredCapacity=True`` (never "desired - 1", which lets AWS
  pick a busy instance), and refuses when that would go below ``min_size`` or
  when the instance is protected from scale-in.

The instance id and region come from instance metadata (IMDSv2) unless given.
"""

from __future__ import annotations

import importlib
import re
import urllib.error
import urllib.request
from typing import Any, Literal

from gpuplan.errors import ActionError, MonitorError
from gpuplan.monitor.actions import ActionContext, ActionResult

IMDS_URL = "http://169.254.169.254"
_INSTANCE_ID_RE = re.compile(r"^i-[0-9a-f]{8,17}$")


def load_boto3() -> Any:
    """Import boto3 or raise a :class:`MonitorError` with the install hint."""
    try:
        return importlib.import_module("boto3")
    except ImportError as exc:
        raise MonitorError(
            "AWS actions need boto3, which is not installed", hint="pip install 'gpuplan[aws]'"
        ) from exc


def instance_metadata(base_url: str = IMDS_URL, *, timeout_s: float = 2.0) -> tuple[str, str]:
    """This instance's id and region from IMDSv2.

    Equivalent of ``curl -X PUT .../latest/api/token`` then
    ``.../latest/meta-data/instance-id`` and ``.../placement/region``.

    Raises:
        ActionError: metadata is unreachable (not on EC2, or IMDS disabled).
    """

    def get(path: str, token: str) -> str:
        req = urllib.request.Request(  # noqa: S310 - fixed http URL
            f"{base_url}{path}", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return str(resp.read().decode("ascii")).strip()

    try:
        token_req = urllib.request.Request(  # noqa: S310
            f"{base_url}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        with urllib.request.urlopen(token_req, timeout=timeout_s) as resp:  # noqa: S310
            token = resp.read().decode("ascii").strip()
        instance_id = get("/latest/meta-data/instance-id", token)
        region = get("/latest/meta-data/placement/region", token)
    except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
        raise ActionError(
            f"cannot read EC2 instance metadata at {base_url}: {exc}",
            hint="run on EC2 with IMDS enabled, or pass --instance-id and --region",
        ) from exc
    return check_instance_id(instance_id), region


def check_instance_id(value: str) -> str:
    """Validate an EC2 instance id (``i-`` + 8 or 17 hex digits)."""
    if not _INSTANCE_ID_RE.match(value):
        raise ActionError(f"{value!r} is not an EC2 instance id (i-0123456789abcdef0)")
    return value


class _AwsBase:
    def __init__(
        self,
        *,
        instance_id: str | None,
        region: str | None,
        endpoint_url: str | None = None,
        imds_url: str = IMDS_URL,
    ) -> None:
        self._instance_id = instance_id
        self._region = region
        self.endpoint_url = endpoint_url
        self.imds_url = imds_url
        self._clients: dict[tuple[str, str], Any] = {}

    def resolve(self) -> tuple[str, str]:
        """Instance id and region (given, else from IMDSv2); cached."""
        if self._instance_id is None or self._region is None:
            iid, region = instance_metadata(self.imds_url)
            self._instance_id = self._instance_id or iid
            self._region = self._region or region
        return check_instance_id(self._instance_id), self._region

    def target(self, ctx: ActionContext) -> tuple[str, str]:
        """The instance to act on: the fleet target if given, else this instance."""
        if ctx.target is None:
            return self.resolve()
        if self._region is None:
            self._region = instance_metadata(self.imds_url)[1]
        return check_instance_id(ctx.target), self._region

    def client(self, service: str, region: str) -> Any:
        """A boto3 client (honouring ``endpoint_url``, e.g. a local moto server); cached."""
        key = (service, region)
        if key not in self._clients:
            boto3 = load_boto3()
            session = boto3.session.Session(region_name=region)
            self._clients[key] = session.client(service, endpoint_url=self.endpoint_url)
        return self._clients[key]


class AwsStopAction(_AwsBase):
    """Stop or terminate this EC2 instance (``aws ec2 stop-instances`` / ``terminate-instances``).

    Args:
        mode: ``"stop"`` or ``"terminate"``; nothing else, and never the other.
        instance_id: the instance, or ``None`` to read it from IMDSv2.
        region: its region, or ``None`` to read it from IMDSv2.
        endpoint_url: EC2 endpoint override (VPC endpoint, moto).
        imds_url: instance-metadata base URL.
    """

    def __init__(
        self,
        mode: Literal["stop", "terminate"],
        *,
        instance_id: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        imds_url: str = IMDS_URL,
    ) -> None:
        if mode not in ("stop", "terminate"):
            raise MonitorError(f"--aws: expected stop, terminate or scale-in, got {mode!r}")
        super().__init__(
            instance_id=instance_id, region=region, endpoint_url=endpoint_url, imds_url=imds_url
        )
        self.mode = mode
        self.name = f"aws-{mode}"

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Stop/terminate the instance (or describe it in a dry run)."""
        try:
            iid, region = self.target(ctx)
        except ActionError as exc:
            return ActionResult(action=self.name, executed=False, ok=False, detail=exc.message)
        if not execute:
            return ActionResult(
                action=self.name,
                executed=False,
                ok=True,
                detail=f"dry run: would {self.mode} {iid} in {region}",
            )
        ec2 = self.client("ec2", region)
        try:
            if self.mode == "stop":
                resp = ec2.stop_instances(InstanceIds=[iid])
                changes = resp.get("StoppingInstances", [])
            else:
                resp = ec2.terminate_instances(InstanceIds=[iid])
                changes = resp.get("TerminatingInstances", [])
        except Exception as exc:  # noqa: BLE001 - botocore errors vary; report, never raise
            return ActionResult(
                action=self.name, executed=True, ok=False, detail=f"{self.mode} {iid}: {exc}"
            )
        state = changes[0]["CurrentState"]["Name"] if changes else "?"
        return ActionResult(
            action=self.name, executed=True, ok=True, detail=f"{self.mode} {iid}: now {state}"
        )


class AsgScaleInAction(_AwsBase):
    """Remove one instance from its Auto Scaling group, decrementing desired capacity.

    ``aws autoscaling terminate-instance-in-auto-scaling-group --instance-id ID
    --should-decrement-desired-capacity``, after checking group membership,
    scale-in protection and ``desired - 1 >= min_size``.

    Args:
        min_size: never go below this many instances (also bounded by the ASG's MinSize).
        group: expected group name; ``None`` = whatever group the instance is in.
        instance_id: the instance, or ``None`` for this one (IMDSv2); fleet mode
            passes the target in the context instead.
        region: the region, or ``None`` for IMDSv2.
        endpoint_url: Auto Scaling endpoint override (moto).
        imds_url: instance-metadata base URL.
    """

    name = "aws-scale-in"

    def __init__(
        self,
        *,
        min_size: int,
        group: str | None = None,
        instance_id: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        imds_url: str = IMDS_URL,
    ) -> None:
        if min_size < 0:
            raise MonitorError(f"--min-size: must be >= 0, got {min_size}")
        super().__init__(
            instance_id=instance_id, region=region, endpoint_url=endpoint_url, imds_url=imds_url
        )
        self.min_size = min_size
        self.group = group

    def _plan(self, iid: str, region: str) -> tuple[str | None, str]:
        """Return (group, detail) when allowed, (None, why-not) otherwise."""
        asg = self.client("autoscaling", region)
        found = asg.describe_auto_scaling_instances(InstanceIds=[iid]).get(
            "AutoScalingInstances", []
        )
        if not found:
            return None, f"{iid} is not in any Auto Scaling group"
        group = str(found[0]["AutoScalingGroupName"])
        if self.group is not None and group != self.group:
            return None, f"{iid} is in group {group!r}, not {self.group!r}"
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
            "AutoScalingGroups"
        ]
        desired, asg_min = int(groups[0]["DesiredCapacity"]), int(groups[0]["MinSize"])
        floor = max(self.min_size, asg_min)
        if desired - 1 < floor:
            return None, f"refused: {group} desired {desired} - 1 would go below min size {floor}"
        for inst in groups[0].get("Instances", []):
            if inst.get("InstanceId") == iid and inst.get("ProtectedFromScaleIn"):
                return None, f"refused: {iid} is protected from scale-in"
        return group, f"{group}: remove {iid}, desired {desired} -> {desired - 1} (min {floor})"

    def run(self, ctx: ActionContext, *, execute: bool) -> ActionResult:
        """Scale in by removing the instance (or describe it in a dry run)."""
        try:
            iid, region = self.target(ctx)
            group, detail = self._plan(iid, region)
        except ActionError as exc:
            return ActionResult(action=self.name, executed=False, ok=False, detail=exc.message)
        except Exception as exc:  # noqa: BLE001 - botocore errors vary
            return ActionResult(
                action=self.name, executed=False, ok=False, detail=f"cannot check the group: {exc}"
            )
        if group is None:
            return ActionResult(action=self.name, executed=False, ok=False, detail=detail)
        if not execute:
            return ActionResult(
                action=self.name, executed=False, ok=True, detail=f"dry run: would {detail}"
            )
        try:
            self.client("autoscaling", region).terminate_instance_in_auto_scaling_group(
                InstanceId=iid, ShouldDecrementDesiredCapacity=True
            )
        except Exception as exc:  # noqa: BLE001
            return ActionResult(
                action=self.name, executed=True, ok=False, detail=f"{detail}: {exc}"
            )
        return ActionResult(action=self.name, executed=True, ok=True, detail=detail)
