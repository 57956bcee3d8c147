"""AWS: the Price List Query API and EC2 spot price history, through boto3 (extra ``aws``).

* ``pricing.get_products`` (``AWSPriceListService.GetProducts``, served from
  us-east-1) per region and instance type, Linux, shared tenancy, no
  pre-installed software: ``terms.OnDemand`` gives on-demand; ``terms.Reserved``
  (standard, 1yr/3yr) gives ``reserved-1y``/``reserved-3y`` as the No Upfront
  hourly rate, or the All Upfront fee spread over the term's years.
* ``ec2.describe_spot_price_history`` per region (``Linux/UNIX``, start = now):
  the lowest current zone price of the region is its spot price.

Credentials: boto3's standard chain (environment, ``~/.aws``, SSO, instance
role). IAM: ``pricing:GetProducts``, ``ec2:DescribeSpotPriceHistory``.
"""

from __future__ import annotations

import json
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

MODES = ("on-demand", "spot", "reserved-1y", "reserved-3y")
PRICING_REGION = "us-east-1"
THROTTLE_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}
)
REGIONS = (
    "af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
    "ap-south-1", "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3",
    "ap-southeast-4", "ap-southeast-5", "ap-southeast-7", "ca-central-1", "ca-west-1",
    "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1",
    "eu-west-2", "eu-west-3", "il-central-1", "me-central-1", "me-south-1", "mx-central-1",
    "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2", "us-gov-east-1",
    "us-gov-west-1",
)  # fmt: skip
"""AWS commercial and GovCloud regions (``aws ec2 describe-regions``)."""
CREDENTIALS_HINT = (
    "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws configure`; "
    "the identity needs pricing:GetProducts and ec2:DescribeSpotPriceHistory"
)


def _clients(req: FetchRequest) -> tuple[Any, Any]:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise FetchError("aws: boto3 is not installed", hint="pip install 'gpuplan[aws]'") from None
    session = boto3.Session()
    if session.get_credentials() is None:
        raise missing_credentials("aws", CREDENTIALS_HINT)
    config = Config(
        connect_timeout=req.timeout_s,
        read_timeout=req.timeout_s,
        retries={"total_max_attempts": 1},  # gpuplan retries throttling itself, bounded
    )
    return session, config


def _call(fn: Any, what: str, req: FetchRequest, **kwargs: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    def once() -> Any:
        try:
            return fn(**kwargs)
        except NoCredentialsError:
            raise missing_credentials("aws", CREDENTIALS_HINT) from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in THROTTLE_CODES:
                raise Throttled() from exc
            message = exc.response.get("Error", {}).get("Message", "")
            raise FetchError(
                f"aws {what}: {code}: {' '.join(str(message).split())}",
                hint="the identity needs pricing:GetProducts and ec2:DescribeSpotPriceHistory"
                if "Denied" in code or "Unauthorized" in code
                else None,
            ) from exc
        except BotoCoreError as exc:
            raise FetchError(f"aws {what}: {exc}") from exc

    return with_retries(once, what=f"aws {what}", req=req)


def _usd(dimension: dict[str, Any]) -> float | None:
    try:
        value = float(dimension.get("pricePerUnit", {}).get("USD", "0"))
    except ValueError:
        return None
    return value if value > 0 else None


def parse_product(text: str) -> list[tuple[str, float, str]]:
    """(mode, amount, unit) from one Price List product (aws_v1 JSON string)."""
    product = json.loads(text)
    attrs = product.get("product", {}).get("attributes", {})
    if attrs.get("marketoption", "OnDemand") != "OnDemand":
        return []
    if attrs.get("licenseModel", "No License required") != "No License required":
        return []
    out: list[tuple[str, float, str]] = []
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = _usd(dim)
            if usd is not None and dim.get("unit") == "Hrs":
                out.append(("on-demand", usd, "per_hour"))
    reserved: dict[tuple[str, str], dict[str, float]] = {}
    for term in product.get("terms", {}).get("Reserved", {}).values():
        ta = term.get("termAttributes", {})
        if ta.get("OfferingClass") != "standard":
            continue
        years = {"1yr": "reserved-1y", "3yr": "reserved-3y"}.get(ta.get("LeaseContractLength", ""))
        if years is None:
            continue
        for dim in term.get("priceDimensions", {}).values():
            usd = _usd(dim)
            if usd is not None:
                reserved.setdefault((years, ta.get("PurchaseOption", "")), {})[dim.get("unit")] = (
                    usd
                )
    for mode in ("reserved-1y", "reserved-3y"):
        no_upfront = reserved.get((mode, "No Upfront"), {}).get("Hrs")
        all_upfront = reserved.get((mode, "All Upfront"), {}).get("Quantity")
        if no_upfront is not None:
            out.append((mode, no_upfront, "per_hour"))
        elif all_upfront is not None:
            out.append((mode, all_upfront / (3 if mode == "reserved-3y" else 1), "per_year"))
    return out


def _filters(region: str, instance_type: str) -> list[dict[str, str]]:
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def fetch(
    req: FetchRequest, templates: Sequence[Offering], progress: Progress | None = None
) -> FetchOutcome:
    """On-demand and Reserved Instance prices per region and type, then spot per region."""
    regions = choose_regions(
        req, [r for o in templates for r in o.regions], REGIONS, kind="aws region"
    )
    session, config = _clients(req)
    pricing = session.client(
        "pricing", region_name=PRICING_REGION, endpoint_url=req.endpoint, config=config
    )
    types = sorted({o.instance_type for o in templates})
    quotes: list[Quote] = []
    total = len(regions) * (len(types) + 1)
    done = 0
    for region in regions:
        for itype in types:
            token: str | None = None
            seen: set[str] = set()
            while True:
                kwargs: dict[str, Any] = {
                    "ServiceCode": "AmazonEC2",
                    "Filters": _filters(region, itype),
                    "FormatVersion": "aws_v1",
                    "MaxResults": 100,
                }
                if token:
                    kwargs["NextToken"] = token
                page = _call(pricing.get_products, "pricing GetProducts", req, **kwargs)
                for text in page.get("PriceList", []):
                    for mode, amount, unit in parse_product(text):
                        if mode in seen:
                            continue
                        seen.add(mode)
                        quotes.append(
                            Quote(
                                instance_type=itype,
                                region=region,
                                mode=mode,
                                amount=amount,
                                unit=unit,  # type: ignore[arg-type]
                                currency="USD",
                                action="GetProducts",
                            )
                        )
                token = page.get("NextToken")
                if not token:
                    break
            done += 1
            tick(progress, done, total, f"{region} {itype}")
        quotes.extend(_spot(session, config, req, region, types))
        done += 1
        tick(progress, done, total, f"{region} spot")
    return FetchOutcome(quotes=tuple(quotes), regions_asked=regions, modes=MODES)


def _spot(
    session: Any, config: Any, req: FetchRequest, region: str, types: Sequence[str]
) -> list[Quote]:
    ec2 = session.client("ec2", region_name=region, endpoint_url=req.endpoint, config=config)
    lowest: dict[str, float] = {}
    token = ""
    while True:
        kwargs: dict[str, Any] = {
            "InstanceTypes": list(types),
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": req.now,
            "MaxResults": 1000,
        }
        if token:
            kwargs["NextToken"] = token
        page = _call(ec2.describe_spot_price_history, "ec2 DescribeSpotPriceHistory", req, **kwargs)
        for item in page.get("SpotPriceHistory", []):
            try:
                price = float(item["SpotPrice"])
            except (KeyError, ValueError):
                continue
            itype = item.get("InstanceType", "")
            if price > 0 and (itype not in lowest or price < lowest[itype]):
                lowest[itype] = price
        token = page.get("NextToken") or ""
        if not token:
            break
    return [
        Quote(
            instance_type=itype,
            region=region,
            mode="spot",
            amount=price,
            unit="per_hour",
            currency="USD",
            action="DescribeSpotPriceHistory",
        )
        for itype, price in sorted(lowest.items())
    ]
