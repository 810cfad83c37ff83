"""Issue 11 item 5 in the UI: a cluster's calibration. The clusters page lists each cluster with its versions;
a cluster's page shows the newest calibration's factors and warnings, and each finished job's measured iteration
time against the prediction before calibration (the cluster as uploaded) and after (the newest version), with the
median |error| of each: the numbers of GET /clusters/{id}/calibration. "Calibrate from finished jobs" sends POST
/clusters/{id}/calibrate with the admin token and shows the new version, or "unchanged", and the warnings; the
API's refusals are shown as text. Headless Chromium against the real seeded server with open reads (``make
serve``'s), so the reads need no token. Each test uploads a cluster of its own (a copy of the DGX A100 under
another name). Screenshots go to ``artifacts/ui/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_support import WAUTH, WORKER, LiveServer

from browser.support import Console, finished_job, needs_browser, open_page, shot, wait_plan

pytestmark = [needs_browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BODY = json.loads((ROOT / "examples" / "clusters" / "dgx-a100-80gb.json").read_text())


#: the server reads without a token (tests/browser/conftest.py `server`)
SERVER_SETTINGS = {"PIPEPLAN_OPEN_READS": "1"}


def _cluster_with_jobs(srv: LiveServer, name: str, factors: tuple[float, ...]) -> tuple[int, list[dict[str, Any]]]:
    """A copy of the DGX A100 named ``name`` and a plan on it whose first candidates finished in ``factors`` times
    their predicted iteration time; (cluster id, the jobs)."""
    with srv.client() as c:
        up = c.post("/clusters", json={**BODY, "name": name})
        assert up.status_code in (200, 201), up.text
        cid = up.json()["id"]
        if not factors:
            return cid, []
        pid = next(p["id"] for p in c.get("/profiles").json()
                   if p["name"] == "gpt-tiny" and p["device"] == "A100-SXM4-80GB")
        r = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 16, "gpus": 4, "top": 10})
        assert r.status_code in (200, 201, 202), r.text
        plan = wait_plan(c, r.json()["id"])
        jobs = [finished_job(c, plan["id"], i, plan["candidates"][i]["iteration_time"] * f, WAUTH)
                for i, f in enumerate(factors)]
    return cid, jobs


def _errors(srv: LiveServer, cid: int) -> dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/clusters/{cid}/calibration")
        assert r.status_code == 200, r.text
        return r.json()


def _pct(x: float) -> str:
    """PP.fmtErr's text: "+12.3 %"."""
    return f"{100 * x:+.1f} %"


def _check_rows(page: Any, errs: dict[str, Any]) -> None:
    """The page's jobs table is the API's: a row per job (linked to its page), each figure's value and text."""
    rows = page.locator("#cal-jobs tbody tr")
    assert rows.count() == len(errs["jobs"]) > 0
    for j in errs["jobs"]:
        row = page.locator(f'#cal-jobs tbody tr[data-job-id="{j["job_id"]}"]')
        assert row.locator("a").get_attribute("href") == f"/ui/jobs/{j['job_id']}"
        assert row.locator("td.config").inner_text() == j["label"]
        for cls, key in (("measured", "measured"), ("predicted-before", "predicted_before"),
                         ("error-before", "relative_error_before"), ("predicted-after", "predicted_after"),
                         ("error-after", "relative_error_after")):
            assert float(row.locator(f"td.{cls}").get_attribute("data-value")) == j[key], (cls, j)
        assert row.locator("td.error-before").inner_text().strip() == _pct(j["relative_error_before"])
        assert row.locator("td.error-after").inner_text().strip() == _pct(j["relative_error_after"])
    for which in ("before", "after"):
        value = errs[f"median_abs_error_{which}"]
        cell = page.locator(f"#median-{which}")
        assert float(cell.get_attribute("data-value")) == value
        assert cell.inner_text() == f"{100 * value:.1f} %"


def test_the_cluster_page_shows_each_jobs_error_before_and_after_and_calibrates(
        server: LiveServer, browser: Any, console: Console) -> None:
    name = "cal-page-a100"
    cid, jobs = _cluster_with_jobs(server, name, (1.2, 1.25, 1.3))
    before = _errors(server, cid)
    assert before["newest_version"] == 1 and before["calibration"] is None

    # open reads: no token, the page reads everything; calibrating is refused in the page, nothing is sent
    page = open_page(browser, console, token=None)
    page.goto(f"{server.url}/ui/clusters/{cid}")
    page.wait_for_selector('body[data-ready="1"]')
    _check_rows(page, before)
    assert [float(x) for x in page.locator("#cal-jobs td.error-before").evaluate_all(
        "tds => tds.map(td => td.dataset.value)")] == pytest.approx([0.2, 0.25, 0.3], rel=1e-9)
    assert page.locator("#no-calibration").is_visible() and page.locator("#cal-warnings").is_hidden()
    assert page.locator("#cal-empty").is_hidden()
    assert page.locator("#after-head").inner_text() == "Predicted after (not calibrated yet)"
    page.click("#calibrate")
    assert "needs the admin token" in page.locator("#calibrate-msg.error").inner_text()
    assert _errors(server, cid)["newest_version"] == 1
    shot(page, "calibration-01-before", full_page=True)
    page.context.close()

    # a token that may read but not write: the API's 403 is shown as text
    page = open_page(browser, console, token=WORKER)
    page.goto(f"{server.url}/ui/clusters/{cid}")
    page.wait_for_selector('body[data-ready="1"]')
    page.click("#calibrate")
    msg = page.locator("#calibrate-msg.error")
    msg.wait_for()
    assert "HTTP 403" in msg.inner_text()
    expected = [e for e in console.errors if "status of 403" in e]
    assert len(expected) == 1, console.errors
    console.errors.remove(expected[0])
    page.context.close()

    # the admin token: a new version, which the page then shows
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/clusters/{cid}")
    page.wait_for_selector('body[data-ready="1"]')
    page.click("#calibrate")
    page.wait_for_selector('#calibrate-msg[data-version="2"]')
    msg = page.locator("#calibrate-msg")
    after = _errors(server, cid)
    v2 = after["newest_id"]
    assert after["newest_version"] == 2 and v2 != cid and msg.get_attribute("data-unchanged") == "0"
    assert msg.inner_text().startswith(f"Stored version 2: {name} v2, calibrated from 3 jobs (#{v2})")
    assert msg.locator("a").get_attribute("href") == f"/ui/clusters/{v2}"
    page.wait_for_selector(f'#versions tr[data-cluster-id="{v2}"]')
    page.wait_for_function("document.getElementById('after-head').textContent === 'Predicted after (v2)'")
    _check_rows(page, after)
    assert after["median_abs_error_after"] < 0.05 < before["median_abs_error_before"]
    assert page.locator("#versions tbody tr").count() == 2
    assert page.locator(f'#versions tr[data-cluster-id="{v2}"] a').first.get_attribute("href") == \
        f"/ui/clusters/{v2}"
    compute = page.locator('#factors tr[data-factor="compute_scale"]')
    assert float(compute.locator("td.value").get_attribute("data-value")) == after["calibration"]["compute_scale"]
    assert compute.locator("td.fit").inner_text() == \
        ("fitted" if "compute_scale" in after["calibration"]["fitted"] else "kept at prior (1.000×)")
    assert page.locator("#cal-warnings").is_hidden() and after["warnings"] == []
    assert page.locator("#newer-version").count() == 1  # this page is v1's: the calibration above is v2's
    shot(page, "calibration-02-calibrated", full_page=True)

    # again with no new job: "unchanged", nothing stored
    page.click("#calibrate")
    page.wait_for_selector('#calibrate-msg[data-unchanged="1"]')
    assert page.locator("#calibrate-msg").inner_text().startswith("Unchanged")
    assert _errors(server, cid)["newest_id"] == v2

    # v2's own page: the newest, no note; the job rows link to the jobs
    page.goto(f"{server.url}/ui/clusters/{v2}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.locator("#newer-version").count() == 0
    assert page.locator("#cluster-label").inner_text() == f"{name} v2, calibrated from 3 jobs"
    page.click(f'#cal-jobs a[href="/ui/jobs/{jobs[0]["id"]}"]')
    page.wait_for_url(f"**/ui/jobs/{jobs[0]['id']}")
    # the job page's cluster name links to the cluster's page
    link = page.locator("#job-cluster a.cluster-version")
    link.wait_for()
    assert link.get_attribute("href") == f"/ui/clusters/{cid}"

    # the clusters list: the cluster with both versions, each linked to its page
    page.goto(f"{server.url}/ui/clusters")
    row = page.locator(f'#clusters tr[data-cluster-id="{cid}"]')
    row.wait_for()
    assert row.locator("a.cluster-name").get_attribute("href") == f"/ui/clusters/{v2}"
    versions = row.locator("td.versions .version-line")
    assert versions.count() == 2
    assert versions.nth(0).locator("a").get_attribute("href") == f"/ui/clusters/{cid}"
    assert versions.nth(1).locator("a").get_attribute("href") == f"/ui/clusters/{v2}"
    assert "calibrated from 3 jobs" in versions.nth(1).inner_text()
    assert row.locator("td.calibrated").inner_text() == "yes, calibrated from 3 jobs"
    shot(page, "calibration-03-clusters")
    page.click('nav a[href="/ui/clusters"]')  # the nav link

    # the new-plan form: ?cluster= selects it, and links to its page
    page.goto(f"{server.url}/?cluster={v2}")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.locator("#cluster").input_value() == str(v2)
    assert page.locator("#cluster-page").get_attribute("href") == f"/ui/clusters/{v2}"
    page.context.close()


@pytest.fixture(scope="module")
def bound_cluster(server: LiveServer) -> int:
    """A cluster whose jobs took 6x their prediction (a wrong profile): the fit stops a factor at a bound."""
    return _cluster_with_jobs(server, "cal-bound-a100", (6.0, 6.2, 5.8))[0]


def test_a_factor_at_a_bound_is_shown_as_a_warning(server: LiveServer, browser: Any, console: Console,
                                                   bound_cluster: int) -> None:
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/clusters/{bound_cluster}")
    page.wait_for_selector('body[data-ready="1"]')
    page.click("#calibrate")
    page.wait_for_selector('#calibrate-msg[data-version="2"]')
    errs = _errors(server, bound_cluster)
    assert errs["warnings"] and errs["calibration"]["at_bound"]
    box = page.locator("#cal-warnings")
    assert box.is_visible() and box.get_attribute("role") == "alert"
    assert box.locator("li").all_inner_texts() == errs["warnings"]
    assert "at a bound: see the warning above" in page.locator("#calibrate-msg").inner_text()
    for factor, bound in errs["calibration"]["at_bound"].items():
        fit = page.locator(f'#factors tr[data-factor="{factor}"] td.fit').inner_text()
        assert fit.startswith("at its upper bound" if bound >= 1 else "at its"), fit
    shot(page, "calibration-04-at-bound", full_page=True)
    # read again (not just after the click): the warning is the newest calibration's
    page.reload()
    page.wait_for_selector('body[data-ready="1"]')
    assert page.locator("#cal-warnings li").all_inner_texts() == errs["warnings"]
    page.context.close()


@pytest.mark.parametrize("width", [1280, 800, 400])
def test_the_cluster_pages_fit_the_window(server: LiveServer, browser: Any, console: Console, bound_cluster: int,
                                          width: int) -> None:
    """Calibrated (a warning, the factors, the jobs, two versions) and the clusters list: no sideways scrolling of
    the page or of a table in its box; below 600 px each row is a card of labelled lines."""
    with server.client() as c:
        assert c.post(f"/clusters/{bound_cluster}/calibrate").status_code in (200, 201)
    page = open_page(browser, console, token=None, width=width)
    for path in (f"/ui/clusters/{bound_cluster}", "/ui/clusters"):
        page.goto(server.url + path)
        page.wait_for_selector(f'#clusters tr[data-cluster-id="{bound_cluster}"]' if path == "/ui/clusters"
                               else 'body[data-ready="1"]')
        shot(page, f"calibration-{width}-{'list' if path == '/ui/clusters' else 'cluster'}", full_page=True)
        scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert scroll <= inner, f"{path} at {width} px: page is {scroll} px wide"
        for table in page.locator("table.data").all():
            box = table.evaluate("t => [t.parentElement.scrollWidth, t.parentElement.clientWidth]")
            assert box[0] <= box[1], f"a table of {path} scrolls in its box at {width} px: {box}"
        if width < 600:
            cell = page.locator("table.cards tbody tr").first.locator("td").nth(1)
            assert cell.evaluate("e => getComputedStyle(e, '::before').content") not in ("none", '""')
    if width < 600:
        page.goto(f"{server.url}/ui/clusters/{bound_cluster}")
        page.wait_for_selector('body[data-ready="1"]')
        assert page.locator("#cal-warnings").is_visible()
        label = page.locator("#cal-jobs tbody tr").first.locator("td.error-after").evaluate(
            "e => getComputedStyle(e, '::before').content")
        assert label == '"Error after"', label
    page.context.close()


def test_a_cluster_without_finished_jobs_says_what_to_do(server: LiveServer, browser: Any,
                                                          console: Console) -> None:
    cid, _ = _cluster_with_jobs(server, "cal-empty-a100", ())
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/clusters/{cid}")
    page.wait_for_selector('body[data-ready="1"]')
    empty = page.locator("#cal-empty")
    assert empty.is_visible()
    text = empty.inner_text()
    assert text.startswith("No finished job with a measured result yet") and "Dispatch a plan on this cluster" in text
    assert empty.locator("a").first.get_attribute("href") == f"/?cluster={cid}"
    assert page.locator("#cal-jobs").is_hidden() and page.locator("#cal-summary").is_hidden()
    assert page.locator("#calibrate").is_disabled()  # nothing to calibrate from: no request that must fail
    assert page.locator("#no-calibration").is_visible()
    assert page.locator("#versions tbody tr").count() == 1
    shot(page, "calibration-05-empty", full_page=True)
    page.context.close()


def test_a_listed_emulated_run_says_its_own_prediction_and_is_not_counted_as_fitted(
        server: LiveServer, browser: Any, console: Console) -> None:
    """With "list emulated runs" ticked, an emulated run's row showed only dashes and the calibration's message said
    "fitted to 3 jobs" where 2 were fitted (an emulated run never is: api/calibration.py)."""
    cid, jobs = _cluster_with_jobs(server, "cal-page-emulated", (1.2, 1.3))
    with server.client() as c:
        plan_id = jobs[0]["plan_id"]
        own = c.get(f"/plans/{plan_id}").json()["candidates"][2]["iteration_time"] * 0.5
        emu = finished_job(c, plan_id, 2, own * 1.1, WAUTH, emulated_at=own)
    page = open_page(browser, console)
    page.goto(f"{server.url}/ui/clusters/{cid}")
    page.wait_for_selector('body[data-ready="1"]')
    page.check("#include-emulated")
    row = page.locator(f'#cal-jobs tbody tr[data-job-id="{emu["id"]}"]')
    row.wait_for()
    assert "emulated: " in row.locator("td.config").inner_text() and "(+10.0 %), not fitted" in \
        row.locator("td.config").inner_text(), row.inner_text()
    page.click("#calibrate")
    page.wait_for_selector('#calibrate-msg[data-version="2"]')
    assert ", fitted to 2 jobs;" in page.locator("#calibrate-msg").inner_text()
    page.context.close()
