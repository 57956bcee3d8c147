"""Pack services onto shared GPUs at the least monthly cost: an exact MILP, or first-fit.

Every service either runs on its cheapest dedicated placement (cost ``d_s``) or
shares one GPU with others: a *bin* of some type ``t`` (a single-GPU offering
shared by time-slicing, MPS or MIG, price ``c_t``) holding a set ``U`` of services
whose uses fit its capacities (compute share and memory bytes for
time-slicing/MPS; compute and memory slices for MIG).

Exact set-partitioning MILP (``scipy.optimize.milp``, HiGHS): the columns are
every set ``U`` that fits some bin type, at the price ``c_U`` of the cheapest
such type (sets are enumerated upwards from single services, so only fitting
sets are ever built)::

    minimise    sum_s d_s z_s + sum_U c_U w_U
    subject to  z_s + sum_{U containing s} w_U = 1        every service s
                z, w binary

Any packing is a partition of the services into bins and dedicated ones, so
this is exact. Beyond :data:`MILP_MAX_SETS` fitting sets (many services that all
fit together), or without scipy, the first-fit-decreasing heuristic runs instead
(services by dedicated cost, each into the open bin or new bin that adds least).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuplan.planner.serve_candidates import BinType, Demand

MILP_MAX_SETS = 50_000
"""Largest number of fitting service sets solved exactly; more use the heuristic."""
MILP_TIME_LIMIT_S = 2.0
TIE_MARGIN = 1e-4
"""Opening a shared GPU costs this much more in the objective, so a service alone keeps its
dedicated placement when sharing would save nothing."""
MODE_PREFERENCE = ("mig", "mps", "time-slicing")
"""At equal cost: MIG (isolated), then MPS (less interference), then time-slicing."""


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


def _objective_price(bt: BinType) -> float:
    rank = MODE_PREFERENCE.index(bt.mode) if bt.mode in MODE_PREFERENCE else 3
    return bt.price.per_month * (1 + TIE_MARGIN * (1 + rank))


def fitting_sets(
    services: Sequence[str],
    types: Sequence[BinType],
    demands: dict[tuple[str, int], Demand],
    limit: int = MILP_MAX_SETS,
) -> dict[frozenset[str], int] | None:
    """Every set of services that fits one bin, with its cheapest bin type (None past ``limit``)."""
    best: dict[frozenset[str], int] = {}
    order = {s: i for i, s in enumerate(services)}
    for t, bt in enumerate(types):
        members = [s for s in services if (s, t) in demands]
        frontier: list[tuple[tuple[str, ...], tuple[float, ...]]] = [
            ((s,), demands[(s, t)].use) for s in members
        ]
        while frontier:
            grown: list[tuple[tuple[str, ...], tuple[float, ...]]] = []
            for group, used in frontier:
                key = frozenset(group)
                old = best.get(key)
                if old is None or _objective_price(bt) < _objective_price(types[old]):
                    best[key] = t
                if len(best) > limit:
                    return None
                for s in members:
                    if order[s] <= order[group[-1]]:
                        continue
                    use = demands[(s, t)].use
                    total = tuple(u + a for u, a in zip(used, use, strict=True))
                    if all(u <= c + 1e-9 for u, c in zip(total, bt.capacity, strict=True)):
                        grown.append(((*group, s), total))
            frontier = grown
    return best


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
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:  # pragma: no cover - scipy is in the serve extra
        return _first_fit(services, dedicated_cost, types, demands, "heuristic (scipy missing)")
    sets = fitting_sets(services, types, demands)
    if sets is None:
        return _first_fit(
            services,
            dedicated_cost,
            types,
            demands,
            f"first-fit heuristic (more than {MILP_MAX_SETS:,} fitting service sets)",
        )
    return _milp(services, dedicated_cost, types, demands, sets)


def _milp(
    services: Sequence[str],
    dedicated_cost: dict[str, float],
    types: Sequence[BinType],
    demands: dict[tuple[str, int], Demand],
    sets: dict[frozenset[str], int],
) -> Packing:
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    big = 1e12
    index = {s: i for i, s in enumerate(services)}
    columns = sorted(sets, key=lambda u: (len(u), sorted(index[s] for s in u)))
    cost = [min(dedicated_cost.get(s, big), big) for s in services]
    cost += [_objective_price(types[sets[u]]) for u in columns]
    rows, cols = list(range(len(services))), list(range(len(services)))
    for j, u in enumerate(columns, start=len(services)):
        for s in u:
            rows.append(index[s])
            cols.append(j)
    n = len(cost)
    a = coo_array((np.ones(len(rows)), (rows, cols)), shape=(len(services), n)).tocsr()
    res = milp(
        c=np.asarray(cost),
        constraints=LinearConstraint(a, np.ones(len(services)), np.ones(len(services))),
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), np.ones(n)),
        options={"time_limit": MILP_TIME_LIMIT_S, "disp": False},
    )
    if res.x is None:
        return _first_fit(services, dedicated_cost, types, demands, "heuristic (MILP failed)")
    x = np.round(res.x).astype(int)
    dedicated = tuple(s for i, s in enumerate(services) if x[i])
    bins = []
    for j, u in enumerate(columns, start=len(services)):
        if not x[j]:
            continue
        t = sets[u]
        members = tuple(s for s in services if s in u)
        used = tuple(
            sum(demands[(s, t)].use[r] for s in members) for r in range(len(types[t].capacity))
        )
        bins.append(Bin(type=types[t], services=members, used=used))
    total = sum(dedicated_cost[s] for s in dedicated) + sum(b.type.price.per_month for b in bins)
    return Packing(
        bins=tuple(bins),
        dedicated=dedicated,
        cost_per_month=total,
        method=f"set-partitioning MILP over {len(columns):,} fitting service sets "
        "(scipy.optimize.milp, HiGHS)",
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


def _fractions(d: Demand, bt: BinType) -> tuple[float, ...]:
    return tuple(u / c for u, c in zip(d.use, bt.capacity, strict=True))


def prune_dominated(
    types: Sequence[BinType], demands: dict[tuple[str, int], Demand]
) -> tuple[list[BinType], dict[tuple[str, int], Demand]]:
    """Drop bin types another type beats: no dearer, and every service it takes fits there
    in no larger a share of each resource. The optimum is unchanged (any bin of a dominated
    type can be swapped for one of its dominator)."""
    services_of: dict[int, set[str]] = {}
    for s, t in demands:
        services_of.setdefault(t, set()).add(s)
    order = sorted(services_of, key=lambda t: (types[t].price.per_month, t))
    kept: list[int] = []
    for t in order:
        mine = services_of[t]
        dominated = False
        for k in kept:
            if types[k].price.per_month > types[t].price.per_month or not mine <= services_of[k]:
                continue
            if all(
                all(
                    a <= b + 1e-12
                    for a, b in zip(
                        _fractions(demands[(s, k)], types[k]),
                        _fractions(demands[(s, t)], types[t]),
                        strict=True,
                    )
                )
                for s in mine
            ):
                dominated = True
                break
        if not dominated:
            kept.append(t)
    new_index = {t: i for i, t in enumerate(sorted(kept))}
    new_types = [types[t] for t in sorted(kept)]
    new_demands = {(s, new_index[t]): d for (s, t), d in demands.items() if t in new_index}
    return new_types, new_demands
