"""The job queue: the lease state machine of dispatched candidates (no HTTP here).

    queued --claim--> running --result--> succeeded
                         |  \\--fail----> failed
                         |   \\-cancel--> cancelled (the agent hears it at its next renewal)
                         +--lease expired / released--> queued (failed after ``max_attempts`` claims)

Every transition is a compare-and-set on the row (``UPDATE ... WHERE state = ... AND worker_id = ...``),
so two claimers, a renewal racing the reaper, or a result racing a cancel never both win. Only the worker
holding a running job may renew, release, fail it or post its result: the caller passes the worker id its
credential proved (``api.deps``), never one read from the request body.

A job is offered only to agents that fit it (device type and size, :func:`api.gang.eligible`); a job that spans
several nodes is claimed slot by slot and runs as a gang (:mod:`api.gang`); its one result comes from node
rank 0 of the running gang (where global rank 0 runs).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api import gang
from api.errors import Conflict, InputError
from db.models import Job, JobSlot, Result, Worker, finite, utcnow

#: the states a job does not leave
FINISHED = ("succeeded", "failed", "cancelled")


def record_event(job: Job, event: str, **kw: Any) -> None:
    job.history = [*(job.history or []), {"at": utcnow().isoformat(), "event": event, **kw}]


def get_job(db: Session, job_id: int) -> Job:
    from api.errors import NotFound

    row = db.get(Job, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def cancel_job(db: Session, job_id: int) -> Job:
    job = get_job(db, job_id)
    if job.state in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"job {job_id} is already {job.state}")
    res = db.execute(update(Job).where(Job.id == job_id, Job.state.in_(("queued", "running")))
                     .values(state="cancelled", finished_at=utcnow(), lease_expires_at=None))
    if res.rowcount != 1:
        raise Conflict(f"job {job_id} changed state meanwhile; retry")
    db.refresh(job)
    record_event(job, "cancelled")
    return job


def expire_leases(db: Session, now: datetime | None = None) -> list[int]:
    """Running jobs whose lease has run out go back to queued, or to failed after ``max_attempts`` claims.
    Each change is a compare-and-set on (state, lease), so a renewal that wins the race is kept."""
    now = now or utcnow()
    changed = gang.expire_slots(db, now)
    expired = list(db.scalars(select(Job).where(Job.state == "running", Job.lease_expires_at < now)))
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
            record_event(job, "lease_expired", worker_id=worker, requeued=not give_up)
            changed.append(job.id)
    return changed


def grace_running_leases(db: Session, lease_seconds: float) -> int:
    """On API startup: agents could not renew while the API was down, so running jobs get one fresh lease
    instead of being requeued at once (a dead agent still loses its job one lease later). A gang's agents renew
    their node slots, not the job: its held slots get the fresh lease, and the job none (a job lease nobody
    renews would requeue the running gang as a single-node job one lease later, its nodes still running)."""
    expires = utcnow() + timedelta(seconds=lease_seconds)
    gangs = select(JobSlot.job_id).where(JobSlot.worker_id.is_not(None))
    res = db.execute(update(Job).where(Job.state == "running", Job.id.not_in(gangs))
                     .values(lease_expires_at=expires))
    slots = db.execute(update(JobSlot).where(
        JobSlot.worker_id.is_not(None), JobSlot.state.in_(("held", "running")),
        JobSlot.job_id.in_(select(Job.id).where(Job.state.in_(("queued", "running")))))
        .values(lease_expires_at=expires))
    return (res.rowcount or 0) + (slots.rowcount or 0)


def claim_job(db: Session, worker_id: int, lease_seconds: float, rdzv_port: int | None = None, *,
              whole: bool = False, alive_seconds: float = 60.0) -> Job | None:
    """Give the oldest queued job that fits ``worker_id`` (:func:`api.gang.eligible`) to it with a fresh
    lease; None if there is none. A multi-node job is claimed one node slot at a time, only by an agent that
    offers ``rdzv_port`` (it may get node rank 0 and host the rendezvous): the job is returned with the slot
    held (:func:`api.gang.claim_slot`; ``job.state`` says whether the gang started). ``whole``: the worker
    places multi-node jobs on nodes itself (Slurm) and claims them whole, as single-node ones. A gang is not
    offered while fewer agents that fit it are alive (heartbeat within ``alive_seconds``) than it has nodes:
    holding a slot of it would only keep this agent from other work.

    A compare-and-set ``UPDATE ... WHERE state = 'queued'`` whose row count says whether this claimer won (a
    loser moves on to the next job); on PostgreSQL a single-node job another claimer has locked is skipped
    first (``SELECT ... FOR UPDATE SKIP LOCKED``), while a gang's row lock is waited for (it orders the slot
    changes of one gang, :mod:`api.gang`). SQLite has one writer at a time. Either way no job (or slot) is
    claimed twice.
    """
    worker = db.get(Worker, worker_id)
    if worker is None:
        return None
    for jid, rank in gang.forming_slots_of(db, worker_id):  # it claims: it is not waiting in those any more
        gang.release_slot(db, jid, rank, worker_id)
    now = utcnow()
    values = {"state": "running", "worker_id": worker_id, "claimed_at": now,
              "lease_expires_at": now + timedelta(seconds=lease_seconds), "attempts": Job.attempts + 1}
    fits = gang.eligible(worker, whole)
    if rdzv_port is None and not whole:
        fits = fits & (Job.nodes == 1)
    queued = select(Job.id, Job.nodes).where(Job.state == "queued", fits, gang.not_holding(worker_id))
    postgres = db.get_bind().dialect.name == "postgresql"
    tried: list[int] = []
    for _ in range(100):  # bounded: each lost race means another claimer took a job or a slot
        q = queued.where(Job.id.not_in(tried)) if tried else queued
        row = db.execute(q.order_by(Job.id).limit(1)).first()
        if row is None:
            return None
        jid, nodes = row
        if whole:
            nodes = 1  # claimed as a single-node job
        if postgres and nodes == 1 and db.scalar(  # skip a job another claimer is taking (no waiting on it)
                select(Job.id).where(Job.id == jid, Job.state == "queued").with_for_update(skip_locked=True)) is None:
            tried.append(jid)
            continue
        if nodes > 1 and not gang.could_form(db, jid, alive_seconds):
            tried.append(jid)
            continue
        # a gang's slot: wait for a concurrent claimer's row lock rather than skip the gang (a half-formed
        # one elsewhere would hold this agent until the slot timeout)
        job = _claim_one(db, jid, nodes, worker, values, lease_seconds, rdzv_port)
        if job is not None:
            return job
        tried.append(jid)
    return None


def _claim_one(db: Session, jid: int, nodes: int, worker: Worker, values: dict[str, Any], lease_seconds: float,
               rdzv_port: int | None) -> Job | None:
    if nodes > 1:
        assert rdzv_port is not None
        if gang.claim_slot(db, jid, worker, lease_seconds, rdzv_port) is None:
            return None
        return get_job(db, jid)
    res = db.execute(update(Job).where(Job.id == jid, Job.state == "queued").values(**values))
    if res.rowcount != 1:
        return None
    job = get_job(db, jid)
    db.refresh(job)
    record_event(job, "claimed", worker_id=worker.id, attempt=job.attempts)
    return job


def _held(db: Session, job_id: int, worker_id: int) -> Job:
    job = get_job(db, job_id)
    if gang.runs_as_gang(db, job):
        raise Conflict(f"job {job_id} runs as a gang of {job.nodes} nodes: use its node slot's endpoints "
                       "(/jobs/{id}/slots/{rank}/...)")
    if job.state in FINISHED and job.worker_id == worker_id:  # its own job, ended: no lease was lost
        raise Conflict(f"job {job_id} is already {job.state} (run by worker {worker_id}): it no longer runs, so "
                       "there is no lease to renew, give back or fail")
    if job.state != "running" or job.worker_id != worker_id:
        holder = f"worker {job.worker_id}" if job.worker_id else "no worker"
        raise Conflict(f"worker {worker_id} does not hold job {job_id} (it is {job.state}, held by {holder}): "
                       "the lease was lost")
    return job


def recover_lease(db: Session, job: Job, worker_id: int, lease_seconds: float) -> bool:
    """Give a job whose lease ran out back to the worker that held it, where nobody has claimed it
    since: its agent was cut off from the API for longer than a lease (a network partition, a stalled host) but
    its run went on, and that run's work would be thrown away at its next renewal or its result (409: "lease
    lost") while the queued job waited to start again from the start. Whether it is that worker's: the job is
    queued, held by nobody, and its last event is the ``lease_expired`` of ``worker_id`` (a claim, a release or
    a cancel since would be a later event). A compare-and-set on (state, holder, attempts) keeps a concurrent
    claim's win. A gang's lease is its slots' (:mod:`api.gang`): a stopped gang's last event is not this one.
    True when recovered (event ``lease_recovered``, the same attempt)."""
    last = (job.history or [{}])[-1]
    if (job.state != "queued" or job.worker_id is not None or last.get("event") != "lease_expired"
            or last.get("worker_id") != worker_id):
        return False
    res = db.execute(update(Job).where(Job.id == job.id, Job.state == "queued", Job.worker_id.is_(None),
                                       Job.attempts == job.attempts)
                     .values(state="running", worker_id=worker_id,
                             lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))
    if res.rowcount != 1:
        return False
    db.refresh(job)
    record_event(job, "lease_recovered", worker_id=worker_id, attempt=job.attempts)
    db.flush()  # (the caller refreshes the job)
    return True


def renew_lease(db: Session, job_id: int, worker_id: int, lease_seconds: float) -> tuple[Job, bool]:
    """Extend the lease; (job, cancel) where cancel says the job was cancelled and the run must stop. A lease
    that ran out while nobody claimed the job since is recovered (:func:`recover_lease`)."""
    job = get_job(db, job_id)
    if job.state == "cancelled" and job.worker_id == worker_id:
        return job, True
    if gang.runs_as_gang(db, job):
        _held(db, job_id, worker_id)  # refused: a gang's nodes renew their slots
    expires = utcnow() + timedelta(seconds=lease_seconds)
    res = db.execute(update(Job).where(Job.id == job_id, Job.worker_id == worker_id, Job.state == "running")
                     .values(lease_expires_at=expires))
    if res.rowcount != 1:
        db.refresh(job)
        if not recover_lease(db, job, worker_id, lease_seconds):
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
    record_event(job, "released", worker_id=worker_id, reason=reason)
    return job


def fail_job(db: Session, job_id: int, worker_id: int, error: str, log_tail: str | None) -> Job:
    job = _held(db, job_id, worker_id)
    job.state, job.error, job.log_tail = "failed", error, log_tail
    job.finished_at, job.lease_expires_at = utcnow(), None
    record_event(job, "failed", worker_id=worker_id)
    return job


def store_result(db: Session, job_id: int, worker_id: int, data: dict[str, Any]) -> tuple[Result, bool]:
    """Store the measured result of a job ``worker_id`` holds: (result, created). The same worker posting
    again after its result was stored (a retry whose first answer was lost, or one that met its first try
    in flight) gets the stored one back with ``created`` False; anyone else gets :class:`Conflict` saying what
    happened."""
    stored = db.scalar(select(Result).where(Result.job_id == job_id))
    if stored is not None:
        if stored.worker_id == worker_id:
            return stored, False
        raise Conflict(f"job {job_id} already has a result (from worker {stored.worker_id})")
    try:
        return _store_new_result(db, job_id, worker_id, data), True
    except (Conflict, IntegrityError):
        # the same worker's other post of this result (a retry that met its first try) was committed after the
        # check above: this one found the job succeeded or the results row taken. The result is stored and is
        # this worker's, so it is answered as a repeated post is, never as a refusal (the agent would call the
        # job lost); anything else is the refusal it was
        db.rollback()
        stored = db.scalar(select(Result).where(Result.job_id == job_id, Result.worker_id == worker_id))
        if stored is None:
            raise
        return stored, False


def _store_new_result(db: Session, job_id: int, worker_id: int, data: dict[str, Any]) -> Result:
    job = get_job(db, job_id)
    if gang.runs_as_gang(db, job):
        rank = gang.running_rank(db, job, worker_id)
        if job.state != "running" or rank is None:
            raise Conflict(f"worker {worker_id} holds no node of running job {job_id} (it is {job.state}): "
                           "the gang was stopped")
        if rank != 0:
            raise Conflict(f"job {job_id}: the result comes from node rank 0 (where global rank 0 runs), not from "
                           f"worker {worker_id}'s node {rank}")
    else:
        recover_lease(db, job, worker_id, 0.0)  # its run finished while cut off, and nobody took the job since
        _held(db, job_id, worker_id)
    emulated = data.get("emulated")
    if emulated is None:  # (absent: as the job was created; calibration fits real runs only)
        emulated = job.emulate
    elif emulated != job.emulate:
        raise InputError(f"emulated: {str(emulated).lower()}, but job {job_id} was created with emulate "
                         f"{str(job.emulate).lower()}: a result says how the job it is of ran")
    res = Result(job_id=job_id, worker_id=worker_id, iteration_time=data["iteration_time"],
                 bubble_ratio=data.get("bubble_ratio"), emulated=bool(emulated),
                 devices=finite(data.get("devices") or []), trace=data.get("trace"),
                 body=finite(data.get("raw") or {}))
    db.add(res)
    holder = Job.worker_id.is_not(None) if gang.runs_as_gang(db, job) else Job.worker_id == worker_id
    done = db.execute(update(Job).where(Job.id == job_id, holder, Job.state == "running")
                      .values(state="succeeded", finished_at=utcnow(), lease_expires_at=None))
    if done.rowcount != 1:
        raise Conflict(f"job {job_id} changed state meanwhile: the lease was lost")
    db.refresh(job)
    record_event(job, "succeeded", worker_id=worker_id)
    db.flush()
    return res
