"""The FastAPI application: API, pages, static assets and local OpenAPI docs.

Errors a user causes answer HTTP 422 with the CLI's one-line message and the
field it names: ``{"detail": "...", "field": "seq_len"}`` (an HTML page for
browser pages). Nothing is fetched from outside: Swagger UI's files come from
the ``swagger-ui-bundle`` package, everything else from ``web/static``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from gpuplan import __version__
from gpuplan.errors import GpuPlanError
from gpuplan.report.svg import esc
from gpuplan.web import api, pages, service
from gpuplan.web.layout import page
from gpuplan.web.store import PlanStore


def default_db_path() -> Path:
    """``$GPUPLAN_HOME/web.db`` (the directory of the user catalog file)."""
    from gpuplan.catalog.loader import user_catalog_path

    return user_catalog_path().parent / "web.db"


def _error_response(request: Request, message: str) -> Response:
    field = service.error_field(message)
    if request.url.path.startswith(("/api/", "/fragments/")):
        return JSONResponse({"detail": message, "field": field}, status_code=422)
    t = pages.texts(request)
    body = f'<p class="error" id="error">error: {esc(message)}</p>'
    return pages.html(t, page(t, t("title.error"), body, path=request.url.path), status=422)


def create_app(db_path: Path | None = None, catalog_path: Path | None = None) -> FastAPI:
    """The web app over the plan store at ``db_path`` and the catalog (with overrides)."""
    app = FastAPI(
        title="gpuplan",
        version=__version__,
        description="GPU fit, speed and cost planning: the CLI's `--json` answers over HTTP.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = PlanStore(db_path or default_db_path())
    app.state.catalog_path = catalog_path

    @app.exception_handler(GpuPlanError)
    async def _gpuplan_error(request: Request, exc: GpuPlanError) -> Response:
        return _error_response(request, exc.one_line())

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors: list[dict[str, Any]] = list(exc.errors())
        err = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
        loc = [str(p) for p in err.get("loc", ()) if p not in ("query", "body")]
        name = (loc[0] if loc else "options").replace("_", "-")
        msg = "unknown option" if err.get("type") == "extra_forbidden" else str(err.get("msg"))
        return _error_response(request, f"--{name}: {msg}")

    _mount_docs(app)  # before /static, which would shadow /static/swagger
    static = resources.files("gpuplan.web").joinpath("static")
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    return app


def openapi_30(node: Any) -> Any:
    """A copy of an OpenAPI 3.1 document in 3.0 terms, for the Swagger UI 4 that ships locally.

    ``/openapi.json`` stays the true 3.1 document; this only relabels the version and turns
    ``anyOf: [X, {type: null}]`` into ``X`` with ``nullable: true`` and numeric
    ``exclusiveMinimum``/``exclusiveMaximum`` into 3.0's boolean form.
    """
    if isinstance(node, list):
        return [openapi_30(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_30(v) for k, v in node.items()}
    if out.get("openapi", "").startswith("3.1"):
        out["openapi"] = "3.0.3"
    members = out.get("anyOf")
    if isinstance(members, list) and {"type": "null"} in members:
        rest = [m for m in members if m != {"type": "null"}]
        del out["anyOf"]
        if len(rest) == 1:
            out.update(rest[0])
        else:
            out["anyOf"] = rest
        out["nullable"] = True
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(key), (int, float)) and not isinstance(out.get(key), bool):
            out[bound], out[key] = out[key], True
    return out


def _mount_docs(app: FastAPI) -> None:
    """Swagger UI at ``/docs`` from local files (a plain list of routes without the package)."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:  # pragma: no cover - the web extra installs it
        swagger_ui_path = None

    if swagger_ui_path is not None:
        app.mount("/static/swagger", StaticFiles(directory=str(swagger_ui_path)), name="swagger")

    @app.get("/openapi-3.0.json", include_in_schema=False)
    def openapi_for_swagger() -> JSONResponse:
        return JSONResponse(openapi_30(app.openapi()))

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if swagger_ui_path is None:
            rows = "".join(
                f"<li><code>{esc(m)} {esc(p)}</code></li>"
                for p, ops in app.openapi()["paths"].items()
                for m in ops
            )
            return HTMLResponse(f"<h1>gpuplan API</h1><p>/openapi.json</p><ul>{rows}</ul>")
        return get_swagger_ui_html(
            openapi_url="/openapi-3.0.json",
            title="gpuplan API",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="/static/swagger/favicon-32x32.png",
        )
