"""The HTML pages: plan form and results, shared plans, fit, serve plan, bill and the catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import SpecError
from gpuplan.models.presets import list_presets
from gpuplan.planner.flags import SERVE_OBJECTIVES
from gpuplan.report.svg import esc
from gpuplan.spec import spec_from_text
from gpuplan.web import forms, render, service
from gpuplan.web.api import is_csv, plan_and_store
from gpuplan.web.i18n import Texts, pick
from gpuplan.web.layout import page
from gpuplan.web.service import (
    BillOptions,
    FitOptions,
    OfferingsOptions,
    PlanOptions,
    ServePlanOptions,
)
from gpuplan.web.store import PlanStore, StoredPlan

router = APIRouter(include_in_schema=False)


def texts(request: Request) -> Texts:
    """The request's language (query, cookie, Accept-Language)."""
    return Texts(
        pick(
            request.query_params.get("lang"),
            request.cookies.get("lang"),
            request.headers.get("accept-language"),
        )
    )


def html(t: Texts, content: str, status: int = 200) -> HTMLResponse:
    """An HTML response that remembers the language in a cookie."""
    resp = HTMLResponse(content, status_code=status)
    resp.set_cookie("lang", t.lang, samesite="lax", max_age=365 * 86400)
    return resp


def _catalog_path(request: Request) -> Path | None:
    path: Path | None = request.app.state.catalog_path
    return path


def _query_options(model: type[Any], request: Request, lists: tuple[str, ...] = ()) -> Any:
    """An options model from the query string (``lang`` aside); errors as one line."""
    data: dict[str, Any] = {}
    for key, value in request.query_params.multi_items():
        if key == "lang" or value == "":
            continue
        if key in lists:
            data.setdefault(key, []).append(value)
        else:
            data[key] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(service.describe_options_error(exc)) from None


# --- plan ------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def plan_page(request: Request) -> HTMLResponse:
    """The job form; results appear below it, each with its share link."""
    t = texts(request)
    cat = load_catalog(_catalog_path(request))
    presets = sorted(p.id for p in list_presets())
    body = (
        f'<p class="lead">{esc(t("plan.lead"))}</p>'
        + forms.plan_form(t, presets, sorted(cat.providers))
        + '<section id="result" aria-live="polite"></section>'
    )
    return html(t, page(t, t("title.plan"), body, path="/"))


def _limits(stored: StoredPlan) -> tuple[float | None, float | None]:
    """The deadline and budget the stored spec asked for (for the chart)."""
    opts = stored.options
    overrides = list(opts.get("set", []))
    if opts.get("currency"):
        overrides.append(f"constraints.currency={opts['currency']}")
    try:
        spec = spec_from_text(stored.spec_yaml, overrides)
    except SpecError:
        return None, None
    return spec.constraints.deadline, spec.constraints.budget


def plan_fragment(t: Texts, stored: StoredPlan, request: Request) -> str:
    """A stored plan: share link, result, and the YAML it ran."""
    deadline, budget = _limits(stored)
    url = str(request.base_url).rstrip("/") + f"/plans/{stored.id}"
    share = t("share.note", created=stored.created_utc, catalog=stored.catalog_version)
    return (
        f'<div class="share"><strong>{esc(t("share.link"))}</strong> '
        f'<a id="share-link" href="/plans/{esc(stored.id)}">{esc(url)}</a>'
        f'<br><span class="muted">{esc(share)}</span></div>'
        + render.plan_result(t, stored.result, deadline_s=deadline, budget=budget)
        + f"<details><summary>{esc(t('share.yaml'))}</summary>"
        f'<pre id="ran-yaml">{esc(stored.spec_yaml)}</pre></details>'
    )


def _stored(request: Request, plan_id: str) -> StoredPlan | None:
    store: PlanStore = request.app.state.store
    return store.get(plan_id)


def _not_found(t: Texts) -> HTMLResponse:
    body = f'<p class="error">{esc(t("share.missing"))}</p>'
    return html(t, page(t, t("title.missing"), body, path="/plans"), status=404)


@router.get("/plans/{plan_id}/fragment", response_class=HTMLResponse)
def plan_fragment_route(request: Request, plan_id: str) -> HTMLResponse:
    """The result part of a stored plan, for the form page's script."""
    t = texts(request)
    stored = _stored(request, plan_id)
    if stored is None:
        return HTMLResponse(f'<p class="error">{esc(t("share.missing"))}</p>', status_code=404)
    return HTMLResponse(plan_fragment(t, stored, request))


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def shared_plan(request: Request, plan_id: str) -> HTMLResponse:
    """A stored plan, read-only, with a button to re-run it on today's catalog."""
    t = texts(request)
    stored = _stored(request, plan_id)
    if stored is None:
        return _not_found(t)
    rerun = (
        f'<form method="post" action="/plans/{esc(plan_id)}/rerun?lang={t.lang}" class="rerun">'
        f'<button type="submit" id="rerun">{esc(t("share.rerun"))}</button></form>'
    )
    body = rerun + '<section id="result">' + plan_fragment(t, stored, request) + "</section>"
    return html(t, page(t, t("title.shared"), body, path=f"/plans/{plan_id}"))


@router.post("/plans/{plan_id}/rerun")
async def rerun(request: Request, plan_id: str) -> Response:
    """Run a stored spec again with the same options on the current catalog."""
    t = texts(request)
    stored = _stored(request, plan_id)
    if stored is None:
        return _not_found(t)
    opts = PlanOptions.model_validate(stored.options)
    _, new_id = await plan_and_store(request, stored.spec_yaml, opts)
    return RedirectResponse(f"/plans/{new_id}?lang={t.lang}", status_code=303)


# --- fit and bill ----------------------------------------------------------------------


@router.get("/fit", response_class=HTMLResponse)
def fit_page(request: Request) -> HTMLResponse:
    """Fit: a spec and a GPU count, one row per catalog GPU."""
    t = texts(request)
    controls = forms.option_field(t, "gpus", forms.opt_input("gpus", "1", "number"))
    controls += forms.option_field(t, "gpu", forms.opt_input("gpu"))
    body = (
        f'<p class="lead">{esc(t("fit.lead"))}</p>'
        + forms.simple_form(t, "fit-form", "/fragments/fit", controls, upload=t("form.yaml"))
        + '<section id="result" aria-live="polite"></section>'
    )
    return html(t, page(t, t("title.fit"), body, path="/fit"))


@router.post("/fragments/fit", response_class=HTMLResponse)
async def fit_fragment(request: Request) -> HTMLResponse:
    """The fit table of ``POST /api/fit``'s JSON."""
    t = texts(request)
    opts = _query_options(FitOptions, request, ("set",))
    text, _ = service.split_body(await request.body(), "spec")
    payload = await run_in_threadpool(service.run_fit, text, opts, _catalog_path(request))
    return HTMLResponse(render.fit_table(t, payload))


@router.get("/serve", response_class=HTMLResponse)
def serve_page(request: Request) -> HTMLResponse:
    """Serve plan: a services file; each service's placement and the shared GPUs."""
    t = texts(request)
    default = ServePlanOptions()
    controls = forms.option_field(
        t,
        "objective",
        forms.select("objective", SERVE_OBJECTIVES, default.objective, spec=False),
    )
    controls += forms.option_field(
        t, "currency", forms.select("currency", ("", *forms.CURRENCIES), "", spec=False)
    )
    body = (
        f'<p class="lead">{esc(t("serve.lead"))}</p>'
        + forms.simple_form(
            t, "serve-form", "/fragments/serve", controls, upload=t("serve.services")
        )
        + '<section id="result" aria-live="polite"></section>'
    )
    return html(t, page(t, t("title.serve"), body, path="/serve"))


@router.post("/fragments/serve", response_class=HTMLResponse)
async def serve_fragment(request: Request) -> HTMLResponse:
    """The placement tables of ``POST /api/serve/plan``'s JSON."""
    t = texts(request)
    opts = _query_options(ServePlanOptions, request)
    text, _ = service.split_body(await request.body(), "spec")
    payload = await run_in_threadpool(service.run_serve_plan, text, opts, _catalog_path(request))
    return HTMLResponse(render.serve_tables(t, payload))


@router.get("/bill", response_class=HTMLResponse)
def bill_page(request: Request) -> HTMLResponse:
    """Bill: a usage YAML or a utilization CSV."""
    t = texts(request)
    controls = forms.option_field(t, "gpu", forms.opt_input("gpu"))
    controls += forms.option_field(
        t, "currency", forms.select("currency", forms.CURRENCIES, "USD", spec=False)
    )
    body = (
        f'<p class="lead">{esc(t("bill.lead"))}</p>'
        + forms.simple_form(t, "bill-form", "/fragments/bill", controls, upload=t("bill.usage"))
        + '<section id="result" aria-live="polite"></section>'
    )
    return html(t, page(t, t("title.bill"), body, path="/bill"))


@router.post("/fragments/bill", response_class=HTMLResponse)
async def bill_fragment(request: Request) -> HTMLResponse:
    """The monthly-cost table of ``POST /api/bill``'s JSON."""
    t = texts(request)
    opts = _query_options(BillOptions, request, ("provider", "region"))
    text, _ = service.split_body(await request.body(), "usage")
    report = await run_in_threadpool(
        service.run_bill, text, opts, is_csv(request, opts), _catalog_path(request)
    )
    return HTMLResponse(render.bill_table(t, report))


# --- catalog ---------------------------------------------------------------------------


@router.get("/catalog", response_class=HTMLResponse)
def catalog_page(request: Request) -> HTMLResponse:
    """Offerings filtered by GPU, provider, region and price, with source and as-of date."""
    t = texts(request)
    opts: OfferingsOptions = _query_options(OfferingsOptions, request, ("provider",))
    cat = load_catalog(_catalog_path(request))
    rows = service.run_offerings(opts, _catalog_path(request))
    gpus = "".join(f'<option value="{esc(g.id)}">' for g in sorted(cat.gpus, key=lambda g: g.id))
    prov = "".join(
        f'<option value="{esc(p)}"{" selected" if p in opts.provider else ""}>{esc(p)}</option>'
        for p in sorted(cat.providers)
    )
    cur = "".join(
        f"<option{' selected' if c == (opts.currency or 'USD') else ''}>{c}</option>"
        for c in forms.CURRENCIES
    )
    filters = (
        f'<form method="get" action="/catalog" class="filters"><input type="hidden" name="lang" value="{t.lang}">'
        f'<label>{esc(t("opt.gpu"))} <input name="gpu" list="gpus" value="{esc(opts.gpu or "")}">'
        f'<datalist id="gpus">{gpus}</datalist></label>'
        f'<label>{esc(t("opt.provider"))} <select name="provider"><option value=""></option>{prov}</select></label>'
        f'<label>{esc(t("opt.region"))} <input name="region" value="{esc(opts.region or "")}"></label>'
        f'<label>{esc(t("opt.max_price"))} <input name="max_price" type="number" step="any" '
        f'value="{esc("" if opts.max_price is None else opts.max_price)}"></label>'
        f'<label>{esc(t("opt.currency"))} <select name="currency">{cur}</select></label>'
        f'<button type="submit">{esc(t("catalog.filter"))}</button></form>'
    )
    body = (
        filters
        + f'<p class="muted">{esc(t("catalog.count", n=t.num(len(rows))))}</p>'
        + render.offerings_table(t, rows)
    )
    query = str(request.url.query)
    query = "&".join(p for p in query.split("&") if p and not p.startswith("lang="))
    return html(t, page(t, t("title.catalog"), body, path="/catalog", query=query))
