"""Tencent Cloud CVM through its official SDK (``tencentcloud-sdk-python-cvm``, extra ``fetch-tencent``).

Per region:

* ``DescribeZoneInstanceConfigInfos`` (filtered by instance family, pay-as-you-go):
  which of the asked instance types some zone sells now (``Status: SELL``),
  and in which zone.
* ``InquiryPriceRunInstances`` per type, in a zone that sells it:
  ``POSTPAID_BY_HOUR`` (``UnitPriceDiscount`` per hour, ``on-demand``) and
  ``PREPAID`` for 1, 12 and 36 months (``DiscountPrice``, the whole term: ``monthly``,
  ``reserved-1y``, ``reserved-3y`` as a yearly amount). These are the prices your
  account would be charged, discounts included.

The API does not name a currency: it is your account's (CNY on the China site,
USD on the international site); ``--currency`` says which (default CNY).
``InquiryPriceRunInstances`` needs an image; a public TencentOS image id is used
(instance prices do not depend on a public image; override with
``GPUPLAN_TENCENT_IMAGE_ID`` if your region lacks it).

Credentials: the SDK's default chain (``TENCENTCLOUD_SECRET_ID``/``TENCENTCLOUD_SECRET_KEY``,
``~/.tencentcloud/credentials``, a CVM role). CAM: ``cvm:InquiryPriceRunInstances``,
``cvm:DescribeZoneInstanceConfigInfos``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from gpuplan.catalog.fetch.common import (
    FetchError,
    FetchOutcome,
    FetchRequest,
    Progress,
    Quote,
    Throttled,
    choose_regions,
    missing_credentials,
    tick,
    with_retries,
)
from gpuplan.catalog.schema import Offering

MODES = ("on-demand", "monthly", "reserved-1y", "reserved-3y")
PUBLIC_IMAGE_ID = "img-487zeit5"
"""A public TencentOS Server image, used only to ask a price."""
TERMS = (
    # (mode, charge type, months, divide the total by, unit)
    ("on-demand", "POSTPAID_BY_HOUR", 0, 1, "per_hour"),
    ("monthly", "PREPAID", 1, 1, "per_month"),
    ("reserved-1y", "PREPAID", 12, 1, "per_year"),
    ("reserved-3y", "PREPAID", 36, 3, "per_year"),
)
REGIONS = (
    "ap-beijing", "ap-chengdu", "ap-chongqing", "ap-guangzhou", "ap-hongkong", "ap-jakarta",
    "ap-nanjing", "ap-seoul", "ap-shanghai", "ap-shanghai-fsi", "ap-shenzhen-fsi",
    "ap-singapore", "ap-tokyo", "ap-bangkok", "eu-frankfurt", "na-ashburn", "na-siliconvalley",
    "sa-saopaulo",
)  # fmt: skip
"""Tencent Cloud CVM regions (``tccli cvm DescribeRegions``)."""
CREDENTIALS_HINT = (
    "set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, or run `tccli configure`; the CAM "
    "user needs cvm:InquiryPriceRunInstances and cvm:DescribeZoneInstanceConfigInfos"
)
THROTTLE_CODES = ("RequestLimitExceeded", "RequestLimitExceeded.UinLimitExceeded")
PERMISSION_CODES = ("AuthFailure", "UnauthorizedOperation")


def _client(region: str, req: FetchRequest) -> tuple[Any, Any]:
    try:
        from tencentcloud.common import credential
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
            TencentCloudSDKException,
        )
        from tencentcloud.common.profile.client_profile import ClientProfile
        from tencentcloud.common.profile.http_profile import HttpProfile
        from tencentcloud.cvm.v20170312 import cvm_client, models
    except ImportError:
        raise FetchError(
            "tencent: the Tencent Cloud CVM SDK is not installed",
            hint="pip install 'gpuplan[fetch-tencent]'",
        ) from None
    try:
        cred = credential.DefaultCredentialProvider().get_credentials()
    except TencentCloudSDKException:
        raise missing_credentials("tencent", CREDENTIALS_HINT) from None
    http = HttpProfile(reqTimeout=max(1, round(req.timeout_s)))
    if req.endpoint:
        protocol, _, host = req.endpoint.rpartition("://")
        http = HttpProfile(
            endpoint=host.rstrip("/"),
            protocol=protocol or "https",
            reqTimeout=max(1, round(req.timeout_s)),
        )
    return cvm_client.CvmClient(cred, region, ClientProfile(httpProfile=http)), models


def _call(
    client: Any, models: Any, action: str, params: dict[str, Any], req: FetchRequest
) -> dict[str, Any] | None:
    """The action's answer as a dict; None when the API has no such price."""
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
        TencentCloudSDKException,
    )

    request = getattr(models, f"{action}Request")()
    request.from_json_string(json.dumps(params))

    def once() -> dict[str, Any] | None:
        try:
            answer: dict[str, Any] = json.loads(getattr(client, action)(request).to_json_string())
            return answer
        except TencentCloudSDKException as exc:
            code = str(exc.get_code() or "")
            if code.startswith(THROTTLE_CODES):
                raise Throttled() from exc
            if code.startswith(PERMISSION_CODES):
                raise FetchError(f"tencent {action}: {code}", hint=CREDENTIALS_HINT) from exc
            if code == "ClientNetworkError":
                raise FetchError(
                    f"tencent {action}: cannot reach the API: {exc.get_message()}",
                    hint="check the network or --endpoint",
                ) from exc
            return None

    return with_retries(once, what=f"tencent {action}", req=req)


def _sold(
    client: Any, models: Any, templates: Sequence[Offering], req: FetchRequest
) -> dict[str, str]:
    """Instance type (lowercase) -> a zone that sells it pay-as-you-go."""
    families = sorted({o.instance_type.split(".")[0] for o in templates})
    zones: dict[str, str] = {}
    for start in range(0, len(families), 10):
        params = {
            "Filters": [
                {"Name": "instance-family", "Values": families[start : start + 10]},
                {"Name": "instance-charge-type", "Values": ["POSTPAID_BY_HOUR"]},
            ]
        }
        answer = _call(client, models, "DescribeZoneInstanceConfigInfos", params, req) or {}
        for row in answer.get("InstanceTypeQuotaSet") or []:
            if row.get("Status") == "SELL" and row.get("InstanceType") and row.get("Zone"):
                zones.setdefault(str(row["InstanceType"]).lower(), str(row["Zone"]))
    return zones


def _amount(answer: dict[str, Any] | None, charge: str) -> float | None:
    price = ((answer or {}).get("Price") or {}).get("InstancePrice") or {}
    value = price.get("UnitPriceDiscount" if charge == "POSTPAID_BY_HOUR" else "DiscountPrice")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def fetch(
    req: FetchRequest, templates: Sequence[Offering], progress: Progress | None = None
) -> FetchOutcome:
    """Postpaid and prepaid prices of every template some zone of each region sells."""
    regions = choose_regions(
        req, [r for o in templates for r in o.regions], REGIONS, kind="tencent region"
    )
    currency = req.currency or "CNY"
    image = os.environ.get("GPUPLAN_TENCENT_IMAGE_ID", PUBLIC_IMAGE_ID)
    quotes: list[Quote] = []
    skipped: list[str] = []
    for i, region in enumerate(regions):
        client, models = _client(region, req)
        zones = _sold(client, models, templates, req)
        for off in templates:
            zone = zones.get(off.instance_type.lower())
            if zone is None:
                continue
            for mode, charge, months, divide, unit in TERMS:
                params: dict[str, Any] = {
                    "Placement": {"Zone": zone},
                    "InstanceType": off.instance_type,
                    "InstanceChargeType": charge,
                    "ImageId": image,
                }
                if months:
                    params["InstanceChargePrepaid"] = {
                        "Period": months,
                        "RenewFlag": "NOTIFY_AND_MANUAL_RENEW",
                    }
                answer = _call(client, models, "InquiryPriceRunInstances", params, req)
                amount = _amount(answer, charge)
                if amount is None:
                    skipped.append(f"{region} {off.instance_type}: no {mode} price")
                    continue
                quotes.append(
                    Quote(
                        instance_type=off.instance_type,
                        region=region,
                        mode=mode,
                        amount=round(amount / divide, 6),
                        unit=unit,  # type: ignore[arg-type]
                        currency=currency,
                        action="InquiryPriceRunInstances",
                    )
                )
        tick(progress, i + 1, len(regions), region)
    return FetchOutcome(
        quotes=tuple(quotes), regions_asked=regions, modes=MODES, skipped=tuple(skipped)
    )
