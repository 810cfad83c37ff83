"""The worker agent: ``pipeplan agent --api URL --token T`` on each node.

It registers, heartbeats, claims jobs, writes the plan (and, for emulated runs, the profile) to disk,
launches the executor (``pipeplan run --plan plan.json --candidate I --model M --iterations N --out
result.json [--emulate profile.json --cluster cluster.json]``: an emulated run gets the plan's profile and
cluster; the command is ``--run-command`` / ``$PIPEPLAN_RUN_COMMAND``)
as a subprocess (or, through the launcher hook, :class:`Launcher`, as a Slurm batch job:
:class:`executor.slurm.SlurmLauncher`), renews the job's lease while it runs, and posts the result, or the
error with the log tail. SIGINT/SIGTERM stop the run and give the job back (release), so another agent takes it at once.
The API being briefly unreachable (restart) is retried, not fatal.

Credentials: the token the agent starts with (``$PIPEPLAN_WORKER_TOKEN`` or a file) only registers it;
the API answers with this worker's own credential, which every later request carries, and which is kept
in ``<workdir>/credential`` (mode 0600, with the name it registered) so that a restarted agent is the same
worker. A name registered to another credential is not taken over: the agent registers as ``NAME-xxxxxx``.
No token reaches the run: its environment is the agent's without ``PIPEPLAN_*TOKEN*`` variables.

The run dies with the agent: it starts under :mod:`executor.runguard`, which holds a pipe from the agent
and kills the run's whole process group when the pipe closes (the agent exited, even by ``kill -9``).

What it has: the agent declares its GPU count (``--gpus``; a CPU agent: the gloo processes it runs), its device type
(the planner's device name, a cluster JSON's ``device``, or an alias; ``cpu`` for a CPU-only agent, which is offered
CPU and emulated plans only; by default what ``nvidia-smi`` lists, :func:`detect_gpus`) and its host (``--host``:
the address other nodes reach it at), at registration and with every heartbeat; the API offers it only the jobs that
fit (:mod:`api.gang`).

Several nodes (an agent with ``--gpus`` > 0): with each claim it offers a free port of its host; it may get a
node slot of a multi-node job instead of a whole job. It then checks in on the slot (renewing its lease) until
the API says the whole gang is held (``start``, with the rendezvous endpoint: node rank 0's host and the port
its agent offered), runs ``pipeplan run ... --nnodes N --node-rank R --nproc-per-node G --rdzv-endpoint H:P
--rdzv-id ID``, and goes on checking in while it runs: a 409 means the gang was stopped (another node's agent
died or its run failed) and the run is killed at once. The node whose run wrote the result (where global rank 0
ran) posts it; the others say their node is done; a failing run stops the whole gang (the API queues the job
again). A slot that waits alone too long is given back by the API (``released``) and the agent claims again.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from planner.units import is_cpu

log = logging.getLogger("pipeplan.agent")
TRACE_LIMIT = 20_000_000
LOG_TAIL = 8000


def default_run_command() -> list[str]:
    env = os.environ.get("PIPEPLAN_RUN_COMMAND")
    if env:
        return shlex.split(env)
    # the agent's own interpreter, hence its checkout: a `pipeplan` found on PATH may be another one's
    return [sys.executable, "-m", "pipeplan.cli", "run"]


class LeaseLost(RuntimeError):
    pass


class LaunchFailed(RuntimeError):
    """The launcher could not start the run (e.g. ``sbatch`` refused it): the job fails with this message."""


class Launcher(Protocol):
    """How the agent runs a job's command: :class:`LocalLauncher` (a subprocess on this node) or
    :class:`executor.slurm.SlurmLauncher` (a batch job). ``cancel`` is called once the run is over too: it
    stops the run if it still goes on and releases what ``start`` holds."""

    def start(self, cmd: list[str], jobdir: Path, logfile: Path) -> Any:
        """Start ``cmd`` for the job whose directory is ``jobdir`` (its output into ``logfile``); a handle."""
        ...

    def poll(self, run: Any) -> int | None:
        """The run's exit status once it ended, else None."""
        ...

    def cancel(self, run: Any) -> None: ...


@dataclass
class LocalRun:
    proc: subprocess.Popen[bytes]
    keep: int | None  # the write end of the guard's pipe


class LocalLauncher:
    """The run as a subprocess of this agent, under :mod:`executor.runguard` (it dies with the agent)."""

    def start(self, cmd: list[str], jobdir: Path, logfile: Path) -> LocalRun:
        with open(logfile, "wb") as logf:
            lifeline, keep = os.pipe()  # the run's guard reads `lifeline`; EOF means this agent is gone
            try:
                proc = subprocess.Popen([sys.executable, "-m", "executor.runguard", str(lifeline), "--", *cmd],
                                        stdout=logf, stderr=subprocess.STDOUT, cwd=jobdir, start_new_session=True,
                                        pass_fds=(lifeline,), env=run_environment())
            except BaseException:
                os.close(keep)
                raise
            finally:
                os.close(lifeline)
        return LocalRun(proc, keep)

    def poll(self, run: LocalRun) -> int | None:
        return run.proc.poll()

    def cancel(self, run: LocalRun) -> None:
        if run.proc.poll() is None:
            _terminate(run.proc)
        if run.keep is not None:
            os.close(run.keep)
            run.keep = None



class RegistrationFailed(RuntimeError):
    """The agent could not register with the API (unreachable, or the token refused): ``pipeplan agent`` says
    so in one line."""

class Agent:
    def __init__(self, api: str, token: str, *, name: str | None = None, node: str | None = None, gpus: int = 0,
                 device_type: str = "cpu", run_command: list[str] | None = None, workdir: str | Path | None = None,
                 poll: float = 2.0, heartbeat: float = 10.0,
                 retry_for: float = 600.0, launcher: Launcher | None = None, host: str | None = None) -> None:
        self.node = node or socket.gethostname()
        self.name = name or f"{self.node}-{os.getpid()}"
        self.gpus, self.device_type = gpus, device_type
        self.host = host or socket.getfqdn()
        self.run_command = run_command or default_run_command()
        self.launcher: Launcher = launcher or LocalLauncher()
        # absolute: the run is started with cwd= its job directory, where a relative path would be looked up
        # a second time (issue 13: every job from `make serve` failed reading data/agent/.../plan.json)
        data = Path(os.environ.get("PIPEPLAN_DATA_DIR", "data"))  # where the API's SQLite database goes too
        self.workdir = Path(workdir or data / "agent" / self.name).resolve()
        self.poll, self.heartbeat_interval = poll, heartbeat
        self.retry_for = retry_for
        self.registration_token = token
        self.api = api.rstrip("/")
        self.client = httpx.Client(base_url=self.api, timeout=30.0)
        self.stop = threading.Event()
        self.worker_id: int | None = None
        self.jobs_done = 0

    # ---- HTTP with retries (the API may be restarting) ----------------------------------------------
    def _request(self, method: str, url: str, *, patient: bool = False, **kw: Any) -> httpx.Response:
        """``method url`` until the API answers other than 5xx or 429, retrying for ``retry_for`` seconds
        (``patient``: for as long as the agent runs -- a finished run's result, which an outage longer than
        ``retry_for`` would otherwise throw away: the API's restart gives the job a fresh lease, so the post is
        taken when it is back); RuntimeError when it gives up, or at the first failure once the agent is stopped
        (a release excepted)."""
        deadline = float("inf") if patient else time.monotonic() + self.retry_for
        delay = 0.2
        while True:
            try:
                r = self.client.request(method, url, **kw)
                if r.status_code < 500 and r.status_code != 429:
                    return r
                err = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.TransportError as e:
                err = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline or (self.stop.is_set() and "release" not in url):
                raise RuntimeError(f"{method} {url} failed: {err}")
            log.warning("%s %s: %s; retrying in %.1f s", method, url, err, delay)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)  # short: a held lease (renewed meanwhile by no one) must not run out

    @property
    def credential_file(self) -> Path:
        return self.workdir / "credential"  # (workdir is per name: a renamed agent keeps using this one)

    def register(self) -> int:
        """Register (with the saved credential of this name if there is one, else the registration token)
        and use the worker's own credential from then on. :class:`RegistrationFailed` says why it could not
        (the API unreachable, the token refused)."""
        try:
            return self._register()
        except RegistrationFailed:
            raise
        except RuntimeError as e:  # _request gave up: the API cannot be reached (or answers 5xx)
            raise RegistrationFailed(f"cannot register with the API at {self.api}: {e}") from None

    def _register(self) -> int:
        saved = None
        try:
            kept = json.loads(self.credential_file.read_text())
            saved, self.name = kept["token"], kept.get("name") or self.name
        except (OSError, ValueError, KeyError, TypeError):
            pass
        body = {"name": self.name, "node": self.node, "gpus": self.gpus, "device_type": self.device_type,
                "host": self.host}
        r = None
        if saved:
            r = self._request("POST", "/workers", json=body, headers={"Authorization": f"Bearer {saved}"})
            if r.status_code == 401:  # the API does not know it (a fresh database): register anew
                r = None
        if r is None:
            r = self._request("POST", "/workers", json=body,
                              headers={"Authorization": f"Bearer {self.registration_token}"})
        if r.status_code == 409:  # the name belongs to a worker whose credential this agent lacks: a new name
            taken, self.name = self.name, f"{self.name}-{secrets.token_hex(3)}"
            log.warning("worker name %r is registered to another credential; registering as %r", taken, self.name)
            r = self._request("POST", "/workers", json={**body, "name": self.name},
                              headers={"Authorization": f"Bearer {self.registration_token}"})
        if r.status_code in (401, 403):
            raise RegistrationFailed(f"the API at {self.api} refused the registration token (HTTP {r.status_code}: "
                                     f"{r.text[:200]}): give the API's PIPEPLAN_WORKER_TOKEN "
                                     f"($PIPEPLAN_WORKER_TOKEN, --token-file or --token)")
        if r.status_code >= 400:
            raise RegistrationFailed(f"the API at {self.api} refused the registration: HTTP {r.status_code}: "
                                     f"{r.text[:300]}")
        data = r.json()
        credential = data.get("token") or saved
        if not credential:
            raise RuntimeError("the API issued no worker credential")
        if data.get("token"):
            self.workdir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.credential_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"name": self.name, "token": credential}, f)
        self.client.headers["Authorization"] = f"Bearer {credential}"
        self.worker_id = int(data["id"])
        # the API stores a device under the shipped description's name it matches (api.gang.canonical_device):
        # that name is what jobs are matched by, and what the log says
        self.device_type = str(data.get("device_type") or self.device_type)
        log.info("registered as worker %d (%s): %s", self.worker_id, self.name, self.declaration())
        return self.worker_id

    def declaration(self) -> str:
        """What this agent takes, in words (logged at registration)."""
        size = (f"{self.gpus} GPU(s) (processes) per node, also nodes of multi-node jobs" if self.gpus
                else "GPUs undeclared: single-node jobs only")
        if is_cpu(self.device_type):  # the API's rule for a CPU agent (api.gang)
            return (f"CPU agent: plans on device {self.device_type!r} and emulated plans only; {size}; "
                    f"host {self.host}")
        return f"device {self.device_type}; {size}; host {self.host}"

    def _heartbeats(self) -> None:
        while not self.stop.wait(self.heartbeat_interval):
            try:
                self.client.post(f"/workers/{self.worker_id}/heartbeat",
                                 json={"gpus": self.gpus, "device_type": self.device_type, "host": self.host})
            except Exception as e:  # noqa: BLE001 - a missed heartbeat is not fatal (the client may be closing)
                log.warning("heartbeat failed: %s", e)

    def claim(self) -> dict[str, Any] | None:
        """A job, or a node slot of a multi-node job (``claim["slot"]``; only with GPUs declared, offering a
        free port of this host for the rendezvous should it get node rank 0). An agent whose launcher is not
        the local one (Slurm) claims multi-node jobs whole: its launcher places them on nodes."""
        if not isinstance(self.launcher, LocalLauncher):
            body: dict[str, Any] | None = {"whole": True}  # e.g. Slurm: it allocates a job's nodes itself
        else:
            body = {"rdzv_port": free_port()} if self.gpus > 0 else None
        r = self._request("POST", f"/workers/{self.worker_id}/claim", json=body)
        if r.status_code == 204:
            return None
        r.raise_for_status()
        return r.json()

    # ---- one job -------------------------------------------------------------------------------------
    def command(self, claim: dict[str, Any], jobdir: Path) -> list[str]:
        job = claim["job"]
        plan_path, out = jobdir / "plan.json", jobdir / "result.json"
        plan_path.write_text(json.dumps(claim["plan"], indent=1))
        cmd = [*self.run_command, "--plan", str(plan_path), "--candidate", str(job["candidate_index"]),
               *(["--model", job["model"]] if job.get("model") else []),  # (an emulated job may build none)
               "--iterations", str(job["iterations"]), "--out", str(out), "--trace", str(jobdir / "trace.json")]
        if job["emulate"] and claim.get("profile") is not None:
            prof = jobdir / "profile.json"
            prof.write_text(json.dumps(claim["profile"], indent=1))
            cmd += ["--emulate", str(prof)]
            if claim.get("cluster") is not None:
                # the plan's cluster: on a fictional one (an H100 plan emulated here) messages are tokens that
                # take its links' predicted times; without it the run sent real tensors over this machine's gloo
                cl = jobdir / "cluster.json"
                cl.write_text(json.dumps(claim["cluster"], indent=1))
                cmd += ["--cluster", str(cl)]
        return cmd

    def run_job(self, claim: dict[str, Any]) -> str:
        """Run one claimed job to its end; the outcome: succeeded, failed, cancelled, lost or released."""
        if claim.get("slot") is not None:
            return self.run_slot(claim)
        job = claim["job"]
        jid = job["id"]
        jobdir = self.workdir / f"job-{jid}-attempt-{job['attempts']}"
        jobdir.mkdir(parents=True, exist_ok=True)
        cmd = self.command(claim, jobdir)

        def renew() -> str | None:
            r = self.client.post(f"/jobs/{jid}/lease", json={"worker_id": self.worker_id})
            if r.status_code == 409:
                return "lost"
            if r.status_code == 200 and r.json().get("cancel"):
                return "cancelled"
            return None

        outcome, code = self._supervise(jid, cmd, jobdir, float(claim["lease_seconds"]), renew, f"/jobs/{jid}/fail")
        if outcome == "released":
            self._request("POST", f"/jobs/{jid}/release", json={"worker_id": self.worker_id})
            log.info("job %d: stopped, released", jid)
            return outcome
        if outcome is not None:
            log.warning("job %d: %s; run stopped", jid, outcome)
            return outcome
        return self._report(jid, code, jobdir / "result.json", jobdir / "run.log")

    def _supervise(self, jid: int, cmd: list[str], jobdir: Path, lease_seconds: float,
                   renew: Any, fail_url: str) -> tuple[str | None, int]:
        """Run ``cmd`` with the launcher in ``jobdir`` (log in run.log), calling ``renew`` every third of a
        lease; (outcome, exit code): outcome None when the run ended by itself, else why it was stopped --
        ``released`` (this agent stops), what ``renew`` answered, or ``failed`` (it could not start: posted
        to ``fail_url``)."""
        logfile = jobdir / "run.log"
        renew_every = max(0.2, lease_seconds / 3)
        log.info("job %d: %s", jid, shlex.join(cmd))
        try:
            run = self.launcher.start(cmd, jobdir, logfile)
        except LaunchFailed as e:
            r = self._request("POST", fail_url, json={"worker_id": self.worker_id, "error": str(e), "log_tail": ""})
            log.warning("job %d failed to start: %s", jid, e)
            return ("failed" if r.status_code == 200 else "lost"), -1
        outcome = code = None
        try:
            while (code := self.launcher.poll(run)) is None:
                if self.stop.wait(renew_every):
                    outcome = "released"
                    break
                try:
                    outcome = renew()
                except httpx.TransportError as e:
                    log.warning("job %d: lease renewal failed (%s); the run goes on", jid, e)
                    continue
                if outcome is not None:
                    break
        finally:
            self.launcher.cancel(run)
        return outcome, -1 if code is None else code

    # ---- a node slot of a multi-node job (a gang) --------------------------------------------------------
    def run_slot(self, claim: dict[str, Any]) -> str:
        """Wait in a claimed node slot until the gang is held, run this node's part, report it. The outcome:
        succeeded (this node posted the result), done (another node has it), failed, cancelled, lost
        (the gang was stopped), released (this agent stops) or timed-out (the gang did not form in time)."""
        job, slot = claim["job"], claim["slot"]
        jid, rank = job["id"], slot["node_rank"]
        url = f"/jobs/{jid}/slots/{rank}"
        lease = float(claim["lease_seconds"])
        log.info("job %d: holding node slot %d of %d; waiting for the gang", jid, rank, job["nodes"])
        start = self._await_gang(jid, url, lease)
        if not isinstance(start, dict):
            return start
        jobdir = self.workdir / f"job-{jid}-attempt-{start['attempt']}-node-{rank}"
        jobdir.mkdir(parents=True, exist_ok=True)
        cmd = [*self.command(claim, jobdir), "--nnodes", str(start["nodes"]), "--node-rank", str(rank),
               "--nproc-per-node", str(start["procs_per_node"]), "--rdzv-endpoint", str(start["rdzv_endpoint"]),
               "--rdzv-id", str(start["rdzv_id"])]

        def renew() -> str | None:
            r = self.client.post(f"{url}/lease", json={"worker_id": self.worker_id})
            if r.status_code == 409:
                return "lost"
            if r.status_code == 200 and r.json().get("state") in ("cancelled", "failed"):
                return r.json()["state"]
            return None  # running, or succeeded (another node posted the result): let the run end

        outcome, code = self._supervise(jid, cmd, jobdir, lease, renew, f"{url}/fail")
        if outcome == "released":
            self._request("POST", f"{url}/release", json={"worker_id": self.worker_id})
            log.info("job %d: node %d stopped, the gang released", jid, rank)
            return outcome
        if outcome is not None:
            log.warning("job %d: node %d: %s; run stopped", jid, rank, outcome)
            return outcome
        out, logfile = jobdir / "result.json", jobdir / "run.log"
        if code == 0 and not out.exists():
            r = self._request("POST", f"{url}/done", json={"worker_id": self.worker_id})
            log.info("job %d: node %d done (the result is on the node of global rank 0)", jid, rank)
            return "done" if r.status_code == 200 else "lost"
        return self._report(jid, code, out, logfile, fail_url=f"{url}/fail")

    def _await_gang(self, jid: int, url: str, lease: float) -> dict[str, Any] | str:
        """Check in on the slot until the gang starts: the start answer, or why not (an outcome)."""
        every = min(self.poll, max(0.2, lease / 3), 0.5)
        while True:
            if self.stop.is_set():
                self._request("POST", f"{url}/release", json={"worker_id": self.worker_id})
                return "released"
            r = self._request("POST", f"{url}/lease", json={"worker_id": self.worker_id})
            if r.status_code == 409:
                log.warning("job %d: the slot was lost while waiting", jid)
                return "lost"
            r.raise_for_status()
            state = r.json()["state"]
            if state == "start":
                return r.json()
            if state == "released":
                log.info("job %d: the gang did not form in time; slot given back", jid)
                return "timed-out"
            if state != "waiting":
                return state  # cancelled, failed
            self.stop.wait(every)

    def _report(self, jid: int, code: int, out: Path, logfile: Path, fail_url: str | None = None) -> str:
        tail = _tail(logfile)
        if code == 0 and out.exists():
            try:
                raw = json.loads(out.read_text())
                measured = raw.get("measured", raw)  # `pipeplan run` nests its figures under "measured"
                body = {"worker_id": self.worker_id, "iteration_time": measured["iteration_time"],
                        "bubble_ratio": measured.get("bubble_ratio"), "devices": measured.get("devices") or [],
                        "emulated": bool(raw.get("emulated", False)), "trace": _trace(out.parent), "raw": raw}
                r = self._request("POST", f"/jobs/{jid}/result", json=body, patient=True)
                if r.status_code in (200, 201):  # 200: a retried post whose first answer was lost
                    log.info("job %d: result posted (iteration %.4g s)", jid, measured["iteration_time"])
                    return "succeeded"
                if r.status_code == 409:
                    log.warning("job %d: result refused: %s", jid, r.text[:300])
                    return "lost"
                error = f"the API refused the result ({r.status_code}): {r.text[:1000]}"
            except (ValueError, KeyError, TypeError) as e:
                error = f"unreadable result file {out}: {type(e).__name__}: {e}"
        elif code == 0:
            error = f"the run exited 0 but wrote no result file ({out})"
        else:
            said = _said_error(tail)
            error = f"the run exited with code {code}" + (f": {said}" if said else "")
        r = self._request("POST", fail_url or f"/jobs/{jid}/fail", json={"worker_id": self.worker_id,
                                                                         "error": error, "log_tail": tail})
        log.warning("job %d failed: %s", jid, error)
        return "failed" if r.status_code == 200 else "lost"

    # ---- main loop -----------------------------------------------------------------------------------
    def serve(self, once: bool = False, max_jobs: int | None = None) -> int:
        """Claim and run jobs until stopped (``once``: at most one job, then return; also when none is
        queued). Returns the number of jobs run."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.register()
        hb = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        hb.start()
        ran = 0
        try:
            while not self.stop.is_set():
                claim = self.claim()
                if claim is None:
                    if once:
                        break
                    self.stop.wait(self.poll)
                    continue
                if self.run_job(claim) == "timed-out":
                    continue  # a slot given back before anything ran: claim again
                ran += 1
                if once or (max_jobs is not None and ran >= max_jobs):
                    break
        finally:
            self.stop.set()
            self.client.close()
        return ran


def run_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The run's environment: the agent's, without its secrets (``PIPEPLAN_*TOKEN*``, ``DATABASE_URL``)."""
    env = dict(os.environ if environ is None else environ)
    for k in list(env):
        if (k.startswith("PIPEPLAN_") and "TOKEN" in k) or k == "DATABASE_URL":
            del env[k]
    return env


@dataclass(frozen=True)
class Detected:
    """What ``nvidia-smi`` says this node has: the device type and GPU count an agent declares by default."""

    device_type: str
    gpus: int
    note: str


def detect_gpus(environ: dict[str, str] | None = None, timeout: float = 15.0) -> Detected:
    """This node's GPUs as ``nvidia-smi --query-gpu=name --format=csv,noheader`` lists them (one name a line):
    the first one's name -- what torch calls it too, e.g. ``NVIDIA H200``, which the API stores as the shipped
    description's name (:func:`api.gang.canonical_device`) -- and how many, or as many as ``CUDA_VISIBLE_DEVICES``
    leaves visible; ``cpu`` and 0 where there is no ``nvidia-smi``, it fails, lists none, or
    ``CUDA_VISIBLE_DEVICES`` is empty. The note says what was found, for the agent's log."""
    env = dict(os.environ if environ is None else environ)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return Detected("cpu", 0, f"no GPU found (nvidia-smi: {type(e).__name__}): a CPU agent")
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not names:
        return Detected("cpu", 0, f"no GPU found (nvidia-smi exited {out.returncode}, {len(names)} GPUs): a CPU agent")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    count = len(names)
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
        if count == 0:
            return Detected("cpu", 0, "CUDA_VISIBLE_DEVICES hides every GPU: a CPU agent")
    mixed = f"; the node mixes {sorted(set(names))}: declared as the first" if len(set(names)) > 1 else ""
    return Detected(names[0], count, f"{count} x {names[0]} (nvidia-smi){mixed}")


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The registration token: ``token_file``'s first line, else ``token``, else ``$PIPEPLAN_WORKER_TOKEN``."""
    if token_file:
        return Path(token_file).read_text().strip() or None
    return token or os.environ.get("PIPEPLAN_WORKER_TOKEN") or None


def _terminate(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def free_port() -> int:
    """A port free on this host now (the kernel's pick; offered for a rendezvous this agent may host)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _said_error(tail: str) -> str | None:
    """The last ``error: ...`` line ``pipeplan run`` printed (its refusal of the plan, or the failing rank and its
    error), so the job's error says why and not only the exit code; None when the log has none."""
    said = [line[len("error: "):].strip() for line in tail.splitlines() if line.startswith("error: ")]
    return said[-1][:1000] if said and said[-1] else None


def _tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def _trace(jobdir: Path) -> str | None:
    """The Chrome trace the run wrote (``--trace``), if any and not too large."""
    p = jobdir / "trace.json"
    try:
        if p.is_file() and p.stat().st_size <= TRACE_LIMIT:
            return p.read_text(errors="replace")
    except OSError:
        pass
    return None


def main(api: str, token: str, **kw: Any) -> int:
    once = kw.pop("once", False)
    agent = Agent(api, token, **kw)

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return agent.serve(once=once)
