"""Fixtures of the browser tests under tests/browser/: one seeded server per module (uvicorn, a fresh copy of
the session's seeded SQLite template in a temp dir, a random port; a module's ``SERVER_SETTINGS`` add to or
override its environment, e.g. ``{"PIPEPLAN_OPEN_READS": "1"}``). Chromium (``browser``, one per session) and
the console-error collector (``console``) are in tests/browser/fixtures.py, shared with tests/test_ui_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import LiveServer, seeded_server


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, seeded_sqlite: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = {"PIPEPLAN_LEASE_SECONDS": "30", "PIPEPLAN_PLAN_WAIT_SECONDS": "0",
                **getattr(request.module, "SERVER_SETTINGS", {})}
    srv = seeded_server(seeded_sqlite, tmp_path_factory, **settings)
    try:
        yield srv
    finally:
        srv.stop()
