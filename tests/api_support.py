"""Fixtures of the API and database tests (a pytest plugin, loaded from conftest.py).

``db_url`` is parametrized over SQLite (a fresh file per test) and PostgreSQL (``$PIPEPLAN_TEST_POSTGRES_URL``,
its public schema emptied per test; skipped with the reason when the variable is unset: ``make test``
sets it under CI from ``.ci/postgres.sh``). Every database is migrated with Alembic, as in production.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
import pytest
from sqlalchemy import create_engine, text

from api.readiness import wait_healthy

if TYPE_CHECKING:
    from planner.export.common import Export

ROOT = Path(__file__).resolve().parent.parent
ADMIN, WORKER = "admin-secret-token", "worker-secret-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
WAUTH = {"Authorization": f"Bearer {WORKER}"}
CONTROLLED_RUN = f"{sys.executable} {ROOT / 'tests' / 'fixtures' / 'controlled_run.py'}"
REAL_RUN = f"{sys.executable} -m pipeplan.cli run"  # the executor
PG_ENV = "PIPEPLAN_TEST_POSTGRES_URL"


def worker_postgres(url: str, worker: str) -> str:
    """The database of pytest-xdist worker ``worker`` beside ``url``'s (``<name>_gw0``, ...; created on first
    use: the CI role has CREATEDB), so that two workers never empty each other's schema (tests/conftest.py
    points ``$PIPEPLAN_TEST_POSTGRES_URL`` at it in each worker)."""
    from sqlalchemy.engine import make_url

    from db.session import database_url

    base = make_url(database_url(url))
    name = f"{base.database}_{worker}"
    eng = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        for attempt in range(10):  # workers creating theirs at once: "template1 is being accessed by other users"
            with eng.connect() as c:
                if c.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first():
                    break
                try:
                    c.execute(text(f'CREATE DATABASE "{name}"'))
                    break
                except Exception:
                    if attempt == 9:
                        raise
            time.sleep(0.5)
    finally:
        eng.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


def _reset_postgres(url: str) -> None:
    from db.session import database_url

    eng = create_engine(database_url(url), isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as c:
            c.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            c.execute(text("CREATE SCHEMA public"))
    finally:
        eng.dispose()


#: the two databases every ``db_url`` test runs on, as pytest parameters (PostgreSQL's marked slow)
DATABASES = {"sqlite": pytest.param("sqlite"), "postgres": pytest.param("postgres", marks=pytest.mark.slow)}


@pytest.fixture(params=list(DATABASES.values()))
def raw_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (no schema)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pipeplan.db'}"
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"PostgreSQL half skipped: {PG_ENV} is not set (CI sets it from .ci/postgres.sh; locally: "
                    f"export {PG_ENV}=$(sudo bash .ci/postgres.sh))")
    try:
        _reset_postgres(url)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"PostgreSQL half skipped: no server at {PG_ENV}: {e}")
    return url


def on_database(name: str) -> pytest.MarkDecorator:
    """Run a test on one of ``db_url``'s two databases (``"sqlite"`` or ``"postgres"``), not both: for the
    end-to-end fault tests whose real processes (servers, agents, executor runs importing torch) cost tens of
    seconds each. What they exercise of the database -- claims, leases, requeues -- is one code path on both
    but for the job claim's ``SKIP LOCKED`` on PostgreSQL (``api.jobqueue.claim``), which the quick claim tests
    and the main flow (``test_flow_profile_plan_job_agent_result_comparison``) run on both; so each fault
    scenario runs once, the scenarios spread over the two databases (README, Tests)."""
    if name not in DATABASES:
        raise ValueError(f"database must be one of {', '.join(map(repr, DATABASES))}, got {name!r}")
    return pytest.mark.parametrize("raw_db_url", [DATABASES[name]], indirect=True)


@pytest.fixture
def db_url(raw_db_url: str) -> str:
    """A database migrated to the head revision."""
    from db.migrate import upgrade

    upgrade(raw_db_url)
    return raw_db_url


def make_settings(db_url: str, **kw: Any) -> Any:
    from api.settings import Settings

    base: dict[str, Any] = dict(database_url=db_url, admin_token=ADMIN, worker_token=WORKER, open_reads=False,
                                lease_seconds=30.0, max_attempts=3, plan_workers=2, plan_wait_seconds=5.0,
                                plan_timeout_seconds=120.0, reaper_interval=0.2, worker_alive_seconds=60.0,
                                max_cluster_gpus=65536)
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def client(db_url: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from api.main import create_app

    with TestClient(create_app(make_settings(db_url)), raise_server_exceptions=False) as c:
        yield c


TINY_DEVICE = "A100-SXM4-80GB"  # tiny_cluster's device: an agent declares it to be offered its (real) jobs


def tiny_cluster(gpus_per_node: int = 4, nodes: int = 1, name: str = "tiny-cluster") -> dict[str, Any]:
    return {"name": name, "nodes": nodes, "gpus_per_node": gpus_per_node, "device": "A100-SXM4-80GB",
            "memory_bytes": 80 * 2**30, "peak_flops": 312e12, "intra": {"alpha": 3e-6, "beta": 4e-12},
            "inter": {"alpha": 5e-6, "beta": 4.5e-11}}


def tiny_profile(name: str = "gpt-tiny", layers: int = 4) -> dict[str, Any]:
    from planner.analytic import transformer_profile

    return transformer_profile(name, layers, 256, 4, 128, 1024, 312e12, "A100-SXM4-80GB").model_dump(mode="json")


#: ports handed out for servers: below Linux's default ephemeral range (32768-60999,
#: /proc/sys/net/ipv4/ip_local_port_range), which the kernel gives to outgoing connections
_SERVER_PORTS = (20000, 32000)
_random = random.SystemRandom()  # not the seeded module state: two xdist workers must not draw alike


def free_port() -> int:
    """A port free on 127.0.0.1 now, drawn below the ephemeral range: a port from ``bind(0)`` is an
    ephemeral one, and between this check and the server's bind the kernel could hand it to an outgoing
    connection of another process (an httpx client, a gloo rank, the other xdist worker's tests) -- CI saw
    "address already in use" that way. A port drawn here can still be taken by a concurrent test:
    :meth:`LiveServer.start` retries a first start on another port."""
    for _ in range(200):
        port = _random.randint(*_SERVER_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


class LiveServer:
    """The real app under uvicorn in a subprocess (so it can be killed and restarted)."""

    def __init__(self, db_url: str, workdir: Path, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = _env({"DATABASE_URL": db_url, "PIPEPLAN_ADMIN_TOKEN": ADMIN, "PIPEPLAN_WORKER_TOKEN": WORKER,
                         "PIPEPLAN_REAPER_INTERVAL": "0.2", "PIPEPLAN_PLAN_WAIT_SECONDS": "2",
                         "PIPEPLAN_PLAN_LEASE_SECONDS": "5", **settings})
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> LiveServer:
        """Start the server and wait for ``/health``. A first start that loses its port to another process
        ("address already in use") moves to another port, up to 5 times; a restart keeps its port, which
        clients already hold."""
        for attempt in range(5):
            try:
                return self._start()
            except RuntimeError as e:
                if self.starts > 1 + attempt or "address already in use" not in str(e) or attempt == 4:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start(self) -> LiveServer:
        self.starts += 1
        log = open(self.workdir / f"server-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--log-level", "warning", "--timeout-graceful-shutdown",
                                      "10"],
                                     cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc
        if wait_healthy(self.url, 60, alive=lambda: proc.poll() is None):
            return self
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {self.log()}")
        raise RuntimeError("server did not start: " + self.log())

    def log(self) -> str:
        return (self.workdir / f"server-{self.starts}.log").read_text(errors="replace")[-3000:]

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=30)


@pytest.fixture(scope="session")
def seeded_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated and seeded (``api.seed.seed``: the example clusters and profiles, and this
    machine's measured CPU profile and local cluster) once per test run: a template that
    :func:`seeded_server` copies, so that each browser-test module gets a fresh seeded database without
    measuring the CPU again (seeding measures for ~50 s on the 2-core machine; copying the file takes
    milliseconds). Under pytest-xdist the workers share it (pytest-xdist's recipe for a session fixture made
    once: a directory beside the workers' own temp roots, a lock, and a marker written once it is complete):
    the first worker that needs it seeds, the other waits on the lock and reads it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    here = root / "seeded-template"
    path, done = here / "pipeplan.db", here / "complete"
    with open(root / "seeded-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (this worker's seeding raised too)
        if not done.exists():
            from api.seed import seed
            from db.migrate import upgrade

            shutil.rmtree(here, ignore_errors=True)  # a worker that failed half-way left a partial one
            here.mkdir()
            url = f"sqlite:///{path}"
            upgrade(url)
            seed(url)
            done.touch()
    return path


def seeded_server(template: Path, tmp_path_factory: pytest.TempPathFactory, **settings: str) -> LiveServer:
    """A started :class:`LiveServer` on a fresh copy of the ``seeded_sqlite`` template, in a temp dir of its
    own (the caller stops it)."""
    tmp = tmp_path_factory.mktemp("ui-server")
    shutil.copyfile(template, tmp / "pipeplan.db")
    return LiveServer(f"sqlite:///{tmp / 'pipeplan.db'}", tmp, **settings).start()


@pytest.fixture
def live_server(db_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    srv = LiveServer(db_url, tmp_path, PIPEPLAN_LEASE_SECONDS="5").start()  # renewed every 5/3 s
    try:
        yield srv
    finally:
        srv.stop()


def start_agent(url: str, workdir: Path, name: str, env: dict[str, str] | None = None,
                *extra: str, run_command: str = CONTROLLED_RUN, device: str = TINY_DEVICE) -> subprocess.Popen[bytes]:
    """A real agent (``pipeplan agent``) in a subprocess; its runs use ``run_command`` (the executor,
    ``REAL_RUN``, or the controllable command of the fault tests). It declares ``device`` (by default
    :func:`tiny_cluster`'s, so that it is offered the jobs of plans on it; a CPU agent takes emulated ones)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pipeplan.cli", "agent", "--api", url, "--token", WORKER, "--name", name,
           "--poll", "0.2", "--heartbeat", "1", "--workdir", str(workdir), "--device-type", device,
           "--run-command", run_command, *extra]
    log = open(workdir / "agent.log", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(env or {}), stdout=log, stderr=subprocess.STDOUT)


def wait_for(fn: Any, timeout: float = 60.0, every: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def post_plan(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    """POST /plans with the admin token and wait until the plan is done or failed: its document."""
    r = client.post("/plans", json=body, headers=AUTH)
    assert r.status_code in (200, 201, 202), r.text
    plan = r.json()
    if plan["status"] not in ("done", "failed"):
        plan = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            client.get(f"/plans/{plan['id']}", headers=AUTH).json()), what="plan done")
    return plan


def upload_profile_and_cluster(client: Any, profile: Any, cluster: Path) -> tuple[int, int]:
    """POST ``profile`` (a ModelProfile) and the cluster file ``cluster`` with the admin token: their ids."""
    p = client.post("/profiles", json=profile.model_dump(mode="json"), headers=AUTH)
    cl = client.post("/clusters", json=json.loads(cluster.read_text()), headers=AUTH)
    assert p.status_code in (200, 201) and cl.status_code in (200, 201), (p.text, cl.text)
    return p.json()["id"], cl.json()["id"]


def plan_done(client: Any, **body: Any) -> dict[str, Any]:
    """:func:`post_plan` of ``body``, which must end done: its document."""
    plan = post_plan(client, body)
    assert plan["status"] == "done", plan
    return plan


def finish_job(client: Any, plan: dict[str, Any], index: int, worker: dict[str, Any], seconds: float,
               emulated: bool = False, raw: dict[str, Any] | None = None) -> int:
    """Candidate ``index`` of ``plan`` dispatched as a gpt-tiny job, claimed by ``worker`` (the registration
    answer: its id and its own credential) and finished with ``seconds`` measured (``raw``: the run's own result
    document, as the agent reports it); the job's id."""
    mine = {"Authorization": f"Bearer {worker['token']}"}
    job = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": index, "model": "gpt-tiny",
                                     "emulate": emulated}, headers=AUTH).json()
    claim = client.post(f"/workers/{worker['id']}/claim", headers=mine)
    assert claim.status_code == 200 and claim.json()["job"]["id"] == job["id"], claim.text
    r = client.post(f"/jobs/{job['id']}/result", json={"worker_id": worker["id"], "iteration_time": seconds,
                                                       "emulated": emulated, "devices": [],
                                                       **({"raw": raw} if raw is not None else {})}, headers=mine)
    assert r.status_code == 201, r.text
    return job["id"]


def seed_plan(c: Any, gpus_per_node: int = 4, global_batch: int = 32,
              **request: Any) -> tuple[int, int, dict[str, Any]]:
    """Upload the tiny profile and cluster and plan them (``request``: more fields of the plan request); (profile
    id, cluster id, done plan)."""
    p = c.post("/profiles", json=tiny_profile(), headers=AUTH)
    assert p.status_code in (200, 201), p.text
    cl = c.post("/clusters", json=tiny_cluster(gpus_per_node), headers=AUTH)
    assert cl.status_code in (200, 201), cl.text
    r = c.post("/plans", json={"profile_id": p.json()["id"], "cluster_id": cl.json()["id"],
                               "global_batch": global_batch, "top": 5, **request}, headers=AUTH)
    assert r.status_code in (200, 201, 202), r.text
    plan = r.json()
    if plan["status"] not in ("done", "failed"):
        plan = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            c.get(f"/plans/{plan['id']}", headers=AUTH).json()), what="plan done")
    assert plan["status"] == "done", plan
    return p.json()["id"], cl.json()["id"], plan


# ---- a tiny fixture's config.json uploaded, planned and exported (the export-surface tests) -------------------------

class Upload(NamedTuple):
    body: dict[str, Any]  # what was posted (posting it again finds the same profile)
    profile_id: int
    cluster_id: int


def upload_fixture(client: Any, name: str) -> Upload:
    """tests/fixtures/``name``/config.json through POST /profiles/hf-config (seq 16, named ``name``) on a new tiny
    cluster of two GPUs."""
    cfg = json.loads((ROOT / "tests" / "fixtures" / name / "config.json").read_text())
    cluster = client.post("/clusters", json=tiny_cluster(2), headers=AUTH)
    assert cluster.status_code == 201, cluster.text
    cid = cluster.json()["id"]
    body = {"config": cfg, "cluster_id": cid, "seq": 16, "name": name}
    r = client.post("/profiles/hf-config", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    return Upload(body, r.json()["id"], cid)


def plan_on_two_gpus(client: Any, upload: Upload, top: int) -> dict[str, Any]:
    """The uploaded profile planned on its cluster's two GPUs (global batch 8, 1F1B), its ``top`` best kept."""
    return plan_done(client, profile_id=upload.profile_id, cluster_id=upload.cluster_id, global_batch=8, gpus=2,
                     top=top, schedules=["1f1b"])


def export_candidate(client: Any, plan: dict[str, Any], rank: int, fmt: str) -> Any:
    """GET the plan's candidate ``rank`` exported as ``fmt``: the response."""
    return client.get(f"/plans/{plan['id']}/candidates/{rank}/export", params={"format": fmt}, headers=AUTH)


def as_export(doc: dict[str, Any]) -> Export:
    """An export's JSON document as the Export it was made from."""
    from planner.export.common import Export, ExportFile

    return Export(doc["format"], tuple(ExportFile(f["name"], f["content"], f["media_type"]) for f in doc["files"]),
                  tuple(doc["notes"]))


def megatron_export(client: Any, plan: dict[str, Any], rank: int = 0) -> Export:
    """The plan's candidate ``rank`` exported for Megatron-LM (a 200)."""
    doc = export_candidate(client, plan, rank, "megatron")
    assert doc.status_code == 200, doc.text
    return as_export(doc.json())


def torchtitan_notes(client: Any, plan: dict[str, Any], rank: int = 0) -> list[str] | None:
    """The notes of the plan's candidate ``rank`` exported for torchtitan; None where the candidate has expert
    parallelism, which torchtitan's export does not write (a 422 naming it)."""
    titan = export_candidate(client, plan, rank, "torchtitan")
    if titan.status_code == 200:
        return titan.json()["notes"]
    assert titan.status_code == 422 and "torchtitan: expert" in titan.json()["detail"], titan.text
    return None
