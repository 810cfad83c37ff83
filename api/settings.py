"""API settings, from the environment (``PIPEPLAN_*``, ``DATABASE_URL``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


def _float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return float(v) if v else default


def _int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return int(v) if v else default


@dataclass
class Settings:
    """``database_url``: None means ``$DATABASE_URL`` or SQLite under ``$PIPEPLAN_DATA_DIR``.
    ``admin_token`` may do everything; ``worker_token`` only the worker endpoints (and reads). A token left
    unset cannot be used. ``open_reads``: GET endpoints need no token."""

    database_url: str | None = field(default_factory=lambda: os.environ.get("DATABASE_URL") or None)
    admin_token: str | None = field(default_factory=lambda: os.environ.get("PIPEPLAN_ADMIN_TOKEN") or None)
    worker_token: str | None = field(default_factory=lambda: os.environ.get("PIPEPLAN_WORKER_TOKEN") or None)
    open_reads: bool = field(default_factory=lambda: _bool("PIPEPLAN_OPEN_READS", False))
    lease_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_LEASE_SECONDS", 30.0))
    max_attempts: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_ATTEMPTS", 3))
    #: a node slot of a multi-node job held this long without the rest of its gang is given back
    #: (api/gang.py: two half-formed gangs cannot hold each other's agents for ever)
    gang_wait_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_GANG_WAIT_SECONDS", 60.0))
    worker_alive_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_WORKER_ALIVE_SECONDS", 60.0))
    plan_workers: int = field(default_factory=lambda: _int("PIPEPLAN_PLAN_WORKERS", 2))
    plan_wait_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_PLAN_WAIT_SECONDS", 1.0))
    plan_timeout_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_PLAN_TIMEOUT_SECONDS", 600.0))
    reaper_interval: float = field(default_factory=lambda: _float("PIPEPLAN_REAPER_INTERVAL", 1.0))
    max_cluster_gpus: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_CLUSTER_GPUS", 65536))
    #: GPUs one plan may use (the budget, or the whole cluster when no budget is given)
    max_plan_gpus: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_PLAN_GPUS", 16384))
    #: address space of a planner process (RLIMIT_AS; it bounds its resident memory too; a process starts
    #: with about 180 MiB); past it the plan fails with a message naming this setting, and the API goes on
    plan_memory_bytes: int = field(default_factory=lambda: _int("PIPEPLAN_PLAN_MEMORY_BYTES", 1536 * 2**20))
    #: a running plan's lease: renewed while its planner process runs; an API that dies stops renewing,
    #: and another API (or the restarted one) runs the plan again once the lease is over
    plan_lease_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_PLAN_LEASE_SECONDS", 30.0))
    #: plans queued or running at most; past it POST /plans answers 429 with Retry-After
    max_queued_plans: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_QUEUED_PLANS", 64))
    #: processes POST /jobs places on one node at most: an agent starts a node's processes together on its host,
    #: each a gloo process of about planner.reserve.CPU_RESERVE_BYTES (320 MiB) before any model -- 256 are 80 GiB;
    #: an emulated job of a 1024-GPU plan on one node (1024 processes, 320 GiB) was queued and failed on the agent
    max_node_processes: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_NODE_PROCESSES", 256))
    #: request bodies above this many bytes are refused with 413
    max_body_bytes: int = field(default_factory=lambda: _int("PIPEPLAN_MAX_BODY_BYTES", 24 * 2**20))
    #: a candidate timeline is simulated in a planner process within this time
    timeline_timeout_seconds: float = field(default_factory=lambda: _float("PIPEPLAN_TIMELINE_TIMEOUT_SECONDS",
                                                                           60.0))
