"""Rows stored under earlier rules (issue 11's hardening: "nothing stored is lost", "4xx, never 5xx").

Profiles and clusters are validated when they are uploaded; a later version of pipeplan may hold them to more
rules (a known dtype, calibration factors in the fit's range). Such a row stays as stored and readable, and
whatever needs it as a model (a new plan, a queued plan, a timeline, calibration) answers 422 naming the row,
the field and the rule (:func:`api.errors.stored`) instead of a failed plan with a pydantic report."""

from __future__ import annotations

import json
from typing import Any

from api_support import AUTH, make_settings, seed_plan, tiny_cluster, tiny_profile, wait_for
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text


def _edit(db_url: str, table: str, row_id: int, change: dict[str, Any]) -> dict[str, Any]:
    """Change a stored body behind the API's back, as an older version would have left it; the new body."""
    eng = create_engine(db_url)
    try:
        with eng.begin() as con:
            body = json.loads(con.execute(text(f"select body from {table} where id = :i"), {"i": row_id}).scalar())
            body.update(change)
            con.execute(text(f"update {table} set body = :b where id = :i"), {"b": json.dumps(body), "i": row_id})
    finally:
        eng.dispose()
    return body


def test_stale_profile_is_named_by_new_plans_and_timelines(client: TestClient, db_url: str) -> None:
    pid, cid, plan = seed_plan(client)
    body = _edit(db_url, "profiles", pid, {"dtype": "int7"})

    got = client.get(f"/profiles/{pid}", headers=AUTH)  # kept as stored, readable
    assert got.status_code == 200 and got.json()["profile"]["dtype"] == "int7", got.text
    assert got.json()["profile"] == body

    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 64}, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"profile {pid} was stored under earlier rules"), detail
    assert "dtype: 'int7' is not one of" in detail and "POST /profiles" in detail and "\n" not in detail

    r = client.get(f"/plans/{plan['id']}/candidates/0/timeline", headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith(f"profile {pid} was stored"), r.text
    assert client.get(f"/plans/{plan['id']}", headers=AUTH).json()["status"] == "done"  # the old plan stays


def test_stale_cluster_is_named(client: TestClient, db_url: str) -> None:
    pid, cid, _ = seed_plan(client)
    _edit(db_url, "clusters", cid, {"calibration": {"compute_scale": 10.0}})
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 64}, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"cluster {cid} was stored under earlier rules"), detail
    assert "calibration.compute_scale" in detail and "POST /clusters" in detail
    r = client.get(f"/clusters/{cid}/calibration", headers=AUTH)  # the jobs' errors before/after calibration
    assert r.status_code == 422 and r.json()["detail"].startswith(f"cluster {cid} was stored"), r.text
    assert client.get(f"/clusters/{cid}", headers=AUTH).status_code == 200


def test_queued_plan_of_a_stale_profile_fails_naming_it(db_url: str) -> None:
    """A plan queued before the upgrade runs after it: it fails with the one-line reason, not a traceback."""
    from api import crud
    from db.session import make_engine, make_sessionmaker
    from planner.cluster import Cluster
    from planner.profile import ModelProfile

    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine).begin() as db:
            prow, _ = crud.add_profile(db, ModelProfile.model_validate(tiny_profile()))
            crow, _ = crud.add_cluster(db, Cluster.model_validate(tiny_cluster()), max_gpus=64)
            plan, _ = crud.create_plan(db, prow.id, crow.id, {"global_batch": 32}, max_gpus=64, max_unfinished=10)
            ids = prow.id, plan.id
    finally:
        engine.dispose()
    _edit(db_url, "profiles", ids[0], {"dtype": "int7"})
    with TestClient(create_app_for(db_url), raise_server_exceptions=False) as c:  # takes the queued plan
        done = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            c.get(f"/plans/{ids[1]}", headers=AUTH).json()), what="queued plan ends")
    assert done["status"] == "failed", done
    assert done["error"].startswith(f"profile {ids[0]} was stored under earlier rules"), done["error"]
    assert "Traceback" not in done["error"]


def create_app_for(db_url: str) -> Any:
    from api.main import create_app

    return create_app(make_settings(db_url))
