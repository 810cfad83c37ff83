"""Database operations of the API (no HTTP here): create/list/get, the job state machine, claiming."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from db.models import CandidateRow, ClusterRow, Job, PlanRequest, Profile, Result, Worker, finite, utcnow
from planner.cluster import Cluster
from planner.profile import ModelProfile


class InputError(ValueError):
    """Bad input found past schema validation: the API answers 422 with this message."""


class Conflict(RuntimeError):
    """The request does not fit the current state: the API answers 409."""


class NotFound(LookupError):
    """The API answers 404."""


def check_text(value: str, field: str, max_length: int = 200) -> str:
    if len(value) > max_length:
        raise InputError(f"{field}: at most {max_length} characters, got {len(value)}")
    if "\x00" in value:
        raise InputError(f"{field}: must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{field}: not valid Unicode text ({e.reason})") from None
    return value


def _event(job: Job, event: str, **kw: Any) -> None:
    job.history = [*(job.history or []), {"at": utcnow().isoformat(), "event": event, **kw}]


# ---- profiles and clusters ------------------------------------------------------------------------

def add_profile(db: Session, profile: ModelProfile) -> tuple[Profile, bool]:
    """Store ``profile`` unless one with the same content hash exists; return (row, created)."""
    check_text(profile.name, "name")
    check_text(profile.device, "device")
    check_text(profile.dtype, "dtype", 32)
    h = profile.content_hash()
    row = db.scalar(select(Profile).where(Profile.content_hash == h))
    if row is not None:
        return row, False
    row = Profile(content_hash=h, name=profile.name, device=profile.device, dtype=profile.dtype,
                  source=profile.source, num_layers=len(profile.layers), total_params=float(profile.total_params),
                  body=profile.model_dump(mode="json"))
    db.add(row)
    db.flush()
    return row, True


def _listed(db: Session, model: Any, name: str | None, device: str | None, limit: int, offset: int) -> list[Any]:
    """Rows of a versioned input table (profiles, clusters) by id, filtered by name and device."""
    q = select(model).order_by(model.id)
    if name is not None:
        q = q.where(model.name == name)
    if device is not None:
        q = q.where(model.device == device)
    return list(db.scalars(q.limit(limit).offset(offset)))


def _got(db: Session, model: Any, what: str, row_id: int) -> Any:
    row = db.get(model, row_id)
    if row is None:
        raise NotFound(f"{what} {row_id} not found")
    return row


def _delete_unused(db: Session, model: Any, what: str, used_by: Any, row_id: int) -> None:
    """Delete an input row unless a plan refers to it (``used_by``: the plan column naming it)."""
    row = _got(db, model, what, row_id)
    used = db.scalar(select(func.count()).select_from(PlanRequest).where(used_by == row_id))
    if used:
        raise Conflict(f"{what} {row_id} is used by {used} plan(s); delete is refused to keep them valid")
    db.delete(row)


def list_profiles(db: Session, name: str | None, device: str | None, limit: int, offset: int) -> list[Profile]:
    return _listed(db, Profile, name, device, limit, offset)


def get_profile(db: Session, profile_id: int) -> Profile:
    return _got(db, Profile, "profile", profile_id)


def delete_profile(db: Session, profile_id: int) -> None:
    _delete_unused(db, Profile, "profile", PlanRequest.profile_id, profile_id)


def add_cluster(db: Session, cluster: Cluster, max_gpus: int) -> tuple[ClusterRow, bool]:
    check_text(cluster.name, "name")
    check_text(cluster.device, "device")
    if cluster.gpus > max_gpus:
        raise InputError(f"nodes * gpus_per_node = {cluster.gpus} exceeds this server's limit of {max_gpus} GPUs")
    h = cluster.content_hash()
    row = db.scalar(select(ClusterRow).where(ClusterRow.content_hash == h))
    if row is not None:
        return row, False
    row = ClusterRow(content_hash=h, name=cluster.name, device=cluster.device, gpus=cluster.gpus,
                     body=cluster.model_dump(mode="json"))
    db.add(row)
    db.flush()
    return row, True


def list_clusters(db: Session, name: str | None, device: str | None, limit: int, offset: int) -> list[ClusterRow]:
    return _listed(db, ClusterRow, name, device, limit, offset)


def get_cluster(db: Session, cluster_id: int) -> ClusterRow:
    return _got(db, ClusterRow, "cluster", cluster_id)


def delete_cluster(db: Session, cluster_id: int) -> None:
    _delete_unused(db, ClusterRow, "cluster", PlanRequest.cluster_id, cluster_id)


# ---- plans ----------------------------------------------------------------------------------------------

def request_hash(profile_id: int, cluster_id: int, request: dict[str, Any]) -> str:
    data = json.dumps({"profile": profile_id, "cluster": cluster_id, "request": request}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def create_plan(db: Session, profile_id: int, cluster_id: int, request: dict[str, Any]) -> tuple[PlanRequest, bool]:
    """A new queued plan request, or the stored one with the same inputs (not failed): (row, created)."""
    if db.get(Profile, profile_id) is None:
        raise InputError(f"profile_id: profile {profile_id} not found")
    cluster = db.get(ClusterRow, cluster_id)
    if cluster is None:
        raise InputError(f"cluster_id: cluster {cluster_id} not found")
    gpus = request.get("gpus")
    if gpus is not None and gpus > cluster.gpus:
        raise InputError(f"gpus: budget {gpus} exceeds the cluster's {cluster.gpus} GPUs")
    h = request_hash(profile_id, cluster_id, request)
    existing = db.scalar(select(PlanRequest).where(PlanRequest.request_hash == h, PlanRequest.status != "failed")
                         .order_by(PlanRequest.id.desc()).limit(1))
    if existing is not None:
        return existing, False
    row = PlanRequest(profile_id=profile_id, cluster_id=cluster_id, request=request, request_hash=h,
                      status="queued", attempts=0)
    db.add(row)
    db.flush()
    return row, True


def get_plan(db: Session, plan_id: int) -> PlanRequest:
    row = db.get(PlanRequest, plan_id)
    if row is None:
        raise NotFound(f"plan {plan_id} not found")
    return row


def list_plans(db: Session, status: str | None, profile_id: int | None, limit: int, offset: int) -> list[PlanRequest]:
    q = select(PlanRequest).order_by(PlanRequest.id)
    if status is not None:
        q = q.where(PlanRequest.status == status)
    if profile_id is not None:
        q = q.where(PlanRequest.profile_id == profile_id)
    return list(db.scalars(q.limit(limit).offset(offset)))


def count_candidates(db: Session, plan_ids: list[int]) -> dict[int, int]:
    if not plan_ids:
        return {}
    rows = db.execute(select(CandidateRow.plan_id, func.count()).where(CandidateRow.plan_id.in_(plan_ids))
                      .group_by(CandidateRow.plan_id))
    return {pid: n for pid, n in rows}


def start_plan(db: Session, plan_id: int) -> bool:
    """queued -> running, atomically; False if another runner took it or it is not queued."""
    res = db.execute(update(PlanRequest).where(PlanRequest.id == plan_id, PlanRequest.status == "queued")
                     .values(status="running", started_at=utcnow(), attempts=PlanRequest.attempts + 1))
    return res.rowcount == 1


def finish_plan(db: Session, plan_id: int, result: dict[str, Any]) -> None:
    row = get_plan(db, plan_id)
    db.execute(delete(CandidateRow).where(CandidateRow.plan_id == plan_id))
    for rank, cand in enumerate(result["candidates"]):
        cand = finite(cand)
        db.add(CandidateRow(plan_id=plan_id, rank=rank, label=str(cand.get("label", ""))[:400],
                            iteration_time=cand.get("iteration_time"), throughput=cand.get("throughput"),
                            body=cand))
    row.summary = {k: v for k, v in result.items() if k != "candidates"}
    row.status = "done"
    row.error = None
    row.finished_at = utcnow()


def fail_plan(db: Session, plan_id: int, error: str) -> None:
    row = get_plan(db, plan_id)
    row.status = "failed"
    row.error = error[:10_000]
    row.finished_at = utcnow()


def requeue_unfinished_plans(db: Session) -> list[int]:
    """After a restart: plans left running go back to queued; return every queued plan id."""
    db.execute(update(PlanRequest).where(PlanRequest.status == "running").values(status="queued"))
    return list(db.scalars(select(PlanRequest.id).where(PlanRequest.status == "queued").order_by(PlanRequest.id)))


def plan_inputs(db: Session, plan_id: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    row = get_plan(db, plan_id)
    return get_profile(db, row.profile_id).body, get_cluster(db, row.cluster_id).body, row.request


def plan_document(row: PlanRequest) -> dict[str, Any]:
    """The stored plan as ``pipeplan plan --json`` prints it."""
    summary = row.summary or {}
    return {"candidates": [c.body for c in row.candidates], **summary}


# ---- jobs -----------------------------------------------------------------------------------------------

def create_job(db: Session, spec: dict[str, Any], default_attempts: int) -> Job:
    plan = db.get(PlanRequest, spec["plan_id"])
    if plan is None:
        raise InputError(f"plan_id: plan {spec['plan_id']} not found")
    if plan.status != "done":
        raise Conflict(f"plan_id: plan {plan.id} is {plan.status}; jobs can be made from done plans only"
                       + (f" (error: {plan.error})" if plan.error else ""))
    n = len(plan.candidates)
    if spec["candidate_index"] >= n:
        raise InputError(f"candidate_index: plan {plan.id} has {n} candidate(s) (0..{n - 1}), "
                         f"got {spec['candidate_index']}")
    job = Job(plan_id=plan.id, candidate_index=spec["candidate_index"], model=spec["model"],
              iterations=spec["iterations"], emulate=spec["emulate"], state="queued", attempts=0,
              max_attempts=spec.get("max_attempts") or default_attempts, history=[])
    _event(job, "created")
    db.add(job)
    db.flush()
    return job


def get_job(db: Session, job_id: int) -> Job:
    row = db.get(Job, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def list_jobs(db: Session, state: str | None, plan_id: int | None, limit: int, offset: int) -> list[Job]:
    q = select(Job).order_by(Job.id)
    if state is not None:
        q = q.where(Job.state == state)
    if plan_id is not None:
        q = q.where(Job.plan_id == plan_id)
    return list(db.scalars(q.limit(limit).offset(offset)))


def has_results(db: Session, job_ids: list[int]) -> set[int]:
    if not job_ids:
        return set()
    return set(db.scalars(select(Result.job_id).where(Result.job_id.in_(job_ids))))


def cancel_job(db: Session, job_id: int) -> Job:
    job = get_job(db, job_id)
    if job.state in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"job {job_id} is already {job.state}")
    res = db.execute(update(Job).where(Job.id == job_id, Job.state.in_(("queued", "running")))
                     .values(state="cancelled", finished_at=utcnow(), lease_expires_at=None))
    if res.rowcount != 1:
        raise Conflict(f"job {job_id} changed state meanwhile; retry")
    db.refresh(job)
    _event(job, "cancelled")
    return job


def expire_leases(db: Session, now: datetime | None = None) -> list[int]:
    """Running jobs whose lease has run out go back to queued, or to failed after ``max_attempts`` claims.
    Each change is a compare-and-set on (state, lease), so a renewal that wins the race is kept."""
    now = now or utcnow()
    expired = list(db.scalars(select(Job).where(Job.state == "running", Job.lease_expires_at < now)))
    changed = []
    for job in expired:
        lease, worker = job.lease_expires_at, job.worker_id
        give_up = job.attempts >= job.max_attempts
        values: dict[str, Any] = {"lease_expires_at": None, "worker_id": None}
        if give_up:
            values.update(state="failed", finished_at=now,
                          error=f"lease expired on attempt {job.attempts} of {job.max_attempts} "
                                f"(worker {worker} stopped renewing it); giving up")
        else:
            values.update(state="queued")
        res = db.execute(update(Job).where(Job.id == job.id, Job.state == "running",
                                           Job.lease_expires_at == lease).values(**values))
        if res.rowcount == 1:
            db.refresh(job)
            _event(job, "lease_expired", worker_id=worker, requeued=not give_up)
            changed.append(job.id)
    return changed


def claim_job(db: Session, worker_id: int, lease_seconds: float) -> Job | None:
    """Give the oldest queued job to ``worker_id`` with a fresh lease; None if the queue is empty.

    PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent claimers skip each other's rows).
    SQLite (one writer at a time): a compare-and-set ``UPDATE ... WHERE state = 'queued'`` whose row count
    says whether this claimer won; a loser moves on to the next job. Either way no job is claimed twice.
    """
    now = utcnow()
    values = {"state": "running", "worker_id": worker_id, "claimed_at": now,
              "lease_expires_at": now + timedelta(seconds=lease_seconds), "attempts": Job.attempts + 1}
    if db.get_bind().dialect.name == "postgresql":
        job = db.scalar(select(Job).where(Job.state == "queued").order_by(Job.id).limit(1)
                        .with_for_update(skip_locked=True))
        if job is None:
            return None
        db.execute(update(Job).where(Job.id == job.id).values(**values))
        db.refresh(job)
        _event(job, "claimed", worker_id=worker_id, attempt=job.attempts)
        return job
    for _ in range(100):  # bounded: each lost race means another claimer took a job
        ids = list(db.scalars(select(Job.id).where(Job.state == "queued").order_by(Job.id).limit(8)))
        if not ids:
            return None
        for jid in ids:
            res = db.execute(update(Job).where(Job.id == jid, Job.state == "queued").values(**values))
            if res.rowcount == 1:
                job = get_job(db, jid)
                db.refresh(job)
                _event(job, "claimed", worker_id=worker_id, attempt=job.attempts)
                return job
    return None


def _held(db: Session, job_id: int, worker_id: int) -> Job:
    job = get_job(db, job_id)
    if job.state != "running" or job.worker_id != worker_id:
        holder = f"worker {job.worker_id}" if job.worker_id else "no worker"
        raise Conflict(f"worker {worker_id} does not hold job {job_id} (it is {job.state}, held by {holder}): "
                       "the lease was lost")
    return job


def renew_lease(db: Session, job_id: int, worker_id: int, lease_seconds: float) -> tuple[Job, bool]:
    """Extend the lease; (job, cancel) where cancel says the job was cancelled and the run must stop."""
    job = get_job(db, job_id)
    if job.state == "cancelled" and job.worker_id == worker_id:
        return job, True
    expires = utcnow() + timedelta(seconds=lease_seconds)
    res = db.execute(update(Job).where(Job.id == job_id, Job.worker_id == worker_id, Job.state == "running")
                     .values(lease_expires_at=expires))
    if res.rowcount != 1:
        db.refresh(job)
        _held(db, job_id, worker_id)
    db.refresh(job)
    return job, False


def release_job(db: Session, job_id: int, worker_id: int, reason: str = "released by the worker") -> Job:
    """The worker gives the job back (it is stopping): queued again; the claim does not count."""
    job = _held(db, job_id, worker_id)
    res = db.execute(update(Job).where(Job.id == job_id, Job.worker_id == worker_id, Job.state == "running")
                     .values(state="queued", worker_id=None, lease_expires_at=None,
                             attempts=Job.attempts - 1))
    if res.rowcount != 1:
        raise Conflict(f"job {job_id} changed state meanwhile")
    db.refresh(job)
    _event(job, "released", worker_id=worker_id, reason=reason)
    return job


def fail_job(db: Session, job_id: int, worker_id: int, error: str, log_tail: str | None) -> Job:
    job = _held(db, job_id, worker_id)
    job.state, job.error, job.log_tail = "failed", error, log_tail
    job.finished_at, job.lease_expires_at = utcnow(), None
    _event(job, "failed", worker_id=worker_id)
    return job


def store_result(db: Session, job_id: int, data: dict[str, Any]) -> Result:
    worker_id = data["worker_id"]
    job = _held(db, job_id, worker_id)
    if db.scalar(select(Result).where(Result.job_id == job_id)) is not None:
        raise Conflict(f"job {job_id} already has a result")
    res = Result(job_id=job_id, worker_id=worker_id, iteration_time=data["iteration_time"],
                 bubble_ratio=data.get("bubble_ratio"), emulated=bool(data.get("emulated")),
                 devices=finite(data.get("devices") or []), trace=data.get("trace"),
                 body=finite(data.get("raw") or {}))
    db.add(res)
    job.state, job.finished_at, job.lease_expires_at = "succeeded", utcnow(), None
    _event(job, "succeeded", worker_id=worker_id)
    db.flush()
    return res


def get_result(db: Session, job_id: int) -> Result:
    get_job(db, job_id)
    res = db.scalar(select(Result).where(Result.job_id == job_id))
    if res is None:
        raise NotFound(f"job {job_id} has no result yet")
    return res


def job_candidate(db: Session, job: Job) -> dict[str, Any]:
    row = db.scalar(select(CandidateRow).where(CandidateRow.plan_id == job.plan_id,
                                               CandidateRow.rank == job.candidate_index))
    return row.body if row is not None else {}


def _rel(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or pred == 0:
        return None
    return (meas - pred) / pred


def comparison(db: Session, job_id: int) -> dict[str, Any]:
    """Predicted vs measured, field by field, with relative errors (measured ones None until a result)."""
    job = get_job(db, job_id)
    cand = job_candidate(db, job)
    res = db.scalar(select(Result).where(Result.job_id == job_id))
    it_m = res.iteration_time if res else None
    gb = cand.get("global_batch") or None
    thr_m = gb / it_m if (gb and it_m) else None
    rows = [("iteration_time", cand.get("iteration_time"), it_m),
            ("throughput", cand.get("throughput"), thr_m),
            ("bubble_ratio", cand.get("bubble_ratio"), res.bubble_ratio if res else None)]
    devices = []
    mem = cand.get("memory") or []
    for d, dev in enumerate(res.devices if res else []):
        entry = dict(dev)
        peak = dev.get("peak_memory")
        if d < len(mem) and isinstance(peak, int | float):
            entry["predicted_peak_memory"] = mem[d]
            entry["peak_memory_relative_error"] = _rel(mem[d], float(peak))
        devices.append(entry)
    return {"job_id": job.id, "plan_id": job.plan_id, "candidate_index": job.candidate_index,
            "label": cand.get("label", ""), "state": job.state, "emulated": res.emulated if res else None,
            "fields": [{"field": f, "predicted": p, "measured": m, "relative_error": _rel(p, m)}
                       for f, p, m in rows],
            "devices": devices}


# ---- workers --------------------------------------------------------------------------------------------

def register_worker(db: Session, spec: dict[str, Any]) -> tuple[Worker, bool]:
    for f in ("name", "node", "device_type"):
        check_text(spec[f], f)
    row = db.scalar(select(Worker).where(Worker.name == spec["name"]))
    created = row is None
    if row is None:
        row = Worker(name=spec["name"])
        db.add(row)
    row.node, row.gpus, row.device_type = spec["node"], spec["gpus"], spec["device_type"]
    row.last_heartbeat = utcnow()
    db.flush()
    return row, created


def get_worker(db: Session, worker_id: int) -> Worker:
    row = db.get(Worker, worker_id)
    if row is None:
        raise NotFound(f"worker {worker_id} not found (register first)")
    return row


def heartbeat(db: Session, worker_id: int) -> Worker:
    row = get_worker(db, worker_id)
    row.last_heartbeat = utcnow()
    return row


def list_workers(db: Session, limit: int, offset: int) -> list[Worker]:
    return list(db.scalars(select(Worker).order_by(Worker.id).limit(limit).offset(offset)))


def alive(worker: Worker, alive_seconds: float, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    return (now - worker.last_heartbeat).total_seconds() <= alive_seconds


def counts(db: Session, alive_seconds: float) -> dict[str, dict[str, int]]:
    """Jobs by state, plans by status, workers alive: the /metrics gauges."""
    jobs = {s: n for s, n in db.execute(select(Job.state, func.count()).group_by(Job.state))}
    plans = {s: n for s, n in db.execute(select(PlanRequest.status, func.count()).group_by(PlanRequest.status))}
    cutoff = utcnow() - timedelta(seconds=alive_seconds)
    n_alive = db.scalar(select(func.count()).select_from(Worker).where(Worker.last_heartbeat >= cutoff)) or 0
    n_all = db.scalar(select(func.count()).select_from(Worker)) or 0
    return {"jobs": jobs, "plans": plans, "workers": {"alive": n_alive, "registered": n_all}}


def grace_running_leases(db: Session, lease_seconds: float) -> int:
    """On API startup: agents could not renew while the API was down, so running jobs get one fresh lease
    instead of being requeued at once (a dead agent still loses its job one lease later)."""
    res = db.execute(update(Job).where(Job.state == "running")
                     .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))
    return res.rowcount or 0


# ---- UI read helpers (api/routers/ui.py) ------------------------------------------------------------

def get_candidate(db: Session, plan_id: int, rank: int) -> CandidateRow:
    """Candidate ``rank`` (0 = best) of a plan."""
    plan = get_plan(db, plan_id)
    row = db.scalar(select(CandidateRow).where(CandidateRow.plan_id == plan_id, CandidateRow.rank == rank))
    if row is None:
        raise NotFound(f"plan {plan_id} has no candidate {rank} ({len(plan.candidates)} candidate(s), "
                       f"status {plan.status})")
    return row


def store_candidate_field(db: Session, row: CandidateRow, key: str, value: Any) -> None:
    """Add ``key`` to a stored candidate record (a new dict, so the JSON column sees the change)."""
    row.body = {**(row.body or {}), key: value}
    db.flush()

