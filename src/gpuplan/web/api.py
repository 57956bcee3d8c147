"""The JSON API: each route answers exactly what the matching CLI command's ``--json`` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from gpuplan.spec import spec_json_schema
from gpuplan.web import service
from gpuplan.web.service import (
    BillOptions,
    EstimateOptions,
    FitOptions,
    OfferingsOptions,
    PlanOptions,
    ServePlanOptions,
)
from gpuplan.web.store import PlanStore


class ApiError(BaseModel):
    """A 422 answer: the CLI's one-line message and the field or option it names."""

    detail: str
    field: str | None


router = APIRouter(
    prefix="/api",
    tags=["api"],
    responses={422: {"model": ApiError, "description": "Bad input: the CLI's one-line error."}},
)

_EXAMPLE = """model: llama-3-8b
method: lora
precision: bf16-mixed
micro_batch_size: 4
global_batch_size: 64
seq_len: 2048
work: {tokens: 200000000}
constraints: {deadline: 24h, currency: USD}
"""


def _body(what: str, key: str) -> dict[str, Any]:
    """OpenAPI text of a raw YAML/JSON body (the routes parse it themselves)."""
    return {
        "requestBody": {
            "required": True,
            "description": f"{what} as YAML or JSON; or a mapping {{{key}: ..., option: value}} "
            "whose options override the query's.",
            "content": {
                "application/yaml": {"schema": {"type": "string"}, "example": _EXAMPLE},
                "application/json": {"schema": {"type": "object"}},
            },
        }
    }


def json_response(payload: Any, headers: dict[str, str] | None = None) -> Response:
    """The CLI's ``--json`` text as the response body."""
    return Response(service.dumps(payload), media_type="application/json", headers=headers)


def _catalog(request: Request) -> Path | None:
    path: Path | None = request.app.state.catalog_path
    return path


async def plan_and_store(request: Request, text: str, opts: PlanOptions) -> tuple[str, str]:
    """Run a plan off the event loop and store it; returns the JSON text and its share id."""
    answer, version = await run_in_threadpool(service.run_plan, text, opts, _catalog(request))
    store: PlanStore = request.app.state.store
    plan_id = store.save(
        spec_yaml=text,
        options=opts.model_dump(exclude_unset=True),
        result_json=answer,
        catalog_version=version,
    )
    return answer, plan_id


@router.post("/plan", openapi_extra=_body("A job spec", "spec"))
async def api_plan(request: Request, query: Annotated[PlanOptions, Query()]) -> Response:
    """``gpuplan plan SPEC --json``; the run is stored, its link in ``X-Plan-Url``."""
    text, body_opts = service.split_body(await request.body(), "spec")
    opts = service.merge_options(PlanOptions, query, body_opts)
    answer, plan_id = await plan_and_store(request, text, opts)
    headers = {"X-Plan-Id": plan_id, "X-Plan-Url": f"/plans/{plan_id}"}
    return Response(answer, media_type="application/json", headers=headers)


@router.post("/fit", openapi_extra=_body("A job spec", "spec"))
async def api_fit(request: Request, query: Annotated[FitOptions, Query()]) -> Response:
    """``gpuplan fit SPEC --json`` (one row per catalog GPU, or one GPU with ``gpu``)."""
    text, body_opts = service.split_body(await request.body(), "spec")
    opts = service.merge_options(FitOptions, query, body_opts)
    return json_response(await run_in_threadpool(service.run_fit, text, opts, _catalog(request)))


@router.post("/estimate", openapi_extra=_body("A job spec", "spec"))
async def api_estimate(request: Request, query: Annotated[EstimateOptions, Query()]) -> Response:
    """``gpuplan estimate SPEC --json``: memory, step time and time-to-train of one configuration."""
    text, body_opts = service.split_body(await request.body(), "spec")
    opts = service.merge_options(EstimateOptions, query, body_opts)
    return json_response(
        await run_in_threadpool(service.run_estimate, text, opts, _catalog(request))
    )


def is_csv(request: Request, opts: BillOptions) -> bool:
    """A utilization CSV by ``format``, else by the Content-Type."""
    if opts.format is not None:
        return opts.format == "csv"
    return "csv" in request.headers.get("content-type", "")


@router.post("/bill", openapi_extra=_body("A usage YAML or a utilization CSV", "usage"))
async def api_bill(request: Request, query: Annotated[BillOptions, Query()]) -> Response:
    """``gpuplan bill USAGE --json``: monthly cost of recurring use, the cheapest mix first."""
    text, body_opts = service.split_body(await request.body(), "usage")
    opts = service.merge_options(BillOptions, query, body_opts)
    return json_response(
        await run_in_threadpool(
            service.run_bill, text, opts, is_csv(request, opts), _catalog(request)
        )
    )


@router.get("/catalog/offerings")
def api_offerings(request: Request, query: Annotated[OfferingsOptions, Query()]) -> Response:
    """``gpuplan catalog offerings --json`` with the same filters."""
    return json_response(service.run_offerings(query, _catalog(request)))


@router.get("/spec/schema")
def api_spec_schema() -> Response:
    """``gpuplan spec schema``: the JSON schema of a job spec."""
    return json_response(spec_json_schema())


# --- serve plan ------------------------------------------------------------------------

_SERVICES_EXAMPLE = """constraints: {currency: USD}
services:
  - name: bert-intent
    model: bert-base
    seq_len: 128
    load: {qps: 20}
    slo: {latency_p99: 100ms}
"""


@router.post(
    "/serve/plan",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A services file as YAML or JSON; or a mapping "
            "{spec: ..., option: value} whose options override the query's.",
            "content": {
                "application/yaml": {"schema": {"type": "string"}, "example": _SERVICES_EXAMPLE},
                "application/json": {"schema": {"type": "object"}},
            },
        }
    },
)
async def api_serve_plan(request: Request, query: Annotated[ServePlanOptions, Query()]) -> Response:
    """``gpuplan serve plan SERVICES --json``: each service's placement and the shared GPUs."""
    text, body_opts = service.split_body(await request.body(), "spec")
    opts = service.merge_options(ServePlanOptions, query, body_opts)
    return json_response(
        await run_in_threadpool(service.run_serve_plan, text, opts, _catalog(request))
    )
