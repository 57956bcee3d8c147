"""Azure: the public Retail Prices API (no credentials).

``GET https://prices.azure.com/api/retail/prices?$filter=...`` returns
``{"Items": [...], "NextPageLink": ...}``; each item has ``armSkuName``,
``armRegionName``, ``retailPrice`` (per ``unitOfMeasure``), ``currencyCode``,
``type`` (``Consumption``, ``Reservation``, ``DevTestConsumption``),
``reservationTerm`` (``1 Year``/``3 Years``; the price is for the whole term),
``skuName`` (``... Spot``, ``... Low Priority``) and ``productName`` (``... Windows``).
One query per region (every asked instance type OR-ed), following ``NextPageLink``.
See https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from gpuplan.catalog.fetch.common import (
    FetchError,
    FetchOutcome,
    FetchRequest,
    Progress,
    Quote,
    choose_regions,
    http_get_json,
    tick,
    with_retries,
)
from gpuplan.catalog.schema import Offering

DEFAULT_ENDPOINT = "https://prices.azure.com"
ACTION = "RetailPrices"
MAX_PAGES = 200
MODES = ("on-demand", "spot", "reserved-1y", "reserved-3y")
REGIONS = (
    "australiacentral", "australiacentral2", "australiaeast", "australiasoutheast",
    "austriaeast", "belgiumcentral", "brazilsouth", "brazilsoutheast", "canadacentral",
    "canadaeast", "centralindia", "centralus", "chilecentral", "eastasia", "eastus", "eastus2",
    "francecentral", "francesouth", "germanynorth", "germanywestcentral", "indonesiacentral",
    "israelcentral", "italynorth", "japaneast", "japanwest", "jioindiacentral", "jioindiawest",
    "koreacentral", "koreasouth", "malaysiawest", "mexicocentral", "newzealandnorth",
    "northcentralus", "northeurope", "norwayeast", "norwaywest", "polandcentral",
    "qatarcentral", "southafricanorth", "southafricawest", "southcentralus", "southeastasia",
    "southindia", "spaincentral", "swedencentral", "swedensouth", "switzerlandnorth",
    "switzerlandwest", "uaecentral", "uaenorth", "uksouth", "ukwest", "westcentralus",
    "westeurope", "westindia", "westus", "westus2", "westus3",
)  # fmt: skip
"""Azure public-cloud region names (armRegionName), from ``az account list-locations``."""


def _filter(region: str, skus: Sequence[str]) -> str:
    either = " or ".join(f"armSkuName eq '{s}'" for s in skus)
    return f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and ({either})"


def _mode(item: dict[str, object]) -> tuple[str, float, str] | None:
    """(mode, amount, unit) of one price item, or None for prices we do not keep."""
    sku = str(item.get("skuName", ""))
    product = str(item.get("productName", ""))
    kind = item.get("type")
    price = item.get("retailPrice", item.get("unitPrice"))
    if not isinstance(price, (int, float)) or price <= 0 or "Windows" in product:
        return None
    if "Low Priority" in sku:
        return None
    if kind == "Consumption" and str(item.get("unitOfMeasure")) == "1 Hour":
        return ("spot" if "Spot" in sku else "on-demand", float(price), "per_hour")
    if kind == "Reservation" and "Spot" not in sku:
        term = str(item.get("reservationTerm", ""))
        if term == "1 Year":
            return ("reserved-1y", float(price), "per_year")
        if term == "3 Years":
            return ("reserved-3y", float(price) / 3, "per_year")
    return None


def fetch(
    req: FetchRequest, templates: Sequence[Offering], progress: Progress | None = None
) -> FetchOutcome:
    """Ask the Retail Prices API for every template's prices in each region."""
    regions = choose_regions(
        req, [r for o in templates for r in o.regions], REGIONS, kind="azure region"
    )
    wanted = {o.instance_type.lower(): o.instance_type for o in templates}
    base = (req.endpoint or DEFAULT_ENDPOINT).rstrip("/")
    # (type, region, mode) -> (effectiveStartDate, quote): the latest meter wins
    best: dict[tuple[str, str, str], tuple[str, Quote]] = {}
    for i, region in enumerate(regions):
        query = {"$filter": _filter(region, sorted(wanted.values()))}
        if req.currency:
            query["currencyCode"] = req.currency
        url: str | None = f"{base}/api/retail/prices?{urllib.parse.urlencode(query)}"
        pages = 0
        while url:
            pages += 1
            if pages > MAX_PAGES:
                raise FetchError(f"azure {region}: more than {MAX_PAGES} pages of prices")
            page_url = url
            page = with_retries(
                lambda u=page_url: http_get_json(u, timeout_s=req.timeout_s),  # type: ignore[misc]
                what=f"azure Retail Prices API ({region})",
                req=req,
            )
            for item in page.get("Items", []):
                itype = wanted.get(str(item.get("armSkuName", "")).lower())
                got = _mode(item)
                if itype is None or got is None or item.get("armRegionName") != region:
                    continue
                mode, amount, unit = got
                start = str(item.get("effectiveStartDate", ""))
                key = (itype, region, mode)
                if key in best and best[key][0] >= start:
                    continue
                best[key] = (
                    start,
                    Quote(
                        instance_type=itype,
                        region=region,
                        mode=mode,
                        amount=amount,
                        unit=unit,  # type: ignore[arg-type]
                        currency=str(item.get("currencyCode", "USD")),
                        action=ACTION,
                    ),
                )
            nxt = page.get("NextPageLink")
            url = _rebase(str(nxt), base) if nxt else None
        tick(progress, i + 1, len(regions), region)
    quotes = [q for _, q in best.values()]
    return FetchOutcome(quotes=tuple(quotes), regions_asked=regions, modes=MODES)


def _rebase(link: str, base: str) -> str:
    """A NextPageLink pointed at ``base`` (the API returns absolute public links)."""
    parts = urllib.parse.urlsplit(link)
    return f"{base}{parts.path}" + (f"?{parts.query}" if parts.query else "")
