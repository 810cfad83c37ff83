"""A QA walkthrough's finds in what the API accepted: JSON of the wrong type silently coerced into what runs
(``"candidate_index": true`` ran candidate 1, ``"plan_id": true`` read plan 1, ``"gpus": "4"`` registered 4 GPUs),
an hf-config profile named with a newline or nothing, ``micro_batches: []`` read as every size, and an unknown
``cluster_id`` of POST /profiles/hf-config answered 404 where POST /plans answers 422 naming the field. Each is now
a 422 naming the field; ids and counts are JSON integers, switches JSON booleans, floats any JSON number."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import AUTH, WAUTH, seed_plan, tiny_cluster

HF_CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
             "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 128}


@pytest.fixture
def seeded(client) -> tuple[Any, int, int, dict[str, Any]]:  # type: ignore[no-untyped-def]
    pid, cid, plan = seed_plan(client)
    return client, pid, cid, plan


def _refused(client: Any, path: str, body: dict[str, Any], field: str, headers: dict[str, str] = AUTH) -> None:
    r = client.post(path, json=body, headers=headers)
    assert r.status_code == 422, (body, r.status_code, r.text)
    assert r.json()["detail"].startswith(f"{field}: "), (body, r.json()["detail"])


def test_job_ids_counts_and_switches_are_json_integers_and_booleans(seeded) -> None:  # type: ignore[no-untyped-def]
    client, _, _, plan = seeded
    base = {"plan_id": plan["id"], "candidate_index": 0, "emulate": True}
    for field, value in (("candidate_index", True), ("candidate_index", "1"), ("candidate_index", 1.0),
                         ("plan_id", True), ("plan_id", float(plan["id"])), ("plan_id", str(plan["id"])),
                         ("emulate", "yes"), ("emulate", 1), ("iterations", "3"), ("iterations", 3.0),
                         ("max_attempts", True), ("gpus_per_node", "4")):
        _refused(client, "/jobs", {**base, field: value}, field)
    assert client.get("/jobs", headers=AUTH).json() == []  # nothing made
    r = client.post("/jobs", json={**base, "iterations": 3}, headers=AUTH)
    assert r.status_code == 201 and r.json()["candidate_index"] == 0 and r.json()["iterations"] == 3, r.text


def test_plan_ids_and_floats_are_json_numbers(seeded) -> None:  # type: ignore[no-untyped-def]
    client, pid, cid, _ = seeded
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 8}
    for field, value in (("profile_id", True), ("profile_id", float(pid)), ("cluster_id", str(cid)),
                         ("bytes_per_param", "16"), ("bytes_per_param", True), ("tensor_efficiency", "0.9"),
                         ("optimizer_bytes_per_param", False), ("memory_reserve_bytes", "0")):
        _refused(client, "/plans", {**base, field: value}, field)
    r = client.post("/plans", json={**base, "bytes_per_param": 16}, headers=AUTH)  # a JSON integer is a number
    assert r.status_code in (200, 201, 202), r.text


def test_an_empty_micro_batches_list_is_refused_as_schedules_is(seeded) -> None:  # type: ignore[no-untyped-def]
    client, pid, cid, _ = seeded
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "micro_batches": []},
                    headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == ("micro_batches: choose at least one micro-batch size (leave the field out to try "
                                  "all of them)"), r.json()["detail"]


def test_worker_gpus_are_json_integers(client) -> None:  # type: ignore[no-untyped-def]
    body = {"name": "w", "node": "n"}
    for field, value in (("gpus", "4"), ("gpus", True), ("gpus", 4.0)):
        _refused(client, "/workers", {**body, field: value}, field, WAUTH)
    r = client.post("/workers", json={**body, "gpus": 4}, headers=WAUTH)
    assert r.status_code == 201 and r.json()["gpus"] == 4, r.text
    mine = {"Authorization": f"Bearer {r.json()['token']}"}
    _refused(client, f"/workers/{r.json()['id']}/heartbeat", {"gpus": "8"}, "gpus", mine)
    _refused(client, f"/workers/{r.json()['id']}/claim", {"rdzv_port": "29500"}, "rdzv_port", mine)
    _refused(client, f"/workers/{r.json()['id']}/claim", {"whole": "yes"}, "whole", mine)


def test_hf_config_fields_are_typed_and_its_name_held_to_the_profiles_rule(client) -> None:  # type: ignore[no-untyped-def]
    base = {"config": HF_CONFIG, "device": "h100"}
    for field, value in (("seq", "4096"), ("seq", 4096.0), ("sequence_parallel", "yes"), ("sequence_parallel", 1),
                         ("p2p_scatter_gather", "true"), ("cluster_id", True)):
        _refused(client, "/profiles/hf-config", {**base, field: value}, field)
    for name in ("a\nb", "tab\there", ""):
        _refused(client, "/profiles/hf-config", {**base, "name": name}, "name")
    r = client.post("/profiles/hf-config", json={**base, "name": "a\nb"}, headers=AUTH)
    assert "must not contain control characters" in r.json()["detail"], r.text
    _refused(client, "/profiles/hf-config", {**base, "config": {**HF_CONFIG, "_name_or_path": "x\ny"}},
             "config._name_or_path")
    assert client.get("/profiles", headers=AUTH).json() == []  # nothing stored by the refusals
    r = client.post("/profiles/hf-config", json={**base, "seq": 128, "sequence_parallel": True, "name": "tiny"},
                    headers=AUTH)
    assert r.status_code == 201 and r.json()["name"] == "tiny", r.text


def test_hf_config_of_an_unknown_cluster_names_the_field(client) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/profiles/hf-config", json={"config": HF_CONFIG, "cluster_id": 99999}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"] == "cluster_id: cluster 99999 not found", r.text


def test_failing_a_finished_job_again_says_it_is_finished(seeded) -> None:  # type: ignore[no-untyped-def]
    """A repeated POST /jobs/{id}/fail by the worker that ran a finished job said 'worker 7 does not hold job 19 (it
    is succeeded, held by worker 7): the lease was lost'."""
    client, _, _, plan = seeded
    w = client.post("/workers", json={"name": "w", "node": "n", "device_type": "cpu"}, headers=WAUTH).json()
    mine = {"Authorization": f"Bearer {w['token']}"}
    job = client.post("/jobs", json={"plan_id": plan["id"], "emulate": True}, headers=AUTH).json()
    assert client.post(f"/workers/{w['id']}/claim", headers=mine).status_code == 200
    r = client.post(f"/jobs/{job['id']}/result", json={"iteration_time": 0.1}, headers=mine)
    assert r.status_code == 201, r.text
    for path in ("fail", "lease"):
        r = client.post(f"/jobs/{job['id']}/{path}", json={"error": "x"} if path == "fail" else {}, headers=mine)
        assert r.status_code == 409, r.text
        assert r.json()["detail"] == (f"job {job['id']} is already succeeded (run by worker {w['id']}): it no longer "
                                      "runs, so there is no lease to renew, give back or fail"), r.text


def _plan_of_1024(client: Any) -> int:
    """A done plan on 8-GPU nodes whose one candidate needs t*D*W = 8*4*32 = 1024 processes (a GPT-3 1024-GPU
    plan's size), stored directly: planning one here would take minutes."""
    from api_support import tiny_cluster, tiny_profile

    from api import planqueue
    from db.models import PlanRequest

    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(8, 128), headers=AUTH).json()["id"]
    with client.app.state.sessions.begin() as db:
        plan = PlanRequest(profile_id=pid, cluster_id=cid, request={"global_batch": 1024}, request_hash="big",
                           status="done")
        db.add(plan)
        db.flush()
        planqueue.finish_plan(db, plan.id, {"candidates": [{"label": "big", "iteration_time": 1.0, "throughput": 1.0,
                                                            "run_spec": {"config": {"tensor": 8, "pipeline": 4,
                                                                                    "data": 32, "micro_batch": 1,
                                                                                    "schedule": "1f1b"},
                                                                         "microbatches": 32}}]})
        return plan.id


def test_a_job_of_more_processes_than_a_node_holds_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    """An emulated job of a 1024-GPU plan was queued as 1 node x 1024 processes (201) and failed on the CPU agent
    ('the plan needs 1024 processes on this machine, about 320 GiB ...'). POST /jobs refuses more than
    PIPEPLAN_MAX_NODE_PROCESSES (256) processes on one node, naming the rule and the way out."""
    plan = _plan_of_1024(client)
    r = client.post("/jobs", json={"plan_id": plan, "emulate": True, "model": "gpt-tiny", "max_attempts": 1},
                    headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (
        f"candidate_index: candidate 0 of plan {plan} needs t*D*W = 1024 processes, placed as 1 node(s) x 1024 "
        "processes (an emulated job runs on one node unless gpus_per_node says otherwise); this server places at "
        "most 256 processes on one node (PIPEPLAN_MAX_NODE_PROCESSES: an agent starts them on one host, each about "
        "320 MiB before any model, planner.reserve; 1024 need about 320 GiB): give a gpus_per_node of at most 256 "
        "to spread it over agents, or dispatch a candidate with fewer processes"), r.json()["detail"]
    r = client.post("/jobs", json={"plan_id": plan, "emulate": True, "gpus_per_node": 512}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("gpus_per_node: "), r.text
    assert client.get("/jobs", headers=AUTH).json() == []
    r = client.post("/jobs", json={"plan_id": plan, "emulate": True, "gpus_per_node": 8}, headers=AUTH)
    assert r.status_code == 201 and (r.json()["nodes"], r.json()["procs_per_node"]) == (128, 8), r.text
    r = client.post("/jobs", json={"plan_id": plan, "model": "gpt-tiny"}, headers=AUTH)  # real: the cluster's 8
    assert r.status_code == 201 and (r.json()["nodes"], r.json()["procs_per_node"]) == (128, 8), r.text


def test_a_reserve_of_the_whole_device_is_a_422(seeded) -> None:  # type: ignore[no-untyped-def]
    """A reserve of a device's whole memory made a plan whose every candidate read 'weights, gradients and optimizer
    state do not fit' (the plan page: the model's state alone exceeds each device's memory); refused at POST /plans,
    naming the field, as the planner refuses it (planner.reserve.reserve_error)."""
    client, pid, cid, _ = seeded
    memory = tiny_cluster()["memory_bytes"]
    body = {"profile_id": pid, "cluster_id": cid, "global_batch": 8, "memory_reserve_bytes": memory}
    _refused(client, "/plans", body, "memory_reserve_bytes")
    r = client.post("/plans", json={**body, "memory_reserve_bytes": memory // 2}, headers=AUTH)
    assert r.status_code in (201, 202), r.text


@pytest.mark.parametrize(("body", "words"), [
    (b'{"name": "\xff\xfe"}', "body: not UTF-8 text: byte 0xff at position 10 (a JSON body is UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "body: nested deeper than the JSON reader follows"),
])
def test_a_body_the_reader_cannot_take_says_which_rule(client, body: bytes, words: str) -> None:  # type: ignore[no-untyped-def]
    """Bytes that are not UTF-8 and arrays nested 100,000 deep were both 400 "There was an error parsing the body"."""
    for path in ("/clusters", "/profiles", "/plans"):
        r = client.post(path, content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["detail"].startswith(words), (path, r.text)


def test_a_query_parameter_an_endpoint_does_not_take_or_given_twice_is_refused(seeded) -> None:  # type: ignore[no-untyped-def]
    """``GET /jobs?cluster_id=1`` listed every job as if it filtered; ``?state=queued&state=running`` kept the
    last value; ``?closest=true`` on an export was ignored. Each is a 422 naming the parameter now."""
    client, pid, _, plan = seeded
    r = client.get("/jobs", params={"cluster_id": 1}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"] == (
        "query: GET /jobs takes no parameter 'cluster_id' (it takes: limit, offset, plan_id, state)"), r.text
    r = client.get("/jobs?state=queued&state=running", headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"] == "query: 'state' is given twice; GET /jobs takes one value of it"
    r = client.get(f"/plans/{plan['id']}/candidates/0/export?format=megatron&closest=true", headers=AUTH)
    assert r.status_code == 422 and "takes no parameter 'closest' (it takes: format)" in r.json()["detail"], r.text
    assert client.get("/jobs", params={"state": "queued", "limit": 5}, headers=AUTH).status_code == 200
    assert client.get(f"/profiles/{pid}/assumes", params={"sharded_weights": "true"}, headers=AUTH).status_code == 200


def test_a_body_sent_to_an_endpoint_that_takes_none_is_refused(seeded) -> None:  # type: ignore[no-untyped-def]
    """``POST /clusters/1/calibrate`` with ``{"include_emulated": "yes"}`` calibrated without the option it meant."""
    client, _, cid, _ = seeded
    r = client.post(f"/clusters/{cid}/calibrate", json={"include_emulated": "yes"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"] == (
        "body: POST /clusters/{cluster_id}/calibrate takes no body; its options are query parameters: "
        "include_emulated"), r.text
    r = client.post("/jobs/1/cancel", json={"why": "x"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"] == "body: POST /jobs/{job_id}/cancel takes no body", r.text
    r = client.post(f"/clusters/{cid}/calibrate", json={}, headers=AUTH)  # an empty object says nothing: as none
    assert r.status_code != 422 or "takes no body" not in r.text, r.text


def test_a_running_plans_candidate_is_a_409_not_a_404(seeded) -> None:  # type: ignore[no-untyped-def]
    """``GET /plans/4/candidates/0/export`` of a running plan said 'plan 4 has no candidate 0' (404): a client
    reads that as gone for good, where the candidate comes once the plan is done."""
    from sqlalchemy import text

    client, _, _, plan = seeded
    with client.app.state.sessions.begin() as db:
        db.execute(text("UPDATE plan_requests SET status = 'running' WHERE id = :i"), {"i": plan["id"]})
    for path in ("timeline", "export?format=megatron"):
        r = client.get(f"/plans/{plan['id']}/candidates/0/{path}", headers=AUTH)
        assert r.status_code == 409 and r.json()["detail"].startswith(
            f"plan {plan['id']} is running: its candidates are known once it is done"), (path, r.text)
