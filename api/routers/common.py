"""Shared bits of the routers: path/query parameter types and row -> response conversions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator
from sqlalchemy.orm import Session

from api import crud
from api.cluster_versions import describe, lineage_id, newest_versions
from api.schemas import MAX_ID
from db.models import ClusterRow, Job, PlanRequest, Profile, Result, Worker


def _plain_id(value: Any) -> Any:
    """A path id is written in digits: ``/profiles/1.0`` and ``/profiles/%201`` answered as ``/profiles/1``."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError(f"an id is written in digits, got {value[:40]!r}")
    return value


IdPath = Annotated[int, BeforeValidator(_plain_id), Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
Filter = Annotated[str | None, Query(max_length=200)]


def profile_out(row: Profile, detail: bool = False, sharded_weights: bool = False) -> dict[str, Any]:
    """A profile answer; ``detail``: with its document and what its times assume (the listing loads neither:
    the document is deferred, tests/test_hardening.py), for a plan that shards its weights where
    ``sharded_weights`` (:func:`planner.profile.runtime_words`)."""
    out = {k: getattr(row, k) for k in ("id", "content_hash", "name", "device", "dtype", "source", "num_layers",
                                         "total_params", "created_at")}
    if detail:
        from planner.profile import runtime_words

        out["profile"] = row.body
        env = (row.body or {}).get("environment") or {}
        out["assumes"] = runtime_words(env, runtime_defaults=row.source == "analytical",
                                       sharded_weights=sharded_weights) if isinstance(env, dict) else []
    return out


def cluster_out(row: ClusterRow, detail: bool = False, newest: ClusterRow | None = None) -> dict[str, Any]:
    """A cluster answer; ``newest``: the newest version of its lineage (api/cluster_versions.py)."""
    out = {k: getattr(row, k) for k in ("id", "content_hash", "name", "device", "gpus", "created_at", "version",
                                         "base_id")}
    out.update(describe(row, newest))
    if detail:
        out["cluster"] = row.body
    return out


def clusters_out(db: Session, rows: list[ClusterRow], detail: bool = False) -> list[dict[str, Any]]:
    """:func:`cluster_out` of each row, each with its lineage's newest version (one query for all)."""
    newest = newest_versions(db, rows)
    return [cluster_out(r, detail, newest.get(lineage_id(r))) for r in rows]


def plan_summary(row: PlanRequest, n: int) -> dict[str, Any]:
    out = {k: getattr(row, k) for k in ("id", "profile_id", "cluster_id", "status", "request", "error",
                                         "attempts", "created_at", "started_at", "finished_at")}
    out["num_candidates"] = n
    return out


def plan_out(row: PlanRequest) -> dict[str, Any]:
    out = plan_summary(row, len(row.candidates))
    out["candidates"] = [c.body for c in row.candidates]
    out.update({k: v for k, v in (row.summary or {}).items()
                if k in ("infeasible", "rejected", "evaluated", "simulated", "considered", "warnings")})
    return out


def job_out(row: Job, has_result: bool = False, waiting: str | None = None,
            times: tuple[float | None, float | None] | None = None, cluster_id: int | None = None) -> dict[str, Any]:
    """A job answer; ``times``: (predicted, measured) iteration time (:func:`api.crud.iteration_times`);
    ``cluster_id``: the cluster version its plan was made on (:func:`api.crud.plan_clusters`)."""
    out = {k: getattr(row, k) for k in ("id", "plan_id", "candidate_index", "model", "iterations", "emulate",
                                         "state", "attempts", "max_attempts", "worker_id", "lease_expires_at",
                                         "error", "log_tail", "created_at", "claimed_at", "finished_at",
                                         "device_type", "nodes", "procs_per_node")}
    out["history"] = row.history or []
    out["has_result"] = has_result
    out["slots"] = [{k: getattr(s, k) for k in ("node_rank", "state", "worker_id", "held_since", "lease_expires_at",
                                                 "endpoint")} for s in row.slots] if row.nodes > 1 else []
    out["waiting"] = waiting
    out["cluster_id"] = cluster_id
    predicted, measured = times or (None, None)
    out["predicted_iteration_time"] = predicted
    out["measured_iteration_time"] = measured
    out["measured_over_predicted"] = measured / predicted if measured is not None and predicted else None
    return out


def worker_out(row: Worker, alive_seconds: float) -> dict[str, Any]:
    out = {k: getattr(row, k) for k in ("id", "name", "node", "host", "gpus", "device_type", "registered_at",
                                         "last_heartbeat")}
    out["alive"] = crud.alive(row, alive_seconds)
    return out


def result_out(row: Result) -> dict[str, Any]:
    return {"job_id": row.job_id, "worker_id": row.worker_id, "iteration_time": row.iteration_time,
            "bubble_ratio": row.bubble_ratio, "emulated": row.emulated, "devices": row.devices,
            "trace": row.trace, "raw": row.body, "created_at": row.created_at}
