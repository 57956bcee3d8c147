"""Live price refresh: ``gpuplan catalog fetch PROVIDER`` (issue 12, item 3).

One module per provider, each asking that provider's own price API through its
official client (an optional extra), plus :mod:`.common` (request, retries,
HTTP, errors) and :mod:`.writer` (the overrides file). The registry below is
explicit: no provider is found by import name.

=========  ===================================================  ==================
provider   API (actions)                                        client (extra)
=========  ===================================================  ==================
alibaba    ECS DescribeAvailableResource, DescribePrice,         alibabacloud-ecs20140526
           DescribeSpotPriceHistory                              (``fetch-alibaba``)
tencent    CVM DescribeZoneInstanceConfigInfos,                  tencentcloud-sdk-python-cvm
           InquiryPriceRunInstances                              (``fetch-tencent``)
aws        Price List GetProducts, EC2 DescribeSpotPriceHistory  boto3 (``aws``)
azure      Retail Prices API (public, no credentials)            none (stdlib)
gcp        Cloud Billing Catalog services.skus.list              none (stdlib; API key)
=========  ===================================================  ==================
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuplan.catalog.fetch.common import (
    FetchError,
    FetchOutcome,
    FetchRequest,
    Progress,
)
from gpuplan.catalog.schema import CatalogFile, Offering
from gpuplan.errors import UnknownNameError

__all__ = ["PROVIDERS", "FetchError", "FetchRequest", "FetchResult", "fetch_overrides"]

PROVIDERS: Mapping[str, str] = {
    "alibaba": "Alibaba Cloud ECS: DescribePrice (pay-as-you-go, 1-month, 1-/3-year "
    "subscription), DescribeSpotPriceHistory, DescribeAvailableResource",
    "tencent": "Tencent Cloud CVM: InquiryPriceRunInstances (postpaid, prepaid 1 month, "
    "1/3 years), DescribeZoneInstanceConfigInfos",
    "aws": "AWS: pricing GetProducts (on-demand, 1-/3-year Reserved Instances), "
    "ec2 DescribeSpotPriceHistory",
    "azure": "Azure Retail Prices API (pay-as-you-go, spot, 1-/3-year reservations); "
    "no credentials",
    "gcp": "GCP Cloud Billing Catalog API, Compute Engine SKUs (on-demand, spot, 1-/3-year "
    "committed use)",
}
"""Every provider ``catalog fetch`` knows, with what it asks."""

Fetcher = Callable[[FetchRequest, Sequence[Offering], "Progress | None"], FetchOutcome]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    """The overrides to write and what the fetch did."""

    catalog: CatalogFile
    outcome: FetchOutcome


def _fetcher(provider: str) -> Fetcher:
    module = importlib.import_module(f"gpuplan.catalog.fetch.{provider}")
    fetch: Fetcher = module.fetch
    return fetch


def fetch_overrides(
    provider: str,
    req: FetchRequest,
    *,
    catalog_files: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> FetchResult:
    """Fetch ``provider``'s live prices for the catalog's offerings and build an overrides file.

    Args:
        provider: one of :data:`PROVIDERS`.
        req: regions, GPUs, endpoint, timeout, retries.
        catalog_files: extra overrides files (``--catalog``) whose rows are templates too.
        env: environment for ``GPUPLAN_HOME``.
        progress: called as requests complete.
    """
    from gpuplan.catalog.fetch.writer import build_overrides, template_offerings
    from gpuplan.catalog.loader import load_catalog

    provider = provider.strip().lower()
    if provider not in PROVIDERS:
        raise UnknownNameError("provider to fetch", provider, PROVIDERS, field="PROVIDER")
    cat = load_catalog(catalog_files[-1] if catalog_files else None, env=env)
    gpus = tuple(dict.fromkeys(cat.gpu(g, field="--gpu").id for g in req.gpus))
    templates = [
        o for o in template_offerings(provider, catalog_files, env=env) if not gpus or o.gpu in gpus
    ]
    if not templates:
        raise FetchError(
            f"{provider}: the catalog has no offering of {', '.join(gpus) or 'any GPU'} to price",
            hint=f"see `gpuplan catalog offerings --provider {provider}`; add the instance type "
            "to your overrides file first",
        )
    req = dataclasses.replace(req, gpus=gpus)
    outcome = _fetcher(provider)(req, templates, progress)
    if not outcome.quotes:
        raise FetchError(
            f"{provider}: {', '.join(outcome.regions_asked)} sold none of the "
            f"{len(templates)} instance types asked",
            hint="try another --region, or leave out --gpu",
        )
    priced = {q.region for q in outcome.quotes}
    empty = [r for r in outcome.regions_asked if r not in priced] if req.regions else []
    if empty:
        raise FetchError(
            f"{provider}: region {empty[0]} sells none of the {len(templates)} instance types "
            f"asked ({', '.join(sorted({o.gpu for o in templates}))})",
            hint="leave that --region out, or ask another GPU with --gpu",
        )
    return FetchResult(
        catalog=build_overrides(provider, templates, outcome, now=req.now), outcome=outcome
    )
