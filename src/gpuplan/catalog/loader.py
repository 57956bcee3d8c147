"""Load and validate the built-in catalog and user overrides.

The built-in catalog is the set of YAML files under ``gpuplan/catalog/data``.
A user overrides file (``--catalog FILE``, or ``$GPUPLAN_HOME/catalog.yaml``,
by default in the platform config dir) has the same shape; its rows shadow
built-in rows with the same key (GPU id, or provider + instance type).

After merging, two kinds of rule are applied to the offerings: billing rules
(``billing.yaml``: increment and minimum of hourly prices), commitment rules
(a published discount off on-demand, per region, where no commitment price is
listed) and the user's compliance declarations (a tag such as ``mlps-3`` with
the user's own certificate reference).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuplan.catalog.schema import (
    BillingRule,
    CatalogFile,
    CommitmentRule,
    ComplianceDeclaration,
    FxRates,
    GpuSpec,
    Offering,
    Price,
)
from gpuplan.errors import CatalogError, UnknownNameError

_DATA_PACKAGE = "gpuplan.catalog.data"
USER_CATALOG_NAME = "catalog.yaml"


def _yaml_loader() -> type[yaml.SafeLoader]:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str, *, origin: str) -> Any:
    """Parse YAML safely, turning syntax errors into one-line CatalogErrors."""
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CatalogError(f"{origin}:{where}: malformed YAML: {problem}") from exc


def describe_validation_error(exc: ValidationError, data: Any = None) -> str:
    """The first pydantic error as ``field.path: message``, naming the row.

    Rows of a list are named by their id/instance_type when the raw data has one.
    """
    err = exc.errors()[0]
    parts: list[str] = []
    node = data
    for loc in err["loc"]:
        if isinstance(loc, int) and isinstance(node, list) and 0 <= loc < len(node):
            row = node[loc]
            label = None
            if isinstance(row, dict):
                label = row.get("id") or row.get("instance_type") or row.get("mode")
            parts.append(f"[{loc}]" + (f"({label})" if label else ""))
            node = row
            continue
        parts.append(f".{loc}" if parts else str(loc))
        node = node.get(loc) if isinstance(node, dict) else None
    path = "".join(parts) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "literal_error":
        msg = f"{msg}, got {err.get('input')!r}"
    return f"{path}: {msg}"


def parse_catalog_file(text: str, *, origin: str) -> CatalogFile:
    """Parse and validate the text of one catalog file."""
    return catalog_from_data(read_yaml(text, origin=origin), origin=origin)


def catalog_from_data(data: Any, *, origin: str) -> CatalogFile:
    """Validate the parsed data of one catalog file."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CatalogError(f"{origin}: expected a mapping with gpus/offerings/billing/fx sections")
    try:
        return CatalogFile.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"{origin}: {describe_validation_error(exc, data)}") from exc


def read_catalog_data(path: Path, *, what: str = "--catalog") -> Any:
    """The parsed YAML of a user catalog file (see :mod:`gpuplan.userfile` for what is refused)."""
    from gpuplan.userfile import read_yaml as read_user_yaml

    data = read_user_yaml(path, what=what, error=CatalogError, mapping=False)
    if data is not None and not isinstance(data, dict):
        raise CatalogError(
            f"{what}: {path}: expected a mapping with gpus/offerings/billing/fx sections, "
            f"got {type(data).__name__}"
        )
    return data


def load_catalog_file(path: Path, *, what: str = "--catalog") -> CatalogFile:
    """Read and validate one user catalog file from disk."""
    return catalog_from_data(read_catalog_data(path, what=what), origin=str(path))


def builtin_files() -> list[tuple[str, str]]:
    """(name, text) of every shipped catalog data file, in a stable order."""
    root = resources.files(_DATA_PACKAGE)
    out: list[tuple[str, str]] = []

    def walk(node: Any, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith((".yaml", ".yml")):
                out.append((f"{prefix}{child.name}", child.read_text(encoding="utf-8")))

    walk(root, "")
    return out


def user_catalog_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the user's overrides file lives: ``$GPUPLAN_HOME/catalog.yaml``."""
    env = os.environ if env is None else env
    home = env.get("GPUPLAN_HOME")
    if home:
        return Path(home) / USER_CATALOG_NAME
    import platformdirs

    return Path(platformdirs.user_config_dir("gpuplan")) / USER_CATALOG_NAME


@dataclasses.dataclass(frozen=True, kw_only=True)
class Catalog:
    """A loaded, cross-checked catalog. Lookups are case-insensitive."""

    gpus: tuple[GpuSpec, ...]
    offerings: tuple[Offering, ...]
    billing: Mapping[str, BillingRule]
    fx: FxRates
    files: tuple[str, ...]
    commitment_rules: tuple[CommitmentRule, ...] = ()
    compliance_declarations: tuple[ComplianceDeclaration, ...] = ()

    @functools.cached_property
    def _gpu_index(self) -> dict[str, GpuSpec]:
        index: dict[str, GpuSpec] = {}
        for gpu in self.gpus:
            for name in (gpu.id, *gpu.aliases):
                index[name.lower()] = gpu
        return index

    def gpu(self, name: str, *, field: str = "gpu") -> GpuSpec:
        """Look up a GPU by id or alias; did-you-mean error otherwise."""
        found = self._gpu_index.get(name.strip().lower())
        if found is None:
            names = [g.id for g in self.gpus] + [a for g in self.gpus for a in g.aliases]
            raise UnknownNameError("GPU id", name, names, field=field)
        return found

    @property
    def providers(self) -> tuple[str, ...]:
        """Providers with at least one offering, sorted."""
        return tuple(sorted({o.provider for o in self.offerings}))

    def offering(self, provider: str, instance_type: str) -> Offering:
        """Look up one offering by provider and instance type."""
        key = (provider.lower(), instance_type.lower())
        for off in self.offerings:
            if off.key == key:
                return off
        names = [f"{o.provider}:{o.instance_type}" for o in self.offerings]
        raise UnknownNameError("offering", f"{provider}:{instance_type}", names, field="offering")

    def filter_offerings(
        self,
        *,
        gpu: str | None = None,
        providers: Sequence[str] = (),
        region: str | None = None,
        max_price_per_hour: float | None = None,
        currency: str = "USD",
    ) -> tuple[Offering, ...]:
        """Offerings matching every given filter (price: on-demand, per instance-hour).

        With ``region`` and ``max_price_per_hour`` both given, the price compared is the
        on-demand price in a matching region; without ``region``, the cheapest region's.
        """
        gpu_id = self.gpu(gpu).id if gpu else None
        wanted = {p.lower() for p in providers}
        for p in wanted:
            if p not in self.providers:
                raise UnknownNameError("provider", p, self.providers, field="provider")
        out = []
        for off in self.offerings:
            if gpu_id and off.gpu != gpu_id:
                continue
            if wanted and off.provider not in wanted:
                continue
            matching = [r for r in off.regions if not region or region.lower() in r.lower()]
            if not matching:
                continue
            if max_price_per_hour is not None:
                amounts = [
                    self.convert(p.hourly_equivalent, p.currency, currency)
                    for r, p in off.region_prices("on-demand")
                    if r in matching
                ]
                if not amounts or min(amounts) > max_price_per_hour:
                    continue
            out.append(off)
        return tuple(out)

    def convert(self, amount: float, from_currency: str, to_currency: str) -> float:
        """Convert money with the catalog's dated FX rates."""
        if from_currency == to_currency:
            return amount
        rates = {"USD": 1.0, **self.fx.per_usd}
        for cur in (from_currency, to_currency):
            if cur not in rates:
                raise UnknownNameError("currency", cur, rates, field="currency")
        return amount / rates[from_currency] * rates[to_currency]


def _merge(files: Iterable[tuple[str, CatalogFile]]) -> Catalog:
    gpus: dict[str, GpuSpec] = {}
    offerings: dict[tuple[str, str], list[Offering]] = {}
    billing: dict[str, BillingRule] = {}
    rules: list[CommitmentRule] = []
    declared: list[ComplianceDeclaration] = []
    fx: FxRates | None = None
    names = []
    for name, cat in files:
        names.append(name)
        rules.extend(cat.commitment_rules)
        declared.extend(cat.compliance_declarations)
        for gpu in cat.gpus:
            gpus[gpu.id.lower()] = gpu
        # rows of a later file replace every earlier row of the same (provider, instance type)
        fresh: dict[tuple[str, str], list[Offering]] = {}
        for off in cat.offerings:
            fresh.setdefault(off.key, []).append(off)
        offerings.update(fresh)
        for rule in cat.billing:
            billing[rule.provider] = rule
        if cat.fx is not None:
            fx = (
                cat.fx
                if fx is None
                else FxRates(
                    per_usd={**fx.per_usd, **cat.fx.per_usd},
                    source=cat.fx.source,
                    as_of=cat.fx.as_of,
                )
            )
    if fx is None:
        raise CatalogError("catalog: no fx section found; currency conversion needs dated rates")
    return Catalog(
        gpus=tuple(gpus.values()),
        offerings=tuple(
            _apply_declarations(
                _apply_billing_rules(_apply_commitment_rules(o, rules), billing), declared
            )
            for rows in offerings.values()
            for o in rows
        ),
        billing=billing,
        fx=fx,
        files=tuple(names),
        commitment_rules=tuple(rules),
        compliance_declarations=tuple(declared),
    )


def _matches(patterns: Sequence[str], instance_type: str) -> bool:
    return not patterns or any(
        fnmatch.fnmatchcase(instance_type.lower(), p.lower()) for p in patterns
    )


def _apply_commitment_rules(off: Offering, rules: Sequence[CommitmentRule]) -> Offering:
    """Derive commitment prices from published discount rules, region by region.

    A region that already has a price in the rule's mode keeps it; the derived
    price has the on-demand price's currency and regions (narrowed to the
    rule's regions) and the rule's source. A later rule for the same provider and
    mode wins over an earlier one (override files come last).
    """
    mine = [
        r
        for r in rules
        if r.provider == off.provider and _matches(r.instance_types, off.instance_type)
    ]
    if not mine:
        return off
    added: list[Price] = []
    for od in [p for p in off.prices if p.mode == "on-demand"]:
        for mode in dict.fromkeys(r.mode for r in mine):
            rule = [r for r in mine if r.mode == mode][-1]
            covered = {
                r for p in (*off.prices, *added) if p.mode == mode for r in off.price_regions(p)
            }
            regions = [
                r
                for r in off.price_regions(od)
                if r not in covered and (not rule.regions or r in rule.regions)
            ]
            if not regions:
                continue
            added.append(
                Price(
                    mode=mode,
                    per_hour=round(od.hourly_equivalent * (1.0 - rule.discount), 6),
                    currency=od.currency,
                    regions=() if tuple(regions) == off.regions else tuple(regions),
                    source=rule.source,
                    source_kind=rule.source_kind,
                    as_of=rule.as_of,
                    derived=f"{rule.discount:.0%} off on-demand "
                    f"({od.hourly_equivalent:g} {od.currency}/h), published rule",
                )
            )
    if not added:
        return off
    return off.model_copy(update={"prices": (*off.prices, *added)})


def _apply_declarations(off: Offering, declared: Sequence[ComplianceDeclaration]) -> Offering:
    """Add the user's declared compliance tags (with their references) to matching offerings."""
    mine = [
        d
        for d in declared
        if d.provider == off.provider
        and _matches(d.instance_types, off.instance_type)
        and (not d.regions or any(r in d.regions for r in off.regions))
    ]
    if not mine:
        return off
    tags = tuple(dict.fromkeys((*off.compliance, *(d.tag for d in mine))))
    refs = {
        **off.compliance_references,
        **{d.tag: f"declared by you: {d.reference} (as of {d.as_of})" for d in mine},
    }
    return off.model_copy(update={"compliance": tags, "compliance_references": refs})


def _apply_billing_rules(off: Offering, billing: Mapping[str, BillingRule]) -> Offering:
    rule = billing.get(off.provider)
    if rule is None:
        return off
    prices = []
    changed = False
    for price in off.prices:
        if price.per_hour is not None and (price.granularity_s is None or price.minimum_s is None):
            price = price.model_copy(
                update={
                    "granularity_s": price.granularity_s or rule.granularity_s,
                    "minimum_s": price.minimum_s if price.minimum_s is not None else rule.minimum_s,
                }
            )
            changed = True
        prices.append(price)
    return off.model_copy(update={"prices": tuple(prices)}) if changed else off


def check_catalog(cat: Catalog, *, today: dt.date | None = None) -> list[str]:
    """Cross-reference checks; returns a list of problems (empty = valid)."""
    today = today or dt.date.today()
    problems: list[str] = []
    gpu_ids = {g.id for g in cat.gpus}
    seen_names: dict[str, str] = {}
    for gpu in cat.gpus:
        for name in (gpu.id, *gpu.aliases):
            other = seen_names.setdefault(name.lower(), gpu.id)
            if other != gpu.id:
                problems.append(f"gpus: name {name!r} used by both {other} and {gpu.id}")
        if gpu.as_of > today:
            problems.append(f"gpus[{gpu.id}].as_of: {gpu.as_of} is in the future")
    currencies = {"USD", *cat.fx.per_usd}
    providers = {o.provider for o in cat.offerings}
    for rule in cat.commitment_rules:
        if rule.provider not in providers:
            problems.append(f"commitment_rules[{rule.provider}]: no offering of this provider")
        if rule.as_of > today:
            problems.append(f"commitment_rules[{rule.provider}].as_of: in the future")
    for decl in cat.compliance_declarations:
        if decl.provider not in providers:
            problems.append(
                f"compliance_declarations[{decl.provider}]: no offering of this provider"
            )
    regions_seen: dict[tuple[str, str], set[str]] = {}
    for off in cat.offerings:
        where = f"offerings[{off.provider}:{off.instance_type}]"
        if off.gpu not in gpu_ids:
            problems.append(f"{where}.gpu: unknown GPU id {off.gpu!r}")
        if off.as_of != "unknown" and off.as_of > today:
            problems.append(f"{where}.as_of: {off.as_of} is in the future")
        seen = regions_seen.setdefault(off.key, set())
        overlap = seen.intersection(off.regions)
        if overlap:
            problems.append(
                f"{where}.regions: {sorted(overlap)[0]} listed in two rows of this instance type"
            )
        seen.update(off.regions)
        priced: set[tuple[str, str]] = set()
        for price in off.prices:
            stray = [r for r in price.regions if r not in off.regions]
            if stray:
                problems.append(
                    f"{where}.prices[{price.mode}].regions: {stray[0]} is not one of the "
                    f"offering's regions {list(off.regions)}"
                )
            for region in off.price_regions(price):
                if (price.mode, region) in priced:
                    problems.append(f"{where}.prices: two {price.mode} prices for region {region}")
                    break
                priced.add((price.mode, region))
        for price in off.prices:
            if price.currency not in currencies:
                problems.append(
                    f"{where}.prices[{price.mode}].currency: {price.currency} has no FX rate"
                )
            if price.as_of is not None and price.as_of > today:
                problems.append(f"{where}.prices[{price.mode}].as_of: in the future")
    return problems


@functools.lru_cache(maxsize=1)
def _builtin_parsed() -> tuple[tuple[str, CatalogFile], ...]:
    return tuple(
        (f"builtin:{name}", parse_catalog_file(text, origin=f"builtin:{name}"))
        for name, text in builtin_files()
    )


def load_catalog(
    override: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    use_user: bool = True,
    check: bool = True,
) -> Catalog:
    """Load the built-in catalog, then the user file, then ``override`` on top.

    Args:
        override: a file given with ``--catalog``; must exist.
        env: environment for ``GPUPLAN_HOME`` (default ``os.environ``).
        use_user: read ``$GPUPLAN_HOME/catalog.yaml`` when it exists.
        check: raise on the first cross-reference problem (``check_catalog``).
    """
    files: list[tuple[str, CatalogFile]] = list(_builtin_parsed())
    if use_user:
        user = user_catalog_path(env)
        if user.is_file():
            files.append((str(user), load_catalog_file(user, what="user catalog")))
    if override is not None:
        files.append((str(override), load_catalog_file(override)))
    cat = _merge(files)
    problems = check_catalog(cat) if check else []
    if problems:
        raise CatalogError(
            f"catalog: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint="run `gpuplan catalog validate` to list every problem",
        )
    return cat
