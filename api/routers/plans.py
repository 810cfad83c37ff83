"""/plans: plan requests, run in the background and polled; results are stored, never recomputed."""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from api import calibration, crud
from api.deps import DB, Admin, Read, SettingsDep
from api.exports import candidate_export
from api.jsonbody import UniqueKeysRoute
from api.routers.common import IdPath, Limit, Offset, plan_out, plan_summary
from api.schemas import MAX_TOP, Message, PlanCreate, PlanOut, PlanSummary
from api.timelines import candidate_timeline
from planner.export import FRAMEWORKS

router = APIRouter(prefix="/plans", tags=["plans"], route_class=UniqueKeysRoute)


@router.post("", response_model=PlanOut, status_code=201, dependencies=[Admin],
             responses={200: {"model": PlanOut, "description": "the same request was planned (or queued) before"},
                        202: {"model": PlanOut, "description": "queued or running: poll GET /plans/{id}"},
                        422: {"model": Message},
                        429: {"model": Message, "description": "the plan queue is full: retry after Retry-After s"}})
def create_plan(body: PlanCreate, db: DB, request: Request, response: Response, settings: SettingsDep):  # noqa: ANN201
    """Rank the configurations for a stored profile on a stored cluster. Answers 201 with the candidates
    when planning ends within about a second, else 202 with ``status`` queued/running: poll GET
    /plans/{id}. The same inputs again give the stored plan (200) unless it failed. 429 with
    ``Retry-After`` when ``PIPEPLAN_MAX_QUEUED_PLANS`` plans are queued or running."""
    try:
        treq = body.training_request()
    except ValueError as e:
        raise crud.InputError(str(e)) from None
    cluster_id = calibration.newest_version(db, body.cluster_id)  # a calibrated version, when there is one
    row, created = crud.stored_once(db, lambda: crud.create_plan(
        db, body.profile_id, cluster_id, treq.model_dump(mode="json"), max_gpus=settings.max_plan_gpus,
        max_unfinished=settings.max_queued_plans))
    db.commit()
    if not created:
        response.status_code = 200
        if row.status == "queued":
            request.app.state.runner.submit(row.id)
        return plan_out(row)
    fut = request.app.state.runner.submit(row.id)
    try:
        fut.result(timeout=settings.plan_wait_seconds)
    except FutureTimeout:
        pass
    db.expire_all()
    row = crud.get_plan(db, row.id)
    if row.status in ("queued", "running"):
        response.status_code = 202
        response.headers["Location"] = f"/plans/{row.id}"
    return plan_out(row)


@router.get("", response_model=list[PlanSummary], dependencies=[Read])
def list_plans(db: DB, status: Annotated[Literal["queued", "running", "done", "failed"] | None, Query()] = None,  # noqa: ANN201
               profile_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
               limit: Limit = 100, offset: Offset = 0):
    rows = crud.list_plans(db, status, profile_id, limit, offset)
    n = crud.count_candidates(db, [r.id for r in rows])
    return [plan_summary(r, n.get(r.id, 0)) for r in rows]


@router.get("/{plan_id}", response_model=PlanOut, dependencies=[Read], responses={404: {"model": Message}})
def get_plan(plan_id: IdPath, db: DB):  # noqa: ANN201
    return plan_out(crud.get_plan(db, plan_id))


@router.get("/{plan_id}/candidates/{rank}/timeline", dependencies=[Read],
            responses={404: {"model": Message}, 409: {"model": Message}, 422: {"model": Message}})
def get_candidate_timeline(plan_id: IdPath, rank: Annotated[int, Path(ge=0, le=MAX_TOP - 1)], db: DB,
                           request: Request, settings: SettingsDep) -> dict[str, Any]:
    """Per-device timeline of candidate ``rank`` (0 = best): rows of ``[action, start, end]`` (sends add the
    peer device), actions in the schedule IR's text form (``0F1``, ``r1:3B2``, ``1SEND_F2``, ``0ALLREDUCE``,
    ``STEP``). Simulated once in a planner process (``PIPEPLAN_TIMELINE_TIMEOUT_SECONDS``), then stored
    apart from the candidate (``cached``, ``computed_at``)."""
    return candidate_timeline(db, request.app.state.runner, settings.timeline_timeout_seconds, plan_id, rank)


ExportFormat = Literal[tuple(FRAMEWORKS)]  # type: ignore[valid-type]


@router.get("/{plan_id}/candidates/{rank}/export", dependencies=[Read],
            responses={404: {"model": Message}, 409: {"model": Message}, 422: {"model": Message}})
def get_candidate_export(plan_id: IdPath, rank: Annotated[int, Path(ge=0, le=MAX_TOP - 1)], db: DB,
                         request: Request, settings: SettingsDep,
                         format: Annotated[ExportFormat, Query(description="megatron, torchtitan or deepspeed")]
                         ) -> dict[str, Any]:
    """Candidate ``rank`` (0 = best) in a training framework's own terms: ``files`` (Megatron-LM's launch
    script, torchtitan's TOML job config and its schedule CSV, DeepSpeed's JSON config), ``notes`` where
    the framework's run differs from the prediction. A schedule the framework lacks: 422 naming the closest
    it has, the predicted cost of switching to it and the plan's fastest candidate that it runs."""
    return candidate_export(db, request.app.state.runner, settings.timeline_timeout_seconds, plan_id, rank, format)
