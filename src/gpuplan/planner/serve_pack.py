"""Pack services onto shared GPUs at the least monthly cost: an exact MILP, or first-fit.

Every service either runs on its cheapest dedicated placement (cost ``d_s``) or
goes into a *bin*: one copy ``k`` of a bin type ``t`` (a single-GPU offering
shared by time-slicing, MPS or MIG), which costs ``c_t`` when opened.

MILP (``scipy.optimize.milp``, HiGHS branch and bound)::

    minimise    sum_s d_s z_s + sum_{t,k} c_t y_tk
    subject to  z_s + sum_{t,k} x_stk = 1                      every service s
                sum_s a_str x_stk <= C_tr y_tk                 every bin (t, k), resource r
                y_t,k+1 <= y_tk                                symmetry: open copies in order
                x, y, z binary

``a_str`` is what service s uses of resource r in type t (compute share and
memory bytes for time-slicing/MPS; compute and memory slices for MIG). Copies
per type: as many as services that fit it. Beyond :data:`MILP_MAX_VARIABLES`
binaries, or without scipy, the first-fit-decreasing heuristic runs instead
(services by dedicated cost, each into the open bin or new bin that adds least).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuplan.planner.serve_candidates import BinType, Demand

MILP_MAX_VARIABLES = 20_000
"""Largest MILP solved exactly; bigger instances use the heuristic."""
MILP_TIME_LIMIT_S = 1.5
TIE_MARGIN = 1e-4
"""Opening a shared GPU costs this much more in the objective, so a service alone keeps its
dedicated placement when sharing would save nothing."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Bin:
    """One opened shared GPU and the services on it."""

    type: BinType
    services: tuple[str, ...]
    used: tuple[float, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Packing:
    """The packer's answer."""

    bins: tuple[Bin, ...]
    dedicated: tuple[str, ...]
    cost_per_month: float
    method: str
    optimal: bool


def pack(
    services: Sequence[str],
    dedicated_cost: dict[str, float],
    types: Sequence[BinType],
    demands: dict[tuple[str, int], Demand],
) -> Packing:
    """The cheapest assignment of services to dedicated placements or shared bins.

    Args:
        services: service names.
        dedicated_cost: cheapest dedicated monthly cost per service (inf if none).
        types: shareable bin types.
        demands: (service, index of type) -> what the service uses there.
    """
    copies = {t: sum(1 for s in services if (s, t) in demands) for t in range(len(types))}
    n_x = sum(copies[t] * copies[t] for t in copies)
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:  # pragma: no cover - scipy is in the serve extra
        return _first_fit(services, dedicated_cost, types, demands, "heuristic (scipy missing)")
    if n_x + len(services) > MILP_MAX_VARIABLES:
        return _first_fit(services, dedicated_cost, types, demands, "heuristic (first-fit)")
    return _milp(services, dedicated_cost, types, demands, copies)


def _milp(
    services: Sequence[str],
    dedicated_cost: dict[str, float],
    types: Sequence[BinType],
    demands: dict[tuple[str, int], Demand],
    copies: dict[int, int],
) -> Packing:
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    big = 1e12
    cols: list[tuple[str, object]] = []
    cost: list[float] = []
    for s in services:
        cols.append(("z", s))
        d = dedicated_cost.get(s, float("inf"))
        cost.append(d if d < float("inf") else big)
    y_index: dict[tuple[int, int], int] = {}
    x_index: dict[tuple[str, int, int], int] = {}
    for t, bt in enumerate(types):
        for k in range(copies[t]):
            y_index[(t, k)] = len(cols)
            cols.append(("y", (t, k)))
            cost.append(bt.price.per_month * (1 + TIE_MARGIN))
            for s in services:
                if (s, t) in demands:
                    x_index[(s, t, k)] = len(cols)
                    cols.append(("x", (s, t, k)))
                    cost.append(0.0)
    n = len(cols)
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []
    for i, s in enumerate(services):
        row = {i: 1.0}
        for (s2, _t, _k), j in x_index.items():
            if s2 == s:
                row[j] = 1.0
        rows.append(row)
        lo.append(1.0)
        hi.append(1.0)
    for (t, k), yj in y_index.items():
        for r, cap in enumerate(types[t].capacity):
            row = {yj: -cap}
            for s in services:
                col = x_index.get((s, t, k))
                if col is not None:
                    row[col] = demands[(s, t)].use[r]
            rows.append(row)
            lo.append(-np.inf)
            hi.append(0.0)
        if k + 1 < copies[t]:
            rows.append({y_index[(t, k + 1)]: 1.0, yj: -1.0})
            lo.append(-np.inf)
            hi.append(0.0)
    from scipy.sparse import coo_array

    ri = [i for i, row in enumerate(rows) for _ in row]
    ci = [j for row in rows for j in row]
    vals = [v for row in rows for v in row.values()]
    a = coo_array((vals, (ri, ci)), shape=(len(rows), n)).tocsr()
    res = milp(
        c=np.asarray(cost),
        constraints=LinearConstraint(a, np.asarray(lo), np.asarray(hi)),
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), np.ones(n)),
        options={"time_limit": MILP_TIME_LIMIT_S, "disp": False},
    )
    if res.x is None:
        return _first_fit(services, dedicated_cost, types, demands, "heuristic (MILP failed)")
    x = np.round(res.x).astype(int)
    bins = []
    for (t, k), yj in sorted(y_index.items()):
        if not x[yj]:
            continue
        members = tuple(s for s in services if (s, t, k) in x_index and x[x_index[(s, t, k)]])
        if not members:
            continue
        used = tuple(
            sum(demands[(s, t)].use[r] for s in members) for r in range(len(types[t].capacity))
        )
        bins.append(Bin(type=types[t], services=members, used=used))
    dedicated = tuple(s for i, s in enumerate(services) if x[i])
    total = sum(dedicated_cost[s] for s in dedicated) + sum(b.type.price.per_month for b in bins)
    return Packing(
        bins=tuple(bins),
        dedicated=dedicated,
        cost_per_month=total,
        method="MILP (scipy.optimize.milp, HiGHS)",
        optimal=bool(res.status == 0),
    )


def _first_fit(
    services: Sequence[str],
    dedicated_cost: dict[str, float],
    types: Sequence[BinType],
    demands: dict[tuple[str, int], Demand],
    method: str,
) -> Packing:
    open_bins: list[tuple[int, list[str], list[float]]] = []
    dedicated: list[str] = []
    order = sorted(services, key=lambda s: -min(dedicated_cost.get(s, 0.0), 1e12))
    for s in order:
        best: tuple[float, int | None, int] | None = None  # (added cost, open bin, type)
        for i, (t, _members, used) in enumerate(open_bins):
            d = demands.get((s, t))
            if d and all(
                u + a <= c for u, a, c in zip(used, d.use, types[t].capacity, strict=True)
            ):
                best = (0.0, i, t)
                break
        if best is None:
            for t, bt in enumerate(types):
                if (s, t) in demands and (best is None or bt.price.per_month < best[0]):
                    best = (bt.price.per_month, None, t)
        if best is None or best[0] >= dedicated_cost.get(s, float("inf")):
            dedicated.append(s)
            continue
        _, where, kind = best
        use = demands[(s, kind)].use
        if where is None:
            open_bins.append((kind, [s], list(use)))
        else:
            open_bins[where][1].append(s)
            open_bins[where][2][:] = [u + a for u, a in zip(open_bins[where][2], use, strict=True)]
    bins = tuple(Bin(type=types[t], services=tuple(m), used=tuple(u)) for t, m, u in open_bins)
    total = sum(dedicated_cost[s] for s in dedicated) + sum(b.type.price.per_month for b in bins)
    return Packing(
        bins=bins, dedicated=tuple(dedicated), cost_per_month=total, method=method, optimal=False
    )
