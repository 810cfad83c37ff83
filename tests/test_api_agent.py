"""End to end with real processes: the API under uvicorn, real agents (``pipeplan agent``) as subprocesses.

The full flow runs the real executor (``pipeplan run``, emulated compute on a tiny plan). The fault tests
(lease expiry, SIGTERM, failure reporting) run ``tests/fixtures/controlled_run.py`` instead: a command that
lasts, fails and reports its pid on demand, so they test the API's and agent's protocol deterministically.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from api_support import REAL_RUN, LiveServer, on_database, seed_plan, start_agent, tiny_cluster, wait_for

from planner.analytic import analytic_profile
from planner.model import PRESETS

pytestmark = [pytest.mark.slow]
PROFILE_1_3B = analytic_profile(PRESETS["gpt2-1.3b"], "A100-SXM4-80GB").model_dump(
    mode="json")  # planning it on 64 GPUs takes seconds: it is still running when the API is killed


def _job(c, jid: int) -> dict:  # type: ignore[no-untyped-def]
    return c.get(f"/jobs/{jid}").json()


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def test_flow_profile_plan_job_agent_result_comparison(live_server: LiveServer, tmp_path: Path) -> None:
    with live_server.client() as c:
        _, _, plan = seed_plan(c)
        pred = plan["candidates"][1]
        job = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 1, "model": "gpt-tiny",
                                    "iterations": 2, "emulate": True}).json()
        agent = start_agent(live_server.url, tmp_path / "a1", "agent-1", None, "--once", run_command=REAL_RUN)
        try:
            assert agent.wait(180) == 0, (tmp_path / "a1" / "agent.log").read_text()
        finally:
            _stop(agent)
        j = _job(c, job["id"])
        assert j["state"] == "succeeded" and j["attempts"] == 1 and j["has_result"], j
        res = c.get(f"/jobs/{job['id']}/result").json()
        assert res["emulated"] is True and res["raw"]["emulated"] is True  # measured by the executor
        assert len(res["devices"]) == pred["pipeline"] and '"traceEvents"' in res["trace"]  # per pipeline device
        assert res["iteration_time"] > 0
        comp = c.get(f"/jobs/{job['id']}/comparison").json()
        f = {x["field"]: x for x in comp["fields"]}
        assert f["iteration_time"]["predicted"] == pred["iteration_time"]
        assert f["iteration_time"]["measured"] == res["iteration_time"]
        assert comp["label"] == pred["label"]
        # the agent wrote the plan and the emulated profile where the run could read them
        jobdir = tmp_path / "a1" / f"job-{job['id']}-attempt-1"
        assert (jobdir / "plan.json").exists() and (jobdir / "profile.json").exists()
        assert "--emulate" in (jobdir / "run.log").read_text() or (jobdir / "result.json").exists()


@on_database("sqlite")
def test_failed_run_posts_error_and_log_tail(live_server: LiveServer, tmp_path: Path) -> None:
    with live_server.client() as c:
        _, _, plan = seed_plan(c)
        job = c.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny", "iterations": 1}).json()
        agent = start_agent(live_server.url, tmp_path / "a", "agent-f", {"CONTROLLED_RUN_FAIL": "1"}, "--once")
        assert agent.wait(60) == 0
        j = _job(c, job["id"])
        assert j["state"] == "failed" and "exited with code 3" in j["error"]
        assert "CUDA out of memory (controlled)" in j["log_tail"]


@on_database("postgres")
def test_agent_killed_mid_job_lease_expires_and_another_agent_completes(live_server: LiveServer,
                                                                         tmp_path: Path) -> None:
    with live_server.client() as c:
        _, _, plan = seed_plan(c)
        job = c.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny", "iterations": 1}).json()
        pidfile = tmp_path / "run.pid"
        a1 = start_agent(live_server.url, tmp_path / "a1", "doomed", {"CONTROLLED_RUN_SLEEP": "60",
                                                                        "CONTROLLED_RUN_PIDFILE": str(pidfile)})
        try:
            wait_for(lambda: _job(c, job["id"])["state"] == "running" and pidfile.exists(), what="claimed")
            assert _job(c, job["id"])["worker_id"] is not None
            a1.kill()  # the node dies: no release, no more renewals
            a1.wait(10)
            with contextlib.suppress(ProcessLookupError):  # the run may already have died with its agent
                os.kill(int(pidfile.read_text()), signal.SIGKILL)  # and its run with it
        finally:
            _stop(a1, signal.SIGKILL)
        wait_for(lambda: _job(c, job["id"])["state"] == "queued", timeout=30, what="lease expiry requeue")
        a2 = start_agent(live_server.url, tmp_path / "a2", "rescuer")
        try:
            wait_for(lambda: _job(c, job["id"])["state"] == "succeeded", timeout=60, what="completed by agent 2")
        finally:
            _stop(a2)
        j = _job(c, job["id"])
        assert j["attempts"] == 2 and [e["event"] for e in j["history"]] == \
            ["created", "claimed", "lease_expired", "claimed", "succeeded"]
        workers = {w["name"]: w["id"] for w in c.get("/workers").json()}
        assert j["worker_id"] == workers["rescuer"]
        assert c.get(f"/jobs/{job['id']}/result").json()["worker_id"] == workers["rescuer"]


@on_database("postgres")
def test_sigterm_stops_the_run_and_releases_the_lease(live_server: LiveServer, tmp_path: Path) -> None:
    with live_server.client() as c:
        _, _, plan = seed_plan(c)
        job = c.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny", "iterations": 1}).json()
        pidfile = tmp_path / "run.pid"
        a1 = start_agent(live_server.url, tmp_path / "a1", "polite", {"CONTROLLED_RUN_SLEEP": "60",
                                                                        "CONTROLLED_RUN_PIDFILE": str(pidfile)})
        wait_for(lambda: _job(c, job["id"])["state"] == "running" and pidfile.exists(), what="claimed")
        assert _stop(a1, signal.SIGTERM) == 0
        j = _job(c, job["id"])
        assert j["state"] == "queued" and j["attempts"] == 0 and j["history"][-1]["event"] == "released", j
        run_pid = int(pidfile.read_text())

        def gone() -> bool:
            try:
                os.kill(run_pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, timeout=10, what="the run stopped with its agent")


@on_database("sqlite")
def test_api_restarted_mid_flow_loses_nothing(db_url: str, tmp_path: Path) -> None:
    """A plan in progress and a job in progress when the API is killed (SIGKILL) both finish after restart."""
    srv = LiveServer(db_url, tmp_path, PIPEPLAN_LEASE_SECONDS="3", PIPEPLAN_PLAN_WAIT_SECONDS="0.05").start()
    agent = None
    try:
        with srv.client() as c:
            _, _, plan = seed_plan(c)
            job = c.post("/jobs", json={"plan_id": plan["id"], "model": "gpt-tiny", "iterations": 1}).json()
            agent = start_agent(srv.url, tmp_path / "a", "survivor", {"CONTROLLED_RUN_SLEEP": "4"})
            wait_for(lambda: _job(c, job["id"])["state"] == "running", what="claimed")
            big = c.post("/profiles", json=PROFILE_1_3B).json()["id"]
            cid256 = c.post("/clusters", json=tiny_cluster(8, 32, "256-gpus")).json()["id"]
            r = c.post("/plans", json={"profile_id": big, "cluster_id": cid256, "global_batch": 2048})
            assert r.status_code == 202, r.text
            pending = r.json()["id"]
            # in progress when the API dies: claimed by a planner (its first attempt), not still queued -- a
            # kill before the claim left a plan that ran once after the restart (attempts 1, seen in CI)
            wait_for(lambda: c.get(f"/plans/{pending}").json()["status"] == "running", what="plan running")
        srv.stop(kill=True)
        srv.start()
        with srv.client() as c:
            done = wait_for(lambda: (lambda p: p if p["status"] in ("done", "failed") else None)(
                c.get(f"/plans/{pending}").json()), timeout=120, what="re-queued plan")
            assert done["status"] == "done" and done["candidates"], done
            assert done["attempts"] == 2, "the plan was re-queued on restart and ran again"
            wait_for(lambda: _job(c, job["id"])["state"] == "succeeded", timeout=60, what="job after restart")
            j = _job(c, job["id"])
            assert j["attempts"] == 1, j  # the agent kept its lease through the restart
            assert c.get(f"/jobs/{job['id']}/comparison").json()["fields"][0]["measured"] is not None
            assert [p["id"] for p in c.get("/plans").json()] == [plan["id"], pending]
    finally:
        if agent is not None:
            _stop(agent)
        srv.stop()
