"""The web UI (issue 7): server-rendered Jinja2 pages at ``/`` and ``/ui/...``; every JSON endpoint they
read lives in its resource's router (the timelines: ``api/routers/plans.py`` and ``api/routers/jobs.py``).

Pages (no data in the HTML: each page's script reads the JSON endpoints, so everything it shows is also
reachable as JSON, and every URL can be shared):

* ``/``                 new plan: stored profile + cluster (or an uploaded profile JSON), request fields;
                        POST /plans, poll GET /plans/{id}, then go to the comparison page
* ``/ui/plans``         plans (GET /plans)
* ``/ui/plans/{id}``    comparison: ranked candidates (GET /plans/{id}) as a sortable, filterable table;
                        1-4 selected side by side: timeline, memory per device, time breakdown; dispatch
* ``/ui/jobs``          jobs (GET /jobs)
* ``/ui/jobs/{id}``     job: state, predicted vs measured (GET /jobs/{id}/comparison), predicted timeline
                        above the measured one (GET /jobs/{id}/timelines)
* ``/ui/workers``       workers, last heartbeat, current job (GET /workers, GET /jobs?state=running)
* ``/ui/clusters``      clusters with their versions (GET /clusters)
* ``/ui/clusters/{id}`` cluster: its versions, the newest calibration's factors and warnings, each finished
                        job's prediction error before and after calibration (GET /clusters/{id}/calibration);
                        calibrate (POST /clusters/{id}/calibrate)

A plan, job or cluster page of an id that names none answers 404 with the page (its script says "plan 999 not
found"), as an address with a bad id does (``/ui/plans/abc``: api/main.py's not-found page).

Timelines (``GET /plans/{id}/candidates/{rank}/timeline``, ``GET /jobs/{id}/timelines``): computed in a
planner process on first request and stored apart from the candidates (:mod:`api.timelines`).

Auth: the HTML pages are open (they hold no data); their scripts send ``Authorization: Bearer <token>``
with the token typed into the page header (kept in the browser's localStorage under ``pipeplan.token``).
With ``PIPEPLAN_OPEN_READS=1`` the read-only pages work without a token; writes (new plan, dispatch,
cancel, calibrate) need the admin token.

Plotly.js is served from the installed ``plotly`` package (``/ui/vendor/plotly.min.js``), never a CDN, and
loaded only when a chart is drawn, so the table pages stay light. Timelines are drawn on a canvas by
``static/timeline.js`` (tens of thousands of actions: aggregated at low zoom, detail on zoom).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api.deps import DB
from api.routers.common import IdPath
from db.models import ClusterRow, Job, PlanRequest
from planner.fsdp import INCOMPATIBLE as FSDP_INCOMPATIBLE
from planner.request import ALL_SCHEDULES, ASYNC_SCHEDULES

HERE = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

pages = APIRouter(include_in_schema=False)


# ---- pages -------------------------------------------------------------------------------------------

def _page(request: Request, name: str, title: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
    settings = request.app.state.settings
    return templates.TemplateResponse(request, name, {"title": title, "open_reads": settings.open_reads, **ctx},
                                      status_code=status_code)


def _found(db: DB, model: Any, row_id: int) -> int:
    """The page's status: 404 where no ``model`` row has the id (/ui/plans/999 as /ui/plans/abc), 200 otherwise. The
    page itself is the same (it holds no data): its script reads the JSON, says "plan 999 not found" and hides its
    empty frame."""
    return 200 if db.get(model, row_id) is not None else 404


def model_names() -> list[str]:
    """The models a job may name (the executor builds them; POST /jobs refuses others): the dispatch forms'
    suggestions."""
    from planner.model import PRESETS

    return sorted(PRESETS)


def _field_max(model: Any, name: str) -> int:
    """The largest value ``model`` (a request schema of :mod:`api.schemas`) accepts in its field ``name``: its
    ``le`` bound, or the 32-bit integer column's largest without one."""
    les = [m.le for m in model.model_fields[name].metadata if getattr(m, "le", None) is not None]
    return int(min(les)) if les else 2**31 - 1


def max_iterations() -> int:
    """The most iterations POST /jobs accepts (:class:`api.schemas.JobCreate`): the dispatch forms' bound."""
    from api.schemas import JobCreate

    return _field_max(JobCreate, "iterations")


def plan_limits() -> dict[str, int]:
    """The largest value POST /plans accepts per numeric field of the new-plan form, read from
    :class:`api.schemas.PlanCreate`, so the form refuses what the API would."""
    from api.schemas import PlanCreate

    return {name: _field_max(PlanCreate, name) for name in ("global_batch", "gpus", "max_tensor", "max_expert", "top")}


@pages.get("/", response_class=HTMLResponse)
def new_plan_page(request: Request) -> HTMLResponse:
    return _page(request, "new_plan.html", "New plan", schedules=ALL_SCHEDULES, async_schedules=ASYNC_SCHEDULES,
                 unsharded_schedules=FSDP_INCOMPATIBLE, limits=plan_limits())


@pages.get("/ui", response_class=RedirectResponse)
def ui_root() -> RedirectResponse:
    return RedirectResponse("/")


@pages.get("/ui/plans", response_class=HTMLResponse)
def plans_page(request: Request) -> HTMLResponse:
    return _page(request, "plans.html", "Plans")


@pages.get("/ui/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(request: Request, plan_id: IdPath, db: DB) -> HTMLResponse:
    return _page(request, "plan.html", f"Plan {plan_id}", _found(db, PlanRequest, plan_id), plan_id=plan_id,
                 models=model_names(), max_node_processes=request.app.state.settings.max_node_processes,
                 max_iterations=max_iterations())


@pages.get("/ui/jobs", response_class=HTMLResponse)
def jobs_page(request: Request) -> HTMLResponse:
    return _page(request, "jobs.html", "Jobs")


@pages.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: IdPath, db: DB) -> HTMLResponse:
    return _page(request, "job.html", f"Job {job_id}", _found(db, Job, job_id), job_id=job_id, models=model_names(),
                 max_iterations=max_iterations())


@pages.get("/ui/workers", response_class=HTMLResponse)
def workers_page(request: Request) -> HTMLResponse:
    return _page(request, "workers.html", "Workers")


@pages.get("/ui/clusters", response_class=HTMLResponse)
def clusters_page(request: Request) -> HTMLResponse:
    return _page(request, "clusters.html", "Clusters")


@pages.get("/ui/clusters/{cluster_id}", response_class=HTMLResponse)
def cluster_page(request: Request, cluster_id: IdPath, db: DB) -> HTMLResponse:
    return _page(request, "cluster.html", f"Cluster {cluster_id}", _found(db, ClusterRow, cluster_id),
                 cluster_id=cluster_id)


def plotly_path() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


@pages.get("/ui/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    path = plotly_path()
    if not path.is_file():
        raise HTTPException(404, f"plotly.min.js not found at {path} (pip install plotly)")
    return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})


def install(app: FastAPI) -> None:
    """Add the UI to ``app``: the pages and ``/ui/static``."""
    app.include_router(pages)
    app.mount("/ui/static", StaticFiles(directory=str(HERE / "static")), name="ui-static")
