"""Bad input through the API as a new user sends it (issue 13, QA on a fresh clone): a clear 4xx naming the
field and the rule, never a failed plan for a budget the schema accepts."""

from __future__ import annotations

import json
from pathlib import Path

from api_support import AUTH, post_plan, tiny_cluster, tiny_profile

CPU4 = Path(__file__).resolve().parent.parent / "examples" / "clusters" / "local-cpu-4.json"


def _plan(client, body: dict) -> dict:  # type: ignore[no-untyped-def]
    return post_plan(client, body)


def test_odd_budget_plans_and_skips_gems(client) -> None:  # type: ignore[no-untyped-def]
    """A budget of 3 devices was a failed plan ('ValueError: gems: devices hold different numbers of stages')."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    r = client.post("/clusters", json=json.loads(CPU4.read_text()), headers=AUTH)
    assert r.status_code in (200, 201), r.text
    plan = _plan(client, {"profile_id": pid, "cluster_id": r.json()["id"], "global_batch": 8, "gpus": 3})
    assert plan["status"] == "done", plan["error"]
    assert plan["candidates"] and plan["rejected"].get("gems: not valid for this D and N", 0) > 0


def test_job_of_a_plan_without_candidates_says_so(client) -> None:  # type: ignore[no-untyped-def]
    """It said 'plan 2 has 0 candidate(s) (0..-1), got 0'."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json={**tiny_cluster(4), "memory_bytes": 2**31 + 2**20}, headers=AUTH).json()["id"]
    plan = _plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})  # (1 MiB past the reserve)
    assert plan["status"] == "done" and plan["num_candidates"] == 0, plan
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny"}, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("candidate_index:") and "has no candidates" in detail and "-1" not in detail


def test_only_asynchronous_schedules_without_allow_async_is_422(client) -> None:  # type: ignore[no-untyped-def]
    """It planned nothing and said nothing ('rejected' empty): every named schedule was filtered out."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    body = {"profile_id": pid, "cluster_id": cid, "global_batch": 8, "schedules": ["pipedream", "pipedream-2bw"]}
    r = client.post("/plans", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert "only asynchronous ones are named (pipedream, pipedream-2bw); set allow_async" in r.json()["detail"]
    plan = _plan(client, {**body, "allow_async": True})
    assert plan["status"] == "done" and plan["candidates"]


def test_validation_errors_name_the_field_without_pydantic_words(client) -> None:  # type: ignore[no-untyped-def]
    """QA of issue 13 on a fresh clone: the README's curl flow with an unknown schedule or model answered
    'body: Value error, schedules: unknown schedule ...' (pydantic's words and the body's location before a
    message that names its field itself)."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "schedules": ["foo"]},
                    headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("schedules: unknown schedule 'foo'; known: gpipe, 1f1b"), r.json()["detail"]
    assert "Value error" not in r.text  # nor in the structured errors beside it
    plan = _plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "nope"}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("model: unknown model 'nope'; presets: "), r.json()["detail"]
    r = client.post("/profiles", json={"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, headers=AUTH)
    assert r.status_code == 422 and "this is a Hugging Face config.json, not a model profile" in r.json()["detail"]
    assert "/profiles/hf-config" in r.json()["detail"] and "Field required" not in r.json()["detail"], r.text
    # a real-compute job builds a model; an emulated one builds none (a new user's Qwen3 plan has no preset)
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("model: a real-compute job builds a model"), r.text
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "emulate": True}, headers=AUTH)
    assert r.status_code == 201 and r.json()["model"] == "", r.text
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": "x"}, headers=AUTH)
    assert r.json()["detail"] == "global_batch: Input should be a valid integer"  # field errors as they were


def test_a_body_that_is_not_json_says_so_with_where(client) -> None:  # type: ignore[no-untyped-def]
    """A malformed body said "16: JSON decode error": the 16 is the character where parsing stopped."""
    r = client.post("/plans", content=b'{"profile_id": , "cluster_id": 1}',
                    headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"] == "body: not valid JSON at character 15", r.text


def test_a_new_job_answers_with_its_prediction_and_cluster(client) -> None:  # type: ignore[no-untyped-def]
    """POST /jobs answered predicted_iteration_time and cluster_id null (GET /jobs/{id} gave both): the README's
    curl flow showed no prediction for the job it had just dispatched."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    plan = _plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    r = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 1, "model": "gpt-tiny"}, headers=AUTH)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["predicted_iteration_time"] == plan["candidates"][1]["iteration_time"]
    assert job["cluster_id"] == plan["cluster_id"]
    assert job["measured_iteration_time"] is None and job["measured_over_predicted"] is None
    got = client.get(f"/jobs/{job['id']}", headers=AUTH).json()
    assert {k: got[k] for k in ("predicted_iteration_time", "cluster_id")} == \
        {k: job[k] for k in ("predicted_iteration_time", "cluster_id")}
    cancelled = client.post(f"/jobs/{job['id']}/cancel", headers=AUTH).json()
    assert cancelled["state"] == "cancelled"
    assert cancelled["predicted_iteration_time"] == job["predicted_iteration_time"]


def test_a_key_given_twice_in_a_body_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    """FastAPI's reader kept the last of a key given twice; pipeplan's files refuse it, and so does the API
    (api.jsonbody), for bodies of every router, at any depth."""
    text = json.dumps(tiny_profile())
    dup = text.replace('"dtype":', '"dtype": "fp32", "dtype":', 1)
    r = client.post("/profiles", content=dup, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "body: key 'dtype' appears twice in one object (which one is meant?)"
    assert client.get("/profiles", headers=AUTH).json() == []  # nothing stored
    cl = json.dumps(tiny_cluster()).replace('"alpha":', '"alpha": 1e-6, "alpha":', 1)  # nested
    r = client.post("/clusters", content=cl, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and "key 'alpha' appears twice" in r.json()["detail"], r.text
    r = client.post("/plans", content='{"profile_id": 1, "profile_id": 2, "cluster_id": 1, "global_batch": 8}',
                    headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and "key 'profile_id' appears twice" in r.json()["detail"], r.text
    r = client.post("/profiles", content=text, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 201, r.text  # the same body without the second key is stored
