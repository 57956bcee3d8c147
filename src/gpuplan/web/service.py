"""Web requests to library calls: the same functions, flags and JSON as the CLI.

Option models mirror the CLI flags one for one (same names with ``_`` for ``-``),
and take their defaults from the CLI command signatures, so the two cannot drift.
Every answer is the exact text ``--json`` prints.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplan.catalog.loader import Catalog, load_catalog
from gpuplan.catalog.schema import SCHEMA_VERSION
from gpuplan.cli import bill_cmd, catalog_cmd, fit_cmd, plan_cmd, serve_cmd
from gpuplan.cli.common import to_jsonable
from gpuplan.cost.mix import bill
from gpuplan.cost.usage import usage_from_text
from gpuplan.errors import SpecError
from gpuplan.estimate.configure import configure
from gpuplan.estimate.fit import fit
from gpuplan.estimate.hardware import resolve_hardware
from gpuplan.planner import plan
from gpuplan.planner.flags import plan_settings, serve_objective, spec_overrides
from gpuplan.planner.serve_plan import plan_services
from gpuplan.report.payloads import (
    estimate_payload,
    fit_payload,
    fit_rows,
    offerings_payload,
    plan_payload,
    select_offerings,
    serve_plan_payload,
)
from gpuplan.serve.spec import serve_spec_from_text
from gpuplan.spec import spec_from_text
from gpuplan.userfile import parse_yaml

ORIGIN = "spec"
SERVICES = "services"
USAGE = "usage"
USAGE_CSV = "usage.csv"
"""How errors name a request body (the CLI names the file instead)."""


def _default(fn: Callable[..., Any], name: str) -> Any:
    """The default of one CLI flag (its command function's parameter)."""
    return inspect.signature(fn).parameters[name].default


class _Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_O = TypeVar("_O", bound=_Options)


class PlanOptions(_Options):
    """The flags of ``gpuplan plan`` (``--set`` is ``set``)."""

    objective: str = Field(
        default=_default(plan_cmd.plan_command, "objective"),
        description="cost, time or pareto.",
    )
    top: int = Field(default=_default(plan_cmd.plan_command, "top"), ge=1, le=500)
    max_gpus: int | None = Field(default=_default(plan_cmd.plan_command, "max_gpus"), ge=1)
    currency: str | None = Field(default=None, description="USD or CNY (default: the spec's).")
    spot_rate: float = Field(default=_default(plan_cmd.plan_command, "spot_rate"), ge=0)
    checkpoint_interval: str = _default(plan_cmd.plan_command, "checkpoint_interval")
    risk: str = Field(
        default=_default(plan_cmd.plan_command, "risk"),
        description="Memory risk: low, medium or high (as `gpuplan plan --risk`).",
    )
    set: list[str] = Field(default_factory=list, description="Spec overrides FIELD=VALUE.")


class FitOptions(_Options):
    """The flags of ``gpuplan fit`` (no ``--trace``: the server downloads nothing)."""

    gpu: str | None = None
    gpus: int = Field(default=_default(fit_cmd.fit_command, "gpus"), ge=1)
    safety_margin: float = Field(default=_default(fit_cmd.fit_command, "margin"), ge=0, le=0.5)
    set: list[str] = Field(default_factory=list)


class EstimateOptions(_Options):
    """The flags of ``gpuplan estimate``."""

    gpu: str | None = None
    count: int | None = Field(default=None, ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1)
    intra_node: str | None = None
    inter_node_gbps: float | None = Field(default=None, ge=0)
    fabric: str | None = None
    offering: str | None = None
    nodes: int | None = Field(default=None, ge=1)
    safety_margin: float = Field(default=_default(fit_cmd.estimate_command, "margin"), ge=0, le=0.5)
    set: list[str] = Field(default_factory=list)


class BillOptions(_Options):
    """The flags of ``gpuplan bill``; ``format`` says whether the body is YAML or CSV."""

    gpu: str | None = None
    provider: list[str] = Field(default_factory=list)
    region: list[str] = Field(default_factory=list)
    autostop_after: str | None = None
    busy_threshold: float | None = Field(
        default=_default(bill_cmd.bill_command, "busy_threshold"), ge=0, le=100
    )
    currency: str = _default(bill_cmd.bill_command, "currency")
    format: Literal["yaml", "csv"] | None = Field(
        default=None, description="yaml or csv (default: from the Content-Type)."
    )


class ServePlanOptions(_Options):
    """The flags of ``gpuplan serve plan`` (no ``--html`` or ``--export``: the API answers JSON)."""

    objective: str = Field(
        default=_default(serve_cmd.plan, "objective"),
        description="cost (least monthly cost, packs services onto shared GPUs) or latency.",
    )
    currency: str | None = Field(
        default=_default(serve_cmd.plan, "currency"),
        description="Currency of costs (default: the file's).",
    )


class OfferingsOptions(_Options):
    """The filters of ``gpuplan catalog offerings``."""

    gpu: str | None = None
    provider: list[str] = Field(default_factory=list)
    region: str | None = None
    max_price: float | None = Field(default=None, ge=0)
    currency: str | None = _default(catalog_cmd.offerings, "currency")


# --- errors ----------------------------------------------------------------------------


def describe_options_error(exc: ValidationError) -> str:
    """One line naming the flag, e.g. ``--top: Input should be greater than or equal to 1``."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if p not in ("query", "body")]
    name = loc[0] if loc else "options"
    msg = "unknown option" if err["type"] == "extra_forbidden" else err["msg"]
    if err["type"] in ("literal_error", "enum"):
        msg += f", got {err.get('input')!r}"
    return f"--{name.replace('_', '-')}: {msg}"


def error_field(message: str) -> str | None:
    """The spec field or option an error message names (``seq_len``, ``constraints.budget``)."""
    text = message
    for origin in (ORIGIN, SERVICES, USAGE_CSV, USAGE):
        if text.startswith(f"{origin}:"):
            text = text[len(origin) + 1 :]
            break
    flag = re.match(r"--([a-z][a-z0-9-]*):", text)
    if flag:
        return flag.group(1).replace("-", "_")
    field = re.match(r"\s*([A-Za-z_][\w.]*):", text)
    return field.group(1) if field else None


# --- request bodies --------------------------------------------------------------------


def split_body(raw: bytes, key: str) -> tuple[str, dict[str, Any]]:
    """The document text and the body options of a request.

    The body is the document itself (YAML or JSON), or a mapping ``{key: document,
    option: value...}`` where the document is a mapping or a string.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{ORIGIN}: the request body is not UTF-8 text") from None
    try:
        data = parse_yaml(text, what=ORIGIN, path=None, error=SpecError)
    except SpecError:
        return text, {}  # the library's reader reports it (aliases, depth, a YAML error)
    if isinstance(data, dict) and key in data:
        options = {k: v for k, v in data.items() if k != key}
        doc = data[key]
        if isinstance(doc, str):
            return doc, options
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), options
    return text, {}


def merge_options(model: type[_O], query: _O, body: dict[str, Any]) -> _O:
    """Query options with the body's on top, validated as one set."""
    if not body:
        return query
    try:
        return model.model_validate({**query.model_dump(exclude_unset=True), **body})
    except ValidationError as exc:
        raise SpecError(describe_options_error(exc)) from None


def dumps(payload: Any) -> str:
    """The exact text the CLI's ``--json`` prints."""
    return json.dumps(to_jsonable(payload), indent=2, ensure_ascii=False) + "\n"


# --- the calls -------------------------------------------------------------------------


def catalog_version(cat: Catalog) -> str:
    """What identifies the catalog a plan used: schema, newest price date, size."""
    newest = max((str(o.as_of) for o in cat.offerings), default="unknown")
    return f"schema {SCHEMA_VERSION}; prices as of {newest}; {len(cat.offerings)} offerings"


def run_plan(text: str, opts: PlanOptions, catalog_path: Path | None) -> tuple[str, str]:
    """``gpuplan plan SPEC --json``: the printed JSON text and the catalog version."""
    settings = plan_settings(
        objective=opts.objective,
        top=opts.top,
        max_gpus=opts.max_gpus,
        spot_rate=opts.spot_rate,
        checkpoint_interval=opts.checkpoint_interval,
        risk=opts.risk,
    )
    spec = spec_from_text(text, spec_overrides(opts.set, opts.currency), origin=ORIGIN)
    cat = load_catalog(catalog_path)
    return dumps(plan_payload(plan(spec, cat, settings))), catalog_version(cat)


def run_fit(text: str, opts: FitOptions, catalog_path: Path | None) -> Any:
    """``gpuplan fit SPEC --json`` (one GPU with ``gpu``, else every catalog GPU)."""
    spec = spec_from_text(text, opts.set, origin=ORIGIN)
    cat = load_catalog(catalog_path)
    if opts.gpu is not None:
        return fit_payload(
            fit(spec, cat.gpu(opts.gpu), opts.gpus, margin=opts.safety_margin), opts.gpus
        )
    return fit_rows(spec, cat, opts.gpus, margin=opts.safety_margin)


def run_estimate(text: str, opts: EstimateOptions, catalog_path: Path | None) -> Any:
    """``gpuplan estimate SPEC --json``."""
    spec = spec_from_text(text, opts.set, origin=ORIGIN)
    cat = load_catalog(catalog_path)
    gspec, n, topo = resolve_hardware(
        cat,
        opts.gpu,
        opts.count,
        opts.gpus_per_node,
        opts.intra_node,
        opts.inter_node_gbps,
        opts.fabric,
        opts.offering,
        opts.nodes,
    )
    conf = configure(spec, gspec, n, topo, margin=opts.safety_margin)
    return estimate_payload(conf, gspec, n, topo)


def run_bill(text: str, opts: BillOptions, is_csv: bool, catalog_path: Path | None) -> Any:
    """``gpuplan bill USAGE --json`` (``is_csv``: a utilization trace)."""
    usage = usage_from_text(
        text,
        origin=USAGE_CSV if is_csv else USAGE,
        is_csv=is_csv,
        gpu=opts.gpu,
        providers=opts.provider,
        regions=opts.region,
        autostop_after=opts.autostop_after,
        busy_threshold=opts.busy_threshold,
    )
    cat = load_catalog(catalog_path)
    return bill(usage, catalog=cat, currency=opts.currency).as_dict()


def run_offerings(opts: OfferingsOptions, catalog_path: Path | None) -> Any:
    """``gpuplan catalog offerings --json``."""
    cat = load_catalog(catalog_path)
    target = opts.currency or "USD"
    rows = select_offerings(
        cat,
        gpu=opts.gpu,
        providers=opts.provider,
        region=opts.region,
        max_price=opts.max_price,
        currency=target,
    )
    return offerings_payload(cat, rows, target, opts.region)


def run_serve_plan(text: str, opts: ServePlanOptions, catalog_path: Path | None) -> Any:
    """``gpuplan serve plan SERVICES --json``."""
    goal = serve_objective(opts.objective)
    spec = serve_spec_from_text(text, origin=SERVICES)
    result = plan_services(spec, load_catalog(catalog_path), objective=goal, currency=opts.currency)
    return serve_plan_payload(result)
