"""``make serve`` as a newcomer runs it (issue 13 item 1): from the repository root, the Makefile's own recipe
(``serve --upgrade --seed --agent``) with its defaults -- only the port (``PORT=``, 8000 may be in
use) and the data directory (``PIPEPLAN_DATA_DIR``, so the developer's ``data/`` is left alone) differ. A plan
on the local CPU cluster with the seeded, measured CPU profile is dispatched to the local agent and runs to
``succeeded`` with measured figures beside the predicted ones."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import free_port, wait_for

from api.readiness import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
H = {"Authorization": "Bearer dev-admin-token"}  # the Makefile's development token

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists(),
                                 reason="needs make and the repository's .venv (make venv)")]


@pytest.fixture
def served(tmp_path: Path) -> Any:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIPEPLAN_", "MAKE", "MFLAGS")) and k != "DATABASE_URL"}
    env["PIPEPLAN_DATA_DIR"] = str(tmp_path / "data")
    log = (tmp_path / "serve.log").open("wb")
    # -o: the installed venv counts as up to date (no pip run inside a test)
    proc = subprocess.Popen(["make", "-o", ".venv/.installed", "serve", f"PORT={port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(url, 240, alive=lambda: proc.poll() is None, every=0.5), \
            "make serve did not come up: " + (tmp_path / "serve.log").read_text()[-3000:]
        yield url, tmp_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_make_serve_runs_a_job_to_done(served: Any) -> None:
    url, tmp = served
    c = httpx.Client(base_url=url, headers=H, timeout=30)
    profiles = [p for p in c.get("/profiles", params={"name": "gpt-tiny", "device": "cpu"}).json()
                if p["source"] == "measured"]
    assert len(profiles) == 1, "make serve seeds one gpt-tiny profile measured on this CPU"
    (cluster,) = [cl for cl in c.get("/clusters").json() if cl["name"] == "local-cpu-4"]
    # measured as its jobs run (api/seed.py, profiler/local_cluster.py): not the example file's links
    body = c.get(f"/clusters/{cluster['id']}").json()
    body = body.get("cluster", body)
    file = json.loads((ROOT / "examples" / "clusters" / "local-cpu-4.json").read_text())
    assert body["intra"] != file["intra"] and body["intra"]["alpha"] >= 0, body
    # measured per-action overhead: every kind present and >= 0 (a compute overhead can measure as 0 once the
    # profiled layer time is subtracted on a loaded machine), and the messages cost something
    ex = {k: v for k, v in (body["executor"] or {}).items() if isinstance(v, int | float)}
    assert ex and all(v >= 0 for v in ex.values()) and ex["send"] > 0 and ex["recv"] > 0, body
    assert body["allreduce_fit"]["ranks"] == 4, body
    r = c.post("/plans", json={"profile_id": profiles[0]["id"], "cluster_id": cluster["id"], "global_batch": 8})
    assert r.status_code in (200, 201, 202), r.text
    plan = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
        c.get(f"/plans/{r.json()['id']}").json()), timeout=120, what="plan done")
    assert plan["status"] == "done" and plan["candidates"], plan
    assert plan["warnings"] == [], "a CPU profile on the CPU cluster: nothing to warn about"
    r = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": 0, "model": "gpt-tiny", "iterations": 3})
    assert r.status_code == 201, r.text
    job = wait_for(lambda: (lambda j: j if j["state"] in ("succeeded", "failed", "cancelled") else None)(
        c.get(f"/jobs/{r.json()['id']}").json()), timeout=300, every=1.0, what="job finished")
    assert job["state"] == "succeeded", (job.get("error"), job.get("log_tail"))
    cmp = c.get(f"/jobs/{job['id']}/comparison").json()
    it = {f["field"]: f for f in cmp["fields"]}["iteration_time"]
    assert it["measured"] > 0 and it["predicted"] > 0
    print(f"measured/predicted iteration time: {it['measured'] / it['predicted']:.2f} "
          f"({it['measured'] * 1e3:.1f} ms / {it['predicted'] * 1e3:.1f} ms, {plan['candidates'][0]['label']})")
    # the run's files went to the absolute work directory under the data directory
    assert list((tmp / "data" / "agent").glob("*/job-*-attempt-1/result.json"))
    # what a newcomer reads in the terminal: each seeding step as it starts and with its time when it ends;
    # the agent starts once the API listens (no "connection refused" warnings)
    log = (tmp / "serve.log").read_text()
    assert "seeding: measuring cluster local-cpu-4" in log and re.search(r"local-cpu-4.*: done in \d+\.\d s", log)
    assert log.index("seeding: measuring") < log.index("seeded in") < log.index("Uvicorn running")
    assert "ConnectError" not in log and "Connection refused" not in log, log[-3000:]


def test_make_serve_on_a_busy_port_fails_at_once(tmp_path: Path) -> None:
    """A port already in use fails before the database is upgraded and seeded (a minute on a first start),
    naming the port and how to choose another (the Makefile's ``PORT``)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIPEPLAN_", "MAKE", "MFLAGS")) and k != "DATABASE_URL"}
    env["PIPEPLAN_DATA_DIR"] = str(tmp_path / "data")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        out = subprocess.run(["make", "-o", ".venv/.installed", "serve", f"PORT={port}"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=240)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log
    assert f"port {port} on 127.0.0.1 is in use" in log and "PORT=" in log, log
    # nothing was seeded or created before the check
    assert "seeding:" not in log and not (tmp_path / "data" / "pipeplan.db").exists(), log
    print(f"make serve on a busy port failed in {time.monotonic() - t0:.1f} s")


def test_sigterm_to_serve_stops_its_local_agent(tmp_path: Path) -> None:
    """``kill <serve pid>`` (SIGTERM to the main process only, as Docker and systemd stop a service) stops the
    local agent ``serve --agent`` started, not only the server: before, uvicorn re-raised the signal after its
    graceful shutdown, the process died before its ``finally``, and the agent lived on, retrying a server
    that was gone."""
    psutil = pytest.importorskip("psutil")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEPLAN_") and k != "DATABASE_URL"}
    env.update(PIPEPLAN_DATA_DIR=str(tmp_path / "data"), PIPEPLAN_ADMIN_TOKEN="a-token",
               PIPEPLAN_WORKER_TOKEN="w-token")
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "pipeplan.cli", "serve", "--upgrade",
                             "--agent", "--no-warm", "--port", str(port)], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    agents: list[Any] = []
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_healthy(url, 120, alive=lambda: proc.poll() is None, every=0.5), \
            (tmp_path / "serve.log").read_text()[-3000:]

        def agent_started() -> bool:
            agents[:] = [p for p in psutil.Process(proc.pid).children(recursive=True)
                         if "agent" in p.cmdline()]
            return bool(agents)

        assert wait_for(agent_started, 60), (tmp_path / "serve.log").read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)  # the serve process alone, not its group
        proc.wait(60)
        _, alive = psutil.wait_procs(agents, timeout=30)
        assert not alive, (f"agent {[p.pid for p in alive]} outlived serve: "
                           + (tmp_path / "serve.log").read_text()[-2000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in agents:
            with contextlib.suppress(Exception):
                p.kill()
        proc.wait()
        log.close()
