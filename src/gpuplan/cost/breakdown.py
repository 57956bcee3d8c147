"""The result of costing one option: every part, its basis, and what is unknown."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuplan.cost.money import FxUse


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CostBreakdown:
    """What one job costs on one offering in one billing mode, and why.

    Money is in ``currency``; durations in seconds. A part that is ``None`` is
    *unknown* (the catalog lacks its rate); ``unknown`` says why, and ``total``
    then is the sum of the known parts: a lower bound.

    Attributes:
        mode: billing mode of the price (on-demand, spot, monthly, ...).
        commitment: for monthly/reserved modes, ``whole-terms`` or ``job-share``; else None.
        currency: ISO code of every amount.
        nodes: instances billed.
        price_per_hour: hourly equivalent of the price per instance, in ``currency``.
        run_s: useful run time.
        startup_s: provisioning + image pull + cold start, billed.
        spot_overhead_s: expected extra wall time from spot interruptions.
        billed_s: billed duration per instance (after rounding, minimum, whole terms/blocks).
        compute: run time x price x nodes.
        startup: startup time x price x nodes.
        spot_overhead: spot overhead time x price x nodes.
        rounding: billing increment and minimum charge; None when the increment is unknown.
        commitment_unused: paid commitment (whole terms) the job does not use.
        on_demand_remainder: when a job longer than one term runs its last part on demand
            (cheaper than one more term), what that part costs above the commitment's rate.
        storage: dataset + checkpoint storage; None when no rate is known.
        egress: data transfer out; None when a rate is unknown.
        total: sum of the known parts.
        unknown: one line per part whose rate is unknown.
        fx: currency conversions used, with their dates.
        sources: where the rates used come from.
        assumptions: every assumption with its numbers, one line each.
    """

    mode: str
    commitment: str | None
    currency: str
    nodes: int
    price_per_hour: float
    run_s: float
    startup_s: float
    spot_overhead_s: float
    billed_s: float
    compute: float
    startup: float
    spot_overhead: float
    rounding: float | None
    commitment_unused: float
    storage: float | None
    egress: float | None
    total: float
    unknown: tuple[str, ...]
    fx: tuple[FxUse, ...]
    sources: tuple[str, ...]
    assumptions: tuple[str, ...]
    on_demand_remainder: float = 0.0

    @property
    def complete(self) -> bool:
        """True when every part is known, so ``total`` is the full cost."""
        return not self.unknown

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; unknown parts are the string ``"unknown"``."""

        def amount(value: float | None) -> float | str:
            return "unknown" if value is None else round(value, 6)

        return {
            "mode": self.mode,
            "commitment": self.commitment,
            "currency": self.currency,
            "nodes": self.nodes,
            "price_per_hour": round(self.price_per_hour, 6),
            "run_s": self.run_s,
            "startup_s": self.startup_s,
            "spot_overhead_s": round(self.spot_overhead_s, 3),
            "billed_s": self.billed_s,
            "compute": amount(self.compute),
            "startup": amount(self.startup),
            "spot_overhead": amount(self.spot_overhead),
            "rounding": amount(self.rounding),
            "commitment_unused": amount(self.commitment_unused),
            "on_demand_remainder": amount(self.on_demand_remainder),
            "storage": amount(self.storage),
            "egress": amount(self.egress),
            "total": round(self.total, 6),
            "total_is_lower_bound": not self.complete,
            "unknown": list(self.unknown),
            "fx": [
                {
                    "from": f.from_currency,
                    "to": f.to_currency,
                    "rate": f.rate,
                    "as_of": f.as_of.isoformat(),
                    "source": f.source,
                }
                for f in self.fx
            ],
            "sources": list(self.sources),
            "assumptions": list(self.assumptions),
        }
