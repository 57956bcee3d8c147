"""Loopback fakes of the Alibaba Cloud and Tencent Cloud APIs and metadata services.

The real SDKs talk to these servers over HTTP (their endpoint set to
``http://127.0.0.1:PORT``); nothing in the SDK is patched. Each fake checks
the action name, the parameters and the credential id in the signed
``Authorization`` header, answers in the shape of the real API (including its
error shape), and records every call so tests can assert what was (not) called.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

ALI_KEY_ID = "LTAI5tFakeKeyId0001"
ALI_SECRET = "ali-secret-MUST-NOT-LEAK-7f3a"
TC_SECRET_ID = "AKIDFakeSecretId0001"
TC_SECRET_KEY = "tc-secret-MUST-NOT-LEAK-9b2c"


@dataclass
class Member:
    """One instance in a fake scaling group."""

    group: str
    state: str = "InService"
    protected: bool = False


@dataclass
class FakeCloud:
    """The state behind one fake API server.

    Attributes:
        members: instance id -> group membership.
        groups: group id -> {"MinSize", "Total" (instances), "Desired", "Policy"}.
        stopped: instance id -> the StoppedMode it was stopped with.
        removed: instance ids removed from a group.
        calls: (action, params) of every call, in order.
        problems: parameter checks that failed (a test asserts this stays empty).
        fail: action -> (http status, code, message) to answer with an error.
        delay: action -> seconds to wait before answering.
    """

    members: dict[str, Member] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fail: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def actions(self) -> list[str]:
        """The action names called so far."""
        return [a for a, _ in self.calls]

    def add_group(self, gid: str, members: list[str], *, min_size: int, policy: str = "release"):  # type: ignore[no-untyped-def]
        """A group with these in-service members."""
        self.groups[gid] = {
            "MinSize": min_size,
            "Total": len(members),
            "Desired": len(members),
            "Policy": policy,
        }
        for iid in members:
            self.members[iid] = Member(group=gid)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.problems.append(what)


def use_alibaba_env(
    monkeypatch: Any, key_id: str | None, secret: str | None, home: str | None = None
) -> None:
    """Put Alibaba credentials in the environment (or none at all), for the SDK's chain.

    ``alibabacloud_credentials`` reads its environment variables once, when it is
    first imported; a test process imports it once for many tests, so its
    snapshot of the environment is set to match as well.
    """
    import importlib

    for key in (
        "ALIBABA_CLOUD_SECURITY_TOKEN",
        "ALIBABA_CLOUD_PROFILE",
        "ALIBABA_CLOUD_ROLE_ARN",
        "ALIBABA_CLOUD_OIDC_TOKEN_FILE",
        "ALIBABA_CLOUD_CREDENTIALS_URI",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
    ):
        monkeypatch.delenv(key, raising=False)
    values = {
        "ALIBABA_CLOUD_ACCESS_KEY_ID": key_id,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": secret,
        "ALIBABA_CLOUD_ECS_METADATA_DISABLED": "true",
        "ALIBABA_CLOUD_CLI_PROFILE_DISABLED": "true",
        "ALIBABA_CLOUD_CREDENTIALS_FILE": None if home is None else f"{home}/none.ini",
    }
    for key, value in values.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    au = importlib.import_module("alibabacloud_credentials.utils.auth_util")
    monkeypatch.setattr(au, "environment_access_key_id", key_id)
    monkeypatch.setattr(au, "environment_access_key_secret", secret)
    monkeypatch.setattr(au, "environment_security_token", None)
    monkeypatch.setattr(au, "environment_ecs_metadata_disabled", "true")
    monkeypatch.setattr(au, "environment_cli_profile_disabled", "true")
    monkeypatch.setattr(au, "environment_credentials_uri", None)
    monkeypatch.setattr(au, "enable_oidc_credential", False)
    monkeypatch.setattr(
        au, "environment_credentials_file", values["ALIBABA_CLOUD_CREDENTIALS_FILE"]
    )


def _start(handler: type[BaseHTTPRequestHandler], cloud: Any) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.cloud = cloud  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, status: int, body: dict[str, Any] | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# --- Alibaba Cloud (RPC style: action in x-acs-action / Action, params in query or form) ---


class _AlibabaHandler(_Quiet):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        cloud: FakeCloud = self.server.cloud  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            params.update(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        action = self.headers.get("x-acs-action") or params.get("Action", "")
        with cloud.lock:
            cloud.calls.append((action, params))
            cloud.expect(
                f"Credential={ALI_KEY_ID}," in self.headers.get("Authorization", "")
                or params.get("AccessKeyId") == ALI_KEY_ID,
                f"{action}: not signed with the env credential",
            )
            if action in cloud.fail:
                status, code, message = cloud.fail[action]
                self.reply(status, {"Code": code, "Message": message, "RequestId": "req-err"})
                return
            handler = getattr(self, f"act_{action}", None)
            if handler is None:
                self.reply(
                    400, {"Code": "InvalidAction.NotFound", "Message": action, "RequestId": "r"}
                )
                return
            handler(cloud, params)

    do_GET = do_POST

    def act_StopInstances(self, cloud: FakeCloud, p: dict[str, str]) -> None:  # noqa: N802
        cloud.expect(p.get("RegionId") == "cn-hangzhou", f"StopInstances RegionId {p}")
        cloud.expect(p.get("StoppedMode") in ("StopCharging", "KeepCharging"), f"mode {p}")
        ids = [v for k, v in sorted(p.items()) if k.startswith("InstanceId.")]
        cloud.expect(len(ids) == 1, f"StopInstances ids {ids}")
        answers = []
        for iid in ids:
            cloud.stopped[iid] = p.get("StoppedMode", "")
            answers.append(
                {
                    "InstanceId": iid,
                    "Code": "200",
                    "Message": "success",
                    "PreviousStatus": "Running",
                    "CurrentStatus": "Stopping",
                }
            )
        self.reply(200, {"RequestId": "req-1", "InstanceResponses": {"InstanceResponse": answers}})

    def act_DescribeScalingInstances(self, cloud: FakeCloud, p: dict[str, str]) -> None:  # noqa: N802
        cloud.expect(p.get("RegionId") == "cn-hangzhou", f"DescribeScalingInstances {p}")
        ids = [v for k, v in p.items() if k.startswith("InstanceIds.")]
        cloud.expect(len(ids) == 1, f"DescribeScalingInstances ids {p}")
        gid = p.get("ScalingGroupId")
        cloud.expect(gid is not None, f"DescribeScalingInstances without a group {p}")
        rows = [
            {
                "InstanceId": iid,
                "ScalingGroupId": cloud.members[iid].group,
                "LifecycleState": cloud.members[iid].state,
                "HealthStatus": "Healthy",
                "CreationType": "AutoCreated",
            }
            for iid in ids
            if iid in cloud.members and cloud.members[iid].group == gid
        ]
        self.reply(200, {"RequestId": "req-2", "TotalCount": len(rows), "ScalingInstances": rows})

    def act_DescribeScalingGroups(self, cloud: FakeCloud, p: dict[str, str]) -> None:  # noqa: N802
        ids = [v for k, v in p.items() if k.startswith("ScalingGroupIds.")]
        cloud.expect(len(ids) == 1, f"DescribeScalingGroups ids {p}")
        rows = [
            {
                "ScalingGroupId": gid,
                "ScalingGroupName": "gpu-pool",
                "MinSize": cloud.groups[gid]["MinSize"],
                "MaxSize": 10,
                "TotalCapacity": cloud.groups[gid]["Total"],
                "DesiredCapacity": cloud.groups[gid]["Desired"],
                "ScalingPolicy": cloud.groups[gid]["Policy"],
                "LifecycleState": "Active",
            }
            for gid in ids
            if gid in cloud.groups
        ]
        self.reply(200, {"RequestId": "req-3", "TotalCount": len(rows), "ScalingGroups": rows})

    def act_RemoveInstances(self, cloud: FakeCloud, p: dict[str, str]) -> None:  # noqa: N802
        gid = p.get("ScalingGroupId", "")
        ids = [v for k, v in p.items() if k.startswith("InstanceIds.")]
        cloud.expect(len(ids) == 1, f"RemoveInstances ids {p}")
        cloud.expect(
            str(p.get("DecreaseDesiredCapacity")).lower() == "true", f"RemoveInstances {p}"
        )
        group = cloud.groups.get(gid)
        if group is None or any(cloud.members.get(i, Member("")).group != gid for i in ids):
            self.reply(
                404,
                {"Code": "InvalidScalingGroupId.NotFound", "Message": gid, "RequestId": "req-4"},
            )
            return
        if group["Total"] - len(ids) < group["MinSize"]:
            self.reply(
                400,
                {
                    "Code": "IncorrectCapacity.MinSize",
                    "Message": "below MinSize",
                    "RequestId": "req-5",
                },
            )
            return
        for iid in ids:
            cloud.members.pop(iid)
            cloud.removed.append(iid)
        group["Total"] -= len(ids)
        group["Desired"] -= len(ids)
        self.reply(200, {"RequestId": "req-6", "ScalingActivityId": "asa-fake0001"})


def start_alibaba(cloud: FakeCloud) -> ThreadingHTTPServer:
    """Serve ``cloud`` as the ECS + ESS APIs; its ``url`` is set."""
    server = _start(_AlibabaHandler, cloud)
    cloud.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


# --- Tencent Cloud (API 3.0: X-TC-Action header, JSON body, {"Response": {...}}) ---------


class _TencentHandler(_Quiet):
    def do_POST(self) -> None:  # noqa: N802
        cloud: FakeCloud = self.server.cloud  # type: ignore[attr-defined]
        action = self.headers.get("X-TC-Action", "")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        auth = self.headers.get("Authorization", "")
        time.sleep(cloud.delay.get(action, 0.0))
        with cloud.lock:
            cloud.calls.append((action, body))
            cloud.expect(
                auth.startswith(f"TC3-HMAC-SHA256 Credential={TC_SECRET_ID}/"),
                f"{action}: not signed with the env credential",
            )
            cloud.expect(self.headers.get("X-TC-Region") == "ap-guangzhou", f"{action} region")
            service = "cvm" if action == "StopInstances" else "as"
            cloud.expect(f"/{service}/tc3_request" in auth, f"{action}: service {auth}")
            if action in cloud.fail:
                _, code, message = cloud.fail[action]
                self.reply(
                    200,
                    {
                        "Response": {
                            "Error": {"Code": code, "Message": message},
                            "RequestId": "req-err",
                        }
                    },
                )
                return
            handler = getattr(self, f"act_{action}", None)
            if handler is None:
                self.reply(
                    200,
                    {
                        "Response": {
                            "Error": {"Code": "InvalidAction", "Message": action},
                            "RequestId": "r",
                        }
                    },
                )
                return
            self.reply(200, {"Response": {**handler(cloud, body), "RequestId": "req-1"}})

    def act_StopInstances(self, cloud: FakeCloud, b: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        cloud.expect(b.get("StoppedMode") in ("STOP_CHARGING", "KEEP_CHARGING"), f"mode {b}")
        cloud.expect(len(b.get("InstanceIds", [])) == 1, f"StopInstances {b}")
        for iid in b.get("InstanceIds", []):
            cloud.stopped[iid] = b.get("StoppedMode", "")
        return {}

    def act_DescribeAutoScalingInstances(
        self, cloud: FakeCloud, b: dict[str, Any]
    ) -> dict[str, Any]:  # noqa: N802
        ids = b.get("InstanceIds", [])
        cloud.expect(len(ids) == 1, f"DescribeAutoScalingInstances {b}")
        rows = [
            {
                "InstanceId": iid,
                "AutoScalingGroupId": cloud.members[iid].group,
                "LifeCycleState": cloud.members[iid].state,
                "HealthStatus": "HEALTHY",
                "ProtectedFromScaleIn": cloud.members[iid].protected,
                "CreationType": "AUTO_CREATION",
            }
            for iid in ids
            if iid in cloud.members
        ]
        return {"AutoScalingInstanceSet": rows, "TotalCount": len(rows)}

    def act_DescribeAutoScalingGroups(self, cloud: FakeCloud, b: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        ids = b.get("AutoScalingGroupIds", [])
        cloud.expect(len(ids) == 1, f"DescribeAutoScalingGroups {b}")
        rows = [
            {
                "AutoScalingGroupId": gid,
                "AutoScalingGroupName": "gpu-pool",
                "MinSize": cloud.groups[gid]["MinSize"],
                "MaxSize": 10,
                "DesiredCapacity": cloud.groups[gid]["Desired"],
                "InstanceCount": cloud.groups[gid]["Total"],
                "InServiceInstanceCount": sum(
                    1 for m in cloud.members.values() if m.group == gid and m.state == "IN_SERVICE"
                ),
                "EnabledStatus": "ENABLED",
            }
            for gid in ids
            if gid in cloud.groups
        ]
        return {"AutoScalingGroupSet": rows, "TotalCount": len(rows)}

    def act_RemoveInstances(self, cloud: FakeCloud, b: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        gid, ids = b.get("AutoScalingGroupId"), b.get("InstanceIds", [])
        cloud.expect(len(ids) == 1, f"RemoveInstances {b}")
        for iid in ids:
            cloud.expect(cloud.members.get(iid, Member("")).group == gid, f"not in group {b}")
            cloud.members.pop(iid, None)
            cloud.removed.append(iid)
        return {"ActivityId": "asa-fake0001"}


def start_tencent(cloud: FakeCloud) -> ThreadingHTTPServer:
    """Serve ``cloud`` as the CVM + Auto Scaling APIs; its ``url`` is set."""
    server = _start(_TencentHandler, cloud)
    cloud.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


# --- instance metadata -------------------------------------------------------------------


@dataclass
class Metadata:
    """A fake metadata service: ``pages`` path -> text; ``token`` for hardened mode."""

    pages: dict[str, str]
    token: str | None = None
    seen: list[str] = field(default_factory=list)
    url: str = ""


class _MetadataHandler(_Quiet):
    def do_PUT(self) -> None:  # noqa: N802
        meta: Metadata = self.server.cloud  # type: ignore[attr-defined]
        if meta.token is None or self.path != "/latest/api/token":
            self.reply(404, "not found")
            return
        assert self.headers["X-aliyun-ecs-metadata-token-ttl-seconds"]
        self.reply(200, meta.token)

    def do_GET(self) -> None:  # noqa: N802
        meta: Metadata = self.server.cloud  # type: ignore[attr-defined]
        meta.seen.append(self.path)
        if meta.token is not None and self.headers.get("X-aliyun-ecs-metadata-token") != meta.token:
            self.reply(403, "token required")
            return
        if self.path not in meta.pages:
            self.reply(404, "not found")
            return
        self.reply(200, meta.pages[self.path])


def start_metadata(meta: Metadata) -> ThreadingHTTPServer:
    """Serve ``meta``; its ``url`` is set."""
    server = _start(_MetadataHandler, meta)
    meta.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


_Fake = TypeVar("_Fake")


@contextlib.contextmanager
def running(start: Callable[[_Fake], ThreadingHTTPServer], fake: _Fake) -> Iterator[_Fake]:
    """Serve ``fake`` with ``start`` (``start_alibaba``, ``start_metadata``...) for the block."""
    server = start(fake)
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
