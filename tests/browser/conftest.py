"""Fixtures of the browser tests under tests/browser/: one seeded server per module (uvicorn, SQLite in a temp
dir, a random port), Debian's Chromium through Playwright, and the console-error collector."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_support import LiveServer

from browser.support import CHROMIUM, CHROMIUM_ARGS, Console


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from api.seed import seed
    from db.migrate import upgrade

    tmp = tmp_path_factory.mktemp("ui-server")
    url = f"sqlite:///{tmp / 'pipeplan.db'}"
    upgrade(url)
    seed(url)
    srv = LiveServer(url, tmp, PIPEPLAN_LEASE_SECONDS="30", PIPEPLAN_PLAN_WAIT_SECONDS="0").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def console() -> Iterator[Console]:
    c = Console()
    yield c
    assert c.errors == [], "console/page errors:\n" + "\n".join(c.errors)
