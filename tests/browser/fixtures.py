"""Browser fixtures shared by every browser test (a pytest plugin, loaded from tests/conftest.py): Debian's
Chromium through Playwright, launched once per test session (per xdist worker; each test opens a context of its
own, so no cookies or storage pass between tests), and the console-error collector. The seeded server is per
module (``server`` in tests/browser/conftest.py and tests/test_ui_browser.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from browser.support import CHROMIUM, CHROMIUM_ARGS, Console


@pytest.fixture(scope="session")
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
