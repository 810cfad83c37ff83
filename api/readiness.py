"""Waiting until a started API server is healthy: ``GET /health`` answers 200 (``api/routers/health.py``: the
app is up and its database answers). The one statement of it for whatever starts a server and then talks to it
(the benchmarks' ``benchmarks/live_server.py``, the tests' ``tests/api_support.py`` and ``make serve`` tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def wait_healthy(url: str, timeout: float, *, alive: Callable[[], bool] | None = None,
                 every: float = 0.1) -> bool:
    """Poll ``url + "/health"`` every ``every`` seconds until it answers 200 (True), or until ``timeout``
    seconds pass or ``alive()`` -- the server's process still running, asked before each poll -- turns false
    (False). A refused or timed-out connection (the server still starting) and any other status (503: its
    database not reachable yet) count as not yet healthy."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if alive is not None and not alive():
            return False
        try:
            if httpx.get(url.rstrip("/") + "/health", timeout=2.0).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(every)
    return False
