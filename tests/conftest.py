"""Test configuration: hypothesis runs derandomized under CI (the same examples every run), so a
submission's result does not depend on the luck of the draw; locally it explores new examples.

Under pytest-xdist (``make test`` runs two workers), each worker gets a PostgreSQL database of its own:
``$PIPEPLAN_TEST_POSTGRES_URL`` is pointed at ``<name>_<worker>`` in the worker before any test runs, so
the tests (and the servers and agents they start) of two workers never empty each other's schema."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

pytest_plugins = ["api_support", "browser.fixtures"]  # fixtures of the API, database and browser tests


def pytest_configure(config: pytest.Config) -> None:
    from api_support import PG_ENV, worker_postgres

    worker, url = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(PG_ENV)
    if worker and url:
        try:
            os.environ[PG_ENV] = worker_postgres(url, worker)
        except Exception as e:  # noqa: BLE001 -- no server: the PostgreSQL halves skip, saying so (api_support)
            print(f"{worker}: no per-worker PostgreSQL database at {PG_ENV}: {e}")
