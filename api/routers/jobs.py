"""/jobs: dispatch a plan's candidate to the workers; results and predicted-vs-measured."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from api import crud
from api.deps import DB, Admin, Read, SettingsDep, WorkerAuth
from api.routers.common import IdPath, Limit, Offset, job_out, result_out
from api.schemas import Comparison, FailureIn, JobCreate, JobOut, LeaseOut, Message, ResultIn, ResultOut, WorkerRef

router = APIRouter(prefix="/jobs", tags=["jobs"])
ERR = {404: {"model": Message}, 409: {"model": Message}, 422: {"model": Message}}


@router.post("", response_model=JobOut, status_code=201, dependencies=[Admin], responses=ERR)
def create_job(body: JobCreate, db: DB, settings: SettingsDep):  # noqa: ANN201
    """Queue candidate ``candidate_index`` of a done plan for the workers."""
    return job_out(crud.create_job(db, body.model_dump(), settings.max_attempts))


@router.get("", response_model=list[JobOut], dependencies=[Read])
def list_jobs(db: DB,  # noqa: ANN201
              state: Annotated[Literal["queued", "running", "succeeded", "failed", "cancelled"] | None, Query()] = None,
              plan_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
              limit: Limit = 100, offset: Offset = 0):
    rows = crud.list_jobs(db, state, plan_id, limit, offset)
    done = crud.has_results(db, [r.id for r in rows])
    return [job_out(r, r.id in done) for r in rows]


@router.get("/{job_id}", response_model=JobOut, dependencies=[Read], responses=ERR)
def get_job(job_id: IdPath, db: DB):  # noqa: ANN201
    job = crud.get_job(db, job_id)
    return job_out(job, job.id in crud.has_results(db, [job.id]))


@router.post("/{job_id}/cancel", response_model=JobOut, dependencies=[Admin], responses=ERR)
def cancel_job(job_id: IdPath, db: DB):  # noqa: ANN201
    """Cancel a queued or running job (a running one stops at its agent's next lease renewal)."""
    return job_out(crud.cancel_job(db, job_id))


@router.post("/{job_id}/lease", response_model=LeaseOut, dependencies=[WorkerAuth], responses=ERR)
def renew_lease(job_id: IdPath, body: WorkerRef, db: DB, settings: SettingsDep):  # noqa: ANN201
    """Renew the lease of a claimed job (409: the lease was lost, stop working on it)."""
    job, cancel = crud.renew_lease(db, job_id, body.worker_id, settings.lease_seconds)
    return {"job_id": job.id, "lease_expires_at": job.lease_expires_at, "cancel": cancel}


@router.post("/{job_id}/release", response_model=JobOut, dependencies=[WorkerAuth], responses=ERR)
def release_job(job_id: IdPath, body: WorkerRef, db: DB):  # noqa: ANN201
    """The agent stops (Ctrl-C, SIGTERM): the job goes back to the queue at once."""
    return job_out(crud.release_job(db, job_id, body.worker_id))


@router.post("/{job_id}/fail", response_model=JobOut, dependencies=[WorkerAuth], responses=ERR)
def fail_job(job_id: IdPath, body: FailureIn, db: DB):  # noqa: ANN201
    """The run failed: store the error and the log tail."""
    return job_out(crud.fail_job(db, job_id, body.worker_id, body.error, body.log_tail))


@router.post("/{job_id}/result", response_model=ResultOut, status_code=201, dependencies=[WorkerAuth],
             responses=ERR)
def post_result(job_id: IdPath, body: ResultIn, db: DB):  # noqa: ANN201
    """The measured figures of a run (the executor's result.json), stored beside the prediction."""
    data = body.model_dump()
    data["devices"] = [d.model_dump() for d in body.devices]
    return result_out(crud.store_result(db, job_id, data))


@router.get("/{job_id}/result", response_model=ResultOut, dependencies=[Read], responses=ERR)
def get_result(job_id: IdPath, db: DB):  # noqa: ANN201
    return result_out(crud.get_result(db, job_id))


@router.get("/{job_id}/comparison", response_model=Comparison, dependencies=[Read], responses=ERR)
def get_comparison(job_id: IdPath, db: DB):  # noqa: ANN201
    """Predicted vs measured, field by field with relative errors; measured values are null until the job
    has a result."""
    return crud.comparison(db, job_id)
