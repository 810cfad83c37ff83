"""API load benchmark: N concurrent clients post plan requests for a 1.3B-parameter model (gpt2-1.3b,
analytic profile) on 64 GPUs (8 DGX A100 nodes) against a local server; prints p50/p99 latency and
requests/s.

Two phases, bounded (clients x requests each):
  new     distinct requests (global batch varies), so each is planned: a POST waits up to
          PIPEPLAN_PLAN_WAIT_SECONDS (default 1 s) for the plan, else answers 202; then the benchmark polls
          until every plan is done and reports the planning throughput.
  stored  the same requests again: answered from the database (200), nothing recomputed.

  python benchmarks/api_bench.py [--clients 8] [--requests 2] [--url http://127.0.0.1:8000 --token T]

Without --url it starts its own server (uvicorn, SQLite in a temporary directory, loopback only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.live_server import start_server  # noqa: E402
from planner.analytic import analytic_profile  # noqa: E402
from planner.cluster import load_cluster  # noqa: E402
from planner.device import device_for_cluster  # noqa: E402
from planner.model import PRESETS  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def phase(url: str, token: str, bodies: list[list[dict]], name: str) -> tuple[list[int], list[int]]:
    lat: list[float] = []
    ids: list[int] = []
    codes: list[int] = []
    lock = threading.Lock()

    def client(my: list[dict]) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
            for body in my:
                t = time.perf_counter()
                r = c.post("/plans", json=body)
                dt = time.perf_counter() - t
                with lock:
                    lat.append(dt)
                    codes.append(r.status_code)
                    if r.status_code < 300:
                        ids.append(r.json()["id"])

    threads = [threading.Thread(target=client, args=(b,)) for b in bodies]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    by = {c: codes.count(c) for c in sorted(set(codes))}
    print(f"{name:7} {len(lat):4d} requests from {len(bodies)} clients in {wall:6.2f} s: "
          f"{len(lat) / wall:7.1f} req/s, latency p50 {pct(lat, 0.5) * 1e3:7.1f} ms, "
          f"p99 {pct(lat, 0.99) * 1e3:7.1f} ms, mean {statistics.mean(lat) * 1e3:7.1f} ms; status {by}")
    return ids, codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="plan requests per client")
    ap.add_argument("--url")
    ap.add_argument("--token", default=os.environ.get("PIPEPLAN_ADMIN_TOKEN", "bench-admin"))
    ap.add_argument("--timeout", type=float, default=600, help="max seconds to wait for the plans")
    a = ap.parse_args()
    if a.clients * a.requests > 1000:
        raise SystemExit("at most 1000 requests in all")
    srv = None
    tmp = tempfile.mkdtemp(prefix="pipeplan-bench-")
    url = a.url
    if url is None:
        srv = start_server(Path(tmp), a.token)
        url = srv.url
    try:
        cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json")
        prof = analytic_profile(PRESETS["gpt2-1.3b"], device_for_cluster(cl))
        H = {"Authorization": f"Bearer {a.token}"}
        pid = httpx.post(url + "/profiles", json=prof.model_dump(mode="json"), headers=H).json()["id"]
        cid = httpx.post(url + "/clusters", json=cl.model_dump(mode="json"), headers=H).json()["id"]
        print(f"server {url}; gpt2-1.3b ({prof.total_params / 1e9:.2f}B parameters) on 64 x {cl.device}")
        n = 0
        bodies = []
        for _ in range(a.clients):
            mine = []
            for _ in range(a.requests):
                mine.append({"profile_id": pid, "cluster_id": cid, "gpus": 64, "global_batch": 512 + 64 * n})
                n += 1
            bodies.append(mine)
        t0 = time.perf_counter()
        ids, _ = phase(url, a.token, bodies, "new")
        pending = set(ids)
        with httpx.Client(base_url=url, headers=H, timeout=60) as c:
            deadline = time.monotonic() + a.timeout
            while pending and time.monotonic() < deadline:
                for i in list(pending):
                    if c.get(f"/plans/{i}").json()["status"] in ("done", "failed"):
                        pending.discard(i)
                time.sleep(0.5)
            total = time.perf_counter() - t0
            failed = [i for i in ids if c.get(f"/plans/{i}").json()["status"] == "failed"]
        print(f"planned {len(ids) - len(pending)} of {len(ids)} in {total:.1f} s "
              f"({(len(ids) - len(pending)) / total:.2f} plans/s, {len(failed)} failed)")
        phase(url, a.token, bodies, "stored")
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
