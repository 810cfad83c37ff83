"""A QA pass over the API with odd input (session 45), each find a 5xx, a stored thing that could not be read
back, or an answer that named no field:

* a lone UTF-16 surrogate (``"\\ud800"``, which JSON's escapes allow) in a result's ``raw`` or a device's extra
  field answered 500 while writing the answer; in a stored trace's event names it made every later
  ``GET /jobs/{id}/timelines`` a 500;
* a profile's ``environment.model_spec`` of 1999 ``[`` (within its length) raised RecursionError: 500;
* a profile whose shape's hidden size its heads do not divide planned, and every export of it was a 500; one
  named after a preset, without a shape, exported the preset (GPT-3 175B's 96 layers for a 6-layer profile);
* a result of 1e308 s was stored, and every calibration then failed with pydantic's words; an emulated job's
  result posted without ``emulated`` was fitted as a real run;
* ``"01"`` and ``"1"`` as keys of one table were read as the same size: one value dropped without a word;
* a cluster's ``memory_bandwidth`` of 5e-324 made a plan fail with "cost is nan";
* an integer of 5000 digits, a body sent as text/plain, ``/profiles/1.0``: answers that named no rule;
* a slot of a gang still forming could be marked done, and then never freed;
* ``/metrics`` grew a series per made-up HTTP method."""

from __future__ import annotations

import json
from typing import Any

from api_support import AUTH, WAUTH, post_plan, tiny_cluster, tiny_profile


def _job_held(client: Any, emulate: bool = True) -> tuple[int, dict[str, str], dict[str, Any]]:
    """A job of a done plan on the tiny cluster, claimed by a CPU worker: (job id, the worker's headers, plan)."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    assert plan["status"] == "done", plan
    jid = client.post("/jobs", json={"plan_id": plan["id"], "emulate": emulate}, headers=AUTH).json()["id"]
    w = client.post("/workers", json={"name": "w", "node": "n", "gpus": 4, "device_type": "cpu"},
                    headers=WAUTH).json()
    mine = {"Authorization": f"Bearer {w['token']}"}
    assert client.post(f"/workers/{w['id']}/claim", json={}, headers=mine).json()["job"]["id"] == jid
    return jid, mine, plan


def _raw_post(client: Any, path: str, text: bytes, headers: dict[str, str]) -> Any:
    return client.post(path, content=text, headers={**headers, "content-type": "application/json"})


def test_a_lone_surrogate_is_refused_where_it_would_be_stored(client) -> None:  # type: ignore[no-untyped-def]
    jid, mine, _ = _job_held(client)
    for body, where in ((b'{"iteration_time": 0.01, "raw": {"s": "\\ud800"}}', "raw.s"),
                        (b'{"iteration_time": 0.01, "raw": {"\\udc00": 1}}', "raw (a key)"),
                        (b'{"iteration_time": 0.01, "devices": [{"busy": 1, "idle": 0, "note": "\\udc00"}]}',
                         "devices[0].note")):
        r = _raw_post(client, f"/jobs/{jid}/result", body, mine)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith(f"{where}: a lone UTF-16 surrogate"), r.json()
    # a pair is text (U+1F600), and is stored and read back
    r = _raw_post(client, f"/jobs/{jid}/result", b'{"iteration_time": 0.01, "raw": {"s": "\\ud83d\\ude00"}}', mine)
    assert r.status_code == 201, r.text
    assert client.get(f"/jobs/{jid}/result", headers=AUTH).json()["raw"] == {"s": "\U0001F600"}


def test_a_trace_naming_events_with_lone_surrogates_still_draws(client) -> None:  # type: ignore[no-untyped-def]
    jid, mine, _ = _job_held(client)
    trace = json.dumps({"traceEvents": [{"ph": "X", "ts": 0, "dur": 5, "name": "F\ud800", "pid": 0, "tid": "t\udc01"},
                                        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1,
                                         "args": {"name": "rank\ud800"}},
                                        {"ph": "X", "ts": 1, "dur": 2, "name": "B", "pid": 0, "tid": 1}]})
    assert "\\ud800" in trace  # (json.dumps escapes it: the stored trace is ASCII)
    assert client.post(f"/jobs/{jid}/result", json={"iteration_time": 0.01, "trace": trace},
                       headers=mine).status_code == 201
    for _ in range(2):  # read back again and again
        r = client.get(f"/jobs/{jid}/timelines", headers=AUTH)
        assert r.status_code == 200, r.text
    measured = r.json()["measured"]
    names = sorted(span[0] for row in measured["rows"] for span in row)
    assert names == ["B", "F\ufffd"] and sorted(measured["labels"]) == ["rank\ufffd", "track t\ufffd"], measured


def test_profiles_that_describe_no_exportable_model_are_refused_by_the_export(client) -> None:  # type: ignore[no-untyped-def]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    deep = tiny_profile()
    deep["environment"]["model_spec"] = "[" * 1999  # (within the 2,000 characters an environment value holds)
    assert client.post("/profiles", json=deep, headers=AUTH).status_code in (200, 201)
    odd = tiny_profile(name="odd-heads")
    odd["environment"].pop("model_spec")
    odd["shape"]["heads"] = 3  # hidden 256
    pid = client.post("/profiles", json=odd, headers=AUTH).json()["id"]
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    assert plan["status"] == "done" and plan["candidates"], plan
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        r = client.get(f"/plans/{plan['id']}/candidates/0/export", params={"format": fmt}, headers=AUTH)
        assert r.status_code == 422, (fmt, r.status_code, r.text)
        assert r.json()["detail"].startswith("shape: profile 'odd-heads' describes no model"), r.json()
        assert "divisible by heads (3)" in r.json()["detail"]


def test_a_profile_named_after_a_preset_exports_its_own_layers(client) -> None:  # type: ignore[no-untyped-def]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    prof = tiny_profile(name="gpt3-175b")  # 4 transformer layers, not GPT-3's 96
    prof["shape"] = None
    for key in ("model_spec", "model"):
        prof["environment"].pop(key, None)
    pid = client.post("/profiles", json=prof, headers=AUTH).json()["id"]
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        r = client.get(f"/plans/{plan['id']}/candidates/0/export", params={"format": fmt}, headers=AUTH)
        assert r.status_code in (200, 422), r.text
        assert "12288" not in json.dumps(r.json()), (fmt, r.text[:2000])  # (GPT-3's hidden size)


def test_a_result_is_a_time_within_the_limits_and_of_the_jobs_kind(client) -> None:  # type: ignore[no-untyped-def]
    jid, mine, _ = _job_held(client, emulate=True)
    r = client.post(f"/jobs/{jid}/result", json={"iteration_time": 1e308}, headers=mine)
    assert r.status_code == 422 and r.json()["detail"].startswith("iteration_time:"), r.text
    r = client.post(f"/jobs/{jid}/result", json={"iteration_time": 0.01, "emulated": False}, headers=mine)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (f"emulated: false, but job {jid} was created with emulate true: a result says how "
                                  "the job it is of ran")
    assert client.post(f"/jobs/{jid}/result", json={"iteration_time": 0.01}, headers=mine).status_code == 201
    assert client.get(f"/jobs/{jid}/result", headers=AUTH).json()["emulated"] is True  # (absent: the job's)


def test_one_size_written_two_ways_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    prof = tiny_profile()
    for layer in prof["layers"]:
        layer.pop("tensor_times", None)
    text = json.dumps(prof)
    first = text.index('"fwd_time": {') + len('"fwd_time": {')
    for key in ('"01"', '" 1"', '"1.0"'):
        r = _raw_post(client, "/profiles", (text[:first] + key + ": 99.0, " + text[first:]).encode(), AUTH)
        assert r.status_code == 422, (key, r.text)
        assert "layers.0.fwd_time" in r.json()["detail"] and "not a whole number written plainly" in r.text


def test_counts_of_a_shape_are_json_integers(client) -> None:  # type: ignore[no-untyped-def]
    for path, value in ((("shape", "layers"), 4.0), (("schema_version",), True)):
        prof = tiny_profile()
        doc = prof
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
        r = client.post("/profiles", json=prof, headers=AUTH)
        assert r.status_code == 422 and ".".join(path) in r.json()["detail"], (path, r.text)


def test_a_clusters_rates_are_at_least_a_real_devices(client) -> None:  # type: ignore[no-untyped-def]
    for field, value in (("memory_bandwidth", 5e-324), ("peak_flops", 1e-300)):
        r = client.post("/clusters", json={**tiny_cluster(4), field: value}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"].startswith(f"{field}:"), r.text
    host = {"cores": 1, "effective_cores": 5e-324}
    r = client.post("/clusters", json={**tiny_cluster(4), "host": host}, headers=AUTH)
    assert r.status_code == 422 and "host.effective_cores" in r.json()["detail"], r.text


def test_a_plans_micro_batch_sizes_must_divide_its_batch(client) -> None:  # type: ignore[no-untyped-def]
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "micro_batches": [16, 3]},
                    headers=AUTH)
    assert r.status_code == 422 and "micro_batches: none of 16, 3 divides global_batch 8" in r.json()["detail"]


def test_bodies_and_paths_that_name_no_rule_now_do(client) -> None:  # type: ignore[no-untyped-def]
    r = _raw_post(client, "/plans", b'{"global_batch": 1' + b"0" * 5000 + b"}", AUTH)
    assert r.status_code == 400 and "4300 digits" in r.json()["detail"], r.text
    r = client.post("/profiles", content=json.dumps(tiny_profile()), headers={**AUTH, "content-type": "text/plain"})
    assert r.status_code == 415, r.text
    assert r.json()["detail"] == ("body: sent as 'text/plain'; POST /profiles takes JSON, sent with content-type "
                                  "application/json")
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    assert client.get(f"/profiles/{pid}", headers=AUTH).status_code == 200
    for odd in (f"{pid}.0", f"%20{pid}", f"+{pid}"):
        r = client.get(f"/profiles/{odd}", headers=AUTH)
        assert r.status_code == 422 and "an id is written in digits" in r.json()["detail"], (odd, r.text)


def test_hf_config_dropout_is_a_probability_and_its_name_a_string(client) -> None:  # type: ignore[no-untyped-def]
    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 128}
    for value in ("Infinity", "NaN", "1.5"):
        text = json.dumps({"config": {**cfg, "attention_dropout": 0.0}, "device": "a100-80gb"})
        text = text.replace('"attention_dropout": 0.0', f'"attention_dropout": {value}')
        r = _raw_post(client, "/profiles/hf-config", text.encode(), AUTH)
        assert r.status_code == 422 and "attention_dropout" in r.json()["detail"], (value, r.text)
    r = client.post("/profiles/hf-config", json={"config": {**cfg, "_name_or_path": ["a"]}, "device": "a100-80gb"},
                    headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("config._name_or_path: a string"), r.text


def test_metrics_count_made_up_methods_as_one(client) -> None:  # type: ignore[no-untyped-def]
    for method in ("M1XYZ", "M2XYZ", "M3XYZ"):
        client.request(method, "/nope")
    text = client.get("/metrics", headers=AUTH).text
    assert "XYZ" not in text and 'method="other"' in text


def test_a_size_or_schedule_named_twice_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    """"2,2,2" in the new-plan form ranked 300 configurations where "2" ranks 100, each row 'same as: 1f1b,
    1f1b'."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    for field, value, said in (("micro_batches", [2, 1, 2], "2"), ("schedules", ["1f1b", "gpipe", "1f1b"], "1f1b")):
        r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, field: value},
                        headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"] == f"{field}: {said} is given twice", r.text


def test_a_real_run_is_of_the_model_its_plans_profile_is_of(client) -> None:  # type: ignore[no-untyped-def]
    """A bert-tiny run of a gpt-tiny plan (the same 6 layers) was compared with gpt-tiny's prediction and fitted in
    the cluster's calibration, with nothing to say so."""
    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cid = client.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
    r = client.post("/jobs", json={"plan_id": plan["id"], "model": "bert-tiny"}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"model: bert-tiny, but plan {plan['id']}'s profile 'gpt-tiny' is of "
                                         "gpt-tiny: a run of another model"), r.text
    assert client.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny"}, headers=AUTH).status_code == 201
    assert client.post("/jobs", json={"plan_id": plan["id"], "emulate": True}, headers=AUTH).status_code == 201
