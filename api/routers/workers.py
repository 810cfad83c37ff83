"""/workers: agents register (and get their own credential), heartbeat and claim jobs."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api import crud, jobqueue
from api.deps import DB, Read, Registrar, SettingsDep, WorkerAuth, as_worker
from api.jsonbody import UniqueKeysRoute
from api.routers.common import IdPath, Limit, Offset, job_out, worker_out
from api.schemas import ClaimIn, JobClaim, Message, WorkerDeclared, WorkerOut, WorkerRegister, WorkerRegistered

router = APIRouter(prefix="/workers", tags=["workers"], route_class=UniqueKeysRoute)
ERR = {403: {"model": Message}, 404: {"model": Message}, 409: {"model": Message}}


@router.post("", response_model=WorkerRegistered, status_code=201,
             responses={200: {"model": WorkerRegistered, "description": "known name: updated"}, **ERR})
def register(body: WorkerRegister, db: DB, response: Response, settings: SettingsDep, who: Registrar):  # noqa: ANN201
    """Register an agent by unique name (registration token). The answer's ``token`` is the worker's own
    credential, shown once: the worker's heartbeats, claims, leases and results need it. A known name is
    updated only with its own credential (the token stays) or the admin token (a new token is issued and
    the old one stops working); with the registration token alone it is 409."""
    row, created, issued = crud.register_worker(db, body.model_dump(), credential=who.token if who.role == "worker"
                                                else None, admin=who.role == "admin")
    if not created:
        response.status_code = 200
    return {**worker_out(row, settings.worker_alive_seconds), "token": issued}


@router.get("", response_model=list[WorkerOut], dependencies=[Read])
def list_workers(db: DB, settings: SettingsDep, limit: Limit = 100, offset: Offset = 0):  # noqa: ANN201
    return [worker_out(w, settings.worker_alive_seconds) for w in crud.list_workers(db, limit, offset)]


@router.get("/{worker_id}", response_model=WorkerOut, dependencies=[Read], responses=ERR)
def get_worker(worker_id: IdPath, db: DB, settings: SettingsDep):  # noqa: ANN201
    return worker_out(crud.get_worker(db, worker_id), settings.worker_alive_seconds)


@router.post("/{worker_id}/heartbeat", response_model=WorkerOut, responses=ERR)
def heartbeat(worker_id: IdPath, db: DB, settings: SettingsDep, who: WorkerAuth,  # noqa: ANN201
              body: WorkerDeclared | None = None):
    """The agent is alive; the body (optional) updates what it declared: GPUs, device type, host."""
    declared = body.model_dump() if body is not None else None
    return worker_out(crud.heartbeat(db, as_worker(who, worker_id), declared), settings.worker_alive_seconds)


@router.post("/{worker_id}/claim", response_model=JobClaim,
             responses={204: {"description": "no job queued"}, **ERR})
def claim(worker_id: IdPath, db: DB, settings: SettingsDep, who: WorkerAuth,  # noqa: ANN201
          body: ClaimIn | None = None):
    """Claim the oldest queued job that fits this worker (its device type and GPUs) with a lease of
    ``lease_seconds``; renew it with POST /jobs/{id}/lease. With ``rdzv_port`` the worker may get a node slot
    of a multi-node job instead (``slot``): renew it with POST /jobs/{id}/slots/{rank}/lease, which says when
    the whole gang is held and the run starts. 204 when nothing fits. Only the worker itself (its credential)
    claims for it."""
    worker_id = as_worker(who, worker_id)
    crud.heartbeat(db, worker_id)
    jobqueue.expire_leases(db)
    db.commit()
    job = jobqueue.claim_job(db, worker_id, settings.lease_seconds, body.rdzv_port if body is not None else None,
                             whole=body is not None and body.whole, alive_seconds=settings.worker_alive_seconds)
    if job is None:
        return Response(status_code=204)
    plan = crud.get_plan(db, job.plan_id)
    profile = crud.get_profile(db, plan.profile_id).body if job.emulate else None
    cluster = crud.get_cluster(db, plan.cluster_id).body if job.emulate else None
    slot = next((s for s in job.slots if s.worker_id == worker_id), None)
    db.commit()
    out = job_out(job)
    return {"job": out, "slot": next((s for s in out["slots"] if slot is not None and s["node_rank"] == slot.node_rank),
                                     None),
            "lease_seconds": settings.lease_seconds, "plan": crud.plan_document(plan),
            "candidate": crud.job_candidate(db, job), "profile": profile, "cluster": cluster}
