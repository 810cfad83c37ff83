"""Schemathesis against the OpenAPI schema of the live app (uvicorn, SQLite and PostgreSQL): whatever
the generated (schema-conforming) input, no 5xx. Bounded: ``$PIPEPLAN_SCHEMATHESIS_EXAMPLES`` examples
per operation (default 8), with the admin token so that writes get past auth and reach validation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from api_support import AUTH, PG_ENV, LiveServer, _reset_postgres, make_settings, seed_plan
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from api.main import create_app
from db.migrate import upgrade

EXAMPLES = int(os.environ.get("PIPEPLAN_SCHEMATHESIS_EXAMPLES", "8"))
schema = schemathesis.openapi.from_dict(create_app(make_settings("sqlite://")).openapi())
pytestmark = [pytest.mark.slow]  # a live server and every operation (about a minute)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def st_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp(f"schemathesis-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'st.db'}"
    else:
        url = os.environ.get(PG_ENV, "")
        if not url:
            pytest.skip(f"PostgreSQL half skipped: {PG_ENV} is not set")
        _reset_postgres(url)
    upgrade(url)
    srv = LiveServer(url, Path(tmp), PIPEPLAN_PLAN_WAIT_SECONDS="0.2", PIPEPLAN_PLAN_TIMEOUT_SECONDS="20").start()
    with srv.client() as c:  # some rows, so that generated ids sometimes hit real ones
        _, _, plan = seed_plan(c)
        c.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny"})
    try:
        yield srv
    finally:
        srv.stop()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, st_server: LiveServer) -> None:
    response = case.call(base_url=st_server.url, headers=AUTH, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])
