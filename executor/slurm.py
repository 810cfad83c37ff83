"""Slurm: the batch script that runs one plan candidate on an allocation, and the ``sbatch`` / ``squeue`` /
``sacct`` / ``scancel`` driver that ``pipeplan agent --launcher slurm`` uses as its launcher.

The script (:func:`slurm_script`; also ``pipeplan export --format slurm``) asks for ``ceil(P / G)`` nodes --
P = t*D*W processes (one per device), G devices per node -- with one task per node. ``srun`` starts one
``pipeplan run`` per node, each with ``--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID`` and the same
``--rdzv-endpoint``: the rendezvous (:mod:`executor.launch`: global rank 0 serves it) on the first node of the
allocation (``scontrol show hostnames $SLURM_JOB_NODELIST``, first line; its ``NodeAddr``, which is the node
name on most clusters) at port ``20000 + SLURM_JOB_ID mod 20000`` unless given. This is the layout of
torchrun under Slurm in PyTorch's "Multinode training" tutorial and torchtitan's ``multinode_trainer.slurm``
(one launcher per node, the rendezvous on the head node). Every node runs ``P / nodes`` processes; the
run's result file is written by node rank 0 (``SLURM_NODEID`` 0, the first node), which hosts global rank 0,
so the job's directory must be on a file system all nodes share (as home and project directories are on
Slurm clusters).

The driver: :func:`submit` (``sbatch --parsable``), :func:`job_status` (``squeue`` while the controller
lists the job, then ``sacct``, then ``scontrol show job`` -- clusters without the accounting database have
no ``sacct``), :func:`cancel` (``scancel``). :class:`SlurmLauncher` puts them behind the agent's launcher
hook (:class:`executor.agent.Launcher`); a watcher process (``python -m executor.slurm watch FD JOBID``)
cancels the Slurm job when the agent dies, even by ``kill -9``, as :mod:`executor.runguard` does for local
runs: a job whose lease then runs out is run again elsewhere, never twice at once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.cluster import node_layout
from planner.limits import MAX_ITERATIONS, MAX_NODES

#: Slurm job states that end a job (squeue(1), "JOB STATE CODES"); COMPLETED is the only success
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                          "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
RDZV_PORT_BASE = 20000
log = logging.getLogger("pipeplan.agent")


class SlurmError(RuntimeError):
    """A Slurm command failed, or a plan cannot be laid out on the nodes asked for."""


@dataclass(frozen=True)
class SlurmOptions:
    """How jobs are laid out and submitted.

    ``gpus_per_node``: devices (processes) per node, G; a job of P processes asks for ceil(P/G) nodes.
    ``request_gpus``: add ``#SBATCH --gpus-per-node`` (P/nodes); off for CPU (gloo) nodes.
    ``nodes_max``: refuse jobs needing more nodes. ``extra``: more ``#SBATCH`` options, e.g. ``--qos=high``.
    """

    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 8
    request_gpus: bool = True
    nodes_max: int | None = None
    time_limit: str | None = None
    rdzv_port: int | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)


def candidate_processes(plan: dict[str, Any], candidate: int) -> int:
    """P = t * D * W, the processes (devices) candidate ``candidate`` of ``plan`` (``pipeplan plan --json``
    output, or a bare candidate) runs on."""
    from planner.runspec import RunSpec

    cands = plan["candidates"] if isinstance(plan, dict) and "candidates" in plan else [plan]
    if not 0 <= candidate < len(cands):
        raise SlurmError(f"candidate: the plan has {len(cands)} candidate(s) (0..{len(cands) - 1}), got {candidate}")
    c = RunSpec.from_document(cands[candidate]).config
    return c.tensor * c.pipeline * c.data


def nodes_needed(processes: int, gpus_per_node: int) -> int:
    """ceil(P / G): whole nodes of G devices for P processes."""
    if gpus_per_node < 1:
        raise SlurmError(f"gpus_per_node must be >= 1 (devices per node), got {gpus_per_node}")
    if processes < 1:
        raise SlurmError(f"the plan must need >= 1 process, got {processes}")
    return math.ceil(processes / gpus_per_node)


def layout(processes: int, options: SlurmOptions) -> tuple[int, int]:
    """(nodes, processes per node) for P processes (:func:`planner.cluster.node_layout`); a
    :class:`SlurmError` naming ``nodes-max`` when that is more (as the option is spelt: ``export --option
    nodes-max=N``, ``agent --nodes-max N``; the field's ``nodes_max`` is no option a user can give)."""
    nodes_needed(processes, options.gpus_per_node)  # (its errors, in Slurm's words)
    nodes, _ = node_layout(processes, options.gpus_per_node)
    if options.nodes_max is not None and nodes > options.nodes_max:
        raise SlurmError(f"the plan needs {processes} processes = {nodes} node(s) of at most "
                         f"{options.gpus_per_node} devices, more than nodes-max = {options.nodes_max}")
    return nodes, processes // nodes


#: sbatch's --time formats (sbatch(1), --time): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds
_SLURM_TIME = re.compile(r"^(?:[0-9]{1,9}-)?[0-9]{1,9}(?::[0-9]{1,9}){0,2}$")
SLURM_TIME_FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"


def time_limit_error(text: str) -> str | None:
    """Why ``text`` is not a time limit in one of the forms sbatch takes (:data:`SLURM_TIME_FORMATS`; the form
    only, as sbatch reads it: ASCII digits, a day count followed by hours), or None."""
    if _SLURM_TIME.match(text) or text.upper() in ("UNLIMITED", "INFINITE"):  # (Slurm's time_str2mins reads both)
        return None
    return f"a Slurm time limit, {SLURM_TIME_FORMATS} (sbatch --time), e.g. 01:00:00, got {text[:40]!r}"


_SBATCH_VALUE = re.compile(r"^[\w.,:=@%/+\-\[\]]+$")


def _sbatch_line(option: str, value: str | int) -> str:
    text = str(value)
    if not _SBATCH_VALUE.match(text):
        raise SlurmError(f"{option}: {text!r} is not a valid #SBATCH value (letters, digits and ._,:=@%/+-[] only)")
    return f"#SBATCH {option}={text}"


def slurm_script(run_command: Sequence[str], processes: int, options: SlurmOptions | None = None, *,
                 job_name: str = "pipeplan", workdir: str | Path | None = None,
                 output: str | Path | None = None, description: str | None = None) -> str:
    """The ``sbatch`` script that runs ``run_command`` (a ``pipeplan run --plan ...`` invocation without
    node options) on ``ceil(P/G)`` nodes: one task per node, c10d rendezvous on the first node."""
    options = options or SlurmOptions()
    nodes, per_node = layout(processes, options)
    lines = ["#!/bin/bash",
             f"# pipeplan: {description or 'a plan candidate'}",
             f"# {processes} process(es) on {nodes} node(s) x {per_node}: one `pipeplan run` per node (srun), "
             "c10d rendezvous on the first node",
             _sbatch_line("--job-name", job_name),
             _sbatch_line("--nodes", nodes),
             _sbatch_line("--ntasks-per-node", 1)]
    if options.request_gpus:
        lines.append(_sbatch_line("--gpus-per-node", per_node))
    else:  # CPU nodes (gloo): a core per process
        lines.append(_sbatch_line("--cpus-per-task", per_node))
    for opt, val in (("--partition", options.partition), ("--account", options.account),
                     ("--time", options.time_limit), ("--chdir", workdir), ("--output", output)):
        if val is not None:
            lines.append(_sbatch_line(opt, val))
    for extra in options.extra:
        opt, sep, val = extra.partition("=")
        if not opt.startswith("--") or not sep:
            raise SlurmError(f"sbatch option {extra!r}: give it as --name=value")
        lines.append(_sbatch_line(opt, val))
    port = (str(options.rdzv_port) if options.rdzv_port is not None
            else f"$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_BASE} ))")
    per_task = ('exec "$@" --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" '
                '--rdzv-endpoint "$PIPEPLAN_RDZV_ENDPOINT" --rdzv-id "slurm-$SLURM_JOB_ID"')
    lines += [
        "set -euo pipefail",
        "# the rendezvous: the first node of the allocation, at its address as Slurm knows it (NodeAddr);",
        "# no pipes into head (under pipefail a writer cut off by SIGPIPE would end the script)",
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "first=${nodes%%$'\\n'*}",
        'info=$(scontrol show node "$first" 2>/dev/null || true)',
        'addr=""',
        'if [[ $info =~ NodeAddr=([^[:space:]]+) ]]; then addr=${BASH_REMATCH[1]}; fi',
        f'export PIPEPLAN_RDZV_ENDPOINT="${{addr:-$first}}:{port}"',
        'echo "pipeplan: Slurm job $SLURM_JOB_ID, $SLURM_NNODES node(s) ($SLURM_JOB_NODELIST), '
        'rendezvous $PIPEPLAN_RDZV_ENDPOINT"',
        "# one task per node; each runs its node's share of the processes (P / nodes)",
        'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \\',
        f"    bash -c {shlex.quote(per_task)} pipeplan-run \\",
        f"    {shlex.join(run_command)}",
        ""]
    return "\n".join(lines)


#: ``pipeplan export --format slurm --option KEY=VALUE``: the keys and what they set
EXPORT_OPTIONS: dict[str, str] = {
    "partition": "#SBATCH --partition", "account": "#SBATCH --account", "time": "#SBATCH --time (e.g. 01:00:00)",
    "nodes-max": "refuse plans needing more nodes", "gpus": "yes (default: #SBATCH --gpus-per-node) or no (CPU nodes)",
    "backend": "pipeplan run --backend (default nccl with GPUs, gloo without)", "model": "pipeplan run --model",
    "iterations": "pipeplan run --iterations (default 10)", "out": "pipeplan run --out (default result.json)",
    "emulate": "pipeplan run --emulate PROFILE (emulated compute)", "run-command": "default: pipeplan run",
    "rdzv-port": "rendezvous port (default 20000 + job id mod 20000)",
}
_YES, _NO = ("yes", "true", "1", "on"), ("no", "false", "0", "off")


def export_script(plan_path: str | Path, candidate: int, *, gpus_per_node: int,
                  options: dict[str, str] | None = None) -> str:
    """The script of :func:`slurm_script` for a user who submits by hand (``pipeplan export --format
    slurm``): ``pipeplan run`` of candidate ``candidate`` of the plan file, settings from ``options``
    (:data:`EXPORT_OPTIONS`)."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(EXPORT_OPTIONS))
    if unknown:
        raise SlurmError(f"option {', '.join(unknown)}: not a slurm export option; known: {', '.join(EXPORT_OPTIONS)}")
    path = Path(plan_path).resolve()
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SlurmError(f"plan: cannot read {plan_path}: {e}") from None
    processes = candidate_processes(plan, candidate)
    gpus = opts.get("gpus", "yes").lower()
    if gpus not in _YES + _NO:
        raise SlurmError(f"option gpus: yes or no, got {opts['gpus']!r}")
    request_gpus = gpus in _YES

    def integer(key: str, most: int, what: str) -> int | None:
        if key not in opts:
            return None
        text = opts[key]
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text[:12]) <= most:
            raise SlurmError(f"option {key}: an integer from 1 to {most} ({what}), got {text[:40]!r}")
        return int(text)

    integer("iterations", MAX_ITERATIONS, "what a job may run: the API's JobCreate.iterations")
    # a time sbatch cannot read was written as #SBATCH --time=banana, refused only when the job was submitted
    if "time" in opts and (why := time_limit_error(opts["time"])) is not None:
        raise SlurmError(f"option time: {why}")
    backend = opts.get("backend", "nccl" if request_gpus else "gloo")
    if backend not in ("nccl", "gloo"):
        raise SlurmError(f"option backend: nccl or gloo (pipeplan run --backend), got {backend[:40]!r}")
    cmd = [*shlex.split(opts.get("run-command", "pipeplan run")), "--plan", str(path), "--candidate", str(candidate),
           "--iterations", opts.get("iterations", "10"), "--backend",
           backend, "--out", opts.get("out", "result.json")]
    if "model" in opts:
        cmd += ["--model", opts["model"]]
    if "emulate" in opts:
        cmd += ["--emulate", str(Path(opts["emulate"]).resolve())]
    sopts = SlurmOptions(partition=opts.get("partition"), account=opts.get("account"), gpus_per_node=gpus_per_node,
                         request_gpus=request_gpus, nodes_max=integer("nodes-max", MAX_NODES, "a cluster's nodes"),
                         time_limit=opts.get("time"), rdzv_port=integer("rdzv-port", 65535, "a TCP port"))
    name = re.sub(r"[^\w.-]", "_", f"pipeplan-{path.stem}-{candidate}")[:64]
    return slurm_script(cmd, processes, sopts, job_name=name, description=f"candidate {candidate} of {path}")


# ---- the driver ---------------------------------------------------------------------------------------

def _run(cmd: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: is Slurm installed on this machine (a login node)?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(cmd)} did not answer within {timeout:.0f} s") from None


def submit(script: Path, env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable SCRIPT``: the Slurm job id."""
    r = _run(["sbatch", "--parsable", str(script)], env=env)
    if r.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {(r.stderr or r.stdout).strip()[:2000]}")
    job_id = r.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
    return job_id


@dataclass(frozen=True)
class JobStatus:
    state: str  # Slurm's state (PENDING, RUNNING, COMPLETED, FAILED, ...), UNKNOWN when no command knows it
    exit_code: int | None = None  # once final: 0 only when COMPLETED
    source: str = ""  # the command that told

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


def _exit_code(state: str, text: str) -> int:
    """Slurm's ``code:signal`` as one status: 0 only for COMPLETED; a failed job's code, 128+signal, or 1."""
    code, _, sig = text.partition(":")
    c = int(code) if code.isdigit() else 0
    s = int(sig) if sig.isdigit() else 0
    if state == "COMPLETED":
        return c
    return c or (128 + s if s else 1)


def _optional(cmd: list[str]) -> subprocess.CompletedProcess[str] | None:
    """``cmd``'s answer, or None when the command is missing or does not answer (ask the next one)."""
    try:
        return _run(cmd)
    except SlurmError:
        return None


def job_status(job_id: str) -> JobStatus:
    """Where Slurm job ``job_id`` stands: ``squeue`` while the controller lists it, then ``sacct`` (the
    accounting database), then ``scontrol show job`` (the controller's memory, MinJobAge seconds)."""
    r = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    state = r.stdout.strip().splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else ""
    if state and state not in FINAL_STATES:
        return JobStatus(state, None, "squeue")
    r = _optional(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
    if r is not None and r.returncode == 0 and r.stdout.strip():
        st, _, code = r.stdout.strip().splitlines()[0].partition("|")
        st = st.split()[0] if st.split() else st  # "CANCELLED by 0"
        if st in FINAL_STATES:
            return JobStatus(st, _exit_code(st, code), "sacct")
        if st:
            return JobStatus(st, None, "sacct")
    r = _optional(["scontrol", "show", "job", "-o", job_id])
    m = re.search(r"\bJobState=(\S+)", r.stdout) if r is not None and r.returncode == 0 else None
    if m:
        st = m.group(1)
        code = re.search(r"\bExitCode=(\S+)", r.stdout)
        return JobStatus(st, _exit_code(st, code.group(1) if code else "") if st in FINAL_STATES else None,
                         "scontrol")
    if state:  # squeue said final but no command has its exit code
        return JobStatus(state, 0 if state == "COMPLETED" else 1, "squeue")
    return JobStatus("UNKNOWN", None, "")


def cancel(job_id: str) -> None:
    """``scancel JOBID`` (a job already ended is no error)."""
    r = _run(["scancel", job_id])
    if r.returncode != 0 and "already completing or completed" not in r.stderr and "Invalid job id" not in r.stderr:
        raise SlurmError(f"scancel {job_id}: {r.stderr.strip()[:500]}")


# ---- the agent's launcher -------------------------------------------------------------------------------

@dataclass
class SlurmRun:
    job_id: str
    watcher: subprocess.Popen[bytes] | None
    keep: int | None  # the write end of the watcher's pipe: closing it (the agent died) cancels the job
    status: JobStatus = field(default_factory=lambda: JobStatus("PENDING"))
    unknown_since: float | None = None


def _option(cmd: Sequence[str], name: str, default: str | None = None) -> str:
    """The value of option ``name`` in ``cmd`` (``--name value`` or ``--name=value``)."""
    for i, arg in enumerate(cmd):
        if arg == name and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    if default is None:
        raise SlurmError(f"the run command has no {name}: {shlex.join(cmd)}")
    return default


class SlurmLauncher:
    """The agent's launcher for a Slurm cluster: ``start`` writes ``job.sbatch`` into the job's directory
    and submits it, ``poll`` follows it (``None`` until it ends, then its exit status), ``cancel`` runs
    ``scancel`` when it has not ended (and stops the watcher either way)."""

    def __init__(self, options: SlurmOptions, env: dict[str, str] | None = None,
                 unknown_grace: float = 120.0) -> None:
        self.options = options
        self.env = env
        self.unknown_grace = unknown_grace  # a job no command knows for this long has failed

    def start(self, cmd: list[str], jobdir: Path, logfile: Path) -> SlurmRun:
        """Submit ``cmd`` (``pipeplan run --plan P --candidate I ...``: the processes it needs are read from
        the plan it names) as a batch job named after ``jobdir``."""
        from executor.agent import LaunchFailed

        try:
            if "--nnodes" in cmd or "--node-rank" in cmd:
                raise SlurmError("a Slurm agent runs whole jobs (its script gives each node its rank), not node "
                                 "slots of a gang")
            plan_path, candidate = _option(cmd, "--plan"), int(_option(cmd, "--candidate", "0"))
            processes = candidate_processes(json.loads(Path(plan_path).read_text()), candidate)
            script = slurm_script(cmd, processes, self.options, job_name=f"pipeplan-{jobdir.name}"[:64],
                                  workdir=jobdir, output=logfile,
                                  description=f"{jobdir.name}: candidate {candidate} of {plan_path}")
            path = jobdir / "job.sbatch"
            path.write_text(script)
            job_id = submit(path, env=self.env)
        except (SlurmError, OSError, ValueError) as e:
            raise LaunchFailed(f"slurm: {e}") from None
        (jobdir / "slurm-job-id").write_text(job_id + "\n")
        lifeline, keep = os.pipe()
        try:
            watcher = subprocess.Popen([sys.executable, "-m", "executor.slurm", "watch", str(lifeline), job_id],
                                       pass_fds=(lifeline,), start_new_session=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        except OSError:
            os.close(keep)
            watcher, keep = None, None
        finally:
            os.close(lifeline)
        return SlurmRun(job_id, watcher, keep)

    def poll(self, run: SlurmRun) -> int | None:
        try:
            run.status = job_status(run.job_id)
        except SlurmError:
            return None  # the controller is briefly unreachable: ask again next time
        if run.status.final:
            return run.status.exit_code
        if run.status.state == "UNKNOWN":
            run.unknown_since = run.unknown_since or time.monotonic()
            if time.monotonic() - run.unknown_since > self.unknown_grace:
                return 1
        else:
            run.unknown_since = None
        return None

    def cancel(self, run: SlurmRun) -> None:
        try:
            if not run.status.final:
                for attempt in range(3):
                    try:
                        cancel(run.job_id)
                        break
                    except SlurmError as e:  # the controller briefly unreachable: not a reason to stop the agent
                        log.warning("slurm job %s: %s%s", run.job_id, e, "; retrying" if attempt < 2 else "")
                        time.sleep(1.0)
        finally:
            if run.watcher is not None and run.watcher.poll() is None:
                run.watcher.terminate()
                run.watcher.wait(10)
            if run.keep is not None:
                os.close(run.keep)
                run.keep = None


def _watch(fd: int, job_id: str) -> None:
    """Block until ``fd`` reads end-of-file (the agent is gone), then cancel the Slurm job."""
    while True:
        try:
            if not os.read(fd, 1024):
                break
        except InterruptedError:
            continue
    try:
        cancel(job_id)
    except SlurmError:
        pass


if __name__ == "__main__":  # python -m executor.slurm watch FD JOBID
    if len(sys.argv) != 4 or sys.argv[1] != "watch":
        sys.exit("usage: python -m executor.slurm watch FD JOBID")
    _watch(int(sys.argv[2]), sys.argv[3])
