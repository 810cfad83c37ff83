"""Prometheus metrics: request counts and latency (middleware), jobs by state, plans by status and workers
alive (read from the database at scrape time). One registry per app, so several apps can live in one
process (tests)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import Response

from db.models import JOB_STATES, Job, PlanRequest, Worker, utcnow

PLAN_STATES = ("queued", "running", "done", "failed")


def counts(db: Session, alive_seconds: float) -> dict[str, dict[str, int]]:
    """Jobs by state, plans by status, workers alive: the /metrics gauges."""
    jobs = {s: n for s, n in db.execute(select(Job.state, func.count()).group_by(Job.state))}
    plans = {s: n for s, n in db.execute(select(PlanRequest.status, func.count()).group_by(PlanRequest.status))}
    cutoff = utcnow() - timedelta(seconds=alive_seconds)
    n_alive = db.scalar(select(func.count()).select_from(Worker).where(Worker.last_heartbeat >= cutoff)) or 0
    n_all = db.scalar(select(func.count()).select_from(Worker)) or 0
    return {"jobs": jobs, "plans": plans, "workers": {"alive": n_alive, "registered": n_all}}


class StateCollector:
    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sessions = getattr(self.app.state, "sessions", None)
        if sessions is None:
            return
        with sessions() as db:
            c = counts(db, self.app.state.settings.worker_alive_seconds)
        jobs = GaugeMetricFamily("pipeplan_jobs", "jobs by state", labels=["state"])
        for s in JOB_STATES:
            jobs.add_metric([s], c["jobs"].get(s, 0))
        yield jobs
        plans = GaugeMetricFamily("pipeplan_plans", "plan requests by status", labels=["status"])
        for s in PLAN_STATES:
            plans.add_metric([s], c["plans"].get(s, 0))
        yield plans
        yield GaugeMetricFamily("pipeplan_workers_alive", "workers with a recent heartbeat",
                                value=c["workers"]["alive"])
        yield GaugeMetricFamily("pipeplan_workers_registered", "workers ever registered",
                                value=c["workers"]["registered"])


#: the methods of RFC 9110 section 9 and PATCH (RFC 5789); any other is counted as "other"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


class Metrics:
    def __init__(self, app: Any) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("pipeplan_http_requests", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("pipeplan_http_request_duration_seconds", "HTTP request latency",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.registry.register(StateCollector(app))

    async def middleware(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            # the label's values are bounded: a client's made-up method ("M1XYZ") added a series per request
            method = request.method if request.method in HTTP_METHODS else "other"
            self.requests.labels(method, path, str(status)).inc()
            self.latency.labels(method, path).observe(time.perf_counter() - start)
