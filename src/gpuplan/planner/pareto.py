"""The cost/time Pareto front."""

from __future__ import annotations

from collections.abc import Sequence

from gpuplan.planner.model import Option


def pareto_front(options: Sequence[Option]) -> list[Option]:
    """Options no other option beats on both time and cost (ties keep the first seen).

    An option is dominated when another is no slower and no more expensive, and
    strictly better on at least one.
    """
    ordered = sorted(
        options,
        key=lambda o: (
            o.time_s,
            o.cost_total,
            o.provider,
            o.instance_type,
            o.billing_mode,
            o.nodes,
        ),
    )
    front: list[Option] = []
    best_cost = float("inf")
    for o in ordered:
        if o.cost_total < best_cost:
            front.append(o)
            best_cost = o.cost_total
    return front
