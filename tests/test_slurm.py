"""The Slurm launcher (:mod:`executor.slurm`): the batch script, the squeue/sacct/scontrol driver, and -- where
Slurm runs (``PIPEPLAN_TEST_SLURM``, set by CI from ``.ci/slurm.sh``) -- a job through ``pipeplan agent
--launcher slurm`` end to end.

The script is tested by running it: bash executes it with stand-ins for ``scontrol`` and ``srun`` on PATH
(``srun`` starts the per-node command once per "node" with that node's ``SLURM_NODEID``), so the node
options every ``pipeplan run`` receives are the ones bash really builds, quoting included.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from api_support import AUTH, LiveServer, start_agent, tiny_cluster, tiny_profile, wait_for

from executor.slurm import (
    JobStatus,
    SlurmError,
    SlurmOptions,
    _exit_code,
    candidate_processes,
    job_status,
    layout,
    nodes_needed,
    slurm_script,
)
from planner.cluster import Cluster
from planner.profile import ModelProfile
from planner.request import TrainingRequest
from planner.search import plan

SLURM_ENV = "PIPEPLAN_TEST_SLURM"


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


# ---- layout --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,g,n", [(1, 8, 1), (8, 8, 1), (9, 8, 2), (16, 8, 2), (64, 8, 8), (3, 1, 3)])
def test_nodes_needed_is_ceil(p: int, g: int, n: int) -> None:
    assert nodes_needed(p, g) == n


def test_layout_refusals_name_the_rule() -> None:
    with pytest.raises(SlurmError, match="nodes-max = 2"):
        layout(24, SlurmOptions(gpus_per_node=8, nodes_max=2))
    with pytest.raises(SlurmError, match="gpus_per_node must be >= 1"):
        layout(4, SlurmOptions(gpus_per_node=0))
    assert layout(12, SlurmOptions(gpus_per_node=8)) == (2, 6)


@pytest.mark.parametrize("p,g,layout_", [(9, 8, (3, 3)), (6, 4, (2, 3)), (5, 4, (5, 1)), (16, 8, (2, 8))])
def test_layout_fewest_nodes_over_which_p_divides(p: int, g: int, layout_: tuple[int, int]) -> None:
    """The same rule as the gang placement: ``pipeplan run`` starts the same number on every node."""
    assert layout(p, SlurmOptions(gpus_per_node=g)) == layout_


def test_candidate_processes_is_t_d_w_of_the_planned_candidate() -> None:
    prof = ModelProfile.model_validate(tiny_profile())
    res = plan(prof, Cluster.model_validate(tiny_cluster(4, nodes=2)), TrainingRequest(global_batch=32, top=5))
    doc = res.to_dict()
    for i, c in enumerate(doc["candidates"]):
        assert candidate_processes(doc, i) == c["tensor"] * c["pipeline"] * c["data"]
    assert candidate_processes(doc["candidates"][0], 0) == candidate_processes(doc, 0)  # a bare candidate
    with pytest.raises(SlurmError, match="candidate"):
        candidate_processes(doc, len(doc["candidates"]))


# ---- the script ----------------------------------------------------------------------------------------

def test_script_header() -> None:
    s = slurm_script(["pipeplan", "run", "--plan", "p.json"], 16, SlurmOptions(
        partition="gpu", account="proj1", time_limit="01:00:00", extra=("--qos=high",)), job_name="pp-7",
        workdir="/scratch/j7", output="/scratch/j7/run.log")
    sb = [ln for ln in s.splitlines() if ln.startswith("#SBATCH")]
    assert sb == ["#SBATCH --job-name=pp-7", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                  "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --account=proj1",
                  "#SBATCH --time=01:00:00", "#SBATCH --chdir=/scratch/j7", "#SBATCH --output=/scratch/j7/run.log",
                  "#SBATCH --qos=high"]
    cpu = slurm_script(["x"], 4, SlurmOptions(gpus_per_node=2, request_gpus=False))
    assert "--gpus-per-node" not in cpu and "#SBATCH --nodes=2\n" in cpu and "#SBATCH --cpus-per-task=2\n" in cpu
    with pytest.raises(SlurmError, match="--partition"):
        slurm_script(["x"], 1, SlurmOptions(partition="gpu\nrm -rf /"))
    with pytest.raises(SlurmError, match="--name=value"):
        slurm_script(["x"], 1, SlurmOptions(extra=("qos high",)))


@pytest.mark.parametrize("nodes,addr", [(2, "10.0.0.7"), (1, ""), (3, "10.0.0.7")])
def test_script_runs_one_command_per_node_with_the_rendezvous_of_the_first(tmp_path: Path, nodes: int,
                                                                           addr: str) -> None:
    """bash runs the script with stand-ins for scontrol and srun; each per-node command records its argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    names = " ".join(f"gpu-{i:02d}" for i in range(nodes))
    _exe(bindir / "scontrol", f"""#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then for n in {names}; do echo $n; done; exit 0; fi
if [ "$1 $2" = "show node" ]; then echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr={addr} NodeHostName=$3"; exit 0; fi
exit 1
""")
    _exe(bindir / "srun", """#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done   # srun's own options
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" || exit $?; done
""")
    rec = _exe(tmp_path / "record.py", "import json, os, sys\n"
               "open(os.environ['REC'] + '.' + os.environ['SLURM_NODEID'], 'w').write(json.dumps(sys.argv[1:]))\n")
    plan_path = tmp_path / "a plan 'quoted'.json"  # a path bash must keep as one argument
    script = slurm_script([sys.executable, str(rec), "--plan", str(plan_path), "--model", "gpt-tiny"], 8 * nodes,
                          SlurmOptions(gpus_per_node=8))
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "123456",
           "SLURM_NNODES": str(nodes), "SLURM_JOB_NODELIST": f"gpu-[00-{nodes - 1:02d}]",
           "REC": str(tmp_path / "argv")}
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    endpoint = f"{addr or 'gpu-00'}:{20000 + 123456 % 20000}"
    assert f"rendezvous {endpoint}" in r.stdout
    for i in range(nodes):
        argv = json.loads((tmp_path / f"argv.{i}").read_text())
        assert argv == ["--plan", str(plan_path), "--model", "gpt-tiny", "--nnodes", str(nodes), "--node-rank", str(i),
                        "--rdzv-endpoint", endpoint, "--rdzv-id", "slurm-123456"]
    assert not (tmp_path / f"argv.{nodes}").exists()


# ---- the driver: squeue, then sacct, then scontrol --------------------------------------------------------

def _fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squeue: str, sacct: str, scontrol: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in (("squeue", squeue), ("sacct", sacct), ("scontrol", scontrol)):
        _exe(bindir / name, "#!/bin/bash\n" + body + "\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_status_from_squeue_while_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_slurm(tmp_path, monkeypatch, "echo RUNNING", "exit 1", "exit 1")
    assert job_status("5") == JobStatus("RUNNING", None, "squeue")


def test_status_from_sacct_once_gone_from_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_slurm(tmp_path, monkeypatch, "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
                "echo 'FAILED|2:0'", "exit 1")
    assert job_status("5") == JobStatus("FAILED", 2, "sacct")


def test_status_from_scontrol_without_accounting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_slurm(tmp_path, monkeypatch, "exit 0", "echo 'Slurm accounting storage is disabled' >&2; exit 1",
                "echo 'JobId=5 JobName=x JobState=CANCELLED Reason=None ExitCode=0:15 RunTime=00:00:03'")
    s = job_status("5")
    assert s.state == "CANCELLED" and s.final and s.exit_code == 128 + 15 and s.source == "scontrol"


def test_status_unknown_when_nobody_knows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_slurm(tmp_path, monkeypatch, "exit 1", "exit 1", "exit 1")
    assert job_status("5").state == "UNKNOWN" and not job_status("5").final


def test_exit_codes() -> None:
    assert _exit_code("COMPLETED", "0:0") == 0
    assert _exit_code("FAILED", "3:0") == 3
    assert _exit_code("TIMEOUT", "0:0") == 1
    assert _exit_code("CANCELLED", "0:9") == 137


# ---- the launcher against stand-ins for sbatch, squeue, scontrol and scancel ------------------------------

def test_launcher_submits_follows_and_cancels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.agent import LaunchFailed
    from executor.slurm import SlurmLauncher

    state = tmp_path / "state"
    state.write_text("RUNNING")
    cancelled = tmp_path / "cancelled"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "sbatch", f'#!/bin/bash\ncp "$2" {tmp_path}/submitted.sbatch; echo "4242;cluster"\n')
    _exe(bindir / "squeue", f"#!/bin/bash\ncat {state}\n")
    _exe(bindir / "sacct", "#!/bin/bash\nexit 1\n")
    _exe(bindir / "scontrol", "#!/bin/bash\necho 'JobId=4242 JobState=FAILED ExitCode=7:0'\n")
    _exe(bindir / "scancel", f"#!/bin/bash\necho $1 >> {cancelled}\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    path, doc = _plan_file(tmp_path)
    widest = max(range(len(doc["candidates"])), key=lambda k: candidate_processes(doc, k))
    p = candidate_processes(doc, widest)
    jobdir = tmp_path / "job-3-attempt-1"
    jobdir.mkdir()
    launcher = SlurmLauncher(SlurmOptions(gpus_per_node=1, request_gpus=False))
    cmd = ["pipeplan", "run", "--plan", str(path), "--candidate", str(widest), "--out", str(jobdir / "result.json")]
    run = launcher.start(cmd, jobdir, jobdir / "run.log")
    assert run.job_id == "4242" and (jobdir / "slurm-job-id").read_text() == "4242\n"
    script = (tmp_path / "submitted.sbatch").read_text()
    assert f"#SBATCH --nodes={p}\n" in script and "#SBATCH --job-name=pipeplan-job-3-attempt-1\n" in script
    assert f"#SBATCH --output={jobdir / 'run.log'}\n" in script
    assert launcher.poll(run) is None  # RUNNING
    state.write_text("")  # gone from squeue: scontrol says FAILED, exit 7
    assert launcher.poll(run) == 7
    launcher.cancel(run)  # ended: no scancel; the watcher is stopped without cancelling
    assert not cancelled.exists()
    # a run still going is scancelled
    state.write_text("PENDING")
    run2 = launcher.start(cmd, jobdir, jobdir / "run.log")
    assert launcher.poll(run2) is None
    launcher.cancel(run2)
    assert cancelled.read_text() == "4242\n"
    # the agent gone (its end of the watcher's pipe closed, as by kill -9): the watcher scancels
    cancelled.unlink()
    run3 = launcher.start(cmd, jobdir, jobdir / "run.log")
    assert run3.keep is not None and run3.watcher is not None
    os.close(run3.keep)
    run3.keep = None
    run3.watcher.wait(30)
    assert cancelled.read_text() == "4242\n"
    # node slots of a gang are not for a Slurm agent; a command without --plan cannot be laid out
    with pytest.raises(LaunchFailed, match="whole jobs"):
        launcher.start([*cmd, "--nnodes", "2", "--node-rank", "1"], jobdir, jobdir / "run.log")
    with pytest.raises(LaunchFailed, match="no --plan"):
        launcher.start(["pipeplan", "run"], jobdir, jobdir / "run.log")


def test_sbatch_refusal_is_a_launch_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.agent import LaunchFailed
    from executor.slurm import SlurmLauncher

    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "sbatch", "#!/bin/bash\necho 'sbatch: error: invalid partition specified: nope' >&2; exit 1\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    path, _ = _plan_file(tmp_path)
    with pytest.raises(LaunchFailed, match="invalid partition specified: nope"):
        SlurmLauncher(SlurmOptions(partition="nope")).start(["pipeplan", "run", "--plan", str(path)], tmp_path,
                                                            tmp_path / "run.log")


# ---- end to end through Slurm (CI) -----------------------------------------------------------------------

def _slurm_partition() -> tuple[str | None, int]:
    """(partition or None for the default, nodes in service in it); skips without PIPEPLAN_TEST_SLURM."""
    value = os.environ.get(SLURM_ENV)
    if not value:
        pytest.skip(f"Slurm tests skipped: {SLURM_ENV} is not set (CI sets it from .ci/slurm.sh; locally, as "
                    f"root: export {SLURM_ENV}=$(bash .ci/slurm.sh))")
    if shutil.which("sinfo") is None:
        pytest.fail(f"{SLURM_ENV} is set but sinfo is not on PATH")
    part = None if value == "1" else value
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t", *(["-p", part] if part else [])], capture_output=True,
                       text=True, timeout=30)
    usable = [ln for ln in r.stdout.splitlines() if ln.split()[-1:] and ln.split()[-1] in
              ("idle", "alloc", "mix", "comp")]  # a job of the test before may still be completing
    assert r.returncode == 0 and usable, f"no Slurm node in service: {r.stdout} {r.stderr}"
    return part, len(usable)


@pytest.fixture
def slurm_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    from db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'pipeplan.db'}"
    upgrade(url)
    srv = LiveServer(url, tmp_path, PIPEPLAN_LEASE_SECONDS="3").start()  # renewed (and polled) every second
    try:
        yield srv
    finally:
        srv.stop()


def _plan_of_two(c) -> dict:  # type: ignore[no-untyped-def]
    """A done plan of 2 devices (the two Slurm "nodes" of one device each)."""
    p = c.post("/profiles", json=tiny_profile(), headers=AUTH).json()
    cl = c.post("/clusters", json=tiny_cluster(2), headers=AUTH).json()
    r = c.post("/plans", json={"profile_id": p["id"], "cluster_id": cl["id"], "global_batch": 8, "gpus": 2, "top": 5})
    plan_ = r.json()
    plan_ = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
        c.get(f"/plans/{plan_['id']}").json()), what="plan done")
    assert plan_["status"] == "done", plan_
    return plan_


def _slurm_agent(url: str, workdir: Path, nodes: int, part: str | None, run_command: str,
                 *extra: str):  # type: ignore[no-untyped-def]
    return start_agent(url, workdir, "slurm-login", None, "--launcher", "slurm", "--gpus-per-node",
                       str(2 // nodes), "--no-request-gpus", "--nodes-max", "2",
                       *(["--partition", part] if part else []), *extra, run_command=run_command)


def _scontrol_state(job_id: str) -> str:
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    return next((f.split("=", 1)[1] for f in r.stdout.split() if f.startswith("JobState=")), "")


@pytest.mark.slow
def test_slurm_agent_runs_a_job_to_done_with_measured_figures(slurm_server: LiveServer, tmp_path: Path) -> None:
    part, up = _slurm_partition()
    nodes = min(2, up)
    with slurm_server.client() as c:
        plan_ = _plan_of_two(c)
        idx = next((i for i, x in enumerate(plan_["candidates"]) if x["pipeline"] == 2), 0)
        job = c.post("/jobs", json={"plan_id": plan_["id"], "candidate_index": idx, "model": "gpt-tiny",
                                    "iterations": 2, "emulate": True}).json()
        start = time.monotonic()
        agent = _slurm_agent(slurm_server.url, tmp_path / "agent", nodes, part, f"{sys.executable} -m pipeplan.cli run",
                             "--once")
        jobdir = tmp_path / "agent" / f"job-{job['id']}-attempt-1"
        try:
            assert agent.wait(300) == 0, (tmp_path / "agent" / "agent.log").read_text()
        finally:
            if agent.poll() is None:
                agent.kill()
        elapsed = time.monotonic() - start
        j = c.get(f"/jobs/{job['id']}").json()
        log = (jobdir / "run.log").read_text() if (jobdir / "run.log").exists() else ""
        assert j["state"] == "succeeded", (j, log, (tmp_path / "agent" / "agent.log").read_text())
        res = c.get(f"/jobs/{job['id']}/result").json()
        assert res["iteration_time"] > 0 and res["raw"]["emulated"] is True
        assert len(res["devices"]) == plan_["candidates"][idx]["pipeline"]
        # it ran as a Slurm job of `nodes` nodes, one `pipeplan run` per node
        script = (jobdir / "job.sbatch").read_text()
        assert f"#SBATCH --nodes={nodes}" in script
        assert f"{nodes} node(s)" in log, log
        if nodes == 2:  # two `pipeplan run`s, one of them on the node without global rank 0
            assert "global rank 0 ran on another node" in log, log
        slurm_id = (jobdir / "slurm-job-id").read_text().strip()
        assert _scontrol_state(slurm_id) in ("COMPLETED", "")  # "" once the controller forgot it
        r = subprocess.run(["scontrol", "show", "job", "-o", slurm_id], capture_output=True, text=True, timeout=30)
        run_time = next((f.split("=", 1)[1] for f in r.stdout.split() if f.startswith("RunTime=")), "?")
        print(f"\nslurm job {slurm_id}: {nodes} node(s); agent started to job succeeded {elapsed:.1f} s, of which "
              f"the Slurm job ran {run_time}; iteration {res['iteration_time'] * 1e3:.2f} ms")


@pytest.mark.slow
def test_slurm_job_cancelled_through_the_api_is_scancelled(slurm_server: LiveServer, tmp_path: Path) -> None:
    part, up = _slurm_partition()
    with slurm_server.client() as c:
        plan_ = _plan_of_two(c)
        job = c.post("/jobs", json={"plan_id": plan_["id"], "model": "gpt-tiny", "iterations": 1}).json()
        sleeper = f"{sys.executable} -c 'import time; time.sleep(300)'"
        agent = _slurm_agent(slurm_server.url, tmp_path / "agent", min(2, up), part, sleeper, "--once")
        idfile = tmp_path / "agent" / f"job-{job['id']}-attempt-1" / "slurm-job-id"
        try:
            wait_for(idfile.exists, timeout=60, what="submitted")
            slurm_id = idfile.read_text().strip()
            wait_for(lambda: _scontrol_state(slurm_id) == "RUNNING", timeout=60, what="slurm job running")
            assert c.post(f"/jobs/{job['id']}/cancel").status_code == 200
            assert agent.wait(60) == 0, (tmp_path / "agent" / "agent.log").read_text()
        finally:
            if agent.poll() is None:
                agent.kill()
        wait_for(lambda: _scontrol_state(slurm_id) in ("CANCELLED", ""), timeout=30, what="slurm job cancelled")
        assert c.get(f"/jobs/{job['id']}").json()["state"] == "cancelled"


@pytest.mark.slow
def test_slurm_job_dies_with_its_agent(slurm_server: LiveServer, tmp_path: Path) -> None:
    """kill -9 of the agent: its watcher cancels the Slurm job (the lease then runs out and the job is queued
    again, never running twice at once)."""
    part, up = _slurm_partition()
    with slurm_server.client() as c:
        plan_ = _plan_of_two(c)
        job = c.post("/jobs", json={"plan_id": plan_["id"], "model": "gpt-tiny", "iterations": 1}).json()
        sleeper = f"{sys.executable} -c 'import time; time.sleep(300)'"
        agent = _slurm_agent(slurm_server.url, tmp_path / "agent", min(2, up), part, sleeper)
        idfile = tmp_path / "agent" / f"job-{job['id']}-attempt-1" / "slurm-job-id"
        try:
            wait_for(idfile.exists, timeout=60, what="submitted")
            slurm_id = idfile.read_text().strip()
            wait_for(lambda: _scontrol_state(slurm_id) == "RUNNING", timeout=60, what="slurm job running")
        finally:
            agent.kill()
            agent.wait(10)
        wait_for(lambda: _scontrol_state(slurm_id) in ("CANCELLED", ""), timeout=30, what="slurm job cancelled")
        wait_for(lambda: c.get(f"/jobs/{job['id']}").json()["state"] == "queued", timeout=30, what="requeued")



# ---- pipeplan export --format slurm ----------------------------------------------------------------------

def _plan_file(tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[type-arg]
    prof = ModelProfile.model_validate(tiny_profile())
    cluster = Cluster.model_validate(tiny_cluster(4, nodes=4))
    doc = plan(prof, cluster, TrainingRequest(global_batch=32, top=5)).to_dict()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path, doc


def _export(*args: str):  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from pipeplan.cli import app

    return CliRunner().invoke(app, ["export", *args])


def test_export_prints_the_script_of_the_candidate(tmp_path: Path) -> None:
    path, doc = _plan_file(tmp_path)
    i = max(range(len(doc["candidates"])), key=lambda k: candidate_processes(doc, k))  # the widest
    p = candidate_processes(doc, i)
    res = _export("--plan", str(path), "--candidate", str(i), "--format", "slurm", "--gpus-per-node", "2",
                  "--option", "partition=gpu", "--option", "account=proj1", "--option", "model=gpt-tiny")
    assert res.exit_code == 0, res.output
    nodes = -(-p // 2)
    assert f"#SBATCH --nodes={nodes}\n" in res.stdout and f"#SBATCH --gpus-per-node={p // nodes}\n" in res.stdout
    assert "#SBATCH --partition=gpu\n" in res.stdout and "#SBATCH --account=proj1\n" in res.stdout
    run_line = res.stdout.rstrip().splitlines()[-1].split()
    assert run_line[:2] == ["pipeplan", "run"] and run_line[run_line.index("--plan") + 1] == str(path.resolve())
    assert run_line[run_line.index("--candidate") + 1] == str(i) and run_line[run_line.index("--backend") + 1] == "nccl"
    # the same script as the one built from the library (what the agent submits, given the same command)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(tiny_cluster(2)))
    again = _export("--plan", str(path), "--candidate", str(i), "--format", "slurm", "--cluster", str(cluster),
                    "--option", "partition=gpu", "--option", "account=proj1", "--option", "model=gpt-tiny")
    assert again.stdout == res.stdout


@pytest.mark.parametrize("args,message", [
    (["--gpus-per-node", "2", "--option", "colour=blue"], "option colour: not a slurm export option"),
    (["--gpus-per-node", "2", "--option", "partition"], "is not KEY=VALUE"),
    ([], "needs --gpus-per-node G or --cluster"),
    (["--gpus-per-node", "2", "--candidate", "99"], "candidate"),
    # the option as it is spelt (it said nodes_max = 1, which is no option)
    (["--gpus-per-node", "1", "--option", "nodes-max=1"], "more than nodes-max = 1"),
    # a time sbatch does not read was written as #SBATCH --time=banana
    (["--gpus-per-node", "2", "--option", "time=banana"], "option time: a Slurm time limit, minutes, MM:SS"),
    (["--gpus-per-node", "2", "--option", "time=1:2:3:4"], "option time: a Slurm time limit"),
    (["--gpus-per-node", "2", "--option", "time=1-"], "option time: a Slurm time limit"),
    (["--gpus-per-node", "2", "--option", "time=-1"], "option time: a Slurm time limit"),
    (["--gpus-per-node", "2", "--option", "time=01:00:00 "], "option time: a Slurm time limit"),
    # `out=` wrote --out '' into the script (the run refuses it at the job's start); a key twice kept the last
    (["--gpus-per-node", "2", "--option", "out="], "--option: out has no value"),
    (["--gpus-per-node", "2", "--option", "partition=x", "--option", "partition=y"],
     "--option: partition is given twice ('x' and 'y')"),
])
def test_export_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    path, doc = _plan_file(tmp_path)
    widest = max(range(len(doc["candidates"])), key=lambda k: candidate_processes(doc, k))
    assert candidate_processes(doc, widest) > 1
    if "--candidate" not in args:
        args = [*args, "--candidate", str(widest)]
    res = _export("--plan", str(path), "--format", "slurm", *args)
    assert res.exit_code == 2 and message in res.output, res.output


@pytest.mark.parametrize("value", ["30", "30:00", "01:00:00", "2-12", "2-12:30", "2-12:30:15", "0"])
def test_export_takes_every_slurm_time_format(tmp_path: Path, value: str) -> None:
    """sbatch(1) --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS are written as given."""
    path, _ = _plan_file(tmp_path)
    res = _export("--plan", str(path), "--format", "slurm", "--gpus-per-node", "2", "--option", f"time={value}",
                  "--option", "model=gpt-tiny")
    assert res.exit_code == 0 and f"#SBATCH --time={value}\n" in res.stdout, res.output


def test_export_slurm_needs_a_plan() -> None:
    res = _export("--schedule", "1f1b", "-D", "2", "-N", "4", "--format", "slurm")
    assert res.exit_code == 2 and "--format slurm exports a --plan candidate" in res.output


@pytest.mark.slow
def test_job_sbatch_refuses_fails_naming_the_reason(slurm_server: LiveServer, tmp_path: Path) -> None:
    """No Slurm needed: a stand-in sbatch refuses; the agent fails the job with sbatch's message and goes on."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "sbatch", "#!/bin/bash\necho 'sbatch: error: invalid account or account/partition combination "
                            "specified' >&2; exit 1\n")
    with slurm_server.client() as c:
        plan_ = _plan_of_two(c)
        job = c.post("/jobs", json={"plan_id": plan_["id"], "model": "gpt-tiny", "iterations": 1}).json()
        agent = start_agent(slurm_server.url, tmp_path / "agent", "slurm-login",
                            {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, "--launcher", "slurm",
                            "--gpus-per-node", "1", "--account", "nobody", "--once",
                            run_command=f"{sys.executable} -m pipeplan.cli run")
        try:
            assert agent.wait(120) == 0, (tmp_path / "agent" / "agent.log").read_text()
        finally:
            if agent.poll() is None:
                agent.kill()
        j = c.get(f"/jobs/{job['id']}").json()
        assert j["state"] == "failed" and "invalid account" in j["error"] and j["error"].startswith("slurm: "), j


def test_status_without_sacct_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster with squeue and scontrol but no sacct binary: the job's end is still seen."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "squeue", "#!/bin/bash\nexit 1\n")
    _exe(bindir / "scontrol", "#!/bin/bash\necho 'JobId=5 JobState=COMPLETED ExitCode=0:0'\n")
    monkeypatch.setenv("PATH", str(bindir))  # nothing else: no sacct anywhere
    assert job_status("5") == JobStatus("COMPLETED", 0, "scontrol")


def test_export_refuses_a_model_the_partition_does_not_cover(tmp_path: Path) -> None:
    """The README's `--option model=gpt2-medium` (26 layers) for a plan of gpt-tiny's 6 wrote a script whose
    `pipeplan run` failed at the job's start ("partition does not cover the model"); export now refuses it, naming
    the presets of the plan's layer count, and checks pipeplan run's default model (gpt-tiny) the same way."""
    path, doc = _plan_file(tmp_path)
    i = next(k for k, c in enumerate(doc["candidates"]) if c["run_spec"]["partition"])
    args = ["--plan", str(path), "--candidate", str(i), "--format", "slurm", "--gpus-per-node", "2"]
    res = _export(*args, "--option", "model=gpt2-medium")
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr.strip() == (
        f"error: --option model=gpt2-medium: 26 layers (24 blocks, the embedding and the head), but candidate {i} "
        f"of {path} partitions 6 layers: the job would fail at its start; give --option model=NAME of the model the "
        "plan was made for (of 6 layers: bert-tiny, gpt-tiny)")
    res = _export(*args, "--option", "model=nope")
    assert res.exit_code == 2 and "--option model=nope: unknown model 'nope'" in res.stderr, res.output
    assert _export(*args).exit_code == 0  # run's default, gpt-tiny: 6 layers
    big = json.loads(path.read_text())
    big["candidates"][i]["run_spec"]["partition"][-1][1] = 26  # as a plan of gpt2-medium partitions it
    path.write_text(json.dumps(big))
    res = _export(*args)
    assert res.exit_code == 2 and "pipeplan run's default model gpt-tiny (no --option model): 6 layers" in res.stderr
    assert "(of 26 layers: gpt2-medium)" in res.stderr
    assert _export(*args, "--option", "model=gpt2-medium").exit_code == 0


def test_export_for_a_cpu_cluster_runs_gloo_without_gpus(tmp_path: Path) -> None:
    """A plan on a cluster of CPU devices (examples/clusters/local-cpu-4.json) exported with its --cluster wrote
    `#SBATCH --gpus-per-node=4` and `pipeplan run --backend nccl`, which needs GPUs; CPU devices now default to
    gpus=no: no GPU request and gloo. --option gpus=yes still asks for GPUs."""
    path, doc = _plan_file(tmp_path)
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({**tiny_cluster(2), "device": "cpu"}))
    args = ["--plan", str(path), "--format", "slurm", "--cluster", str(cpu), "--option", "model=gpt-tiny"]
    res = _export(*args)
    assert res.exit_code == 0, res.output
    run_line = res.stdout.rstrip().splitlines()[-1].split()
    assert run_line[run_line.index("--backend") + 1] == "gloo" and "--gpus-per-node" not in res.stdout
    res = _export(*args, "--option", "gpus=yes")
    run_line = res.stdout.rstrip().splitlines()[-1].split()
    assert run_line[run_line.index("--backend") + 1] == "nccl" and "#SBATCH --gpus-per-node=" in res.stdout


@pytest.mark.parametrize("text", ["30", "1:30", "01:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED", "infinite"])
def test_every_time_form_sbatch_reads_is_taken(text: str) -> None:
    from executor.slurm import time_limit_error

    assert time_limit_error(text) is None


@pytest.mark.timeout(60)  # the old agent went on to register with the unreachable API, retrying
def test_the_agents_time_limit_is_checked_before_it_registers() -> None:
    """``pipeplan agent --launcher slurm --time-limit banana`` wrote ``#SBATCH --time=banana`` into every job's
    script (sbatch refused each); it is one error line at start now."""
    from typer.testing import CliRunner

    from pipeplan.cli import app

    r = CliRunner().invoke(app, ["agent", "--api", "http://127.0.0.1:9", "--token", "t", "--launcher", "slurm",
                                 "--time-limit", "banana"])
    assert r.exit_code == 2 and "error: --time-limit: a Slurm time limit" in r.output, r.output
