"""SQLAlchemy 2.0 tables: profiles, clusters, plan requests and their candidates, jobs, workers, results.

JSON documents are stored as text (:class:`JSONText`): the same on SQLite and PostgreSQL, and it keeps
non-finite floats (a candidate that does not fit has an infinite iteration time) and NUL escapes that
PostgreSQL's ``jsonb`` would refuse.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from planner.jsondoc import finite  # (re-exported: the api's queues import it from here)


def utcnow() -> datetime:
    return datetime.now(UTC)


class JSONText(TypeDecorator[Any]):
    """A JSON document in a text column (canonical: sorted keys, ASCII, non-finite floats as null)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        if value is None:
            return None
        return json.dumps(finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both databases (SQLite drops the zone: put it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class Profile(Base):
    __tablename__ = "profiles"
    __table_args__ = {"sqlite_autoincrement": True}  # an id is never handed out twice (migration 0007)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    device: Mapped[str] = mapped_column(String(200), index=True)
    dtype: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(32))
    num_layers: Mapped[int] = mapped_column(Integer)
    total_params: Mapped[float] = mapped_column(Float)
    body: Mapped[Any] = mapped_column(JSONText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ClusterRow(Base):
    __tablename__ = "clusters"
    __table_args__ = {"sqlite_autoincrement": True}  # an id is never handed out twice (migration 0007)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    device: Mapped[str] = mapped_column(String(200), index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    body: Mapped[Any] = mapped_column(JSONText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: versions (api/calibration.py): a calibrated cluster is version n > 1 of the uploaded one, ``base_id``
    base_id: Mapped[int | None] = mapped_column(ForeignKey("clusters.id", ondelete="SET NULL"), nullable=True,
                                                index=True)
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: on an uploaded cluster's row: the largest version number its lineage has handed out, so that a version
    #: deleted is never numbered again (migration 0008; api/calibration.py)
    last_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: the finished jobs the body's calibration was fitted to (None: no calibration), kept beside the body so
    #: that list answers label a version (api/cluster_versions.py) without loading documents
    calibration_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)


class PlanRequest(Base):
    """One plan request: inputs, status (queued/running/done/failed), summary; candidates apart."""

    __tablename__ = "plan_requests"
    #: one live plan per request: identical requests at once get the one row (api.crud.create_plan), a failed
    #: plan leaves room for a new one; older duplicates stored before the index are marked (``duplicate_of``)
    __table_args__ = (Index("uq_plan_requests_live_request", "request_hash", unique=True,
                            sqlite_where=text("status != 'failed' AND duplicate_of IS NULL"),
                            postgresql_where=text("status != 'failed' AND duplicate_of IS NULL")),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="RESTRICT"), index=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="RESTRICT"), index=True)
    request: Mapped[Any] = mapped_column(JSONText)
    request_hash: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[Any] = mapped_column(JSONText, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: the API process running the plan and until when it holds it (renewed while the planner runs)
    runner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: set by migration 0006 on a plan stored twice for one request before the unique index existed (two
    #: identical POST /plans at once): the id of the newer copy, the one a repeated request was answered with;
    #: the row itself is kept as it was (jobs may refer to it)
    duplicate_of: Mapped[int | None] = mapped_column(Integer, nullable=True)

    candidates: Mapped[list[CandidateRow]] = relationship(
        back_populates="plan", order_by="CandidateRow.rank", cascade="all, delete-orphan")


class CandidateRow(Base):
    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("plan_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plan_requests.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(400))
    iteration_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    throughput: Mapped[float | None] = mapped_column(Float, nullable=True)
    body: Mapped[Any] = mapped_column(JSONText)

    plan: Mapped[PlanRequest] = relationship(back_populates="candidates")


class CandidateTimeline(Base):
    """A candidate's simulated per-device timeline, computed on first request and kept apart from the
    candidate (a timeline can be thousands of times the size of its candidate record)."""

    __tablename__ = "candidate_timelines"
    __table_args__ = (UniqueConstraint("plan_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plan_requests.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    body: Mapped[Any] = mapped_column(JSONText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")


class Job(Base):
    """A candidate dispatched to the workers. queued -> running (claimed, leased) -> succeeded | failed |
    cancelled; an expired lease puts a running job back to queued, or to failed after ``max_attempts``."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plan_requests.id", ondelete="RESTRICT"), index=True)
    candidate_index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    iterations: Mapped[int] = mapped_column(Integer)
    emulate: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    history: Mapped[Any] = mapped_column(JSONText, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    #: placement (api/gang.py): the device an agent must have (the plan's cluster device; null: any agent,
    #: jobs stored before agents declared theirs), ``nodes`` node slots of ``procs_per_node`` processes each
    #: (null: any agent runs it on one node, as before)
    device_type: Mapped[str | None] = mapped_column(String(200), nullable=True)
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    procs_per_node: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: bumped by every change of a forming gang's slots: the compare-and-set that starts the gang
    slots_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    slots: Mapped[list[JobSlot]] = relationship(back_populates="job", order_by="JobSlot.node_rank",
                                                cascade="all, delete-orphan")


SLOT_STATES = ("open", "held", "running", "done")


class JobSlot(Base):
    """One node of a multi-node job (``Job.nodes`` > 1): open -> held (an agent waits in it) -> running
    (every slot was held: the gang started) -> done (its run exited 0); a stopped gang puts every slot back
    to open. An agent holds at most one slot of a job (the unique constraint)."""

    __tablename__ = "job_slots"
    __table_args__ = (UniqueConstraint("job_id", "node_rank"), UniqueConstraint("job_id", "worker_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    node_rank: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="open")
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    held_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: node rank 0's rendezvous endpoint (host:port its agent picked)
    endpoint: Mapped[str | None] = mapped_column(String(300), nullable=True)

    job: Mapped[Job] = relationship(back_populates="slots")


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    node: Mapped[str] = mapped_column(String(200))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    device_type: Mapped[str] = mapped_column(String(200), default="cpu")
    #: the address other nodes reach this agent's node at (the rendezvous of a gang it leads)
    host: Mapped[str | None] = mapped_column(String(200), nullable=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: sha256 of the credential issued at registration (the credential itself is shown once)
    token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)
    last_heartbeat: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Result(Base):
    """What an agent measured for a job, beside the job's prediction."""

    __tablename__ = "results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), nullable=True)
    iteration_time: Mapped[float] = mapped_column(Float)
    bubble_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    emulated: Mapped[bool] = mapped_column(Boolean, default=False)
    devices: Mapped[Any] = mapped_column(JSONText)
    trace: Mapped[str | None] = mapped_column(Text, nullable=True)
    body: Mapped[Any] = mapped_column(JSONText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
