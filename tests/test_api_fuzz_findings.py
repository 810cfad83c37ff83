"""What a fuzzing pass over the API found (session 26: ~9,000 malformed requests against a live server on
SQLite): requests that made it answer 500, and values it accepted and stored that broke later reads. Each is
now a 4xx naming the field, or read around where it was stored before the check existed; nothing is stored by
a refused request."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from api_support import AUTH, TINY_DEVICE, WAUTH, seed_plan, tiny_cluster, tiny_profile
from sqlalchemy import select

from api.timelines import trace_timeline

pytestmark = pytest.mark.slow  # database

BIG = 10**400  # a JSON integer no float holds


def _worker(client: Any) -> dict[str, Any]:
    w = client.post("/workers", json={"name": "a", "node": "n", "device_type": TINY_DEVICE}, headers=WAUTH)
    assert w.status_code in (200, 201), w.text
    return w.json()


def _job(client: Any, emulate: bool = False) -> tuple[dict[str, Any], dict[str, str], int]:
    """A claimed job of a seeded plan, emulated or real (a result must say how its job ran): (worker, its auth
    header, job id)."""
    _, _, plan = seed_plan(client)
    w = _worker(client)
    mine = {"Authorization": f"Bearer {w['token']}"}
    job = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny",
                                     "emulate": emulate}, headers=AUTH).json()
    claim = client.post(f"/workers/{w['id']}/claim", headers=mine)
    assert claim.status_code == 200, claim.text
    return w, mine, job["id"]


@pytest.mark.parametrize("event", [
    {"ph": "X", "name": "0F0", "ts": BIG, "dur": 10},
    {"ph": "X", "name": "0F0", "ts": 1, "dur": BIG},
    {"ph": "X", "name": "0F0", "ts": 1, "dur": "abc"},
    {"ph": "X", "name": "0F0", "ts": 1, "dur": {"a": 1}},
    {"ph": "X", "name": "0F0", "ts": 1e308, "dur": 1e308},
    {"ph": "M", "name": "thread_name", "args": [1]},
    {"ph": "X", "name": "0F0", "ts": 1, "dur": 1, "pid": [1]},
    {"ph": "X", "name": "0F0", "ts": 1, "dur": 1, "tid": {"a": 1}},
])
def test_a_malformed_trace_event_is_left_out(event: dict[str, Any]) -> None:
    """A worker stores its trace as it wrote it; an event of another shape was read as it came (float() of a
    400-digit integer, .get on a list, a list as a dict key) and every later timelines GET answered 500."""
    good = {"ph": "X", "name": "0B0", "ts": 5, "dur": 2, "pid": 0, "tid": 0}
    got, why = trace_timeline(json.dumps({"traceEvents": [event, good]}))
    assert got is not None, why
    assert got["rows"] == [[["0B0", 0.0, pytest.approx(2e-6)]]]


@pytest.mark.parametrize("args", [[1], "x", 3])
def test_args_that_are_not_an_object_are_taken_as_none(args: Any) -> None:
    got, why = trace_timeline(json.dumps({"traceEvents": [{"ph": "X", "name": "0F0", "ts": 1, "dur": 1,
                                                           "args": args}]}))
    assert got is not None and got["iteration"] == 0 and got["rows"] == [[["0F0", 0.0, pytest.approx(1e-6)]]], why


def test_tracks_of_number_and_string_ids_and_a_deep_trace() -> None:
    got, why = trace_timeline(json.dumps({"traceEvents": [
        {"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": "a", "tid": 0},
        {"ph": "X", "name": "b", "ts": 0, "dur": 1, "pid": 1, "tid": 0}]}))
    assert got is not None and [r[0][0] for r in got["rows"]] == ["b", "a"], why  # numbers first, no TypeError
    got, why = trace_timeline("[" * 100_000 + "]" * 100_000)  # json.loads: RecursionError
    assert got is None and "not JSON" in why


def test_timelines_and_comparison_of_odd_results_are_not_server_errors(client) -> None:  # type: ignore[no-untyped-def]
    """The result fields that broke the job's pages: a malformed trace, ``raw.predicted`` that is not an
    object on an emulated run. And a peak memory no float holds is refused when posted (it was stored, then
    float() of it answered 500 in the comparison)."""
    w, mine, job_id = _job(client, emulate=True)
    r = client.post(f"/jobs/{job_id}/result", content=json.dumps({
        "worker_id": w["id"], "iteration_time": 0.5, "emulated": True,
        "devices": [{"busy": 1, "idle": 0, "peak_memory": BIG}]}), headers={**mine, "content-type": "application/json"})
    assert r.status_code == 422 and "peak_memory" in r.text, r.text
    trace = json.dumps({"traceEvents": [{"ph": "X", "name": "0F0", "ts": BIG, "dur": 1, "args": [1]},
                                        {"ph": "X", "name": "0F0", "ts": 1, "dur": 2, "pid": 0, "tid": 0}]})
    r = client.post(f"/jobs/{job_id}/result", json={
        "worker_id": w["id"], "iteration_time": 0.5, "emulated": True, "trace": trace, "raw": {"predicted": 5},
        "devices": [{"busy": 1.0, "idle": 0.0}]}, headers=mine)
    assert r.status_code == 201, r.text
    assert "peak_memory" not in client.get(f"/jobs/{job_id}/result", headers=AUTH).json()["devices"][0]
    for path in (f"/jobs/{job_id}/timelines", f"/jobs/{job_id}/comparison"):
        got = client.get(path, headers=AUTH)
        assert got.status_code == 200, (path, got.text)


def test_an_emulated_runs_own_prediction_no_float_holds_is_left_out(client) -> None:  # type: ignore[no-untyped-def]
    """``raw.predicted.iteration_time`` of 10**400 passed the number check and overflowed in the note's
    arithmetic (0.5 / 10**400 raises): the note is left out, as for a figure that is not a number."""
    w, mine, job_id = _job(client, emulate=True)
    r = client.post(f"/jobs/{job_id}/result", content=json.dumps({
        "worker_id": w["id"], "iteration_time": 0.5, "emulated": True,
        "raw": {"predicted": {"iteration_time": BIG}}}), headers={**mine, "content-type": "application/json"})
    assert r.status_code == 201, r.text
    got = client.get(f"/jobs/{job_id}/comparison", headers=AUTH)
    assert got.status_code == 200 and "emulated" not in (got.json()["note"] or ""), got.text


def test_a_stored_peak_memory_no_float_holds_is_read_as_unmeasured(client) -> None:  # type: ignore[no-untyped-def]
    """Results stored before ``peak_memory`` was checked may hold anything: the comparison leaves it out."""
    from db.models import Result

    w, mine, job_id = _job(client)
    r = client.post(f"/jobs/{job_id}/result", json={"worker_id": w["id"], "iteration_time": 0.5,
                                                    "devices": [{"busy": 1.0, "idle": 0.0, "peak_memory": 1.0}]},
                    headers=mine)
    assert r.status_code == 201, r.text
    with client.app.state.sessions() as db:
        row = db.scalar(select(Result).where(Result.job_id == job_id))
        row.devices = [{"busy": 1.0, "idle": 0.0, "peak_memory": BIG}]
        db.commit()
    got = client.get(f"/jobs/{job_id}/comparison", headers=AUTH)
    assert got.status_code == 200 and "peak_memory_relative_error" not in got.json()["devices"][0], got.text


@pytest.mark.parametrize("field, value", [("iteration_time", True), ("iteration_time", "1"),
                                          ("worker_id", True), ("emulated", 1)])
def test_result_numbers_are_json_numbers(client, field: str, value: Any) -> None:  # type: ignore[no-untyped-def]
    """``true`` was taken as 1.0 seconds (and as worker 1), ``"1"`` as a number: as strict as PlanCreate."""
    w, mine, job_id = _job(client)
    body = {"worker_id": w["id"], "iteration_time": 0.5, field: value}
    r = client.post(f"/jobs/{job_id}/result", json=body, headers=mine)
    assert r.status_code == 422 and field in r.text, r.text


@pytest.mark.parametrize("calibration", [
    '{"compute_scale": 1.0, "jobs": 9223372036854775808}',
    '{"compute_scale": 1.0, "jobs": 1000000000000000000000000000000}',
    '{"compute_scale": 1.0, "at_bound": {"compute_scale": NaN}}',
    '{"compute_scale": 1.0, "at_bound": {"compute_scale": Infinity}}',
    '{"compute_scale": 1.0, "error_before": NaN}',
])
def test_a_cluster_calibration_out_of_range_is_refused(client, calibration: str) -> None:  # type: ignore[no-untyped-def]
    """A job count past the database's integer answered 500 (the driver's OverflowError); a NaN bound was stored
    as null, and every later read of that cluster (its calibration, a plan on it) failed validation."""
    body = json.dumps(tiny_cluster())[:-1] + f', "calibration": {calibration}}}'
    r = client.post("/clusters", content=body, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422 and "calibration" in r.text, r.text
    assert client.get("/clusters", headers=AUTH).json() == []


def test_an_hf_config_of_more_layers_than_a_profile_holds_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    """The 1,024-layer bound of an uploaded profile held for an uploaded config too (it made and stored a profile
    of 4,098 layers in 11 s, which POST /profiles would refuse)."""
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 4, "num_hidden_layers": 4096, "vocab_size": 1000}
    r = client.post("/profiles/hf-config", json={"config": config, "seq": 128, "device": "a100-80gb"}, headers=AUTH)
    assert r.status_code == 422 and "config.num_hidden_layers: 4096 is beyond any published model (at most 1022 " \
        "transformer layers: a profile holds at most 1024 layers" in r.text, r.text
    assert client.get("/profiles", headers=AUTH).json() == []


def test_identical_uploads_at_once_all_get_the_stored_row(live_server) -> None:  # type: ignore[no-untyped-def]
    """Uploads of one new document at once: the one that lost the race on the unique content hash answered 409
    ("conflicts with stored data"); sent one after another they get 201 then 200. Now every one gets the row."""
    import httpx

    for what, make in (("/profiles", lambda n: tiny_profile(name=n)), ("/clusters", lambda n: tiny_cluster(name=n))):
        for round_ in range(3):
            body = json.dumps(make(f"raced-{round_}"))
            got: list[httpx.Response] = []
            gate = threading.Barrier(8)

            def send(body: str = body, what: str = what, got: list[httpx.Response] = got,
                     gate: threading.Barrier = gate) -> None:
                with httpx.Client(base_url=live_server.url, timeout=60) as c:
                    gate.wait()
                    got.append(c.post(what, content=body, headers={**AUTH, "content-type": "application/json"}))

            threads = [threading.Thread(target=send) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted({r.status_code for r in got}) in ([200, 201], [201]), [(r.status_code, r.text) for r in got]
            assert len({r.json()["id"] for r in got}) == 1
