"""``pipeplan serve``, ``agent``, ``db-upgrade`` and ``seed`` (registered by pipeplan.cli)."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("db-upgrade")
    def db_upgrade_cmd(
        url: Annotated[str | None, typer.Option(help="database URL (default: $DATABASE_URL, else SQLite under "
                                                     "$PIPEPLAN_DATA_DIR)")] = None,
    ) -> None:
        """Upgrade the database schema to the latest migration."""
        from db.migrate import upgrade
        from db.session import database_url

        rev = upgrade(url)
        shown = database_url(url).split("@")[-1]
        typer.echo(f"database {shown} at revision {rev}")

    @app.command("seed")
    def seed_cmd(url: Annotated[str | None, typer.Option(help="database URL")] = None,
                 measure: Annotated[bool, typer.Option(
                     "--measure/--no-measure", help="also measure the local cluster (links, executor overhead) "
                     "and profile gpt-tiny on this CPU (seconds; once)")] = True,
                 ) -> None:
        """Store the example clusters, analytic profiles of a few presets and a gpt-tiny profile measured on
        this CPU (idempotent)."""
        from api.seed import seed

        t0 = time.perf_counter()
        out = seed(url, measure=measure, progress=lambda line: typer.echo(line, err=True))
        typer.echo(f"seeded in {time.perf_counter() - t0:.1f} s:", err=True)
        for kind, rows in out.items():
            for name, rid, created in rows:
                typer.echo(f"{kind[:-1]:8} {rid:4} {name}{'' if created else ' (already there)'}")

    @app.command("serve")
    def serve_cmd(
        host: Annotated[str, typer.Option()] = "127.0.0.1",
        port: Annotated[int, typer.Option()] = 8000,
        upgrade_db: Annotated[bool, typer.Option("--upgrade/--no-upgrade", help="migrate the database first")] = False,
        seed_db: Annotated[bool, typer.Option("--seed/--no-seed", help="store the example data first")] = False,
        agent: Annotated[bool, typer.Option("--agent/--no-agent", help="also run one local CPU agent")] = False,
        warm: Annotated[bool, typer.Option(
            "--warm/--no-warm", help="load transformers in the background once the API listens, so that the first "
            "POST /profiles/hf-config does not wait for it (seconds)")] = True,
        log_level: Annotated[str, typer.Option()] = "info",
    ) -> None:
        """Run the API with uvicorn (settings from PIPEPLAN_* and DATABASE_URL)."""
        import uvicorn

        busy = port_in_use(host, port)  # before the database upgrade and the seeding (a minute on a first start)
        if busy:
            typer.echo(f"error: port {port} on {host} is in use ({busy}); choose another port: "
                       f"`make serve PORT=8123` or `pipeplan serve --port 8123`", err=True)
            raise typer.Exit(2)
        if upgrade_db:
            db_upgrade_cmd(None)
        if seed_db:
            seed_cmd(None, True)
        base = f"http://{host}:{port}"
        typer.echo(f"pipeplan API on {base}  (OpenAPI: {base}/docs, metrics: {base}/metrics, health: {base}/health)")
        launcher = None
        if agent:
            token = os.environ.get("PIPEPLAN_WORKER_TOKEN") or os.environ.get("PIPEPLAN_ADMIN_TOKEN")
            if not token:
                typer.echo("error: --agent needs PIPEPLAN_WORKER_TOKEN (or PIPEPLAN_ADMIN_TOKEN)", err=True)
                raise typer.Exit(2)
            # the token goes by environment, never on the command line (``ps`` shows every argv)
            cmd = [sys.executable, "-m", "pipeplan.cli", "agent", "--api", base, "--name", f"local-cpu-{port}",
                   "--device-type", "cpu"]  # a CPU agent on a GPU machine too (not --device-type auto)
            typer.echo("local agent (started once the API listens): " + shlex.join(cmd))
            launcher = AgentLauncher(cmd, {**os.environ, "PIPEPLAN_WORKER_TOKEN": token},
                                     "127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port)
            launcher.start()
        if warm:
            HFWarmer("127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port).start()
        try:
            from api.accesslog import quiet_polls

            quiet_polls()  # the agents' successful claims, heartbeats and lease renewals stay out of the log
            if launcher is not None:
                stop_on_sigterm()
            uvicorn.run("api.main:app", host=host, port=port, log_level=log_level)
        finally:
            if launcher is not None:
                launcher.stop()

    @app.command("agent")
    def agent_cmd(
        api: Annotated[str, typer.Option(help="API base URL")] = "http://127.0.0.1:8000",
        token: Annotated[str | None, typer.Option(
            help="registration token (default $PIPEPLAN_WORKER_TOKEN; prefer the variable or --token-file: "
                 "a command line is visible to every user in `ps`)")] = None,
        token_file: Annotated[str | None, typer.Option(help="file holding the registration token")] = None,
        gpus: Annotated[int | None, typer.Option(help="GPUs on this node (a CPU agent: the gloo processes it "
                                                       "runs); > 0 also takes node slots of multi-node jobs "
                                                       "(default: what --device-type auto finds, else 0)")] = None,
        host: Annotated[str | None, typer.Option(help="address other nodes reach this one at (default: the "
                                                      "fully qualified host name)")] = None,
        name: Annotated[str | None, typer.Option(help="unique agent name (default host-pid)")] = None,
        node: Annotated[str | None, typer.Option(help="node name (default: host name)")] = None,
        device_type: Annotated[str, typer.Option(help="device type, the planner's name as in a cluster JSON's "
                                                      "'device' (e.g. A100-SXM4-80GB) or an alias ('NVIDIA H200', "
                                                      "torch's name); cpu: CPU and emulated plans only; auto: "
                                                      "this node's GPUs as nvidia-smi lists them, else cpu (with "
                                                      "--launcher slurm: cpu)")] = "auto",
        once: Annotated[bool, typer.Option(help="run at most one job, then exit (also when none is queued)")] = False,
        run_command: Annotated[str | None, typer.Option(
            help="executor command (default $PIPEPLAN_RUN_COMMAND, else 'pipeplan run')")] = None,
        workdir: Annotated[str | None, typer.Option(help="where plans, logs and results go")] = None,
        poll: Annotated[float, typer.Option(help="seconds between claims when the queue is empty")] = 2.0,
        heartbeat: Annotated[float, typer.Option(help="seconds between heartbeats")] = 10.0,
        launcher: Annotated[str, typer.Option(
            help="local (a subprocess on this node) or slurm (an sbatch job per claimed job; run this agent on "
                 "a login node)")] = "local",
        partition: Annotated[str | None, typer.Option(help="slurm: the partition (#SBATCH --partition)")] = None,
        account: Annotated[str | None, typer.Option(help="slurm: the account (#SBATCH --account)")] = None,
        nodes_max: Annotated[int | None, typer.Option(help="slurm: refuse jobs needing more nodes")] = None,
        gpus_per_node: Annotated[int, typer.Option(
            help="slurm: devices (processes) per node; a job of P = t*D*W processes gets ceil(P/G) nodes")] = 8,
        request_gpus: Annotated[bool, typer.Option(
            "--request-gpus/--no-request-gpus", help="slurm: ask for GPUs (#SBATCH --gpus-per-node); "
            "--no-request-gpus for CPU nodes (gloo)")] = True,
        time_limit: Annotated[str | None, typer.Option(help="slurm: #SBATCH --time, e.g. 01:00:00")] = None,
        sbatch_option: Annotated[list[str] | None, typer.Option(
            help="slurm: another #SBATCH option as --name=value (repeatable), e.g. --qos=high")] = None,
    ) -> None:
        """Register with the API, claim jobs and run them with the executor until stopped (Ctrl-C)."""
        from executor.agent import RegistrationFailed, main, read_token, run_environment

        token = read_token(token, token_file)
        if not token:
            typer.echo("error: set PIPEPLAN_WORKER_TOKEN (or give --token-file / --token)", err=True)
            raise typer.Exit(2)
        job_launcher = None
        if launcher == "slurm":
            from executor.slurm import SlurmLauncher, SlurmOptions, time_limit_error

            if time_limit is not None and (why := time_limit_error(time_limit)) is not None:
                typer.echo(f"error: --time-limit: {why}", err=True)  # (sbatch refused each job's script)
                raise typer.Exit(2)
            job_launcher = SlurmLauncher(SlurmOptions(
                partition=partition, account=account, gpus_per_node=gpus_per_node, request_gpus=request_gpus,
                nodes_max=nodes_max, time_limit=time_limit, extra=tuple(sbatch_option or ())), env=run_environment())
        elif launcher != "local":
            typer.echo(f"error: --launcher must be local or slurm, got {launcher!r}", err=True)
            raise typer.Exit(2)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        device_type, gpus = agent_device(device_type, gpus, launcher)
        start = time.monotonic()
        try:
            n = main(api, token, gpus=gpus, name=name, node=node, device_type=device_type, once=once,
                     run_command=shlex.split(run_command) if run_command else None, workdir=workdir, poll=poll,
                     heartbeat=heartbeat, host=host, launcher=job_launcher)
        except RegistrationFailed as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"agent: {n} job(s) in {time.monotonic() - start:.1f} s")


def agent_device(device_type: str, gpus: int | None, launcher: str) -> tuple[str, int]:
    """The device type and GPU count an agent declares: as given, except ``auto`` -- this node's GPUs
    (:func:`executor.agent.detect_gpus`: nvidia-smi's name of the first and their count; ``cpu`` and 0 without
    any), where ``--gpus`` not given takes the count found. With the Slurm launcher the agent runs on a login
    node whose GPUs, if any, are not the compute nodes': ``auto`` is ``cpu`` there, as before it existed."""
    if device_type != "auto":
        return device_type, gpus or 0
    if launcher == "slurm":
        return "cpu", gpus or 0
    from executor.agent import detect_gpus

    found = detect_gpus()
    logging.getLogger("pipeplan.agent").info("--device-type auto: %s", found.note)
    return found.device_type, found.gpus if gpus is None else gpus


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (the OS's words, e.g. "Address already in use"), else None.
    Bound as uvicorn binds (``SO_REUSEADDR``: a port left in TIME_WAIT by a stopped server is free) and
    released at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror}"
    family, kind, proto, _name, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            return e.strerror or str(e)
    return None


def wait_listening(addr: tuple[str, int], until: float, stopping: threading.Event | None = None) -> bool:
    """Wait until ``addr`` accepts connections (True) or the monotonic time ``until`` passes (False)."""
    while time.monotonic() < until and not (stopping is not None and stopping.is_set()):
        try:
            socket.create_connection(addr, timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


class HFWarmer(threading.Thread):
    """Loads what ``POST /profiles/hf-config`` needs -- ``transformers`` (which imports torch) and each supported
    model type's configuration class (:func:`profiler.hf_config.warm`) -- once the API listens, so that readiness
    is not delayed and the first request does not wait for the import (measured on the 2-core machine: 15 s
    for the first request before, 0.2 s after; README). A request that comes during the warm-up waits for the
    import in progress (Python's import lock), no longer than it would have."""

    def __init__(self, host: str, port: int, wait: float = 120.0) -> None:
        super().__init__(name="hf-warm-up", daemon=True)
        self.addr, self.wait = (host, port), wait

    def run(self) -> None:
        if not wait_listening(self.addr, time.monotonic() + self.wait):
            return
        log = logging.getLogger("pipeplan.warm")
        t0 = time.perf_counter()
        try:
            from profiler.hf_config import warm

            warm()
        except Exception as e:  # noqa: BLE001 - a warm-up must never take the server down
            log.warning("warm-up of transformers failed (the first hf-config request will load it): %s", e)
            return
        log.info("transformers loaded for /profiles/hf-config in %.1f s (background warm-up)",
                    time.perf_counter() - t0)


def stop_on_sigterm() -> None:
    """Make SIGTERM end ``serve`` by ``SystemExit``, so that its ``finally`` stops the local agent. uvicorn
    shuts down gracefully on SIGTERM and then raises the signal again under the handler that was there before
    it ran (``Server.capture_signals``): with the default one the process died right there, and the agent
    ``make serve`` started lived on, retrying a server that was gone (a new user's ``kill``; Docker and
    systemd stop a service by SIGTERM to its main process)."""

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


class AgentLauncher(threading.Thread):
    """Starts ``serve --agent``'s local agent once the API accepts connections on ``host:port`` (else the
    agent's first registrations fail with "connection refused" warnings a newcomer takes for an error), or
    after ``wait`` seconds in any case (the agent retries); :meth:`stop` ends it with the server."""

    def __init__(self, cmd: list[str], env: dict[str, str], host: str, port: int, wait: float = 120.0) -> None:
        super().__init__(name="agent-launcher", daemon=True)
        self.cmd, self.env, self.addr, self.wait = cmd, env, (host, port), wait
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        end = time.monotonic() + self.wait
        while not self._stopping.is_set() and time.monotonic() < end:
            try:
                socket.create_connection(self.addr, timeout=1).close()
                break
            except OSError:
                self._stopping.wait(0.2)
        with self._lock:
            if not self._stopping.is_set():
                self.proc = subprocess.Popen(self.cmd, env=self.env)

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            proc = self.proc
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

