"""What the Alibaba Cloud and Tencent Cloud actions share.

* :class:`CloudSpec` names one cloud: its instance-metadata service, how its
  instance ids look, and the extra that installs its SDK.
* :func:`instance_metadata` reads this instance's id and region from that
  service with a short timeout (never hangs a start-up).
* :class:`CloudTarget` resolves (and caches) the instance and region an action
  works on: flags, else metadata; in fleet mode the target comes from the
  decision instead.
* :func:`sdk_error` turns an SDK exception into one short line that never holds
  a credential.

Credentials are never read here: each SDK's own default chain finds them.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from gpuplan.errors import ActionError, MonitorError

T = TypeVar("T")
# Backstop for one action's SDK work (credential chain + API calls): the SDKs set
# HTTP timeouts, but a credential provider may not (Tencent's CVM-role lookup has none).
CALL_TIMEOUT_S = 60.0

_REGION_RE = re.compile(r"^[a-z]{2,}(-[a-z0-9]+){1,4}$")
_GROUP_RE = re.compile(r"^asg-[0-9a-zA-Z]{4,40}$")
# Environment variables whose values are secrets; their values are scrubbed from messages.
_SECRET_ENV = (
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALIBABA_CLOUD_SECURITY_TOKEN",
    "ALICLOUD_ACCESS_KEY_SECRET",
    "TENCENTCLOUD_SECRET_KEY",
    "TENCENTCLOUD_SESSION_TOKEN",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudSpec:
    """One cloud's constants.

    Attributes:
        name: the cloud's name in messages ("Alibaba Cloud").
        flag: the CLI flag that selects it (``--alibaba``).
        extra: the gpuplan extra that installs its SDK (``alibaba``).
        metadata_url: instance-metadata base URL.
        instance_path: metadata path of this instance's id.
        region_path: metadata path of this instance's region.
        token_header: header that carries a metadata token (hardened mode), or ``None``.
        id_pattern: regular expression an instance id must match.
        id_example: an id of the right shape, for messages.
    """

    name: str
    flag: str
    extra: str
    metadata_url: str
    instance_path: str
    region_path: str
    token_header: str | None
    id_pattern: str
    id_example: str

    def check_instance_id(self, value: str) -> str:
        """Return ``value`` if it is an instance id of this cloud.

        Raises:
            ActionError: it is not.
        """
        if not re.fullmatch(self.id_pattern, value):
            raise ActionError(f"{value!r} is not an instance id of {self.name} ({self.id_example})")
        return value


ALIBABA = CloudSpec(
    name="Alibaba Cloud",
    flag="--alibaba",
    extra="alibaba",
    metadata_url="http://100.100.100.200",
    instance_path="/latest/meta-data/instance-id",
    region_path="/latest/meta-data/region-id",
    token_header="X-aliyun-ecs-metadata-token",
    id_pattern=r"i-[0-9a-z]{8,30}",
    id_example="i-bp67acfmxazb4ph0abcd",
)
TENCENT = CloudSpec(
    name="Tencent Cloud",
    flag="--tencent",
    extra="tencent",
    metadata_url="http://metadata.tencentyun.com",
    instance_path="/latest/meta-data/instance-id",
    region_path="/latest/meta-data/placement/region",
    token_header=None,
    id_pattern=r"ins-[0-9a-z]{8}",
    id_example="ins-abcd1234",
)


def check_region(value: str, spec: CloudSpec) -> str:
    """Validate a region id such as ``cn-hangzhou`` or ``ap-guangzhou``."""
    if not _REGION_RE.match(value):
        raise ActionError(f"--region: {value!r} is not a region id of {spec.name} (cn-hangzhou)")
    return value


def check_group_id(value: str, flag: str) -> str:
    """Validate a scaling-group id (``asg-`` + letters and digits, both clouds)."""
    if not _GROUP_RE.match(value):
        raise MonitorError(f"{flag}: {value!r} is not a scaling group id (asg-bp1abcd2efgh3ijk)")
    return value


def parse_endpoint(value: str, flag: str) -> tuple[str, str]:
    """``(scheme, host[:port])`` from ``https://host``, ``http://127.0.0.1:8080`` or ``host``.

    >>> parse_endpoint("http://127.0.0.1:8080", "--alibaba-endpoint")
    ('http', '127.0.0.1:8080')
    >>> parse_endpoint("ecs-vpc.cn-hangzhou.aliyuncs.com", "--alibaba-endpoint")
    ('https', 'ecs-vpc.cn-hangzhou.aliyuncs.com')
    """
    text = value.strip()
    parsed = urllib.parse.urlsplit(text if "://" in text else f"https://{text}")
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.netloc
        or parsed.path not in ("", "/")
        or parsed.query
        or "@" in parsed.netloc
    ):
        raise MonitorError(
            f"{flag}: expected a host or an http(s)://host[:port] URL, got {value!r}"
        )
    try:
        parsed.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise MonitorError(f"{flag}: bad port in {value!r}") from exc
    return parsed.scheme, parsed.netloc


def load_sdk(module: str, spec: CloudSpec) -> ModuleType:
    """Import an SDK module or raise a one-line :class:`MonitorError` with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MonitorError(
            f"{spec.flag}: {spec.name} actions need the {spec.name} SDK ({module}), "
            "which is not installed",
            hint=f"pip install 'gpuplan[{spec.extra}]'",
        ) from exc


def instance_metadata(
    spec: CloudSpec, base_url: str | None = None, *, timeout_s: float = 2.0
) -> tuple[str, str]:
    """This instance's id and region from the cloud's metadata service.

    Alibaba: ``curl http://100.100.100.200/latest/meta-data/instance-id`` and
    ``.../region-id`` (in hardened mode with a token from ``PUT
    /latest/api/token`` first). Tencent: ``curl
    http://metadata.tencentyun.com/latest/meta-data/instance-id`` and
    ``.../placement/region``.

    Raises:
        ActionError: the service is unreachable, answers an error, or gives an id
            of the wrong shape (not on that cloud).
    """
    base = (base_url or spec.metadata_url).rstrip("/")
    try:
        headers = {}
        if spec.token_header is not None:
            token = _metadata_token(base, timeout_s)
            if token:
                headers[spec.token_header] = token
        instance_id = _get(f"{base}{spec.instance_path}", headers, timeout_s)
        region = _get(f"{base}{spec.region_path}", headers, timeout_s)
    except (urllib.error.URLError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ActionError(
            f"cannot read {spec.name} instance metadata at {base}: {exc}",
            hint="run on the instance, or pass --instance-id and --region",
        ) from exc
    return spec.check_instance_id(instance_id), check_region(region, spec)


def _get(url: str, headers: dict[str, str], timeout_s: float) -> str:
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s) URL
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
        return str(resp.read(256).decode("ascii")).strip()


def _metadata_token(base: str, timeout_s: float) -> str | None:
    """A hardened-mode metadata token, or ``None`` where the service has no token API."""
    req = urllib.request.Request(  # noqa: S310
        f"{base}/latest/api/token",
        method="PUT",
        headers={"X-aliyun-ecs-metadata-token-ttl-seconds": "60"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return str(resp.read(256).decode("ascii")).strip() or None
    except urllib.error.HTTPError:
        return None  # normal mode: plain GETs work


class CloudTarget:
    """The instance and region an action works on (flags, else metadata); cached.

    Args:
        spec: the cloud.
        instance_id: the instance, or ``None`` to read it from metadata.
        region: its region, or ``None`` to read it from metadata.
        metadata_url: metadata base URL override (tests).
        timeout_s: metadata timeout in seconds.
    """

    def __init__(
        self,
        spec: CloudSpec,
        *,
        instance_id: str | None = None,
        region: str | None = None,
        metadata_url: str | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self._instance_id = instance_id
        self._region = region
        self.metadata_url = metadata_url
        self.timeout_s = timeout_s

    def resolve(self) -> tuple[str, str]:
        """This instance's id and region (given, else from metadata).

        Raises:
            ActionError: metadata unreachable, or a malformed id or region.
        """
        if self._instance_id is None or self._region is None:
            iid, region = instance_metadata(self.spec, self.metadata_url, timeout_s=self.timeout_s)
            self._instance_id = self._instance_id or iid
            self._region = self._region or region
        return self.spec.check_instance_id(self._instance_id), check_region(self._region, self.spec)

    def region(self) -> str:
        """The region (given, else from metadata)."""
        if self._region is None:
            self._region = instance_metadata(
                self.spec, self.metadata_url, timeout_s=self.timeout_s
            )[1]
        return check_region(self._region, self.spec)

    def target(self, fleet_target: str | None) -> tuple[str, str]:
        """The fleet target if given (an instance id), else this instance; with the region."""
        if fleet_target is None:
            return self.resolve()
        return self.spec.check_instance_id(fleet_target), self.region()


def sdk_error(exc: BaseException) -> str:
    """One short line for an SDK exception: its error code and message, no credential.

    Alibaba's ``TeaException`` and Tencent's ``TencentCloudSDKException`` both
    carry ``code`` and ``message``; anything else is named by its type. Values
    of the secret environment variables are replaced by ``***`` in any case.
    """
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    if isinstance(code, str) and isinstance(message, str) and code:
        text = f"{code}: {message}"
        request_id = getattr(exc, "requestId", None) or getattr(exc, "request_id", None)
        if isinstance(request_id, str) and request_id and request_id not in text:
            text += f" (request id {request_id})"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    for name in _SECRET_ENV:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text[:300]


def bounded(work: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run ``work`` in a daemon thread; its result, its exception, or a ``TimeoutError``.

    The agent never waits longer than ``timeout_s`` for an SDK; a call left
    running in the background is abandoned (it cannot block the next step).
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"gpuplan-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
