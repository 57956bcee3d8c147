"""Alibaba Cloud ECS through its official SDK (``alibabacloud-ecs20140526``, extra ``fetch-alibaba``).

Per region:

* ``DescribeAvailableResource`` (``DestinationResource=InstanceType``,
  pay-as-you-go): the instance types some zone of the region sells now
  (``Status: Available``); only those are priced.
* ``DescribePrice`` (``ResourceType=instance``) per type: ``PriceUnit=Hour``
  (pay-as-you-go, ``on-demand``), ``Month`` x 1 (``monthly``), ``Year`` x 1
  (``reserved-1y``) and ``Year`` x 3 (``reserved-3y``, the 3-year total over 3).
  The amount kept is ``TradePrice``: what *your* account pays after the
  discounts Alibaba applies to it (``OriginalPrice`` is the list price); the
  currency is the answer's ``Currency`` (CNY on the China site).
* ``DescribeSpotPriceHistory`` (``NetworkType=vpc``, ``OSType=linux``): the
  latest price of each zone; the region's spot price is the lowest zone's.

Credentials: ``ALIBABA_CLOUD_ACCESS_KEY_ID``/``ALIBABA_CLOUD_ACCESS_KEY_SECRET``
(and ``ALIBABA_CLOUD_SECURITY_TOKEN``) when set, else the SDK's default chain
(``~/.aliyun/config.json``, ``~/.alibabacloud/credentials.ini``, an ECS RAM
role). RAM: ``ecs:DescribePrice``, ``ecs:DescribeSpotPriceHistory``,
``ecs:DescribeAvailableResource``.
"""

from __future__ import annotations

import datetime as dt
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

MODES = ("on-demand", "monthly", "reserved-1y", "reserved-3y", "spot")
SUBSCRIPTIONS = (
    # (mode, PriceUnit, Period, divide the total by, unit)
    ("on-demand", "Hour", 1, 1, "per_hour"),
    ("monthly", "Month", 1, 1, "per_month"),
    ("reserved-1y", "Year", 1, 1, "per_year"),
    ("reserved-3y", "Year", 3, 3, "per_year"),
)
REGIONS = (
    "cn-qingdao", "cn-beijing", "cn-zhangjiakou", "cn-huhehaote", "cn-wulanchabu",
    "cn-hangzhou", "cn-shanghai", "cn-nanjing", "cn-fuzhou", "cn-wuhan-lr", "cn-shenzhen",
    "cn-heyuan", "cn-guangzhou", "cn-chengdu", "cn-hongkong", "ap-northeast-1",
    "ap-northeast-2", "ap-southeast-1", "ap-southeast-3", "ap-southeast-5", "ap-southeast-6",
    "ap-southeast-7", "ap-south-1", "us-east-1", "us-west-1", "eu-west-1", "eu-central-1",
    "me-east-1", "me-central-1", "na-south-1",
)  # fmt: skip
"""Alibaba Cloud ECS public regions (``aliyun ecs DescribeRegions``)."""
CREDENTIALS_HINT = (
    "set ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET, or run "
    "`aliyun configure`; the RAM user needs ecs:DescribePrice, ecs:DescribeSpotPriceHistory "
    "and ecs:DescribeAvailableResource"
)
PERMISSION_CODES = ("Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoPermission")


def _sdk() -> tuple[Any, Any, Any, Any]:
    try:
        from alibabacloud_credentials import models as cred_models
        from alibabacloud_credentials.client import Client as CredentialClient
        from alibabacloud_ecs20140526 import models
        from alibabacloud_ecs20140526.client import Client
    except ImportError:
        raise FetchError(
            "alibaba: the Alibaba Cloud ECS SDK is not installed",
            hint="pip install 'gpuplan[fetch-alibaba]'",
        ) from None
    return Client, models, CredentialClient, cred_models


def _credential(credential_client: Any, cred_models: Any) -> Any:
    """The environment's keys when set (read now, not at SDK import), else the default chain."""
    key_id = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    if key_id and secret:
        token = os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN")
        config = cred_models.Config(
            type="sts" if token else "access_key",
            access_key_id=key_id,
            access_key_secret=secret,
            security_token=token,
        )
        return credential_client(config)
    try:
        return credential_client()
    except Exception as exc:  # noqa: BLE001 - the chain raises assorted types
        raise missing_credentials("alibaba", CREDENTIALS_HINT) from exc


def _client(region: str, req: FetchRequest) -> tuple[Any, Any]:
    client_cls, models, credential_client, cred_models = _sdk()
    from alibabacloud_tea_openapi.utils_models import Config

    endpoint = req.endpoint
    protocol = "https"
    if endpoint and "://" in endpoint:
        protocol, endpoint = endpoint.split("://", 1)
    config = Config(
        credential=_credential(credential_client, cred_models),
        region_id=region,
        endpoint=endpoint.rstrip("/") if endpoint else None,
        protocol=protocol,
        read_timeout=int(req.timeout_s * 1000),
        connect_timeout=int(req.timeout_s * 1000),
    )
    return client_cls(config), models


def _call(fn: Any, request: Any, what: str, req: FetchRequest) -> dict[str, Any] | None:
    """The answer's body as a dict; None when the API says it has no such price."""

    def once() -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = fn(request).body.to_map()
            return body
        except Exception as exc:  # noqa: BLE001 - Tea raises its own hierarchy
            code = str(getattr(exc, "code", "") or "")
            text = " ".join(str(getattr(exc, "message", "") or exc).split())
            if code.startswith("Throttling") or code == "ServiceUnavailable":
                raise Throttled() from exc
            if "unable to load credentials" in text or "CredentialException" in repr(exc):
                raise missing_credentials("alibaba", CREDENTIALS_HINT) from exc
            if code.startswith(PERMISSION_CODES):
                raise FetchError(f"alibaba {what}: {code}", hint=CREDENTIALS_HINT) from exc
            if code:
                return None  # e.g. a subscription term this type is not sold on
            raise FetchError(f"alibaba {what}: {text[:200]}") from exc

    return with_retries(once, what=f"alibaba {what}", req=req)


def _available(client: Any, models: Any, region: str, req: FetchRequest) -> set[str]:
    request = models.DescribeAvailableResourceRequest(
        region_id=region, destination_resource="InstanceType", instance_charge_type="PostPaid"
    )
    body = _call(client.describe_available_resource, request, "DescribeAvailableResource", req)
    out: set[str] = set()
    zones = ((body or {}).get("AvailableZones") or {}).get("AvailableZone") or []
    for zone in zones:
        for res in (zone.get("AvailableResources") or {}).get("AvailableResource") or []:
            for sup in (res.get("SupportedResources") or {}).get("SupportedResource") or []:
                if sup.get("Status") == "Available" and sup.get("Value"):
                    out.add(str(sup["Value"]).lower())
    return out


def _spot(
    client: Any, models: Any, region: str, itype: str, req: FetchRequest
) -> tuple[float, str] | None:
    start = (req.now - dt.timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    request = models.DescribeSpotPriceHistoryRequest(
        region_id=region, network_type="vpc", instance_type=itype, ostype="linux", start_time=start
    )
    body = _call(client.describe_spot_price_history, request, "DescribeSpotPriceHistory", req)
    latest: dict[str, tuple[str, float]] = {}
    for row in ((body or {}).get("SpotPrices") or {}).get("SpotPriceType") or []:
        zone, stamp, price = (
            row.get("ZoneId", ""),
            str(row.get("Timestamp", "")),
            row.get("SpotPrice"),
        )
        if not isinstance(price, (int, float)) or price <= 0:
            continue
        if zone not in latest or stamp > latest[zone][0]:
            latest[zone] = (stamp, float(price))
    if not latest:
        return None
    return (min(p for _, p in latest.values()), str((body or {}).get("Currency") or "CNY"))


def fetch(
    req: FetchRequest, templates: Sequence[Offering], progress: Progress | None = None
) -> FetchOutcome:
    """Pay-as-you-go, subscription and spot prices of every template sold in each region."""
    regions = choose_regions(
        req, [r for o in templates for r in o.regions], REGIONS, kind="alibaba region"
    )
    quotes: list[Quote] = []
    skipped: list[str] = []
    for i, region in enumerate(regions):
        client, models = _client(region, req)
        sold = _available(client, models, region, req)
        for off in templates:
            itype = off.instance_type
            if itype.lower() not in sold:
                continue
            for mode, unit_name, period, divide, unit in SUBSCRIPTIONS:
                request = models.DescribePriceRequest(
                    region_id=region,
                    resource_type="instance",
                    instance_type=itype,
                    price_unit=unit_name,
                    period=period,
                )
                body = _call(client.describe_price, request, "DescribePrice", req)
                price = ((body or {}).get("PriceInfo") or {}).get("Price") or {}
                amount = price.get("TradePrice")
                if not isinstance(amount, (int, float)) or amount <= 0:
                    skipped.append(f"{region} {itype}: no {mode} price")
                    continue
                quotes.append(
                    Quote(
                        instance_type=itype,
                        region=region,
                        mode=mode,
                        amount=round(float(amount) / divide, 6),
                        unit=unit,  # type: ignore[arg-type]
                        currency=str(price.get("Currency") or "CNY"),
                        action="DescribePrice",
                    )
                )
            spot = _spot(client, models, region, itype, req)
            if spot is not None:
                quotes.append(
                    Quote(
                        instance_type=itype,
                        region=region,
                        mode="spot",
                        amount=spot[0],
                        unit="per_hour",
                        currency=spot[1],
                        action="DescribeSpotPriceHistory",
                    )
                )
        tick(progress, i + 1, len(regions), region)
    return FetchOutcome(
        quotes=tuple(quotes), regions_asked=regions, modes=MODES, skipped=tuple(skipped)
    )
