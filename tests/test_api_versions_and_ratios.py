"""Issue 13 (newcomer audit, UI points): a calibrated cluster version is named as what it is in every cluster
answer ("tiny-cluster v2, calibrated from 3 jobs", the newest version of its lineage), and the jobs list
carries each job's predicted and measured iteration time and their ratio, as the job page does."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import AUTH, TINY_DEVICE, WAUTH, finish_job, seed_plan

pytestmark = pytest.mark.slow  # database


def _worker(client: Any) -> dict[str, Any]:
    w = client.post("/workers", json={"name": "a", "node": "n", "device_type": TINY_DEVICE}, headers=WAUTH)
    assert w.status_code in (200, 201), w.text
    return w.json()


def test_cluster_versions_are_named_with_their_calibration(client) -> None:  # type: ignore[no-untyped-def]
    _, cluster_id, plan = seed_plan(client)
    before = client.get(f"/clusters/{cluster_id}", headers=AUTH).json()
    # one version: the plain name, it is its own newest
    assert before["label"] == "tiny-cluster" and before["calibration_jobs"] is None
    assert (before["newest_id"], before["newest_version"]) == (cluster_id, 1)

    w = _worker(client)
    done = [finish_job(client, plan, i, w, cand["iteration_time"] * (1.2 + 0.05 * i))
            for i, cand in enumerate(plan["candidates"][:3])]
    cal = client.post(f"/clusters/{cluster_id}/calibrate", headers=AUTH)
    assert cal.status_code == 201, cal.text
    new_id = cal.json()["cluster_id"]

    listed = {c["id"]: c for c in client.get("/clusters", headers=AUTH).json()}
    base, v2 = listed[cluster_id], listed[new_id]
    assert v2["label"] == "tiny-cluster v2, calibrated from 3 jobs"
    assert v2["calibration_jobs"] == 3 and v2["version"] == 2 and v2["base_id"] == cluster_id
    # the uploaded one now says which version it is and that a newer one exists
    assert base["label"] == "tiny-cluster v1 (uncalibrated)"
    assert (base["newest_id"], base["newest_version"]) == (new_id, 2)
    assert base["newest_label"] == v2["label"] == v2["newest_label"]
    assert v2["newest_id"] == new_id
    detail = client.get(f"/clusters/{cluster_id}", headers=AUTH).json()
    assert detail["newest_id"] == new_id and detail["label"] == base["label"]

    # a second calibration (one more job) is v3; both older versions point to it
    finish_job(client, plan, 3, w, plan["candidates"][3]["iteration_time"] * 1.4)
    v3_id = client.post(f"/clusters/{new_id}/calibrate", headers=AUTH).json()["cluster_id"]
    listed = {c["id"]: c for c in client.get("/clusters", headers=AUTH).json()}
    assert listed[v3_id]["label"] == "tiny-cluster v3, calibrated from 4 jobs"
    assert {listed[i]["newest_id"] for i in (cluster_id, new_id, v3_id)} == {v3_id}
    assert listed[new_id]["label"] == "tiny-cluster v2, calibrated from 3 jobs"

    # a plan asked for on the uploaded cluster is made on the newest version: its cluster answer names it
    r = client.post("/plans", json={"profile_id": plan["profile_id"], "cluster_id": cluster_id, "global_batch": 8},
                    headers=AUTH)
    assert r.status_code in (201, 202), r.text
    used = client.get(f"/clusters/{r.json()['cluster_id']}", headers=AUTH).json()
    assert used["id"] == v3_id and used["label"] == "tiny-cluster v3, calibrated from 4 jobs"

    # a job names the cluster version its plan was made on (the job page shows its label): a job of the first
    # plan keeps the uploaded version, whose answer says a newer one exists
    job = client.get(f"/jobs/{done[0]}", headers=AUTH).json()
    assert job["cluster_id"] == cluster_id
    assert {j["id"]: j["cluster_id"] for j in client.get("/jobs", headers=AUTH).json()}[done[0]] == cluster_id
    assert client.get(f"/clusters/{job['cluster_id']}", headers=AUTH).json()["newest_id"] == v3_id


def test_jobs_list_has_predicted_measured_and_their_ratio(client) -> None:  # type: ignore[no-untyped-def]
    _, _, plan = seed_plan(client)
    w = _worker(client)
    cands = plan["candidates"]
    done = finish_job(client, plan, 1, w, cands[1]["iteration_time"] * 1.25)
    queued = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny"},
                         headers=AUTH).json()
    jobs = {j["id"]: j for j in client.get("/jobs", headers=AUTH).json()}
    got = jobs[done]
    assert got["has_result"] is True
    assert got["predicted_iteration_time"] == pytest.approx(cands[1]["iteration_time"])
    assert got["measured_iteration_time"] == pytest.approx(cands[1]["iteration_time"] * 1.25)
    assert got["measured_over_predicted"] == pytest.approx(1.25)
    # a job without a result: its prediction, nothing measured, no ratio
    q = jobs[queued["id"]]
    assert q["has_result"] is False and q["measured_iteration_time"] is None and q["measured_over_predicted"] is None
    assert q["predicted_iteration_time"] == pytest.approx(cands[0]["iteration_time"])
    # the job answer agrees with the list and with the job's own comparison
    one = client.get(f"/jobs/{done}", headers=AUTH).json()
    assert one["measured_over_predicted"] == pytest.approx(1.25)
    cmp = client.get(f"/jobs/{done}/comparison", headers=AUTH).json()
    it = next(f for f in cmp["fields"] if f["field"] == "iteration_time")
    assert one["predicted_iteration_time"] == pytest.approx(it["predicted"])
    assert one["measured_iteration_time"] == pytest.approx(it["measured"])
