"""Issue 13 (newcomer audit, UI points): a calibrated cluster version is shown as what it is. After a
calibration (POST /clusters/{id}/calibrate) the cluster has a new version with an id of its own; the plan page
says which version a plan used and whether a newer one exists (and plans again on it), the plans list and the
new-plan form name versions as "dgx-a100-80gb v2, calibrated from 3 jobs" linked to the version, and the jobs
list shows each finished job's predicted and measured iteration time and their ratio. Headless Chromium at
1280x800 against the real seeded server (a module of its own: the calibration changes what later plans on the
cluster are made on). Screenshots go to ``artifacts/ui/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_support import WAUTH, LiveServer

from browser.support import Console, finished_job, needs_browser, open_page, shot, wait_plan

pytestmark = [needs_browser, pytest.mark.slow]

CLUSTER = "dgx-a100-80gb"
ROOT = Path(__file__).resolve().parents[2]


def test_calibrated_versions_are_named_and_the_plan_page_says_which_it_used(
        server: LiveServer, browser: Any, console: Console) -> None:
    with server.client() as c:
        pid = next(p["id"] for p in c.get("/profiles").json()
                   if p["name"] == "gpt-tiny" and p["device"] == "A100-SXM4-80GB")
        cid = next(x["id"] for x in c.get("/clusters").json() if x["name"] == CLUSTER)
        r = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 16, "gpus": 4, "top": 10})
        assert r.status_code in (200, 201, 202), r.text
        plan = wait_plan(c, r.json()["id"])
        jobs = [finished_job(c, plan["id"], i, plan["candidates"][i]["iteration_time"] * f, WAUTH)
                for i, f in enumerate((1.2, 1.25, 1.3))]
        cal = c.post(f"/clusters/{cid}/calibrate")
        assert cal.status_code == 201, cal.text
        v2 = cal.json()["cluster_id"]
    v2_label = f"{CLUSTER} v2, calibrated from 3 jobs"

    # the plan made before: it used v1, a newer version exists, and it can be planned again on it
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/plans/{plan['id']}")
    page.wait_for_selector('body[data-ready="1"]')
    used = page.locator("#info-cluster a.cluster-version")
    assert used.inner_text() == f"{CLUSTER} v1 (uncalibrated)" and used.get_attribute("href") == f"/ui/clusters/{cid}"
    note = page.locator("#cluster-version")
    assert note.is_visible() and note.get_attribute("data-newer") == str(v2)
    text = note.inner_text()
    assert "A newer version exists" in text and v2_label in text and f"version 1 of cluster #{cid}" in text
    assert note.locator(f'a[href="/ui/clusters/{v2}"]').count() == 1
    shot(page, "versions-01-older-plan")
    page.click("#replan")
    page.wait_for_url(lambda url: "/ui/plans/" in url and not url.rstrip("/").endswith(f"/{plan['id']}"))
    page.wait_for_selector('body[data-ready="1"]')
    new_id = int(page.url.split("/ui/plans/")[1].split("?")[0])
    with server.client() as c:
        new = c.get(f"/plans/{new_id}").json()
    assert new["cluster_id"] == v2 and new["request"] == plan["request"]  # the same request, on v2
    used = page.locator("#info-cluster a.cluster-version")
    assert used.inner_text() == v2_label and used.get_attribute("href") == f"/ui/clusters/{v2}"
    text = page.locator("#cluster-version").inner_text()
    assert f"version 2 of cluster #{cid}" in text and "the newest version" in text and "newer" not in text
    assert page.locator("#replan").count() == 0
    shot(page, "versions-02-plan-on-v2")

    # the plans list names the version each plan used, linked to it
    page.goto(f"{server.url}/ui/plans")
    page.wait_for_selector(f'#plans a[href="/ui/plans/{new_id}"]')
    row = page.locator("#plans tbody tr", has=page.locator(f'a[href="/ui/plans/{new_id}"]'))
    assert row.locator("td.cluster a").inner_text() == v2_label
    assert row.locator("td.cluster a").get_attribute("href") == f"/ui/clusters/{v2}"
    old = page.locator("#plans tbody tr", has=page.locator(f'a[href="/ui/plans/{plan["id"]}"]'))
    assert old.locator("td.cluster a").inner_text() == f"{CLUSTER} v1 (uncalibrated)"
    shot(page, "versions-03-plans")

    # the new-plan form lists both versions by what they are
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="1"]')
    options = page.locator("#cluster option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    named = dict((int(v), t) for v, t in options)
    assert named[v2].startswith(v2_label) and named[cid].startswith(f"{CLUSTER} v1 (uncalibrated)")

    # the jobs list: predicted, measured and measured / predicted of each finished job
    page.goto(f"{server.url}/ui/jobs")
    for job, factor in zip(jobs, (1.2, 1.25, 1.3), strict=True):
        ratio = page.locator(f'#jobs tr[data-job-id="{job["id"]}"] td.ratio')
        ratio.wait_for()
        assert ratio.inner_text().strip() == f"{factor:.2f}×"
        assert "error +" in ratio.get_attribute("title")
    shot(page, "versions-04-jobs")
    page.context.close()


def test_the_job_page_names_the_cluster_version_its_plan_used(server: LiveServer, browser: Any,
                                                              console: Console) -> None:
    """A job's page names the cluster version its plan was made on (label, linked to that version) and, once a
    calibration made a newer version, says so and links to it and to planning again; a job of a plan made on
    the newest version says it is the newest. A cluster of its own (an uploaded copy of the DGX A100 under
    another name), so that the calibration of the test above does not matter."""
    body = json.loads((ROOT / "examples" / "clusters" / f"{CLUSTER}.json").read_text())
    name = "job-page-a100"
    with server.client() as c:
        up = c.post("/clusters", json={**body, "name": name})
        assert up.status_code in (200, 201), up.text
        cid = up.json()["id"]
        pid = next(p["id"] for p in c.get("/profiles").json()
                   if p["name"] == "gpt-tiny" and p["device"] == "A100-SXM4-80GB")
        r = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 16, "gpus": 4, "top": 10})
        assert r.status_code in (200, 201, 202), r.text
        plan = wait_plan(c, r.json()["id"])
        first = finished_job(c, plan["id"], 0, plan["candidates"][0]["iteration_time"] * 1.2, WAUTH)
    assert first["cluster_id"] == cid

    # one version, never calibrated: the plain name, linked, and no version note
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/jobs/{first['id']}")
    used = page.locator("#job-cluster a.cluster-version")
    used.wait_for()
    assert used.inner_text() == name and used.get_attribute("href") == f"/ui/clusters/{cid}"
    assert page.locator("#job-cluster").inner_text().endswith(f", {up.json()['gpus']} GPUs (#{cid})")  # its size
    assert page.locator("#cluster-version").count() == 0

    with server.client() as c:
        for i, f in ((1, 1.25), (2, 1.3)):
            finished_job(c, plan["id"], i, plan["candidates"][i]["iteration_time"] * f, WAUTH)
        cal = c.post(f"/clusters/{cid}/calibrate")
        assert cal.status_code == 201, cal.text
        v2 = cal.json()["cluster_id"]
        again = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, **{
            k: v for k, v in plan["request"].items() if v is not None}})
        assert again.status_code in (200, 201, 202) and again.json()["cluster_id"] == v2, again.text
        replanned = wait_plan(c, again.json()["id"])
        later = finished_job(c, replanned["id"], 0, replanned["candidates"][0]["iteration_time"], WAUTH)
    v2_label = f"{name} v2, calibrated from 3 jobs"

    # the job of the older plan: v1, a newer version exists (linked), and where to plan again on it
    page.goto(f"{server.url}/ui/jobs/{first['id']}")
    used = page.locator("#job-cluster a.cluster-version")
    used.wait_for()
    assert used.inner_text() == f"{name} v1 (uncalibrated)" and used.get_attribute("href") == f"/ui/clusters/{cid}"
    note = page.locator("#cluster-version")
    assert note.is_visible() and note.get_attribute("data-newer") == str(v2)
    text = note.inner_text()
    assert text.startswith("This job's plan used") and "A newer version exists" in text and v2_label in text
    assert f"version 1 of cluster #{cid}" in text
    assert note.locator(f'a[href="/ui/clusters/{v2}"]').inner_text() == v2_label
    assert note.locator("#replan-link").get_attribute("href") == f"/ui/plans/{plan['id']}#cluster-version"
    shot(page, "versions-05-job-on-older-version")

    # the job of the plan made after the calibration: v2, the newest
    page.goto(f"{server.url}/ui/jobs/{later['id']}")
    used = page.locator("#job-cluster a.cluster-version")
    used.wait_for()
    assert used.inner_text() == v2_label and used.get_attribute("href") == f"/ui/clusters/{v2}"
    text = page.locator("#cluster-version").inner_text()
    assert f"version 2 of cluster #{cid}" in text and "the newest version" in text and "newer" not in text
    assert page.locator("#replan-link").count() == 0
    shot(page, "versions-06-job-on-newest-version")
    page.context.close()
