"""Gang dispatch on one machine: four CPU agents declared as 2-"GPU" nodes (2 gloo processes each), a job of
world size 4 (gpt-tiny, 1F1B, t*D*W = 4) that spans two of them, then the same job with one of its two agents
killed (SIGKILL) mid-run. Prints, from the job's history (the API's clock): claim to gang start, gang start to
result, POST to result; kill to gang stopped and kill to the job's success on a new gang; and, for scale, the
same candidate run by one `pipeplan run` on one node (4 processes).

  python benchmarks/gang_bench.py [--iterations 2] [--kill-iterations 40] [--no-check]

It starts its own API (uvicorn, SQLite in a temporary directory, loopback only) and agents, and stops them.
Figures depend on the machine's load: say what it was when you quote them.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.live_server import server_env, start_server  # noqa: E402
from planner.analytic import transformer_profile  # noqa: E402

ADMIN, WORKER = "bench-admin", "bench-worker"
SETTINGS = {"PIPEPLAN_LEASE_SECONDS": "6", "PIPEPLAN_REAPER_INTERVAL": "0.2"}
CLUSTER = {"name": "cpu-2x2", "nodes": 2, "gpus_per_node": 2, "device": "cpu", "memory_bytes": 8 * 2**30,
           "peak_flops": 50e9, "intra": {"alpha": 3e-6, "beta": 4e-12}, "inter": {"alpha": 5e-6, "beta": 4.5e-11}}


def _env(tmp: Path) -> dict[str, str]:
    return server_env(tmp, ADMIN, WORKER, **SETTINGS)


def start_agents(url: str, tmp: Path, run: str, n: int = 4) -> list[subprocess.Popen[bytes]]:
    out = []
    for k in range(n):
        wd = tmp / f"node{k}"
        wd.mkdir(parents=True, exist_ok=True)
        log = open(wd / "agent.log", "wb")  # noqa: SIM115
        out.append(subprocess.Popen([sys.executable, "-m", "pipeplan.cli", "agent", "--api", url, "--name", f"node{k}",
                                     "--gpus", "2", "--device-type", "cpu", "--host", "127.0.0.1", "--poll", "0.2",
                                     "--heartbeat", "1", "--workdir", str(wd), "--run-command", run],
                                    env=_env(tmp), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return out


def wait(fn: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def at(job: dict[str, Any], event: str, nth: int = 0) -> datetime:
    return [datetime.fromisoformat(e["at"]) for e in job["history"] if e["event"] == event][nth]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--kill-iterations", type=int, default=40)
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the finally below stops what it started
    check = "" if args.no_check else " --check"
    run = f"{sys.executable} -m pipeplan.cli run{check}"
    with tempfile.TemporaryDirectory(prefix="gang-bench-") as d:
        tmp = Path(d)
        server = start_server(tmp, ADMIN, WORKER, **SETTINGS)
        url = server.url
        agents: list[subprocess.Popen[bytes]] = []
        try:
            c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
            prof = transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, 312e12, "cpu").model_dump(mode="json")
            pid = c.post("/profiles", json=prof).json()["id"]
            cid = c.post("/clusters", json=CLUSTER).json()["id"]
            r = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "gpus": 4, "top": 20,
                                       "schedules": ["1f1b"], "max_tensor": 1}).json()
            plan = wait(lambda: (lambda p: p if p["status"] == "done" else None)(c.get(f"/plans/{r['id']}").json()),
                        120, "plan")
            fours = [i for i, x in enumerate(plan["candidates"]) if x["pipeline"] * x["data"] * x["tensor"] == 4]
            idx = next((i for i in fours if plan["candidates"][i]["pipeline"] > 1), fours[0])  # D > 1 if any
            cand = plan["candidates"][idx]
            print(f"candidate {idx}: {cand['label']} (t*D*W = 4 on 2 nodes x 2 processes){check}")
            (tmp / "plan.json").write_text(__import__("json").dumps({"candidates": plan["candidates"]}))
            t0 = time.monotonic()
            one = subprocess.run([*run.split(), "--plan", str(tmp / "plan.json"), "--candidate", str(idx), "--model",
                                  "gpt-tiny", "--iterations", str(args.iterations)], cwd=ROOT, env=_env(tmp),
                                 capture_output=True, text=True)
            print(f"one node, one `pipeplan run` (4 processes): {time.monotonic() - t0:.1f} s, exit {one.returncode}")
            if one.returncode:
                print("  its output: " + (one.stdout + one.stderr)[-1500:])

            agents = start_agents(url, tmp, run)
            wait(lambda: len(c.get("/workers").json()) == 4, 120, "4 agents")
            job = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": idx, "model": "gpt-tiny",
                                        "iterations": args.iterations}).json()
            done = wait(lambda: (lambda j: j if j["state"] in ("succeeded", "failed") else None)(
                c.get(f"/jobs/{job['id']}").json()), 600, "gang job")
            res = c.get(f"/jobs/{job['id']}/result").json() if done["state"] == "succeeded" else {}
            print(f"2x2 gang job: {done['state']}; created -> gang started "
                  f"{(at(done, 'gang_started') - at(done, 'created')).total_seconds():.1f} s, gang started -> result "
                  f"{(at(done, 'succeeded') - at(done, 'gang_started')).total_seconds():.1f} s, POST -> result "
                  f"{(at(done, 'succeeded') - at(done, 'created')).total_seconds():.1f} s; measured iteration "
                  f"{res.get('iteration_time', float('nan')) * 1e3:.1f} ms; check "
                  f"{(res.get('raw') or {}).get('check', {}).get('ok')}")

            job = c.post("/jobs", json={"plan_id": plan["id"], "candidate_index": idx, "model": "gpt-tiny",
                                        "iterations": args.kill_iterations}).json()
            jid = job["id"]

            def both_running() -> list[Path] | None:
                logs = sorted(tmp.glob(f"node*/job-{jid}-attempt-1-node-*/run.log"))
                return logs if c.get(f"/jobs/{jid}").json()["state"] == "running" and len(logs) == 2 else None

            logs = wait(both_running, 300, "gang running")
            victim = int(logs[0].parent.parent.name[-1])
            time.sleep(3.0)  # let the runs get past start-up: the kill lands mid-run
            t_kill = time.monotonic()
            agents[victim].send_signal(signal.SIGKILL)
            wait(lambda: any(e["event"] == "gang_stopped" for e in c.get(f"/jobs/{jid}").json()["history"]), 120,
                 "gang stopped")
            stopped = time.monotonic() - t_kill
            done = wait(lambda: (lambda j: j if j["state"] in ("succeeded", "failed") else None)(
                c.get(f"/jobs/{jid}").json()), 600, "job after requeue")
            stop = next(e for e in done["history"] if e["event"] == "gang_stopped")
            print(f"kill node{victim}'s agent mid-run ({args.kill_iterations} iterations): gang stopped "
                  f"{stopped:.1f} s after SIGKILL ({stop['reason']}), job {done['state']} on a new gang "
                  f"{time.monotonic() - t_kill:.1f} s after SIGKILL (attempts {done['attempts']}; second gang: run "
                  f"{(at(done, 'succeeded') - at(done, 'gang_started', 1)).total_seconds():.1f} s)")
        finally:
            for a in agents:
                if a.poll() is None:
                    a.send_signal(signal.SIGTERM)
            for a in agents:
                try:
                    a.wait(30)
                except subprocess.TimeoutExpired:
                    a.kill()
            server.stop()


if __name__ == "__main__":
    main()
