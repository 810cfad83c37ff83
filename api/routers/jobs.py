"""/jobs: dispatch a plan's candidate to the workers; results and predicted-vs-measured."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from sqlalchemy.orm import Session

from api import crud, gang, jobqueue
from api.comparison import comparison
from api.deps import DB, Admin, Read, SettingsDep, WorkerAuth, as_worker
from api.jsonbody import UniqueKeysRoute
from api.routers.common import IdPath, Limit, Offset, job_out, result_out
from api.schemas import (
    Comparison,
    FailureIn,
    JobCreate,
    JobOut,
    LeaseOut,
    Message,
    ResultIn,
    ResultOut,
    SlotLeaseOut,
    WorkerRef,
)
from api.settings import Settings
from api.timelines import candidate_timeline, trace_timeline
from db.models import Job

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=UniqueKeysRoute)
RankPath = Annotated[int, Path(ge=0, le=65535, description="node rank of the slot")]
ERR = {403: {"model": Message}, 404: {"model": Message}, 409: {"model": Message}, 422: {"model": Message}}


@router.post("", response_model=JobOut, status_code=201, dependencies=[Admin], responses=ERR)
def create_job(body: JobCreate, db: DB, settings: SettingsDep):  # noqa: ANN201
    """Queue candidate ``candidate_index`` of a done plan for the workers."""
    job = crud.create_job(db, body.model_dump(), settings.max_attempts, settings.max_node_processes)
    return _job_answer(db, job, settings)


def _job_answer(db: Session, job: Job, settings: Settings) -> dict[str, Any]:
    """A job with what GET /jobs/{id} gives: why it waits, its predicted (and measured) iteration time, and the
    cluster version its plan used (POST /jobs and cancel answered these null)."""
    times = crud.iteration_times(db, [job.id]).get(job.id)
    return job_out(job, times is not None and times[1] is not None,
                   gang.waiting_reason(db, job, settings.worker_alive_seconds), times,
                   crud.plan_clusters(db, [job.plan_id]).get(job.plan_id))


@router.get("", response_model=list[JobOut], dependencies=[Read])
def list_jobs(db: DB, settings: SettingsDep,  # noqa: ANN201
              state: Annotated[Literal["queued", "running", "succeeded", "failed", "cancelled"] | None, Query()] = None,
              plan_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
              limit: Limit = 100, offset: Offset = 0):
    """Jobs, newest first; each with its predicted and (once finished) measured iteration time and their
    ratio, measured / predicted."""
    rows = crud.list_jobs(db, state, plan_id, limit, offset)
    times = crud.iteration_times(db, [r.id for r in rows])
    clusters = crud.plan_clusters(db, [r.plan_id for r in rows])
    alive = settings.worker_alive_seconds
    workers = gang.alive_workers(db, alive) if any(r.state == "queued" for r in rows) else []
    return [job_out(r, times.get(r.id, (None, None))[1] is not None, gang.waiting_reason(db, r, alive, workers),
                    times.get(r.id), clusters.get(r.plan_id)) for r in rows]


@router.get("/{job_id}", response_model=JobOut, dependencies=[Read], responses=ERR)
def get_job(job_id: IdPath, db: DB, settings: SettingsDep):  # noqa: ANN201
    """A job; ``waiting`` says why a queued one is not running yet (e.g. no agent with its device);
    ``cluster_id`` is the cluster version its plan was made on (GET /clusters/{id} names it)."""
    return _job_answer(db, crud.get_job(db, job_id), settings)


@router.post("/{job_id}/cancel", response_model=JobOut, dependencies=[Admin], responses=ERR)
def cancel_job(job_id: IdPath, db: DB, settings: SettingsDep):  # noqa: ANN201
    """Cancel a queued or running job (a running one stops at its agent's next lease renewal)."""
    return _job_answer(db, jobqueue.cancel_job(db, job_id), settings)


@router.post("/{job_id}/lease", response_model=LeaseOut, responses=ERR)
def renew_lease(job_id: IdPath, body: WorkerRef, db: DB, settings: SettingsDep, who: WorkerAuth):  # noqa: ANN201
    """Renew the lease of a claimed job (409: the lease was lost, stop working on it). Only the worker
    holding the job (its credential) may."""
    job, cancel = jobqueue.renew_lease(db, job_id, as_worker(who, body.worker_id), settings.lease_seconds)
    return {"job_id": job.id, "lease_expires_at": job.lease_expires_at, "cancel": cancel}


@router.post("/{job_id}/release", response_model=JobOut, responses=ERR)
def release_job(job_id: IdPath, body: WorkerRef, db: DB, who: WorkerAuth):  # noqa: ANN201
    """The agent stops (Ctrl-C, SIGTERM): the job goes back to the queue at once."""
    return job_out(jobqueue.release_job(db, job_id, as_worker(who, body.worker_id)))


@router.post("/{job_id}/fail", response_model=JobOut, responses=ERR)
def fail_job(job_id: IdPath, body: FailureIn, db: DB, who: WorkerAuth):  # noqa: ANN201
    """The run failed: store the error and the log tail."""
    return job_out(jobqueue.fail_job(db, job_id, as_worker(who, body.worker_id), body.error, body.log_tail))


@router.post("/{job_id}/slots/{node_rank}/lease", response_model=SlotLeaseOut, responses=ERR)
def renew_slot(job_id: IdPath, node_rank: RankPath, body: WorkerRef, db: DB, settings: SettingsDep,  # noqa: ANN201
               who: WorkerAuth):
    """A multi-node job's node slot checks in: renews its lease and says what to do (wait for the gang,
    start the run with the rendezvous, stop). 409: the slot is not this worker's any more (the gang was
    stopped): kill the run."""
    return gang.renew_slot(db, job_id, node_rank, as_worker(who, body.worker_id), settings.lease_seconds,
                           settings.gang_wait_seconds)


@router.post("/{job_id}/slots/{node_rank}/release", response_model=JobOut, responses=ERR)
def release_slot(job_id: IdPath, node_rank: RankPath, body: WorkerRef, db: DB, who: WorkerAuth):  # noqa: ANN201
    """The slot's agent stops: a forming gang's slot opens again; a running gang stops and is queued again
    (the attempt does not count)."""
    return job_out(gang.release_slot(db, job_id, node_rank, as_worker(who, body.worker_id)))


@router.post("/{job_id}/slots/{node_rank}/fail", response_model=JobOut, responses=ERR)
def fail_slot(job_id: IdPath, node_rank: RankPath, body: FailureIn, db: DB, who: WorkerAuth):  # noqa: ANN201
    """This node's run failed: the whole gang stops and the job is queued again (failed after max_attempts)."""
    return job_out(gang.fail_slot(db, job_id, node_rank, as_worker(who, body.worker_id), body.error, body.log_tail))


@router.post("/{job_id}/slots/{node_rank}/done", response_model=JobOut, responses=ERR)
def finish_slot(job_id: IdPath, node_rank: RankPath, body: WorkerRef, db: DB, who: WorkerAuth):  # noqa: ANN201
    """This node's run ended well without the result (global rank 0 ran on another node)."""
    return job_out(gang.finish_slot(db, job_id, node_rank, as_worker(who, body.worker_id)))


@router.post("/{job_id}/result", response_model=ResultOut, status_code=201, responses={
    200: {"model": ResultOut, "description": "this worker's result was stored before (a repeated post)"}, **ERR})
def post_result(job_id: IdPath, body: ResultIn, db: DB, who: WorkerAuth, response: Response):  # noqa: ANN201
    """The measured figures of a run (the executor's result.json), stored beside the prediction. Only
    from the worker holding the job; the same worker posting again gets its stored result (200)."""
    data = body.model_dump()
    data["devices"] = [d.model_dump(exclude_unset=True) for d in body.devices]  # no peak_memory: not measured
    row, created = jobqueue.store_result(db, job_id, as_worker(who, body.worker_id), data)
    if not created:
        response.status_code = 200
    return result_out(row)


@router.get("/{job_id}/result", response_model=ResultOut, dependencies=[Read], responses=ERR)
def get_result(job_id: IdPath, db: DB):  # noqa: ANN201
    return result_out(crud.get_result(db, job_id))


@router.get("/{job_id}/comparison", response_model=Comparison, dependencies=[Read], responses=ERR)
def get_comparison(job_id: IdPath, db: DB):  # noqa: ANN201
    """Predicted vs measured, field by field with relative errors; measured values are null until the job
    has a result."""
    return comparison(db, job_id)


@router.get("/{job_id}/timelines", dependencies=[Read], responses=ERR)
def get_job_timelines(job_id: IdPath, db: DB, request: Request, settings: SettingsDep) -> dict[str, Any]:
    """The predicted timeline of the job's candidate and the measured one (from the result's trace; null
    with ``measured_note`` saying why when there is none yet)."""
    job = crud.get_job(db, job_id)
    try:
        res = crud.get_result(db, job_id)
    except crud.NotFound:
        measured, note = None, f"job {job_id} has no result yet ({job.state})"
    else:
        measured, note = trace_timeline(res.trace)
    predicted = candidate_timeline(db, request.app.state.runner, settings.timeline_timeout_seconds,
                                   job.plan_id, job.candidate_index)
    return {"job_id": job.id, "plan_id": job.plan_id, "candidate_index": job.candidate_index,
            "predicted": predicted, "measured": measured, "measured_note": note}
