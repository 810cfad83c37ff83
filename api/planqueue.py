"""The plan queue: plan requests' lease state machine (no HTTP here); :mod:`api.planrun` drives it.

    queued --start (runner, lease)--> running --finish--> done
                                         |  \\--fail----> failed
                                         +--release (API stopping) / lease expired--> queued

The plan row is the queue. ``start`` is a compare-and-set ``queued -> running`` that records the runner
(one API process) and a lease; the runner renews the lease while its planner process works and ends the
plan only while it still holds it. An API that stops releases its running plans; one that dies stops
renewing, and once the lease is over any API process on the same database (or the restarted one) queues
the plan again. So a plan runs to its end once, whatever happens to the APIs around it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from db.models import CandidateRow, PlanRequest, finite, utcnow

UNFINISHED = ("queued", "running")


def _held(plan_id: int, runner: str) -> Any:
    return (PlanRequest.id == plan_id, PlanRequest.status == "running", PlanRequest.runner == runner)


def start_plan(db: Session, plan_id: int, runner: str, lease_seconds: float) -> bool:
    """queued -> running under ``runner``'s lease, atomically; False if another runner took it first."""
    now = utcnow()
    res = db.execute(update(PlanRequest).where(PlanRequest.id == plan_id, PlanRequest.status == "queued")
                     .values(status="running", started_at=now, attempts=PlanRequest.attempts + 1,
                             runner=runner, lease_expires_at=now + timedelta(seconds=lease_seconds)))
    return res.rowcount == 1


def renew_plan(db: Session, plan_id: int, runner: str, lease_seconds: float) -> bool:
    """Extend ``runner``'s lease; False when it no longer holds the plan."""
    res = db.execute(update(PlanRequest).where(*_held(plan_id, runner))
                     .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))
    return res.rowcount == 1


def renew_runner(db: Session, runner: str, lease_seconds: float) -> int:
    """Extend the lease of every plan ``runner`` holds (the runner is alive); how many."""
    res = db.execute(update(PlanRequest).where(PlanRequest.status == "running", PlanRequest.runner == runner)
                     .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))
    return res.rowcount or 0


def finish_plan(db: Session, plan_id: int, result: dict[str, Any], runner: str | None = None) -> bool:
    """Store the candidates and mark the plan done, if ``runner`` still holds it (None: unconditionally,
    for tests and tools); False (nothing written) otherwise."""
    cond = _held(plan_id, runner) if runner is not None else (PlanRequest.id == plan_id,)
    summary = {k: v for k, v in result.items() if k != "candidates"}
    res = db.execute(update(PlanRequest).where(*cond)
                     .values(status="done", error=None, finished_at=utcnow(), lease_expires_at=None,
                             summary=finite(summary)))
    if res.rowcount != 1:
        return False
    db.execute(delete(CandidateRow).where(CandidateRow.plan_id == plan_id))
    for rank, cand in enumerate(result["candidates"]):
        cand = finite(cand)
        db.add(CandidateRow(plan_id=plan_id, rank=rank, label=str(cand.get("label", ""))[:400],
                            iteration_time=cand.get("iteration_time"), throughput=cand.get("throughput"),
                            body=cand))
    db.flush()
    db.expire_all()
    return True


def fail_plan(db: Session, plan_id: int, error: str, runner: str | None = None) -> bool:
    cond = _held(plan_id, runner) if runner is not None else (PlanRequest.id == plan_id,)
    res = db.execute(update(PlanRequest).where(*cond)
                     .values(status="failed", error=error[:10_000], finished_at=utcnow(), lease_expires_at=None))
    db.expire_all()
    return res.rowcount == 1


def release_plan(db: Session, plan_id: int, runner: str) -> bool:
    """The API is stopping: the plan goes back to the queue, its attempt not counted."""
    res = db.execute(update(PlanRequest).where(*_held(plan_id, runner))
                     .values(status="queued", runner=None, lease_expires_at=None,
                             attempts=PlanRequest.attempts - 1))
    return res.rowcount == 1


def requeue_expired_plans(db: Session, now: datetime | None = None, keep: str | None = None,
                          max_attempts: int = 3) -> list[int]:
    """Running plans whose runner stopped renewing (its API died) go back to the queue; those of runner
    ``keep`` (the caller: it knows its own plans are running) stay. A plan whose API died during each of its
    ``max_attempts`` starts fails instead, saying so: one that takes its API down (memory past the machine's,
    a crash) would otherwise do it again at every restart (an API that stops releases its plans uncounted)."""
    now = now or utcnow()
    stale = or_(PlanRequest.lease_expires_at.is_(None), PlanRequest.lease_expires_at < now)
    if keep is not None:
        stale = and_(stale, or_(PlanRequest.runner.is_(None), PlanRequest.runner != keep))
    rows = list(db.execute(select(PlanRequest.id, PlanRequest.attempts).where(PlanRequest.status == "running",
                                                                              stale)))
    out = []
    for pid, attempts in rows:
        if attempts >= max_attempts:
            values: dict[str, Any] = dict(
                status="failed", finished_at=now,
                error=f"the API running this plan stopped without finishing it at each of its {attempts} starts "
                      f"(its process died: killed, out of memory, crashed); not started again "
                      f"(PIPEPLAN_MAX_ATTEMPTS={max_attempts})")
        else:
            values = dict(status="queued")
        res = db.execute(update(PlanRequest).where(PlanRequest.id == pid, PlanRequest.status == "running", stale)
                         .values(runner=None, lease_expires_at=None, **values))
        if res.rowcount == 1:
            out.append(pid)
    return out


def queued_plans(db: Session, limit: int = 100) -> list[int]:
    return list(db.scalars(select(PlanRequest.id).where(PlanRequest.status == "queued")
                           .order_by(PlanRequest.id).limit(limit)))


def unfinished_count(db: Session) -> int:
    return db.scalar(select(func.count()).select_from(PlanRequest)
                     .where(PlanRequest.status.in_(UNFINISHED))) or 0
