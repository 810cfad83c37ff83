"""The web UI (issue 7): server-rendered Jinja2 pages at ``/`` and ``/ui/...`` plus the two JSON endpoints
they need beyond the rest of the API.

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

JSON endpoints added here:

* ``GET /plans/{id}/candidates/{rank}/timeline``: one candidate's per-device timeline. Plans store no
  timelines (500 candidates would make every plan document heavy), so the first request re-simulates
  the candidate with :func:`planner.search.predict` and stores the result in the candidate record under
  ``simulated_timeline``; later requests return the stored one (``cached: true``, ``computed_at``), and
  ``matches_stored`` says whether the re-simulation gave the stored iteration time.
* ``GET /jobs/{id}/timelines``: the predicted timeline of the job's candidate and the measured one from the
  executor's Chrome trace (one row per rank; the last traced iteration), when the result has a trace.

Auth: the HTML pages are open (they hold no data); their scripts send ``Authorization: Bearer <token>``
with the token typed into the page header (kept in the browser's localStorage under ``pipeplan.token``).
With ``PIPEPLAN_OPEN_READS=1`` the read-only pages work without a token; writes (new plan, dispatch,
cancel) need the admin token.

Plotly.js is served from the installed ``plotly`` package (``/ui/vendor/plotly.min.js``), never a CDN, and
loaded only when a chart is drawn, so the table pages stay light. Timelines are drawn on a canvas by
``static/timeline.js`` (tens of thousands of actions: aggregated at low zoom, detail on zoom).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api import crud
from api.deps import DB, Read
from api.routers.common import IdPath
from api.schemas import Message
from planner.request import ALL_SCHEDULES, ASYNC_SCHEDULES
from planner.schedules import SCHEDULE_PARAMETERS

HERE = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
TIMELINE_KEY = "simulated_timeline"
CONFIG_KEYS = ("tensor", "pipeline", "data", "micro_batch", "schedule", "recompute", *SCHEDULE_PARAMETERS)

api_router = APIRouter(tags=["ui"])
pages = APIRouter(include_in_schema=False)


# ---- JSON --------------------------------------------------------------------------------------------

def simulate_candidate(profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any],
                       cand: dict[str, Any]) -> dict[str, Any]:
    """Re-simulate one stored candidate; its timeline document (rows of [action, start, end(, peer)])."""
    from planner.cluster import Cluster
    from planner.profile import ModelProfile
    from planner.request import Config, TrainingRequest
    from planner.search import predict

    config = Config(**{k: cand[k] for k in CONFIG_KEYS if cand.get(k) is not None})
    got = predict(ModelProfile.model_validate(profile), Cluster.model_validate(cluster),
                  TrainingRequest.model_validate(request), config)
    if got.simulation is None:
        raise crud.InputError(f"candidate {config.label()} cannot be simulated: {got.reason or 'rejected'}")
    rows = []
    for row in got.simulation.timeline:
        out = []
        for a, s, e in row:
            if a.kind in ("RECV_F", "RECV_B"):  # instants (the arrival a compute waits for): the sends show it
                continue
            out.append([str(a), s, e, a.peer] if a.kind in ("SEND_F", "SEND_B") else [str(a), s, e])
        rows.append(out)
    stored = cand.get("iteration_time")
    same = stored is not None and abs(got.iteration_time - stored) <= 1e-9 * max(1.0, abs(stored))
    return {"label": config.label(), "devices": len(rows), "makespan": got.simulation.makespan,
            "iteration_time": got.iteration_time, "stored_iteration_time": stored, "matches_stored": same,
            "rows": rows, "computed_at": datetime.now(UTC).isoformat(), "source": "planner.search.predict"}


def candidate_timeline(db: Any, plan_id: int, rank: int) -> dict[str, Any]:
    row = crud.get_candidate(db, plan_id, rank)
    doc = (row.body or {}).get(TIMELINE_KEY)
    cached = doc is not None
    if doc is None:
        profile, cluster, request = crud.plan_inputs(db, plan_id)
        doc = simulate_candidate(profile, cluster, request, row.body)
        crud.store_candidate_field(db, row, TIMELINE_KEY, doc)
    return {"plan_id": plan_id, "rank": rank, "cached": cached, **doc}


@api_router.get("/plans/{plan_id}/candidates/{rank}/timeline", dependencies=[Read],
                responses={404: {"model": Message}, 422: {"model": Message}})
def get_candidate_timeline(plan_id: IdPath, rank: int, db: DB) -> dict[str, Any]:
    """Per-device timeline of candidate ``rank`` (0 = best): rows of ``[action, start, end]`` (sends add the
    peer device), actions in the schedule IR's text form (``0F1``, ``r1:3B2``, ``1SEND_F2``, ``0ALLREDUCE``,
    ``STEP``). Computed once by re-simulating the candidate, then stored (``cached``, ``computed_at``)."""
    if rank < 0 or rank > 100_000:
        raise crud.InputError(f"rank: must be 0..100000, got {rank}")
    return candidate_timeline(db, plan_id, rank)


def trace_timeline(trace: str | None) -> tuple[dict[str, Any] | None, str]:
    """The measured timeline from a Chrome trace (``pipeplan run --trace``): complete ("X") events, one row
    per track (rank), of the last traced iteration, times in seconds from that iteration's first start.
    (None, why) when there is nothing to show."""
    if not trace:
        return None, "the result has no trace"
    try:
        data = json.loads(trace)
    except ValueError as e:
        return None, f"the trace is not JSON: {e}"
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        return None, "the trace has no traceEvents list"
    names: dict[Any, str] = {}
    spans: list[tuple[Any, int, str, float, float]] = []
    for ev in events:
        if not isinstance(ev, dict):
            continue
        tid = (ev.get("pid", 0), ev.get("tid", 0))
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[tid] = str((ev.get("args") or {}).get("name", ""))
        elif ev.get("ph") == "X" and isinstance(ev.get("ts"), int | float):
            it = (ev.get("args") or {}).get("iteration", 0)
            ts, dur = float(ev["ts"]) / 1e6, float(ev.get("dur") or 0.0) / 1e6
            spans.append((tid, it if isinstance(it, int) else 0, str(ev.get("name", "")), ts, ts + dur))
    if not spans:
        return None, "the trace has no timed events"
    last = max(s[1] for s in spans)
    spans = [s for s in spans if s[1] == last]
    t0 = min(s[3] for s in spans)
    tracks = sorted({s[0] for s in spans}, key=lambda t: (t[0], t[1] if isinstance(t[1], int) else 0, str(t[1])))
    rows: list[list[list[Any]]] = [[] for _ in tracks]
    index = {t: i for i, t in enumerate(tracks)}
    for tid, _, name, s, e in spans:
        rows[index[tid]].append([name, s - t0, e - t0])
    for r in rows:
        r.sort(key=lambda x: x[1])
    labels = [names.get(t) or f"track {t[1]}" for t in tracks]
    return {"iteration": last, "devices": len(rows), "labels": labels, "rows": rows,
            "makespan": max(s[4] for s in spans) - t0}, ""


@api_router.get("/jobs/{job_id}/timelines", dependencies=[Read], responses={404: {"model": Message}})
def get_job_timelines(job_id: IdPath, db: DB) -> dict[str, Any]:
    """The predicted timeline of the job's candidate and the measured one (from the result's trace; null
    with ``measured_note`` saying why when there is none yet)."""
    job = crud.get_job(db, job_id)
    predicted = candidate_timeline(db, job.plan_id, job.candidate_index)
    try:
        res = crud.get_result(db, job_id)
    except crud.NotFound:
        measured, note = None, f"job {job_id} has no result yet ({job.state})"
    else:
        measured, note = trace_timeline(res.trace)
    return {"job_id": job.id, "plan_id": job.plan_id, "candidate_index": job.candidate_index,
            "predicted": predicted, "measured": measured, "measured_note": note}


# ---- pages -------------------------------------------------------------------------------------------

def _page(request: Request, name: str, title: str, **ctx: Any) -> HTMLResponse:
    settings = request.app.state.settings
    return templates.TemplateResponse(request, name, {"title": title, "open_reads": settings.open_reads, **ctx})


def model_names() -> list[str]:
    """The models a job may name (the executor builds them; POST /jobs refuses others): the dispatch forms'
    suggestions."""
    from planner.model import PRESETS

    return sorted(PRESETS)


def plan_limits() -> dict[str, int]:
    """The largest value POST /plans accepts per numeric field of the new-plan form, read from
    :class:`api.schemas.PlanCreate`, so the form refuses what the API would."""
    from api.schemas import PlanCreate

    out = {}
    for name in ("global_batch", "gpus", "max_tensor", "top"):
        les = [m.le for m in PlanCreate.model_fields[name].metadata if getattr(m, "le", None) is not None]
        out[name] = int(min(les)) if les else 2**31 - 1
    return out


@pages.get("/", response_class=HTMLResponse)
def new_plan_page(request: Request) -> HTMLResponse:
    return _page(request, "new_plan.html", "New plan", schedules=ALL_SCHEDULES, async_schedules=ASYNC_SCHEDULES,
                 limits=plan_limits())


@pages.get("/ui", response_class=RedirectResponse)
def ui_root() -> RedirectResponse:
    return RedirectResponse("/")


@pages.get("/ui/plans", response_class=HTMLResponse)
def plans_page(request: Request) -> HTMLResponse:
    return _page(request, "plans.html", "Plans")


@pages.get("/ui/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(request: Request, plan_id: IdPath) -> HTMLResponse:
    return _page(request, "plan.html", f"Plan {plan_id}", plan_id=plan_id, models=model_names())


@pages.get("/ui/jobs", response_class=HTMLResponse)
def jobs_page(request: Request) -> HTMLResponse:
    return _page(request, "jobs.html", "Jobs")


@pages.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: IdPath) -> HTMLResponse:
    return _page(request, "job.html", f"Job {job_id}", job_id=job_id, models=model_names())


@pages.get("/ui/workers", response_class=HTMLResponse)
def workers_page(request: Request) -> HTMLResponse:
    return _page(request, "workers.html", "Workers")


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
    """Add the UI to ``app``: the JSON endpoints, the pages and ``/ui/static``."""
    app.include_router(api_router)
    app.include_router(pages)
    app.mount("/ui/static", StaticFiles(directory=str(HERE / "static")), name="ui-static")
