"""The UI's server side without a browser: pages render, plotly.js is served from the package, the
candidate timeline endpoint re-simulates once (in a planner process) and stores it apart from the
candidate, job timelines read the executor's trace."""

from __future__ import annotations

import json

from api_support import AUTH, TINY_DEVICE, WAUTH, seed_plan

from api.routers.ui import plotly_path
from api.timelines import trace_timeline

PAGES = ["/", "/ui/plans", "/ui/plans/1", "/ui/jobs", "/ui/jobs/1", "/ui/workers", "/ui/clusters", "/ui/clusters/1"]


def test_pages_render_without_token(client) -> None:  # type: ignore[no-untyped-def]
    _, cid, plan = seed_plan(client)  # (the pages of plan, job and cluster 1: a missing one is a 404 page)
    assert (cid, plan["id"]) == (1, 1)
    assert client.post("/jobs", json={"plan_id": plan["id"], "emulate": True}, headers=AUTH).json()["id"] == 1
    for path in PAGES:
        r = client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith("text/html")
        assert '<script src="/ui/static/ui.js" defer></script>' in r.text and 'id="token"' in r.text
        assert "cdn" not in r.text.lower()
    assert 'value="chimera"' in client.get("/").text
    assert 'data-plan-id="1"' in client.get("/ui/plans/1").text
    # a page address with a bad id is a page saying so (it was the API's 422 JSON)
    for missing in ("/ui/plans/2", "/ui/jobs/2", "/ui/clusters/2"):
        r = client.get(missing)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), (missing, r.text)
    for bad in ("/ui/plans/0", "/ui/plans/abc", "/ui/jobs/x", "/ui/nonexistent", "/ui/plans/1/more"):
        r = client.get(bad)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), (bad, r.text)
        assert f"No page at <code>{bad}</code>" in r.text and '<a href="/ui/plans">' in r.text
    # an address under /ui/ that is no page was the API's JSON ({"detail": "Not Found"}); a script is still JSON
    assert client.get("/ui/static/nope.js").json() == {"detail": "Not Found"}
    assert client.get("/nonexistent").json() == {"detail": "Not Found"}
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/"
    assert '<option value="gpt-tiny">' in client.get("/ui/plans/1").text  # the executor's models, for dispatch
    for name in ("ui.js", "timeline.js", "plan.js", "new_plan.js", "job.js", "lists.js", "cluster.js", "ui.css"):
        assert client.get(f"/ui/static/{name}").status_code == 200, name


def test_plotly_served_from_the_package(client) -> None:  # type: ignore[no-untyped-def]
    r = client.get("/ui/vendor/plotly.min.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert len(r.content) == plotly_path().stat().st_size > 1_000_000
    assert "max-age" in r.headers["cache-control"]
    # the UI endpoints are in the API schema, the pages are not
    paths = client.get("/openapi.json").json()["paths"]
    assert "/plans/{plan_id}/candidates/{rank}/timeline" in paths and "/jobs/{job_id}/timelines" in paths
    assert "/ui/plans/{plan_id}" not in paths


def test_candidate_timeline_simulated_once_then_stored(client) -> None:  # type: ignore[no-untyped-def]
    _, _, plan = seed_plan(client)
    pid = plan["id"]
    assert client.get(f"/plans/{pid}/candidates/0/timeline").status_code == 401  # reads need a token
    first = client.get(f"/plans/{pid}/candidates/0/timeline", headers=AUTH)
    assert first.status_code == 200, first.text
    t = first.json()
    cand = plan["candidates"][0]
    assert t["cached"] is False and t["matches_stored"] is True and t["label"] == cand["label"]
    assert t["devices"] == len(t["rows"]) == cand["pipeline"]
    assert abs(t["makespan"] - cand["iteration_time"]) < 1e-12
    kinds = {a for row in t["rows"] for a, *_ in row}
    assert any("F" in a for a in kinds) and any("B" in a or "I" in a for a in kinds) and "STEP" in kinds
    for row in t["rows"]:
        for ev in row:
            assert ev[1] <= ev[2] <= t["makespan"] + 1e-12
            if "SEND" in ev[0]:
                assert len(ev) == 4 and 0 <= ev[3] < t["devices"]
    again = client.get(f"/plans/{pid}/candidates/0/timeline", headers=AUTH).json()
    assert again["cached"] is True and again["computed_at"] == t["computed_at"] and again["rows"] == t["rows"]
    stored = client.get(f"/plans/{pid}", headers=AUTH).json()["candidates"]
    assert stored == plan["candidates"]  # the timeline is stored apart: the plan document is unchanged
    r = client.get(f"/plans/{pid}/candidates/{len(stored)}/timeline", headers=AUTH)
    assert r.status_code == 404 and "has no candidate" in r.json()["detail"]
    assert client.get("/plans/999/candidates/0/timeline", headers=AUTH).status_code == 404
    assert client.get(f"/plans/{pid}/candidates/-1/timeline", headers=AUTH).status_code == 422


def _chrome_trace() -> str:
    events = []
    for rank in range(2):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank} (device {rank}, copy 0, tp 0)"}})
        for it in range(2):
            base = it * 1000.0 + rank * 100.0
            events.append({"name": f"{rank}F0", "cat": "F", "ph": "X", "pid": 0, "tid": rank, "ts": base,
                           "dur": 50.0, "args": {"iteration": it}})
            events.append({"name": f"{rank}B0", "cat": "B", "ph": "X", "pid": 0, "tid": rank, "ts": base + 300,
                           "dur": 80.0, "args": {"iteration": it}})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


def test_trace_timeline_reads_the_executors_chrome_trace() -> None:
    tl, note = trace_timeline(_chrome_trace())
    assert note == "" and tl is not None
    assert tl["iteration"] == 1 and tl["devices"] == 2
    assert tl["labels"] == ["rank 0 (device 0, copy 0, tp 0)", "rank 1 (device 1, copy 0, tp 0)"]
    name, start, end = tl["rows"][0][0]
    assert name == "0F0" and start == 0.0 and abs(end - 50e-6) < 1e-12
    assert abs(tl["rows"][1][1][1] - 400e-6) < 1e-12 and abs(tl["makespan"] - 480e-6) < 1e-12
    assert trace_timeline(None) == (None, "the result has no trace")
    assert trace_timeline("{nope")[0] is None and "not JSON" in trace_timeline("{nope")[1]
    empty = trace_timeline(json.dumps({"traceEvents": []}))
    assert empty[0] is None and "no timed events" in empty[1]


def test_job_timelines_predicted_and_measured(client) -> None:  # type: ignore[no-untyped-def]
    _, _, plan = seed_plan(client)
    job = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 1, "model": "gpt-tiny"},
                      headers=AUTH).json()
    t = client.get(f"/jobs/{job['id']}/timelines", headers=AUTH).json()
    assert t["measured"] is None and "no result yet (queued)" in t["measured_note"]
    assert t["predicted"]["rank"] == 1 and t["predicted"]["devices"] == plan["candidates"][1]["pipeline"]
    w = client.post("/workers", json={"name": "w1", "node": "n1", "device_type": TINY_DEVICE}, headers=WAUTH).json()
    mine = {"Authorization": f"Bearer {w['token']}"}
    claim = client.post(f"/workers/{w['id']}/claim", headers=mine)
    assert claim.status_code == 200, claim.text
    r = client.post(f"/jobs/{job['id']}/result", headers=mine,
                    json={"worker_id": w["id"], "iteration_time": 0.01, "trace": _chrome_trace()})
    assert r.status_code == 201, r.text
    t = client.get(f"/jobs/{job['id']}/timelines", headers=AUTH).json()
    assert t["predicted"]["cached"] is True
    assert t["measured"]["devices"] == 2 and t["measured_note"] == ""


def test_inputs_the_form_used_to_change_silently_are_refused(client) -> None:  # type: ignore[no-untyped-def]
    """No schedule (an empty list meant "all of them"), a non-numeric "top", an unknown model for a job:
    422 naming the field, and nothing stored."""
    from api.routers.ui import plan_limits

    pid, cid, plan = seed_plan(client)
    n_plans = len(client.get("/plans", headers=AUTH).json())
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 32}
    r = client.post("/plans", json={**base, "schedules": []}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("schedules:"), r.text
    assert "at least one schedule" in r.json()["detail"]
    r = client.post("/plans", json={**base, "top": "ten"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("top:"), r.text
    top = plan_limits()["top"]  # the new-plan form refuses what the API refuses
    assert f'data-max="{top}"' in client.get("/").text
    r = client.post("/plans", json={**base, "top": top + 1}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("top:"), r.text
    assert len(client.get("/plans", headers=AUTH).json()) == n_plans
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tinyy"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("model:"), r.text
    assert "unknown model 'gpt-tinyy'" in r.json()["detail"] and "gpt-tiny" in r.json()["detail"]
    assert client.get("/jobs", headers=AUTH).json() == []
    ok = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny"}, headers=AUTH)
    assert ok.status_code == 201, ok.text


def test_docs_pages_load_nothing_from_a_cdn(client) -> None:  # type: ignore[no-untyped-def]
    """/docs and /redoc were FastAPI's Swagger UI and ReDoc pages, whose scripts come from cdn.jsdelivr.net: blank
    on a host without internet. They are a page of their own now: the endpoints, /openapi.json, and the interactive
    pages as links that say they need internet."""
    for path in ("/docs", "/redoc"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
        assert "<script" not in r.text and "<link" not in r.text  # nothing loaded from elsewhere
        assert '<a href="/openapi.json">' in r.text and "need internet" in r.text
        assert "<code>/plans/{plan_id}</code>" in r.text and "<code>POST</code>" in r.text
    assert "swagger-ui" in client.get("/docs/swagger").text and "redoc" in client.get("/docs/redoc").text
    assert "/docs" not in client.get("/openapi.json").json()["paths"]
