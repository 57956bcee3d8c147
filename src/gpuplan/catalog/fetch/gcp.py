"""GCP: the Cloud Billing Catalog API, Compute Engine service (``6F81-5844-456A``).

``GET https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus``
(paged by ``nextPageToken``) lists every SKU with ``description``,
``category.usageType`` (``OnDemand``, ``Preemptible``, ``Commit1Yr``,
``Commit3Yr``), ``serviceRegions`` and
``pricingInfo[0].pricingExpression.tieredRates[].unitPrice`` (``units`` +
``nanos``, ``currencyCode``). GPU machines are priced by component (GPU, vCPU,
RAM per GiB); ``gcp_map.yaml`` says which SKUs make up each machine series.
Auth: an API key (``--api-key`` / ``GPUPLAN_GCP_API_KEY``), else Application
Default Credentials when ``google-auth`` is installed (extra ``fetch-gcp``);
the caller needs ``cloudbilling.services.list``-level read access (any
authenticated project with the Cloud Billing API enabled).
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections import defaultdict
from collections.abc import Sequence
from importlib import resources
from typing import Any

import yaml

from gpuplan.catalog.fetch.common import (
    FetchError,
    FetchOutcome,
    FetchRequest,
    Progress,
    Quote,
    choose_regions,
    http_get_json,
    missing_credentials,
    tick,
    with_retries,
)
from gpuplan.catalog.schema import Offering

DEFAULT_ENDPOINT = "https://cloudbilling.googleapis.com"
SERVICE = "services/6F81-5844-456A"
ACTION = "services.skus.list"
MAX_PAGES = 100
MODES_BY_USAGE = {
    "OnDemand": "on-demand",
    "Preemptible": "spot",
    "Commit1Yr": "reserved-1y",
    "Commit3Yr": "reserved-3y",
}
MODES = tuple(MODES_BY_USAGE.values())
REGIONS = (
    "africa-south1", "asia-east1", "asia-east2", "asia-northeast1", "asia-northeast2",
    "asia-northeast3", "asia-south1", "asia-south2", "asia-southeast1", "asia-southeast2",
    "australia-southeast1", "australia-southeast2", "europe-central2", "europe-north1",
    "europe-north2", "europe-southwest1", "europe-west1", "europe-west10", "europe-west12",
    "europe-west2", "europe-west3", "europe-west4", "europe-west6", "europe-west8",
    "europe-west9", "me-central1", "me-central2", "me-west1", "northamerica-northeast1",
    "northamerica-northeast2", "northamerica-south1", "southamerica-east1",
    "southamerica-west1", "us-central1", "us-east1", "us-east4", "us-east5", "us-south1",
    "us-west1", "us-west2", "us-west3", "us-west4",
)  # fmt: skip
"""Compute Engine regions (``gcloud compute regions list``)."""
CREDENTIALS_HINT = (
    "pass --api-key (or set GPUPLAN_GCP_API_KEY) with a key allowed to call the Cloud Billing "
    "API, or install google-auth (pip install 'gpuplan[fetch-gcp]') and run "
    "`gcloud auth application-default login`"
)
_PREFIX = re.compile(r"^(spot preemptible |preemptible |commitment v1: )", re.IGNORECASE)
_SUFFIX = re.compile(r" (running in .*|in .* for \d+ years?)$", re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _map() -> dict[str, Any]:
    text = resources.files("gpuplan.catalog.fetch").joinpath("gcp_map.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def component_name(description: str) -> str:
    """``Spot Preemptible A2 Instance Core running in Americas`` -> ``a2 instance core``."""
    name = _PREFIX.sub("", description.strip())
    return _SUFFIX.sub("", name).strip().lower()


def _names(items: Sequence[str]) -> set[str]:
    return {n.lower() for n in items}


def machine_parts(itype: str) -> dict[str, set[str]] | None:
    """The component names (gpu/core/ram) of an instance type, or None if unmapped."""
    data = _map()
    base, _, accel = itype.partition("+")
    for prefix, parts in data["series"].items():
        if base.startswith(prefix):
            gpu = parts.get("gpu")
            if gpu is None:
                gpu = data["gpus"].get(accel.split(":")[0], [])
            if not gpu:
                return None
            return {"gpu": _names(gpu), "core": _names(parts["core"]), "ram": _names(parts["ram"])}
    return None


def _unit_price(sku: dict[str, Any]) -> tuple[float, str] | None:
    try:
        expr = sku["pricingInfo"][0]["pricingExpression"]
        tiers = expr["tieredRates"]
    except (KeyError, IndexError, TypeError):
        return None
    tier = min(tiers, key=lambda t: float(t.get("startUsageAmount", 0)), default=None)
    if tier is None:
        return None
    price = tier.get("unitPrice", {})
    amount = float(price.get("units", 0) or 0) + float(price.get("nanos", 0) or 0) / 1e9
    return (amount, str(price.get("currencyCode", "USD"))) if amount > 0 else None


def _auth(req: FetchRequest) -> tuple[dict[str, str], dict[str, str]]:
    """(query params, headers) carrying the credential; never logged."""
    if req.api_key:
        return {"key": req.api_key}, {}
    try:
        import google.auth  # type: ignore[import-not-found, unused-ignore]
        import google.auth.transport.requests  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise missing_credentials("gcp", CREDENTIALS_HINT) from None
    try:
        creds, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-billing.readonly"]
        )
        creds.refresh(google.auth.transport.requests.Request())
    except Exception as exc:  # noqa: BLE001 - google.auth raises several unrelated types
        raise missing_credentials("gcp", CREDENTIALS_HINT) from exc
    return {}, {"Authorization": f"Bearer {creds.token}"}


def _list_skus(req: FetchRequest, progress: Progress | None) -> list[dict[str, Any]]:
    params, headers = _auth(req)
    base = (req.endpoint or DEFAULT_ENDPOINT).rstrip("/")
    skus: list[dict[str, Any]] = []
    token = ""
    for page_no in range(1, MAX_PAGES + 1):
        query = {**params, "pageSize": "5000"}
        if req.currency:
            query["currencyCode"] = req.currency
        if token:
            query["pageToken"] = token
        url = f"{base}/v1/{SERVICE}/skus?{urllib.parse.urlencode(query)}"
        page = with_retries(
            lambda u=url: http_get_json(u, headers=headers, timeout_s=req.timeout_s),  # type: ignore[misc]
            what="gcp Cloud Billing Catalog",
            req=req,
        )
        skus.extend(page.get("skus", []))
        tick(progress, page_no, 0, f"SKU page {page_no}")
        token = page.get("nextPageToken") or ""
        if not token:
            return skus
    raise FetchError(f"gcp Cloud Billing Catalog: more than {MAX_PAGES} pages of SKUs")


def fetch(
    req: FetchRequest, templates: Sequence[Offering], progress: Progress | None = None
) -> FetchOutcome:
    """Price each GPU machine as GPU + vCPU + RAM SKUs, per region and usage type."""
    regions = choose_regions(
        req, [r for o in templates for r in o.regions], REGIONS, kind="gcp region"
    )
    skipped = [
        f"{o.instance_type}: not in gcp_map.yaml"
        for o in templates
        if not machine_parts(o.instance_type)
    ]
    wanted = set(regions)
    # (component name, region, mode) -> (price, currency)
    rates: dict[tuple[str, str, str], tuple[float, str]] = {}
    for sku in _list_skus(req, progress):
        mode = MODES_BY_USAGE.get(str(sku.get("category", {}).get("usageType", "")))
        price = _unit_price(sku)
        if mode is None or price is None:
            continue
        name = component_name(str(sku.get("description", "")))
        for region in sku.get("serviceRegions", []):
            if region in wanted:
                rates.setdefault((name, region, mode), price)
    quotes: list[Quote] = []
    missing: dict[str, int] = defaultdict(int)
    for off in templates:
        parts = machine_parts(off.instance_type)
        if parts is None:
            continue
        for region in regions:
            for mode in MODES:
                got = _machine_price(off, parts, rates, region, mode)
                if got is None:
                    missing[off.instance_type] += 1
                    continue
                quotes.append(
                    Quote(
                        instance_type=off.instance_type,
                        region=region,
                        mode=mode,
                        amount=round(got[0], 6),
                        unit="per_hour",
                        currency=got[1],
                        action=ACTION,
                    )
                )
    skipped += [
        f"{itype}: {n} region/mode pairs lack a GPU, core or RAM SKU"
        for itype, n in sorted(missing.items())
    ]
    return FetchOutcome(
        quotes=tuple(quotes), regions_asked=regions, modes=MODES, skipped=tuple(skipped)
    )


def _machine_price(
    off: Offering,
    parts: dict[str, set[str]],
    rates: dict[tuple[str, str, str], tuple[float, str]],
    region: str,
    mode: str,
) -> tuple[float, str] | None:
    """GPUs x GPU rate + vCPUs x core rate + GiB x RAM rate; None if a component is missing."""
    amounts = {"gpu": off.gpu_count, "core": off.vcpus or 0.0, "ram": off.ram_gb or 0.0}
    total = 0.0
    currency = None
    for kind, names in parts.items():
        hit = next((rates[(n, region, mode)] for n in names if (n, region, mode) in rates), None)
        if hit is None:
            return None
        if currency not in (None, hit[1]):
            return None
        currency = hit[1]
        total += amounts[kind] * hit[0]
    return (total, currency) if currency and total > 0 else None
