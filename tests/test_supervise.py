"""The launcher's supervisor (:mod:`executor.supervise`): ranks forked from one import, named when they die
of a signal, gone when the supervisor is; the rendezvous refuses a node of another job; nothing touches CUDA
before the fork (a CUDA context does not survive one; checked here on the CPU build through torch.cuda's
Python entry points)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from executor.launch import RunFailed, launch
from executor.plan import RunPlan

REPO = Path(__file__).resolve().parent.parent


def test_preload_touches_no_cuda() -> None:
    code = textwrap.dedent("""
        import torch
        calls = []
        for name in ("is_available", "device_count", "_lazy_init", "init", "current_device", "set_device",
                     "get_device_properties", "mem_get_info"):
            real = getattr(torch.cuda, name)
            setattr(torch.cuda, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
        import executor.rank
        from executor.plan import RunPlan
        from executor.supervise import preload
        preload([RunPlan.direct("1f1b", 2, 4, recompute=True).to_dict()])  # all it imports: torch._dynamo too
        import sys
        assert "torch._dynamo" in sys.modules
        print("calls:", calls, "threads:", len(__import__("os").listdir("/proc/self/task")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "calls: [] threads: 1", out.stdout  # no CUDA, no thread to lose in a fork


def test_rendezvous_refuses_a_node_of_another_job() -> None:
    import socket

    from executor.rank import rendezvous_store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors: dict[int, BaseException | None] = {}
    stores: list[object] = []  # rank 0's store serves the rendezvous: held until rank 1 has read it

    def node(rank: int, rid: str) -> None:
        try:
            stores.append(rendezvous_store({"endpoint": f"127.0.0.1:{port}", "id": rid}, rank, 2,
                                           timedelta(seconds=30)))
            errors[rank] = None
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors[rank] = e

    threads = [threading.Thread(target=node, args=(r, rid)) for r, rid in ((0, "job7"), (1, "job8"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors[0] is None
    assert isinstance(errors[1], RuntimeError) and "is 'job7''s, this node was launched for 'job8'" in str(errors[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _supervisor_and_ranks(parent: int, nproc: int, deadline: float) -> tuple[int, list[int], Path]:
    """The supervisor ``parent`` started, once its ``nproc`` ranks are there: its pid, theirs, its spec file."""
    while time.monotonic() < deadline:
        for pid in _children(parent):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"executor.supervise" in cmd:
                    ranks = _children(pid)
                    if len(ranks) == nproc:
                        return pid, ranks, Path(cmd[-2].decode())
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError("no supervisor with its ranks appeared")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _left(pids: list[int], within: float = 10.0) -> list[int]:
    """Those of ``pids`` still alive after up to ``within`` seconds (a SIGKILLed process takes a moment)."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["rank", "supervisor"])
def test_a_killed_rank_is_named_and_a_killed_supervisor_takes_its_ranks(tmp_path: Path, victim: str) -> None:
    """kill -9 of rank 1 mid-run: the run fails at once naming rank 1 and the signal (it wrote no error of its
    own), and no rank is left. kill -9 of the supervisor: its ranks die with it (no orphan keeps running)."""
    from executor.emulate import uniform_profile
    from planner.profile import save_profile

    path = tmp_path / "profile.json"
    save_profile(uniform_profile(2, fwd=0.05, bwd=0.1), path)  # emulated: ~0.75 s per iteration, 200 iterations
    plan = RunPlan.direct("1f1b", 2, 4, emulate=str(path), iterations=200, warmup=0)
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = launch([plan], 2, timeout=120)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            out["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=run)
    th.start()
    supervisor, ranks, _spec = _supervisor_and_ranks(os.getpid(), 2, t0 + 90)
    rank_1 = sorted(ranks)[1]  # forked in rank order
    os.kill(rank_1 if victim == "rank" else supervisor, signal.SIGKILL)
    th.join(60)
    assert not th.is_alive(), "the launch did not end after the kill"
    assert time.monotonic() - t0 < 100  # far short of the 150 s the 200 iterations would take
    assert not _left(ranks), "a rank outlived the run"
    assert isinstance(out.get("error"), RunFailed), out
    if victim == "rank":
        assert "rank 1 failed: the rank's process killed by SIGKILL" in str(out["error"]), out["error"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_pipeplan_run_ends_its_supervisor_and_ranks(tmp_path: Path, sig: signal.Signals) -> None:
    """``kill <pipeplan run>`` (SIGTERM to that process alone, as ``kill`` and service managers send it): the
    run stops at once saying so, its supervisor and ranks are gone and its temporary work directory with them
    (the signal's default action left the supervisor running its ranks, orphaned). ``kill -9``: nothing can
    clean up, but the supervisor and its ranks still go with it."""
    from executor.emulate import uniform_profile
    from planner.profile import save_profile

    path = tmp_path / "profile.json"
    save_profile(uniform_profile(2, fwd=0.05, bwd=0.1), path)
    proc = subprocess.Popen([sys.executable, "-m", "pipeplan.cli", "run", "--schedule", "1f1b", "--devices", "2",
                             "--microbatches", "4", "--emulate", str(path), "--iterations", "200"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        supervisor, ranks, spec = _supervisor_and_ranks(proc.pid, 2, time.monotonic() + 90)
        workdir = spec.parent
        assert workdir.is_dir()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not _left([supervisor, *ranks])
    if sig == signal.SIGTERM:
        assert proc.returncode == 1 and "error: stopped by SIGTERM" in out, out
        assert not workdir.exists()
    else:
        assert proc.returncode == -signal.SIGKILL
        shutil.rmtree(workdir, ignore_errors=True)
