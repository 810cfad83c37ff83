"""``pipeplan serve`` loads transformers in the background once it listens (newcomer pass: the first
``POST /profiles/hf-config`` after start took ~15 s, later ones 0.2 s; figures from
benchmarks/hf_config_first_request_bench.py): readiness does not wait for it, a request during the warm-up is
answered (not a 500 from transformers' half-loaded lazy module), and the warm-up says when it is done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from api_support import free_port, wait_for

from api.readiness import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
CONFIG = json.loads((ROOT / "examples" / "models" / "llama-3.1-8b" / "config.json").read_text())
pytestmark = pytest.mark.slow


def test_serve_warms_transformers_after_it_listens(tmp_path: Path) -> None:
    token = "warm-admin-token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEPLAN_") and k != "DATABASE_URL"}
    env.update(PIPEPLAN_DATA_DIR=str(tmp_path), PIPEPLAN_ADMIN_TOKEN=token)
    log = tmp_path / "serve.log"
    # our server, on a port no concurrent test took between free_port() and its bind: CI saw another test's server
    # answer the health check (401 to our token) while ours exited with "address already in use"
    for attempt in range(5):
        port = free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pipeplan.cli", "serve", "--upgrade", "--port", str(port)],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda p=proc: p.poll() is not None or "Uvicorn running" in log.read_text(), timeout=180,
                 every=0.2, what="serve listening or exited")
        if proc.poll() is None or "in use" not in log.read_text() or attempt == 4:
            break
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(url, 180, alive=lambda: proc.poll() is None), \
            "serve did not come up: " + log.read_text()[-3000:]
        # at once: during the warm-up (or after it, on a fast machine); either way a profile, never a 500
        r = httpx.post(url + "/profiles/hf-config", json={"config": CONFIG, "device": "h100"}, timeout=300,
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, (r.text, log.read_text()[-3000:])
        wait_for(lambda: "transformers loaded" in log.read_text(), timeout=300, every=0.5, what="warm-up done")
        text = log.read_text()
        assert text.index("Uvicorn running") < text.index("transformers loaded"), "readiness first, then the warm-up"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
