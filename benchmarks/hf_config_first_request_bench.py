"""The first ``POST /profiles/hf-config`` after ``pipeplan serve`` starts (newcomer pass: ~15 s, later ones 0.2 s:
the import of transformers, and torch with it). Starts the server on a random port with a fresh SQLite database,
``--no-warm`` and ``--warm`` (api/cli.py's HFWarmer), and prints the time of the first and second request: with
the warm-up, once its log line says transformers is loaded, and also right at readiness. Prints figures only (a
loaded machine makes them vary; say the load when you quote them)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.readiness import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
CONFIG = json.loads((ROOT / "examples" / "models" / "llama-3.1-8b" / "config.json").read_text())
TOKEN = "bench-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(warm: bool, wait_for_warm: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {**os.environ, "PIPEPLAN_DATA_DIR": tmp, "PIPEPLAN_ADMIN_TOKEN": TOKEN}
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pipeplan.cli", "serve", "--upgrade", "--port", str(port),
                                     "--warm" if warm else "--no-warm"], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            end = time.monotonic() + 300
            wait_healthy(url, 300, alive=lambda: proc.poll() is None, every=0.2)
            while wait_for_warm and "transformers loaded" not in log.read_text() and time.monotonic() < end:
                time.sleep(0.2)
            times = []
            for i in range(2):
                body = {"config": CONFIG, "device": "h100", "seq": 4096 + i}
                t0 = time.perf_counter()
                r = httpx.post(url + "/profiles/hf-config", json=body, timeout=300,
                               headers={"Authorization": f"Bearer {TOKEN}"})
                times.append(time.perf_counter() - t0)
                assert r.status_code in (200, 201), (r.text, log.read_text()[-3000:])
            return times[0], times[1]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f}")
    for warm, wait in ((False, False), (True, True), (True, False)):
        first, second = run(warm, wait)
        what = "--no-warm" if not warm else ("--warm, after the warm-up" if wait else "--warm, right at readiness")
        print(f"{what:30} first request {first:6.2f} s, second {second:5.2f} s")


if __name__ == "__main__":
    main()
