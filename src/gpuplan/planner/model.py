"""The planner's immutable results: options, rejections and the plan."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuplan.cost import CostBreakdown
from gpuplan.estimate.configure import Configuration
from gpuplan.estimate.margin import DEFAULT_SAFETY_MARGIN

DEFAULT_MAX_GPUS = 64
"""GPUs per option when neither the spec nor the caller sets a limit."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """Planner inputs besides the spec and catalog (each one shown as an assumption)."""

    objective: str = "cost"
    """cost (cheapest meeting the deadline), time (fastest within the budget) or pareto."""
    top: int = 10
    max_gpus: int | None = None
    """Most GPUs per option: when set it overrides the spec's ``constraints.max_gpus``; when
    None the spec's value stands, else :data:`DEFAULT_MAX_GPUS`."""
    spot_interruptions_per_hour: float = 0.05
    checkpoint_interval_s: float = 1800.0
    restart_s: float = 600.0
    provisioning_s: float = 300.0
    image_pull_s: float = 180.0
    cold_start_s: float = 120.0
    commitment: str = "whole-terms"
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    risk: str = "medium"
    """How the memory verdict ranks options: ``low`` keeps only ``fits`` (the 80% upper bound
    fits), ``medium`` also keeps ``tight`` ones (only the estimate fits) but ranks them after
    sure ones at equal cost, ``high`` ranks by the point estimate alone."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One rentable way to run the job, with its time, cost and reasons."""

    provider: str
    instance_type: str
    region: str
    """The region whose price the option is costed at (the cheapest allowed one)."""
    regions: tuple[str, ...]
    """Every region of the offering."""
    billing_mode: str
    nodes: int
    gpus: int
    gpu: str
    configuration: Configuration
    cost: CostBreakdown
    time_s: float
    tokens: float | None
    price_as_of: str
    price_source: str
    price_regions: tuple[str, ...] = ()
    """Allowed regions charging the same price as ``region`` (``region`` first)."""
    priced_regions: int = 1
    """Allowed regions with a price in this billing mode (the one used included)."""
    price_amount: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The price as published: ``amount``, ``unit`` (per_hour/per_month/per_year), ``currency``."""
    why: str = ""
    warnings: tuple[str, ...] = ()

    def region_label(self) -> str:
        """``cn-beijing``, or ``cn-beijing +5`` when five more regions charge the same."""
        extra = len(self.price_regions) - 1
        return self.region + (f" +{extra}" if extra > 0 else "")

    @property
    def cost_total(self) -> float:
        """Total cost in the plan's currency (a lower bound when parts are unknown)."""
        return self.cost.total

    @property
    def cost_per_million_tokens(self) -> float | None:
        """Cost per 1M training tokens, for text models with a known token count."""
        return self.cost.total / self.tokens * 1e6 if self.tokens else None

    def label(self) -> str:
        """Short name, e.g. ``aws p5.48xlarge x2 (16 H100-SXM, spot)``."""
        return f"{self.provider} {self.instance_type} x{self.nodes} ({self.gpus} {self.gpu}, {self.billing_mode})"

    def as_dict(self) -> dict[str, Any]:
        """The contract shape of one option in ``plan --json``."""
        conf = self.configuration
        t = conf.time
        return {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "region": self.region,
            "billing_mode": self.billing_mode,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "strategy": conf.strategy.as_contract(),
            "time_s": self.time_s,
            "cost_total": round(self.cost.total, 4),
            "cost_breakdown": self.cost.as_dict(),
            "currency": self.cost.currency,
            "why": self.why,
            "gpu": self.gpu,
            "regions": list(self.regions),
            "cost_per_1m_tokens": self.cost_per_million_tokens,
            "tokens_per_s": t.tokens_per_s,
            "samples_per_s": t.samples_per_s,
            "step_time_s": t.step_time_s,
            "mfu": t.mfu,
            "headroom_bytes": round(conf.fit.memory.headroom_bytes),
            "verdict": conf.fit.verdict,
            "device_used_bounds_bytes": [round(v) for v in conf.fit.bounds()["device_used_bytes"]],
            "device_used_bytes": round(conf.fit.memory.device_used_bytes),
            "capacity_bytes": round(conf.fit.memory.capacity_bytes),
            "memory_breakdown": {k: round(v) for k, v in conf.fit.memory.breakdown.items()},
            "warnings": list(self.warnings),
            "price_as_of": self.price_as_of,
            "price_source": self.price_source,
            "price_regions": list(self.price_regions or (self.region,)),
            "other_regions_priced": self.priced_regions - len(self.price_regions or (self.region,)),
            "price": self.price_amount,
            "topology": {
                "gpus_per_node": conf.topology.gpus_per_node,
                "intra_node": conf.topology.intra_node,
                "inter_node_gbps": conf.topology.inter_node_gbps,
                "fabric": conf.topology.fabric,
                "hosting": conf.topology.hosting,
            },
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """An option that was dropped, and why."""

    provider: str
    instance_type: str
    reason: str
    gpu: str = ""
    nodes: int = 0
    billing_mode: str = ""
    time_s: float | None = None
    cost_total: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The contract shape of one rejection."""
        out: dict[str, Any] = {
            "provider": self.provider,
            "instance_type": self.instance_type,
            "reason": self.reason,
            "gpu": self.gpu,
            "nodes": self.nodes,
            "billing_mode": self.billing_mode,
        }
        if self.time_s is not None:
            out["time_s"] = self.time_s
        if self.cost_total is not None:
            out["cost_total"] = round(self.cost_total, 4)
        return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Ranked options (best first), the Pareto front, rejections and provenance."""

    options: tuple[Option, ...]
    pareto: tuple[Option, ...]
    rejected: tuple[Rejection, ...]
    currency: str
    objective: str
    provenance: dict[str, Any]
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    considered: int


_REASON_CLASSES: tuple[tuple[str, str], ...] = (
    ("misses the deadline", "misses the deadline"),
    ("over budget", "over budget"),
    ("does not fit", "does not fit in GPU memory"),
    ("network bandwidth", "multi-node network bandwidth unknown"),
    ("--inter-node-gbps", "multi-node network bandwidth unknown"),
    ("no price", "no price (in the allowed billing modes)"),
    ("not in constraints.providers", "provider not allowed"),
    ("constraints.regions", "region not allowed"),
    ("lacks compliance", "lacks required compliance"),
    ("bare metal", "not bare metal"),
    ("global_batch_size", "batch size does not divide the GPUs"),
    ("precision:", "precision not supported by the GPU"),
)


def reason_class(reason: str) -> str:
    """Group a rejection reason into a short class, e.g. ``misses the deadline``.

    >>> reason_class("misses the deadline: 53.8 h > 24.0 h")
    'misses the deadline'
    >>> reason_class("precision: bf16-mixed needs bf16, which T4 does not support")
    'precision not supported by the GPU'
    >>> reason_class("something else: details")
    'something else'
    """
    for needle, name in _REASON_CLASSES:
        if needle in reason:
            return name
    head = reason.split(":")[0].strip()
    return head if len(head) <= 60 else head[:59] + "\u2026"
