"""Browser-test support: Debian's headless Chromium driven by Playwright's Python package, the real API
server (uvicorn, SQLite in a temp dir, seeded) and a real agent subprocess.

Chromium comes from Debian (``apt-get install -y chromium``), not from Playwright's download; it is launched
with flags that stop it dialling out (the test machines have no network). Without ``/usr/bin/chromium`` or
the ``playwright`` package the browser tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN, AUTH, LiveServer, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "artifacts" / "ui"
CHROMIUM = os.environ.get("PIPEPLAN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}


def skip_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "browser tests need the playwright Python package (pip install playwright)"
    return None


needs_browser = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


class Console:
    """Collects console errors and uncaught page errors; the tests fail on any."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def attach(self, page: Any) -> Any:
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text} @ {page.url}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e} @ {page.url}"))
        return page


def open_page(browser: Any, console: Console, token: str | None = ADMIN, width: int = VIEWPORT["width"],
              **context: Any) -> Any:
    """A page in a new browser context of ``width`` x 800 (``context``: more of Playwright's new_context options,
    e.g. accept_downloads), holding ``token`` in the UI's token box (None: a visitor without one), its console
    errors collected by ``console``, waits of up to a minute."""
    ctx = browser.new_context(viewport={"width": width, "height": VIEWPORT["height"]}, **context)
    if token:
        ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(token)})")
    page = console.attach(ctx.new_page())
    page.set_default_timeout(60_000)
    return page


def shot(page: Any, name: str, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def agent_process(url: str, token: str, workdir: Path, name: str, run_command: str) -> subprocess.Popen[bytes]:
    """``pipeplan agent`` in a subprocess; the executor it launches is ``$PIPEPLAN_RUN_COMMAND``."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PIPEPLAN_RUN_COMMAND"] = run_command
    cmd = [sys.executable, "-m", "pipeplan.cli", "agent", "--api", url, "--token", token, "--name", name,
           "--poll", "0.3", "--heartbeat", "1", "--workdir", str(workdir)]
    log = open(workdir / "agent.log", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def seeded_ids(srv: LiveServer, profile: str, device: str, cluster: str) -> tuple[int, int]:
    """The ids of a seeded profile (``profile`` measured on ``device``) and of the cluster named ``cluster``."""
    with srv.client() as c:
        p = [x["id"] for x in c.get("/profiles").json() if x["name"] == profile and x["device"] == device]
        cl = [x["id"] for x in c.get("/clusters").json() if x["name"] == cluster]
    assert p and cl, f"seeded {profile} on {device} / {cluster} missing"
    return p[0], cl[0]


def wait_plan(c: Any, plan_id: int, timeout: float = 240) -> dict[str, Any]:
    """Plan ``plan_id`` once it is done (GET /plans/{id} polled; a failed plan fails the test with its error).
    ``c``: a client of the server (``LiveServer.client()``)."""
    plan = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
        c.get(f"/plans/{plan_id}").json()), timeout=timeout, what=f"plan {plan_id} done")
    assert plan["status"] == "done", plan.get("error")
    return plan


def done_plan(srv: LiveServer, profile_id: int, cluster_id: int, **req: Any) -> dict[str, Any]:
    """POST /plans for the profile and cluster with the request fields ``req``; the plan once it is done."""
    with srv.client() as c:
        r = c.post("/plans", json={"profile_id": profile_id, "cluster_id": cluster_id, **req})
        assert r.status_code in (200, 201, 202), r.text
        return wait_plan(c, r.json()["id"])


def finished_job(c: Any, plan_id: int, rank: int, seconds: float, worker_headers: dict[str, str],
                 devices: list[dict[str, Any]] | None = None, emulated_at: float | None = None) -> dict[str, Any]:
    """A job of candidate ``rank`` that a worker (registered here, one per job, with the job's device) claimed
    and finished with ``seconds`` measured per iteration (and ``devices``, the result's figures per device;
    ``emulated_at``: an emulated run that predicted itself that many seconds).
    ``c``: an admin client of the server (``LiveServer.client()``); ``worker_headers``: the shared worker token's,
    for registration. Jobs queued before it are claimed and failed on the way (a test leaves none queued)."""
    job = c.post("/jobs", json={"plan_id": plan_id, "candidate_index": rank, "model": "gpt-tiny",
                                "iterations": 4, "emulate": emulated_at is not None}).json()
    w = c.post("/workers", json={"name": f"ui-done-worker-{job['id']}", "node": "n1",
                                 "device_type": job.get("device_type") or "cpu"}, headers=worker_headers)
    assert w.status_code in (200, 201), w.text
    wid, own = w.json()["id"], {"Authorization": f"Bearer {w.json()['token']}"}
    while True:
        r = c.post(f"/workers/{wid}/claim", headers=own)
        assert r.status_code == 200, f"job {job['id']} never claimed: {r.status_code}"
        got = r.json()["job"]["id"]
        if got == job["id"]:
            break
        c.post(f"/jobs/{got}/fail", headers=own, json={"worker_id": wid, "error": "other", "log_tail": "other"})
    r = c.post(f"/jobs/{job['id']}/result", headers=own,
               json={"worker_id": wid, "iteration_time": seconds, "emulated": emulated_at is not None,
                     "devices": devices or [],
                     # an emulated run's own prediction, as pipeplan run --emulate reports it
                     **({"raw": {"emulated": True, "predicted": {"iteration_time": emulated_at}}}
                        if emulated_at is not None else {})})
    assert r.status_code == 201, r.text
    return c.get(f"/jobs/{job['id']}").json()


def new_plan_form(server: LiveServer, browser: Any, console: Console, prof: Any, fields: dict[str, str]
                   ) -> tuple[Any, Any]:
    """Store ``prof``, open the new-plan page (as the admin) and fill in the profile, the dgx-h100-80gb cluster and
    ``fields`` (element id -> value); returns (context, page)."""
    with server.client() as c:
        p = c.post("/profiles", json=prof.model_dump(mode="json"), headers=AUTH)
        assert p.status_code in (200, 201), p.text
        cid = next(x["id"] for x in c.get("/clusters").json() if x["name"] == "dgx-h100-80gb")
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
    page = console.attach(ctx.new_page())
    page.set_default_timeout(60_000)
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="1"]')
    page.select_option("#profile", str(p.json()["id"]))
    page.select_option("#cluster", str(cid))
    for key, value in fields.items():
        page.fill(f"#{key}", value)
    return ctx, page


def expected_refusals(page: Any, console: Console, count: int, status: int = 422, wait: float = 5.0) -> None:
    """Take off ``console``'s errors the ``count`` lines Chromium logs itself for API refusals the page asked for
    and shows (``Failed to load resource: ... status of 422``): those may come on their own channel after the page
    showed the refusal, so they are waited for, up to ``wait`` seconds. Fewer or more of them fail the test; any
    other error stays for the ``console`` fixture to report."""
    import time

    def refusals() -> list[str]:
        return [e for e in console.errors if f"status of {status}" in e]

    deadline = time.monotonic() + wait
    while len(refusals()) < count and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    page.wait_for_timeout(100)  # (one more arriving late)
    got = refusals()
    assert len(got) == count, console.errors
    for e in got:
        console.errors.remove(e)
