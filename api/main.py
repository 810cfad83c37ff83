"""The FastAPI app: ``create_app(settings)``; ``api.main:app`` for uvicorn (settings from the environment).

On startup it checks that the database schema is at the migrations' head (else it refuses to start and
names ``pipeplan db-upgrade``), warns when no admin token is set, takes the queued plans, and starts the
reaper (running jobs whose lease ran out and plans whose runner died go back to the queue). On shutdown it
stops its planner processes and puts their plans back in the queue. Request bodies above
``PIPEPLAN_MAX_BODY_BYTES`` are refused with 413 before they are read whole.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import escape
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.exc import DataError, IntegrityError, StatementError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import crud, jobqueue
from api.bodylimit import BodyLimit
from api.errors import clean_errors, validation_message
from api.metrics import Metrics
from api.planrun import PlanRunner
from api.routers import auth, clusters, health, jobs, plans, profiles, workers
from api.settings import Settings
from db.migrate import check
from db.session import make_engine, make_sessionmaker

log = logging.getLogger("pipeplan.api")


class Reaper(threading.Thread):
    """Puts running jobs with an expired lease back in the queue (or fails them) every ``interval`` s."""

    def __init__(self, app: FastAPI, interval: float) -> None:
        super().__init__(name="lease-reaper", daemon=True)
        self.app, self.interval, self.stop = app, interval, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                with self.app.state.sessions.begin() as db:
                    changed = jobqueue.expire_leases(db)
                if changed:
                    log.info("leases expired: jobs %s", changed)
                self.app.state.runner.poll()
            except Exception:  # noqa: BLE001 - keep reaping after a transient database error
                log.exception("lease reaper")


def app_logging() -> None:
    """The application's INFO logs (plans re-queued, leases expired) reach the server's log: uvicorn sets
    up only its own loggers, and Python's fallback handler shows warnings and above only."""
    root = logging.getLogger("pipeplan")
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        root.addHandler(handler)


def not_found_page(path: str) -> HTMLResponse:
    """The UI's page for an address that names no page (a bad id, or no such page)."""
    return HTMLResponse(status_code=404, content=(
        f"<!doctype html><title>pipeplan: not found</title><p>No page at <code>{escape(path)}</code>: a plan, job "
        f"or cluster is named by its number (1, 2, ...).</p><p><a href=\"/\">New plan</a> · "
        f"<a href=\"/ui/plans\">Plans</a> · <a href=\"/ui/jobs\">Jobs</a></p>"))


def docs_page(app: FastAPI) -> HTMLResponse:
    """/docs and /redoc: the endpoints listed from the OpenAPI document, served from here. FastAPI's own pages load
    Swagger UI and ReDoc from cdn.jsdelivr.net and are blank on a host without internet; no installed package has
    their files (the UI serves plotly from its package, never a CDN), so they are links here, marked as needing
    internet."""
    rows = []
    for path, ops in app.openapi().get("paths", {}).items():
        for method, op in ops.items():
            summary = op.get("summary") or ""
            rows.append(f"<tr><td><code>{escape(method.upper())}</code></td><td><code>{escape(path)}</code></td>"
                        f"<td>{escape(summary)}</td></tr>")
    return HTMLResponse(
        "<!doctype html><meta charset=\"utf-8\"><title>pipeplan API</title>"
        f"<h1>pipeplan API {escape(app.version)}</h1><p>The OpenAPI document: <a href=\"/openapi.json\">/openapi.json"
        "</a> (every endpoint, body and answer). The interactive docs, <a href=\"/docs/swagger\">Swagger UI</a> and "
        "<a href=\"/docs/redoc\">ReDoc</a>, load their scripts from cdn.jsdelivr.net: they need internet (blank "
        "without it).</p><table><thead><tr><th>Method</th><th>Path</th><th>What</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table><p><a href=\"/\">The web UI</a></p>")


def install_docs(app: FastAPI) -> None:
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    @app.get("/docs", include_in_schema=False)
    @app.get("/redoc", include_in_schema=False)
    def _docs() -> HTMLResponse:
        return docs_page(app)

    @app.get("/docs/swagger", include_in_schema=False)
    def _swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="pipeplan API (Swagger UI)")

    @app.get("/docs/redoc", include_in_schema=False)
    def _redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="pipeplan API (ReDoc)")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app_logging()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        try:
            check(engine)
        except Exception:
            engine.dispose()
            raise
        app.state.engine = engine
        app.state.sessions = make_sessionmaker(engine)
        if not settings.admin_token:
            log.warning("no admin token is set (PIPEPLAN_ADMIN_TOKEN): every write endpoint answers 401 until "
                        "one is set")
        app.state.runner = PlanRunner(app.state.sessions, settings)
        with app.state.sessions.begin() as db:
            jobqueue.grace_running_leases(db, settings.lease_seconds)
        app.state.runner.recover()
        reaper = Reaper(app, settings.reaper_interval)
        reaper.start()
        try:
            yield
        finally:
            reaper.stop.set()
            app.state.runner.shutdown()
            reaper.join(5)
            engine.dispose()

    app = FastAPI(title="pipeplan", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Plan pipeline/tensor/data-parallel training from model profiles, dispatch the "
                              "chosen configuration to worker agents, compare predicted and measured.")
    app.state.settings = settings
    app.state.metrics = Metrics(app)
    app.middleware("http")(app.state.metrics.middleware)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = clean_errors(exc.errors())
        if request.url.path.startswith("/ui/"):  # a page's address with a bad id: a page, not the API's JSON
            return not_found_page(request.url.path)
        return JSONResponse(status_code=422, content={"detail": validation_message(errors), "errors": errors})

    @app.exception_handler(StarletteHTTPException)
    async def _routing(request: Request, exc: StarletteHTTPException) -> Response:
        """What the router itself raises (no route: 404, 405): an address under /ui/ that is no page gets the
        not-found page (it was the API's JSON, {"detail": "Not Found"}); the scripts and styles under
        /ui/static and /ui/vendor, and the API, keep their JSON."""
        path = request.url.path
        if exc.status_code == 404 and path.startswith("/ui/") and not path.startswith(("/ui/static/", "/ui/vendor/")):
            return not_found_page(path)
        return await http_exception_handler(request, exc)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc.detail)},
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(crud.InputError)
    async def _input(_: Request, exc: crud.InputError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(crud.NotFound)
    async def _not_found(_: Request, exc: crud.NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc.args[0])})

    @app.exception_handler(crud.Busy)
    async def _busy(_: Request, exc: crud.Busy) -> JSONResponse:
        return JSONResponse(status_code=429, content={"detail": str(exc)},
                            headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(crud.Conflict)
    async def _conflict(_: Request, exc: crud.Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(IntegrityError)
    async def _integrity(_: Request, exc: IntegrityError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": f"conflicts with stored data: {exc.orig}"})

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": f"a value does not fit the database: {exc.orig}"})

    @app.exception_handler(StatementError)
    async def _statement(request: Request, exc: StatementError) -> JSONResponse:
        if isinstance(exc.orig, UnicodeError | OverflowError | ValueError):
            return JSONResponse(status_code=422, content={"detail": f"a value cannot be stored: {exc.orig}"})
        log.error("database error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=500, content={"detail": "internal database error"})

    for r in (profiles.router, clusters.router, plans.router, jobs.router, workers.router, health.router,
              auth.router):
        app.include_router(r)
    install_docs(app)
    from api.routers import ui  # web UI: pages at / and /ui/..., /ui/static
    ui.install(app)
    return app


def __getattr__(name: str) -> Any:  # ``api.main:app`` builds the app on first use (settings from env)
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
