"""Issue 14's goals, measured against a server it starts on 127.0.0.1 (SQLite in a temporary directory):

1. the probe's expensive request (a cluster of 8192 nodes x 8 GPUs, ``global_batch`` 2^20 on 4096 GPUs,
   ``top`` 1000): refused up front, or planned within its limits;
2. ``/health`` latency (p50/p99/max) while ``--clients`` clients keep submitting the most expensive plan
   the limits allow (``global_batch`` 65536 on 4096 GPUs of that cluster, ``top`` 100; each client varies
   the batch so that nothing is answered from the store), for ``--seconds``; and the planner processes'
   peak resident memory meanwhile (from /proc, every 0.5 s).

Bounded: the clients stop after ``--seconds``; the server (and its planner processes) is stopped at the end.
Figures only, no pass/fail: the machine it runs on (and its load) says what they mean.

  python benchmarks/hardening_bench.py [--clients 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.live_server import start_server  # noqa: E402
from planner.analytic import analytic_profile  # noqa: E402
from planner.cluster import load_cluster  # noqa: E402
from planner.device import device_for_cluster  # noqa: E402
from planner.model import PRESETS  # noqa: E402

TOKEN = "bench-admin-token"


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c, parent in parents.items():
            if parent == p:
                out.append(c)
                todo.append(c)
    return out


def rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def poll_health(url: str, seconds: float, out: Any) -> None:
    """GET /health every 50 ms for ``seconds``; put the latencies (s) on ``out``."""
    got = []
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as hc:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            hc.get("/health")
            got.append(time.perf_counter() - t0)
            time.sleep(0.05)
    out.put(got)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp), TOKEN)
        try:
            run(srv.url, srv.proc.pid, args.clients, args.seconds)
        finally:
            srv.stop()


def run(url: str, server_pid: int, clients: int, seconds: float) -> None:
    h = {"Authorization": f"Bearer {TOKEN}"}
    c = httpx.Client(base_url=url, headers=h, timeout=60)
    cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json").model_copy(update={"nodes": 8192})
    prof = analytic_profile(PRESETS["gpt2-1.3b"], device_for_cluster(cl))
    pid = c.post("/profiles", json=prof.model_dump(mode="json")).json()["id"]
    r = c.post("/clusters", json=cl.model_dump(mode="json"))
    print(f"cluster of 8192 x 8 GPUs: {r.status_code}")
    cid = r.json()["id"]
    probe = {"profile_id": pid, "cluster_id": cid, "global_batch": 1048576, "gpus": 4096, "top": 1000}
    t = time.perf_counter()
    r = c.post("/plans", json=probe)
    print(f"the probe's request: {r.status_code} in {1000 * (time.perf_counter() - t):.1f} ms: "
          f"{r.json().get('detail', r.json().get('status'))}")

    stop = threading.Event()
    health: list[float] = []
    codes: dict[int, int] = {}
    peak = {"planner_mb": 0.0, "api_mb": 0.0}
    lock = threading.Lock()


    def watch_memory() -> None:
        while not stop.is_set():
            kids = descendants(server_pid)
            with lock:
                peak["api_mb"] = max(peak["api_mb"], rss_mb(server_pid))
                peak["planner_mb"] = max([peak["planner_mb"], *(rss_mb(k) for k in kids)])
            time.sleep(0.5)

    def client(i: int) -> None:
        with httpx.Client(base_url=url, headers=h, timeout=60) as pc:
            n = 0
            while not stop.is_set():
                batch = 65536 - 8 * (i + clients * n)  # distinct requests: each one is planned
                r = pc.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": batch,
                                            "gpus": 4096, "top": 100})
                with lock:
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code == 429:
                    stop.wait(min(float(r.headers.get("Retry-After", "1")), 2.0))
                n += 1

    # /health is timed from a process of its own: the client threads here would hold its GIL
    prober = mp.get_context("spawn")
    results = prober.Queue()
    probe = prober.Process(target=poll_health, args=(url, seconds, results))
    probe.start()
    threads = [threading.Thread(target=watch_memory)]
    threads += [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    health.extend(results.get(timeout=seconds + 120))
    probe.join(30)
    stop.set()
    for th in threads:
        th.join(120)
    lat = sorted(health)
    p = lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    plans = c.get("/plans", params={"limit": 1000}).json()
    by_status: dict[str, int] = {}
    for pl in plans:
        by_status[pl["status"]] = by_status.get(pl["status"], 0) + 1
    print(f"{clients} clients for {seconds:.0f} s submitting B^<=65536 on 4096 GPUs, top 100: POST /plans answers "
          f"{dict(sorted(codes.items()))}; plans {by_status}")
    print(f"/health: {len(lat)} requests, p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {1000 * lat[-1]:.1f} ms")
    print(f"peak resident memory: API process {peak['api_mb']:.0f} MB, largest planner process "
          f"{peak['planner_mb']:.0f} MB")
    c.close()


if __name__ == "__main__":
    main()
