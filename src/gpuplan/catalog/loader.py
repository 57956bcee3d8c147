"""Load and validate the built-in catalog and user overrides.

The built-in catalog is the set of YAML files under ``gpuplan/catalog/data``.
A user overrides file (``--catalog FILE``, or ``$GPUPLAN_HOME/catalog.yaml``,
by default in the platform config dir) has the same shape; its rows shadow
built-in rows with the same key (GPU id, or provider + instance type).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
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
    FxRates,
    GpuSpec,
    Offering,
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
        """Offerings matching every given filter (price: on-demand, per instance-hour)."""
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
            if region and not any(region.lower() in r.lower() for r in off.regions):
                continue
            if max_price_per_hour is not None:
                price = off.price("on-demand")
                if price is None:
                    continue
                if (
                    self.convert(price.hourly_equivalent, price.currency, currency)
                    > max_price_per_hour
                ):
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
    fx: FxRates | None = None
    names = []
    for name, cat in files:
        names.append(name)
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
            _apply_billing_rules(o, billing) for rows in offerings.values() for o in rows
        ),
        billing=billing,
        fx=fx,
        files=tuple(names),
    )


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
    regions_seen: dict[tuple[str, str], set[str]] = {}
    for off in cat.offerings:
        where = f"offerings[{off.provider}:{off.instance_type}]"
        if off.gpu not in gpu_ids:
            problems.append(f"{where}.gpu: unknown GPU id {off.gpu!r}")
        if off.as_of > today:
            problems.append(f"{where}.as_of: {off.as_of} is in the future")
        seen = regions_seen.setdefault(off.key, set())
        overlap = seen.intersection(off.regions)
        if overlap:
            problems.append(
                f"{where}.regions: {sorted(overlap)[0]} listed in two rows of this instance type"
            )
        seen.update(off.regions)
        modes = [p.mode for p in off.prices]
        if len(modes) != len(set(modes)):
            problems.append(f"{where}.prices: a billing mode appears twice")
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
