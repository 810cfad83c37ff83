"""/workers: agents register, heartbeat and claim jobs (worker or admin token)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api import crud
from api.deps import DB, Read, SettingsDep, WorkerAuth
from api.routers.common import IdPath, Limit, Offset, job_out, worker_out
from api.schemas import JobClaim, Message, WorkerOut, WorkerRegister

router = APIRouter(prefix="/workers", tags=["workers"])
ERR = {404: {"model": Message}, 409: {"model": Message}}


@router.post("", response_model=WorkerOut, status_code=201, dependencies=[WorkerAuth],
             responses={200: {"model": WorkerOut, "description": "known name: updated"}})
def register(body: WorkerRegister, db: DB, response: Response, settings: SettingsDep):  # noqa: ANN201
    """Register an agent (by unique name; registering again updates it)."""
    row, created = crud.register_worker(db, body.model_dump())
    if not created:
        response.status_code = 200
    return worker_out(row, settings.worker_alive_seconds)


@router.get("", response_model=list[WorkerOut], dependencies=[Read])
def list_workers(db: DB, settings: SettingsDep, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return [worker_out(w, settings.worker_alive_seconds) for w in crud.list_workers(db, limit, offset)]


@router.get("/{worker_id}", response_model=WorkerOut, dependencies=[Read], responses=ERR)
def get_worker(worker_id: IdPath, db: DB, settings: SettingsDep):  # noqa: ANN201
    return worker_out(crud.get_worker(db, worker_id), settings.worker_alive_seconds)


@router.post("/{worker_id}/heartbeat", response_model=WorkerOut, dependencies=[WorkerAuth], responses=ERR)
def heartbeat(worker_id: IdPath, db: DB, settings: SettingsDep):  # noqa: ANN201
    return worker_out(crud.heartbeat(db, worker_id), settings.worker_alive_seconds)


@router.post("/{worker_id}/claim", response_model=JobClaim, dependencies=[WorkerAuth],
             responses={204: {"description": "no job queued"}, **ERR})
def claim(worker_id: IdPath, db: DB, settings: SettingsDep, request: Request):  # noqa: ANN201
    """Claim the oldest queued job with a lease of ``lease_seconds``; renew it with POST /jobs/{id}/lease.
    204 when the queue is empty."""
    crud.heartbeat(db, worker_id)
    crud.expire_leases(db)
    db.commit()
    job = crud.claim_job(db, worker_id, settings.lease_seconds)
    if job is None:
        return Response(status_code=204)
    plan = crud.get_plan(db, job.plan_id)
    profile = crud.get_profile(db, plan.profile_id).body if job.emulate else None
    db.commit()
    return {"job": job_out(job), "lease_seconds": settings.lease_seconds, "plan": crud.plan_document(plan),
            "candidate": crud.job_candidate(db, job), "profile": profile}
