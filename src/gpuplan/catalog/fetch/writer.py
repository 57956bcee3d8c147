"""Turn fetched quotes into an overrides file (the format ``--catalog`` reads).

An overrides row replaces every built-in row of its provider and instance type,
so each written offering keeps the catalog's shape (GPU, count, vCPUs...) and
the catalog's prices for the regions and modes that were *not* fetched, each
with its own source. In each region where the API priced the instance type, the
modes the fetcher asks are replaced by the API's answer (a mode it did not
price there is dropped: not sold); a region asked where the API priced nothing
for that type keeps the catalog's prices (their source and date show their age) (``source: api:<provider>:<action>``, ``source_kind: api``,
``as_of``: the fetch date in local time, as ``catalog validate`` compares dates
with today's local date; the fetch time, UTC, is in the row's notes).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from gpuplan.catalog.fetch.common import FetchOutcome, Quote
from gpuplan.catalog.schema import CatalogFile, Offering, Price

PLACEHOLDER_REGIONS = ("unspecified",)
"""Region names that stand for "not known"; dropped (with their prices) once real regions are fetched."""


def template_offerings(
    provider: str, extra_files: Sequence[Path] = (), *, env: Mapping[str, str] | None = None
) -> tuple[Offering, ...]:
    """The provider's offerings as written in the catalog files (before any rule is applied).

    Built-in files, then ``$GPUPLAN_HOME/catalog.yaml``, then ``extra_files``; a
    later file's rows replace earlier rows of the same instance type. Rows of one
    instance type split over several entries are merged into one.
    """
    from gpuplan.catalog.loader import _builtin_parsed, load_catalog_file, user_catalog_path

    files = [cat for _, cat in _builtin_parsed()]
    user = user_catalog_path(env)
    for path in ([user] if user.is_file() else []) + list(extra_files):
        files.append(load_catalog_file(path))
    rows: dict[tuple[str, str], list[Offering]] = {}
    for cat in files:
        fresh: dict[tuple[str, str], list[Offering]] = defaultdict(list)
        for off in cat.offerings:
            if off.provider == provider:
                fresh[off.key].append(off)
        rows.update(fresh)
    return tuple(_combine(group) for group in rows.values())


def _explicit(off: Offering, price: Price) -> Price:
    """``price`` with its regions, source, kind and date spelled out (no inheritance)."""
    return price.model_copy(
        update={
            "regions": off.price_regions(price),
            "source": price.source or off.source,
            "source_kind": price.source_kind or off.source_kind,
            "as_of": price.as_of or off.as_of,
        }
    )


def _combine(group: Sequence[Offering]) -> Offering:
    first = group[0]
    if len(group) == 1:
        return first
    regions = tuple(dict.fromkeys(r for off in group for r in off.regions))
    prices = tuple(_explicit(off, p) for off in group for p in off.prices)
    return first.model_copy(update={"regions": regions, "prices": prices})


def _fetched_prices(quotes: Iterable[Quote], provider: str, day: dt.date) -> list[Price]:
    """One price per mode, amount and action, listing every region charging it."""
    groups: dict[tuple[str, float, str, str, str], list[str]] = defaultdict(list)
    for q in quotes:
        groups[(q.mode, round(q.amount, 6), q.unit, q.currency, q.action)].append(q.region)
    out = []
    for (mode, amount, unit, currency, action), regions in sorted(groups.items()):
        out.append(
            Price.model_validate(
                {
                    "mode": mode,
                    unit: amount,
                    "currency": currency,
                    "regions": tuple(sorted(set(regions))),
                    "source": f"api:{provider}:{action}",
                    "source_kind": "api",
                    "as_of": day,
                }
            )
        )
    return out


def build_overrides(
    provider: str, templates: Sequence[Offering], outcome: FetchOutcome, *, now: dt.datetime
) -> CatalogFile:
    """An overrides file with every template that got at least one fetched price."""
    by_type: dict[str, list[Quote]] = defaultdict(list)
    for q in outcome.quotes:
        by_type[q.instance_type.lower()].append(q)
    replaced_modes = set(outcome.modes)
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    offerings = []
    for off in sorted(templates, key=lambda o: o.instance_type):
        quotes = by_type.get(off.instance_type.lower())
        if not quotes:
            continue
        fetched_regions = {q.region for q in quotes}
        kept: list[Price] = []
        for price in off.prices:
            if price.derived:
                continue  # re-derived from its rule when the file is loaded
            full = _explicit(off, price)
            regions = tuple(
                r
                for r in full.regions
                if r not in PLACEHOLDER_REGIONS
                and not (r in fetched_regions and price.mode in replaced_modes)
            )
            if regions:
                kept.append(full.model_copy(update={"regions": regions}))
        regions = tuple(
            sorted(
                {r for r in off.regions if r not in PLACEHOLDER_REGIONS}
                | {r for p in kept for r in p.regions}
                | fetched_regions
            )
        )
        actions = sorted({q.action for q in quotes})
        offerings.append(
            off.model_copy(
                update={
                    "regions": regions,
                    "prices": (*kept, *_fetched_prices(quotes, provider, now.astimezone().date())),
                    "source": f"api:{provider} ({', '.join(actions)}); shape: {off.source}",
                    "source_kind": "api",
                    "as_of": now.astimezone().date(),
                    "compliance_references": {},
                    "notes": f"prices fetched {stamp} by `gpuplan catalog fetch {provider}` in "
                    f"{', '.join(sorted(fetched_regions))}; other regions/modes keep the "
                    "catalog's prices with their own sources"
                    + (f". {off.notes}" if off.notes else ""),
                }
            )
        )
    return CatalogFile(offerings=tuple(offerings))


def header_comment(provider: str, outcome: FetchOutcome, *, now: dt.datetime) -> str:
    """YAML comment lines opening a written file: what was fetched, when."""
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        f"# Written by `gpuplan catalog fetch {provider}` at {stamp}.",
        f"# Regions asked: {', '.join(outcome.regions_asked)}; modes: {', '.join(outcome.modes)}.",
        "# Load with --catalog FILE (or copy to $GPUPLAN_HOME/catalog.yaml).",
    ]
    return "\n".join(lines) + "\n"
