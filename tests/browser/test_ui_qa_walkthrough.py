"""A QA walkthrough's UI finds, each on a fresh server of its own (no seeding): the jobs list's status filter and
the address (/ui/jobs?state=failed listed every job, and a choice in the filter was not written to the address);
the plan page's dispatch button of a candidate POST /jobs refuses for its processes on one node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN, AUTH, LiveServer, post_plan, tiny_cluster, tiny_profile

from browser.support import Console, needs_browser

pytestmark = [needs_browser, pytest.mark.slow]


def _fresh_server(tmp_path: Path, **settings: str) -> LiveServer:
    """A started server on an empty, migrated SQLite database of its own (no seeding)."""
    from db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'pipeplan.db'}"
    upgrade(url)
    return LiveServer(url, tmp_path, **settings).start()


@pytest.fixture
def jobs_server(tmp_path: Path) -> Iterator[tuple[LiveServer, dict[str, int]]]:
    srv = _fresh_server(tmp_path)
    try:
        with srv.client() as c:
            pid = c.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
            cid = c.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
            plan = post_plan(c, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
            ids = {s: c.post("/jobs", json={"plan_id": plan["id"], "emulate": True}, headers=AUTH).json()["id"]
                   for s in ("queued", "cancelled")}
            assert c.post(f"/jobs/{ids['cancelled']}/cancel", headers=AUTH).status_code == 200
        yield srv, ids
    finally:
        srv.stop()


def _shown(page: Any) -> set[int]:
    return {int(r.get_attribute("data-job-id")) for r in page.locator("#jobs tr[data-job-id]").all()}


def test_the_jobs_filter_reads_and_writes_the_address(browser, console: Console, jobs_server) -> None:  # type: ignore[no-untyped-def]
    srv, ids = jobs_server
    ctx = browser.new_context()
    ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
    page = console.attach(ctx.new_page())
    page.set_default_timeout(30_000)
    page.goto(f"{srv.url}/ui/jobs?state=cancelled")
    page.wait_for_selector(f'#jobs tr[data-job-id="{ids["cancelled"]}"]')
    assert page.locator("#state-filter").input_value() == "cancelled"
    assert _shown(page) == {ids["cancelled"]}
    page.select_option("#state-filter", "queued")
    page.wait_for_selector(f'#jobs tr[data-job-id="{ids["queued"]}"]')
    assert page.url.endswith("/ui/jobs?state=queued") and _shown(page) == {ids["queued"]}
    page.select_option("#state-filter", "")
    page.wait_for_function("document.querySelectorAll('#jobs tr[data-job-id]').length === 2")
    assert page.url.endswith("/ui/jobs")
    page.goto(f"{srv.url}/ui/jobs?state=bogus")  # a state the filter does not have is ignored: every job
    page.wait_for_function("document.querySelectorAll('#jobs tr[data-job-id]').length === 2")
    assert page.locator("#state-filter").input_value() == ""
    ctx.close()


def test_dispatch_is_disabled_where_a_node_would_run_too_many_processes(browser, console: Console,  # type: ignore[no-untyped-def]
                                                                        tmp_path: Path) -> None:
    """An emulated job runs its t*D*W processes on one node; POST /jobs refuses more than PIPEPLAN_MAX_NODE_PROCESSES
    there (here 2), and the card's dispatch button says so instead of a 422 after the click; unemulated, the same
    candidate spreads over the cluster's 2-process nodes and may be dispatched."""
    srv = _fresh_server(tmp_path, PIPEPLAN_MAX_NODE_PROCESSES="2")
    try:
        with srv.client() as c:
            pid = c.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
            cid = c.post("/clusters", json=tiny_cluster(2, 2), headers=AUTH).json()["id"]
            plan = post_plan(c, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
            world = [k["tensor"] * k["pipeline"] * k["data"] for k in plan["candidates"]]
            runs = [not k.get("executor_refusal") for k in plan["candidates"]]
            big = next(i for i, w in enumerate(world) if w == 4 and runs[i])
            r = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": big, "emulate": True}, headers=AUTH)
            assert r.status_code == 422 and "PIPEPLAN_MAX_NODE_PROCESSES" in r.text, r.text
        ctx = browser.new_context()
        ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
        page = console.attach(ctx.new_page())
        page.set_default_timeout(60_000)
        page.goto(f"{srv.url}/ui/plans/{plan['id']}?sel={big}")
        button = page.locator(f'button.dispatch[data-rank="{big}"]')
        button.wait_for()
        emulate = page.locator("#job-emulate")
        # no agent of the cluster's device is registered: the page ticks "emulate" itself once its workers request
        # answers (plan.js preferEmulation); ticking it here raced that (CI: 'Clicking the checkbox did not change
        # its state')
        page.wait_for_function("document.querySelector('#job-emulate').checked")
        page.wait_for_function(f"document.querySelector('button.dispatch[data-rank=\"{big}\"]').disabled")
        assert "4 processes run 4 on one node" in button.get_attribute("title")
        msg = page.locator(f'article[data-rank="{big}"] .dispatch-msg')
        assert "at most 2 on one node (PIPEPLAN_MAX_NODE_PROCESSES)" in msg.inner_text()
        emulate.uncheck()  # real: 2 nodes x 2
        page.wait_for_function(f"!document.querySelector('button.dispatch[data-rank=\"{big}\"]').disabled")
        assert msg.inner_text() == ""
        ctx.close()
    finally:
        srv.stop()


def test_a_failed_plan_names_its_profile_and_no_unknown_counts(browser, console: Console,  # type: ignore[no-untyped-def]
                                                                tmp_path: Path) -> None:
    """A plan that failed (here: stopped by PIPEPLAN_PLAN_TIMEOUT_SECONDS) showed "profile #1" where a done plan
    names its profile, and "0 ranked candidates of ? configurations (? simulated)" above its error."""
    srv = _fresh_server(tmp_path, PIPEPLAN_PLAN_TIMEOUT_SECONDS="0")
    try:
        with srv.client() as c:
            pid = c.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
            cid = c.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()["id"]
            plan = post_plan(c, {"profile_id": pid, "cluster_id": cid, "global_batch": 8})
            assert plan["status"] == "failed" and "longer than" in plan["error"], plan
            name = c.get(f"/profiles/{pid}", headers=AUTH).json()["name"]
        ctx = browser.new_context()
        ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
        page = console.attach(ctx.new_page())
        page.set_default_timeout(30_000)
        page.goto(f"{srv.url}/ui/plans/{plan['id']}")
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_function(f"document.querySelector('#info-profile').textContent.startsWith({json.dumps(name)})")
        info = page.locator("#plan-info").inner_text()
        assert "?" not in info and "no configurations ranked" in info and "longer than" in info, info
        ctx.close()
    finally:
        srv.stop()


def test_the_token_box_says_an_invalid_token_and_the_role_of_a_valid_one(browser, console: Console,  # type: ignore[no-untyped-def]
                                                                         tmp_path: Path) -> None:
    """A mistyped token said "token set" like the admin token (GET /whoami now names the role)."""
    srv = _fresh_server(tmp_path)
    try:
        ctx = browser.new_context()
        page = console.attach(ctx.new_page())
        page.set_default_timeout(30_000)
        page.goto(f"{srv.url}/ui/jobs")
        state = "document.querySelector('#token-state')"
        page.fill("#token", "not-the-token")
        page.click("#token-save")
        page.wait_for_function(f"{state}.textContent === 'invalid token'")
        assert "error" in page.locator("#token-state").get_attribute("class")
        # /whoami's and the jobs list's 401, in either order: the state can read "invalid token" before the jobs
        # list's answer is in (CI, session 38: its 401 came after the first was removed, and failed the test)
        expected: list[str] = []
        for _ in range(100):
            expected = [e for e in console.errors if "status of 401" in e]
            if len(expected) >= 2:
                break
            page.wait_for_timeout(100)
        assert len(expected) >= 2, console.errors
        for e in expected:
            console.errors.remove(e)
        page.fill("#token", ADMIN)
        page.click("#token-save")
        page.wait_for_function(f"{state}.textContent === 'admin token'")
        assert "error" not in (page.locator("#token-state").get_attribute("class") or "")
        page.reload()  # kept in localStorage: the role is asked again
        page.wait_for_function(f"{state}.textContent === 'admin token'")
        ctx.close()
    finally:
        srv.stop()
