"""A QA pass in a real browser (nine UI points), each checked in headless Chromium at 1280x800 against the real
seeded server: rows that do not fit show no placeholder throughput or idle share; a file flagged as no profile
is not sent; every write button says "needs the admin token" without one; the plan page's dispatch iterations
are bounded; hand-edited ?sel= values are ignored; the plan summary names the micro-batch sizes and the
candidates kept; the new-plan form defaults to a cluster's newest version and sends each micro-batch size once;
a page of a missing plan, job or cluster answers 404. The server reads without a token (PIPEPLAN_OPEN_READS=1),
so the pages load for a visitor who has none. Screenshots go to ``artifacts/ui/``; any console or page error
fails a test (``console`` fixture)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from api_support import WAUTH, LiveServer

from browser.support import Console, done_plan, finished_job, needs_browser, open_page, seeded_ids, shot

pytestmark = [needs_browser, pytest.mark.slow]

FRIENDLY = "needs the admin token: paste it into “API token” at the top right"
RAW = "missing bearer token"


#: the server reads without a token (tests/browser/conftest.py `server`)
SERVER_SETTINGS = {"PIPEPLAN_OPEN_READS": "1"}


def _count(srv: LiveServer, what: str) -> int:
    with srv.client() as c:
        return len(c.get(f"/{what}?limit=1000").json())


def _small_plan(srv: LiveServer, **req: Any) -> dict[str, Any]:
    pid, cid = seeded_ids(srv, "gpt-tiny", "A100-SXM4-80GB", "dgx-a100-80gb")
    return done_plan(srv, pid, cid, **{"global_batch": 16, "gpus": 4, "top": 10, **req})


def _sel(page: Any) -> str | None:
    return (parse_qs(urlparse(page.url).query).get("sel") or [None])[0]


# ---- 1. rows that do not fit: no placeholder throughput (0.0) or idle share (100.0 %) ---------------------

def test_rows_that_do_not_fit_show_no_throughput_or_idle(server: LiveServer, browser: Any,
                                                         console: Console) -> None:
    # gpt2-1.3b on two 40 GB A100s: some configurations are out of memory before they are simulated
    pid, cid = seeded_ids(server, "gpt2-1.3b", "A100-SXM4-80GB", "dgx-a100-40gb")
    plan = done_plan(server, pid, cid, global_batch=16, gpus=2, top=5)
    unsimulated = [c for c in plan["infeasible"] if c["iteration_time"] is None]
    assert unsimulated and all(c["throughput"] == 0 and c["bubble_ratio"] == 1 for c in unsimulated)
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/plans/{plan['id']}?infeasible=1")
    page.wait_for_selector('body[data-ready="1"]')
    cells = page.locator("#cands tbody tr").evaluate_all("""rows => rows.map((r) => ({
        fits: !r.classList.contains('infeasible'),
        iteration: r.querySelector('td[data-v]').textContent,
        throughput: r.querySelector('td[data-role=throughput]').textContent,
        idle: r.querySelector('td[data-role=idle]').textContent }))""")
    empty = [c for c in cells if c["iteration"] == "–"]
    assert len(empty) == len(unsimulated), cells
    assert all(c["throughput"] == "–" and c["idle"] == "–" for c in empty), empty
    fitting = [c for c in cells if c["fits"]]
    assert fitting and all(c["throughput"] != "–" and c["idle"].endswith("%") for c in fitting), fitting
    shot(page, "qa-01-unsimulated-rows")
    page.context.close()


# ---- 2. a file the page flags as no profile is not sent --------------------------------------------------

def test_a_file_flagged_as_no_profile_is_not_sent(server: LiveServer, browser: Any, console: Console) -> None:
    page = open_page(browser, console)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="1"]')
    bad = json.dumps({"id": 3, "name": "not-a-profile", "device": "cpu"}).encode()
    page.set_input_files("#profile-file", files=[{"name": "cluster.json", "mimeType": "application/json",
                                                   "buffer": bad}])
    note = page.locator("#profile-file-note")
    note.wait_for(state="visible")
    assert "not a profile (no list of layers)" in note.inner_text()
    page.fill("#global-batch", "16")
    page.click("#submit-plan")
    under = page.locator("#profile-file + .field-error")
    assert "Profile file: cluster.json is not a profile (no list of layers)" in under.inner_text()
    assert page.locator("#profile-file.invalid").count() == 1
    assert "cluster.json is not a profile" in page.locator("#plan-error").inner_text()
    page.wait_for_timeout(300)
    assert sent == []  # neither POST /profiles nor POST /plans
    shot(page, "qa-02-flagged-file")
    # back to the list: Plan works again
    page.click("#profile-file-clear")
    page.click("#submit-plan")
    page.wait_for_url("**/ui/plans/*")
    page.context.close()


# ---- 3 and 7. writes without a token; the new-plan form on a calibrated cluster ---------------------------

@pytest.fixture(scope="module")
def calibrated(server: LiveServer) -> dict[str, Any]:
    """local-cpu-4 calibrated (v2) from three jobs of a plan on v1: (the plan, its finished jobs, v1's and v2's
    ids); a queued job of the plan besides (nothing claims it)."""
    pid, cid = seeded_ids(server, "gpt-tiny", "cpu", "local-cpu-4")
    plan = done_plan(server, pid, cid, global_batch=8, gpus=4, top=5)
    assert plan["num_candidates"] >= 3
    with server.client() as c:
        jobs = [finished_job(c, plan["id"], i, plan["candidates"][i]["iteration_time"] * f, WAUTH)
                for i, f in enumerate((1.2, 1.25, 1.3))]
        cal = c.post(f"/clusters/{cid}/calibrate")
        assert cal.status_code == 201, cal.text
        queued = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny",
                                       "iterations": 4}).json()
    return {"plan": plan, "jobs": jobs, "v1": cid, "v2": cal.json()["cluster_id"], "queued": queued}


def test_writes_without_a_token_say_it_needs_the_admin_token(server: LiveServer, browser: Any, console: Console,
                                                              calibrated: dict[str, Any]) -> None:
    plan, job, queued = calibrated["plan"], calibrated["jobs"][0], calibrated["queued"]
    plans, jobs = _count(server, "plans"), _count(server, "jobs")
    page = open_page(browser, console, token=None)
    # the plan page: "Plan again on v2" and a candidate's Dispatch
    page.goto(f"{server.url}/ui/plans/{plan['id']}?sel=0")
    page.wait_for_selector('#compare[data-drawn="1"]')
    page.click("#replan")
    replan = page.locator("#replan-msg").inner_text()
    assert replan.startswith("Planning " + FRIENDLY) and RAW not in replan, replan
    page.click('button.dispatch[data-rank="0"]')
    dispatch = page.locator('article[data-rank="0"] .dispatch-msg').inner_text()
    assert dispatch.startswith("Dispatching " + FRIENDLY) and RAW not in dispatch, dispatch
    shot(page, "qa-03-plan-no-token")
    # a finished job's Retry
    page.goto(f"{server.url}/ui/jobs/{job['id']}")
    page.wait_for_selector('body[data-state="succeeded"]')
    page.click("#retry-job")
    retry = page.locator("#action-msg").inner_text()
    assert retry.startswith("Dispatching " + FRIENDLY) and RAW not in retry, retry
    # a queued job's Cancel (said in the notice: the job's part is drawn again at every poll)
    page.goto(f"{server.url}/ui/jobs/{queued['id']}")
    page.wait_for_selector('body[data-state="queued"]')
    page.click("#cancel-job")
    notice = page.locator("#notice")
    notice.wait_for(state="visible")
    assert notice.inner_text().startswith("Cancelling a job " + FRIENDLY) and RAW not in notice.inner_text()
    shot(page, "qa-03-job-no-token")
    assert (_count(server, "plans"), _count(server, "jobs")) == (plans, jobs)
    with server.client() as c:
        assert c.get(f"/jobs/{queued['id']}").json()["state"] == "queued"
    page.context.close()


def test_the_new_plan_form_defaults_to_the_newest_cluster_version(server: LiveServer, browser: Any,
                                                                  console: Console,
                                                                  calibrated: dict[str, Any]) -> None:
    v1, v2 = calibrated["v1"], calibrated["v2"]
    page = open_page(browser, console)
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="1"]')
    # the first profile is gpt-tiny on the CPU: its cluster is local-cpu-4, in its newest version
    assert page.locator("#profile option:checked").inner_text().startswith("gpt-tiny on cpu")
    assert page.input_value("#cluster") == str(v2)
    assert page.locator("#cluster option:checked").inner_text().startswith("local-cpu-4 v2, calibrated from 3 jobs")
    values = page.locator("#cluster option").evaluate_all("os => os.map((o) => o.value)")
    assert values.index(str(v2)) == values.index(str(v1)) - 1  # listed newest first, its versions together
    shot(page, "qa-07-newest-version")
    page.context.close()


# ---- 4. the plan page's dispatch iterations are bounded as the clone form's ------------------------------

def test_dispatch_iterations_past_the_limit_are_refused_in_the_page(server: LiveServer, browser: Any,
                                                                    console: Console) -> None:
    plan = _small_plan(server)
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/plans/{plan['id']}?sel=0")
    page.wait_for_selector('#compare[data-drawn="1"]')
    jobs = _count(server, "jobs")
    page.fill("#job-model", "gpt-tiny")
    page.fill("#job-iterations", "99999999999")
    page.click('button.dispatch[data-rank="0"]')
    assert page.locator("article.card .dispatch-msg").inner_text() == "Iterations: at most 1000000, got 99999999999"
    assert page.locator("#job-iterations.invalid").count() == 1
    under = page.locator("#job-iterations + .field-error")  # under the field too
    assert under.is_visible() and under.inner_text() == "Iterations: at most 1000000, got 99999999999"
    assert under.bounding_box()["y"] > page.locator("#job-iterations").bounding_box()["y"]
    assert _count(server, "jobs") == jobs
    shot(page, "qa-04-iterations")
    page.fill("#job-iterations", "3")  # corrected: the field's message goes
    assert under.is_hidden() and page.locator("#job-iterations.invalid").count() == 0
    page.context.close()


# ---- 5. hand-edited ?sel= values ---------------------------------------------------------------------------

def test_hand_edited_selection_values_are_ignored(server: LiveServer, browser: Any, console: Console) -> None:
    plan = _small_plan(server)
    assert plan["num_candidates"] >= 6
    page = open_page(browser, console)
    url = f"{server.url}/ui/plans/{plan['id']}"
    for sel in ("-1", "999", "abc", "1.5"):  # no row: nothing selected, nothing shown, the URL cleaned
        page.goto(f"{url}?sel={sel}")
        page.wait_for_selector('body[data-ready="1"]')
        page.wait_for_timeout(200)
        assert page.locator("#compare-section").is_hidden(), sel
        assert page.locator("#compare-btn").is_disabled(), sel
        assert page.locator("#cands input.sel:checked").count() == 0, sel
        assert _sel(page) is None, (sel, page.url)
    # past the limit of four: the first four
    page.goto(f"{url}?sel=0,1,2,3,4,5")
    page.wait_for_selector('#compare[data-drawn="1"]')
    assert page.locator("#compare article.card").count() == 4
    assert page.locator("#compare").get_attribute("data-count") == "4"
    assert page.locator("#cands input.sel:checked").count() == 4
    assert page.locator("#compare-btn").inner_text() == "Compare selected (4)"
    assert _sel(page) == "0,1,2,3"
    # a valid index among invalid ones stays
    page.goto(f"{url}?sel=-1,2,999")
    page.wait_for_selector('#compare[data-drawn="1"]')
    assert page.locator("#compare article.card").get_attribute("data-rank") == "2"
    assert page.locator("#compare-title").inner_text() == "Selected candidate" and _sel(page) == "2"
    shot(page, "qa-05-selection")
    page.context.close()


# ---- 6. the plan summary names the micro-batch sizes and the candidates kept ------------------------------

def test_the_plan_summary_names_micro_batch_sizes_and_candidates_kept(server: LiveServer, browser: Any,
                                                                      console: Console) -> None:
    sized = _small_plan(server, micro_batches=[1, 2], top=7)
    every = _small_plan(server, top=7)
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/plans/{sized['id']}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.locator("#info-micro-batches").inner_text() == "micro-batch sizes 1, 2"
    assert page.locator("#info-top").inner_text() == "candidates to keep 7"
    shot(page, "qa-06-summary")
    page.goto(f"{server.url}/ui/plans/{every['id']}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.locator("#info-micro-batches").count() == 0  # every size: not named
    assert page.locator("#info-top").inner_text() == "candidates to keep 7"
    page.context.close()


# ---- 8. micro-batch sizes: each once --------------------------------------------------------------------

def test_micro_batch_sizes_are_sent_once_each(server: LiveServer, browser: Any, console: Console) -> None:
    page = open_page(browser, console)
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(r.post_data_json)
            if r.method == "POST" and urlparse(r.url).path == "/plans" else None)
    for typed, sent in (("2,2,2", [2]), ("1,,2, 1", [1, 2])):
        page.goto(server.url + "/")
        page.wait_for_selector('body[data-ready="1"]')
        page.fill("#global-batch", "8")
        page.fill("#gpus", "4")
        page.fill("#top", "3")
        page.fill("#micro-batches", typed)
        page.click("#submit-plan")
        page.wait_for_url("**/ui/plans/*")
        assert bodies[-1]["micro_batches"] == sent, (typed, bodies[-1])
        plan_id = int(urlparse(page.url).path.rsplit("/", 1)[1])
        with server.client() as c:
            assert c.get(f"/plans/{plan_id}").json()["request"]["micro_batches"] == sent
    page.context.close()


# ---- 9. a page of a missing plan, job or cluster answers 404 ---------------------------------------------

def test_a_page_of_a_missing_id_answers_404_with_the_page(server: LiveServer, browser: Any,
                                                          console: Console) -> None:
    plan = _small_plan(server)
    with server.client() as c:
        job = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny",
                                    "iterations": 4}).json()
        c.post(f"/jobs/{job['id']}/cancel")
    with httpx.Client(base_url=server.url, timeout=30) as c:  # no token: the pages are open
        for kind in ("plans", "jobs", "clusters"):
            r = c.get(f"/ui/{kind}/999999")
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), (kind, r.text)
            assert '<script src="/ui/static/ui.js" defer></script>' in r.text, kind  # the page, its script says it
            assert c.get(f"/ui/{kind}/abc").status_code == 404
        assert c.get(f"/ui/plans/{plan['id']}").status_code == 200
        assert c.get(f"/ui/jobs/{job['id']}").status_code == 200
        assert c.get("/ui/clusters/1").status_code == 200
    # the friendly body stays: the heading and the page's own "not found", its empty frame hidden
    page = open_page(browser, console)
    page.goto(server.url + "/ui/plans/999999")
    page.wait_for_selector('body[data-missing="1"]')
    assert "plan 999999 not found" in page.locator("#notice").inner_text()
    assert page.locator("#cands").is_hidden() and page.locator("h1").is_visible()
    shot(page, "qa-09-missing-plan")
    # Chromium logs the page's 404 and its script's GET /plans/999999
    expected = [e for e in console.errors if "status of 404" in e]
    assert len(expected) == 2, console.errors
    for e in expected:
        console.errors.remove(e)
    page.context.close()

