"""The live API server the benchmarks run against: uvicorn on a free loopback port over SQLite in a temporary
directory, the schema upgraded (and, when asked, the example data seeded) first, stopped when the benchmark
ends. One copy for ``api_bench.py``, ``gang_bench.py`` and ``ui_timeline_bench.py``.

    with live_server(tmp, admin="bench-admin") as srv:
        httpx.get(srv.url + "/health")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from api.readiness import wait_healthy

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(tmp: Path, admin: str, worker: str = "bench-worker", **extra: str) -> dict[str, str]:
    """The environment of the server (and of agents talking to it): SQLite under ``tmp``, the tokens, open
    reads, and ``extra`` settings (e.g. ``PIPEPLAN_LEASE_SECONDS="6"``)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), PIPEPLAN_DATA_DIR=str(tmp),
                DATABASE_URL=f"sqlite:///{tmp / 'pipeplan.db'}", PIPEPLAN_ADMIN_TOKEN=admin,
                PIPEPLAN_WORKER_TOKEN=worker, PIPEPLAN_OPEN_READS="1", **extra)


@dataclass
class LiveServer:
    """A running server: its base ``url``, its ``env`` (for agents) and its process."""

    url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(tmp: Path, admin: str, worker: str = "bench-worker", *, seed: bool = False,
                 timeout: float = 60.0, **extra: str) -> LiveServer:
    """Upgrade the database in ``tmp`` (``seed``: and store the example clusters and analytic profiles,
    ``pipeplan seed --no-measure``), start uvicorn and wait for ``/health``; its output goes to
    ``tmp/server.log``."""
    env = server_env(tmp, admin, worker, **extra)
    for cmd in (["db-upgrade"], *([["seed", "--no-measure"]] if seed else [])):
        subprocess.run([sys.executable, "-m", "pipeplan.cli", *cmd], env=env, cwd=ROOT, check=True,
                       capture_output=True)
    port, log = free_port(), tmp / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    srv = LiveServer(f"http://127.0.0.1:{port}", env, proc, log)
    if wait_healthy(srv.url, timeout, alive=lambda: proc.poll() is None):
        return srv
    srv.stop()
    raise SystemExit("the API server did not start:\n" + log.read_text()[-3000:])


@contextmanager
def live_server(tmp: Path, admin: str, worker: str = "bench-worker", *, seed: bool = False,
                **extra: str) -> Iterator[LiveServer]:
    """:func:`start_server`, stopped on leaving (also on an exception)."""
    srv = start_server(tmp, admin, worker, seed=seed, **extra)
    try:
        yield srv
    finally:
        srv.stop()
