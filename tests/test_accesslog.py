"""``pipeplan serve``'s access log leaves out the agents' successful polls (api/accesslog.py), keeps the rest."""

from __future__ import annotations

import logging

from api.accesslog import QuietPolls, quiet_polls


def _record(method: str, path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", method, path, "1.1", status), None)


def test_successful_polls_are_dropped_and_everything_else_kept() -> None:
    f = QuietPolls()
    for path, status in (("/workers/1/claim", 204), ("/workers/12/claim", 200), ("/workers/1/heartbeat", 200),
                         ("/jobs/4/lease", 200), ("/jobs/4/slots/1/lease", 200)):
        assert not f.filter(_record("POST", path, status)), path
    kept = [("POST", "/workers/1/claim", 401), ("POST", "/jobs/4/lease", 409), ("POST", "/jobs", 201),
            ("GET", "/jobs/4", 200), ("POST", "/workers", 201), ("POST", "/jobs/4/result", 200),
            ("POST", "/plans", 202), ("GET", "/workers/1/claim", 200)]
    for method, path, status in kept:
        assert f.filter(_record(method, path, status)), (method, path, status)
    other = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "plain message", None, None)
    assert f.filter(other)


def test_install_is_idempotent() -> None:
    name = "pipeplan.test.access"
    quiet_polls(name)
    quiet_polls(name)
    assert sum(isinstance(x, QuietPolls) for x in logging.getLogger(name).filters) == 1
