"""Data transfer (egress) and storage: what moving and keeping the data costs.

Rates come from the catalog only: internet egress is ``BillingRule.egress_usd_per_gb``
(``billing.yaml``, the first paid tier, USD per 10^9 bytes). The catalog has no
inter-region rates and no storage rates, so those are *unknown* unless the caller
passes a :class:`StorageRate` with its source; nothing is invented.

Rules (cloud_billing.md section 4):

- Transfer within one provider and one region is free (internal/VPC traffic;
  this assumes the data sits in the same zone as the GPUs).
- The sender pays egress; ingress is not charged.
- A provider whose rule says ``egress_usd_per_gb: 0.0`` states no egress fee.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuplan.catalog.schema import HOURS_PER_MONTH, BillingRule

SAME_REGION_SOURCE = "intra-region traffic free (cloud_billing.md section 4)"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Location:
    """Where data lives: a catalog provider id and one of its regions.

    Attributes:
        provider: provider id as in the catalog, e.g. ``aws``.
        region: region name, e.g. ``us-east-1``.
    """

    provider: str
    region: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.region}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DataPlan:
    """The data a job moves and stores. Sizes are GB (10^9 bytes).

    Attributes:
        dataset_gb: dataset copied to the GPUs' region.
        dataset_source: where the dataset lives; None = outside every catalog cloud
            (on-premises, a public hub): that is ingress, which providers do not charge.
        checkpoint_gb: checkpoints kept during the job (stored next to the GPUs).
        results_out_gb: outputs copied out of the GPUs' region after the job.
        results_destination: where the outputs go; None = the internet (charged at the
            GPU provider's internet egress rate).
    """

    dataset_gb: float
    dataset_source: Location | None
    checkpoint_gb: float
    results_out_gb: float
    results_destination: Location | None

    def __post_init__(self) -> None:
        for name in ("dataset_gb", "checkpoint_gb", "results_out_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StorageRate:
    """A storage price the caller vouches for (the catalog has none).

    Attributes:
        per_gb_month: price per GB (10^9 bytes) per 730-hour month.
        currency: ISO code of ``per_gb_month``.
        source: where the price comes from (shown in the breakdown).
    """

    per_gb_month: float
    currency: str
    source: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TransferCost:
    """Egress of one job, in USD (the catalog's egress currency).

    Attributes:
        egress_usd: total egress; None when any leg's rate is unknown.
        known_usd: sum of the legs whose rate is known.
        lines: one explanation per leg.
        unknown: one line per leg whose rate the catalog lacks.
        sources: sources of the rates used.
    """

    egress_usd: float | None
    known_usd: float
    lines: tuple[str, ...]
    unknown: tuple[str, ...]
    sources: tuple[str, ...]


def _leg(
    what: str,
    gb: float,
    src: Location | None,
    dst: Location | None,
    billing: Mapping[str, BillingRule],
) -> tuple[float | None, str, str | None]:
    """(usd or None, explanation, source) of moving ``gb`` from ``src`` to ``dst``."""
    if src is None:
        return (
            0.0,
            f"{what}: {gb:g} GB in from outside the catalog clouds: ingress, not charged",
            None,
        )
    if dst is not None and dst.provider == src.provider:
        if dst.region == src.region:
            return 0.0, f"{what}: {gb:g} GB within {src}: same region, free", SAME_REGION_SOURCE
        return (
            None,
            f"{what}: {gb:g} GB {src} -> {dst}: inter-region rate for {src.provider} "
            "is not in the catalog (unknown)",
            None,
        )
    rule = billing.get(src.provider)
    where = "the internet" if dst is None else str(dst)
    if rule is None or rule.egress_usd_per_gb is None:
        return (
            None,
            f"{what}: {gb:g} GB {src} -> {where}: no egress rate for {src.provider} "
            "in the catalog (billing.yaml) (unknown)",
            None,
        )
    rate = rule.egress_usd_per_gb
    source = f"{src.provider} egress: {' '.join(rule.source.split())} (as of {rule.as_of})"
    if rate == 0.0:
        return (
            0.0,
            f"{what}: {gb:g} GB {src} -> {where}: {src.provider} states no egress fee",
            source,
        )
    usd = gb * rate
    return (
        usd,
        f"{what}: {gb:g} GB {src} -> {where} x {rate:g} USD/GB = {usd:.2f} USD "
        f"({src.provider} first paid internet tier; free allowances not applied)",
        source,
    )


def transfer_cost(
    data: DataPlan, *, gpus_at: Location, billing: Mapping[str, BillingRule]
) -> TransferCost:
    """Egress for bringing the dataset to the GPUs and taking the results out.

    Args:
        data: sizes and endpoints.
        gpus_at: provider and region of the GPUs.
        billing: the catalog's billing rules by provider.

    >>> import datetime as dt
    >>> rules = {"aws": BillingRule(provider="aws", granularity_s=1, minimum_s=60,
    ...     egress_usd_per_gb=0.09, source="test", as_of=dt.date(2026, 1, 1))}
    >>> plan = DataPlan(dataset_gb=1000, dataset_source=Location(provider="aws",
    ...     region="us-east-1"), checkpoint_gb=0, results_out_gb=0, results_destination=None)
    >>> transfer_cost(plan, gpus_at=Location(provider="lambda", region="us-east-1"),
    ...               billing=rules).egress_usd
    90.0
    >>> transfer_cost(plan, gpus_at=Location(provider="aws", region="us-east-1"),
    ...               billing=rules).egress_usd
    0.0
    """
    legs = []
    if data.dataset_gb > 0:
        legs.append(_leg("dataset in", data.dataset_gb, data.dataset_source, gpus_at, billing))
    if data.results_out_gb > 0:
        legs.append(
            _leg("results out", data.results_out_gb, gpus_at, data.results_destination, billing)
        )
    known = sum(usd for usd, _, _ in legs if usd is not None)
    unknown = tuple(line for usd, line, _ in legs if usd is None)
    return TransferCost(
        egress_usd=None if unknown else known,
        known_usd=known,
        lines=tuple(line for _, line, _ in legs),
        unknown=unknown,
        sources=tuple(dict.fromkeys(src for _, _, src in legs if src is not None)),
    )


def stored_gb_months(data: DataPlan, wall_s: float) -> float:
    """GB-months of dataset + checkpoints kept next to the GPUs for ``wall_s`` seconds.

    Storage is billed pro rata per 730-hour month.

    >>> plan = DataPlan(dataset_gb=500, dataset_source=None, checkpoint_gb=230,
    ...                 results_out_gb=0, results_destination=None)
    >>> stored_gb_months(plan, 73 * 3600)
    73.0
    """
    return (data.dataset_gb + data.checkpoint_gb) * wall_s / (HOURS_PER_MONTH * 3600.0)
