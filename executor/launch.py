"""Launching: one supervisor per node (:mod:`executor.supervise`), which forks one process per device; on one
node, or on several (one launch per node with the same endpoint: node rank r is node r).

:func:`launch` refuses, before starting anything, a plan whose point-to-point posting policy could deadlock
under NCCL (:func:`check_p2p`, with ``backend="nccl"``), writes the spec into a fresh temporary work directory,
runs the supervisor (a failing rank makes it stop every other rank of its node at once, and the ranks of the
other nodes fail on their next exchange with it: no hang), and

* on failure raises :class:`RunFailed` naming the *first* rank of this node that failed and its error (from
  the ``error-rank*.json`` files the ranks write -- the supervisor writes one for a rank killed by a signal --
  earliest first; the supervisor's own output otherwise);
* on success returns the result rank 0 wrote -- ``None`` on a node that does not host global rank 0 (node
  rank 0 does). The caller's output files are written atomically
  (:func:`executor.trace.write_json_atomic`) and only then, so a failed run leaves no result behind.

Several nodes (``nnodes > 1``): every node runs ``launch`` with the same plans, its ``node_rank`` and ``nproc``
processes, and the same ``rdzv_endpoint`` (``host:port`` reachable from all nodes, on node rank 0's host:
global rank 0 serves the rendezvous store there) and ``rdzv_id`` (a node launched for another id is refused
there); the world is ``nnodes * nproc`` ranks, global ranks ``node_rank * nproc ..``, and node rank 0 writes
the result. (A gang dispatched by the API, :mod:`api.gang`, counts on node rank 0 being the one that hosts
the endpoint and stores the result.) On one node the ranks meet in a file of the work directory.

Until session 31 the supervisor was torchrun (``--standalone``, or its static rendezvous, ``--max-restarts=0``);
its elastic agent cost an import of torch and 3-5 s of every start (``benchmarks/launch_bench.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from executor.p2p_order import POLICIES, check_schedule, default_policy
from executor.plan import PlanError, RunPlan
from planner.placement import global_rank

REPO = Path(__file__).resolve().parent.parent


class RunFailed(RuntimeError):
    """A rank failed (or the launch did); the message names the rank and the error."""


def first_error(workdir: Path) -> dict[str, Any] | None:
    errors = []
    for f in workdir.glob("error-rank*.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return min(errors, key=lambda e: e["time"]) if errors else None


def check_p2p(plan: RunPlan, policy: str) -> None:
    """Raise :class:`PlanError` when ``policy`` could deadlock ``plan`` under NCCL semantics (one stream per
    rank, :func:`executor.p2p_order.check_schedule`); the message names the ranks (of data-parallel copy 0,
    tensor rank 0 -- every copy posts alike) and the cycle."""
    problem = check_schedule(plan.schedule(), policy, streams="rank")
    if problem is not None:
        c = plan.spec.config
        # copy 0's tensor rank 0 (planner.placement: executor.groups.Layout imports torch, which this process does not)
        firsts = [global_rank(c.order, d, 0, 0, c.pipeline, c.data, c.tensor) for d in range(c.pipeline)]
        note = "" if firsts == list(range(c.pipeline)) else (
            f" (ranks are pipeline devices; copy 0's global ranks, order {c.order}: "
            + ", ".join(f"device {d} = rank {r}" for d, r in enumerate(firsts)) + ")")
        raise PlanError(f"p2p policy {policy!r} would {'deadlock' if problem.kind == 'deadlock' else 'fail'} on "
                        f"NCCL for {c.schedule} D={c.pipeline} N={plan.spec.microbatches}{note}: {problem}")


def check_placement(nproc: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None) -> None:
    """Raise ``ValueError`` for a placement no launch can make: fewer than one node or process, a node rank
    outside the nodes, several nodes without a ``host:port`` endpoint."""
    if nnodes < 1 or nproc < 1:
        raise ValueError(f"nnodes and nproc must be >= 1, got {nnodes} and {nproc}")
    if nnodes == 1:
        return
    if not rdzv_endpoint or ":" not in rdzv_endpoint:
        raise ValueError(f"{nnodes} nodes need a rendezvous endpoint host:port (every node the same), got "
                         f"{rdzv_endpoint!r}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} is outside 0..{nnodes - 1}")


@contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM while the run goes (an agent stopping its job, ``kill``) raises :class:`RunFailed` here, in the
    main thread: ``subprocess.run`` then kills the supervisor (its ranks die with it) and the work directory is
    removed, where the signal's default action ended the process and left both behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise RunFailed(f"stopped by {signal.Signals(signum).name}")

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def launch(plans: list[RunPlan], nproc: int, *, check: bool = False, backend: str = "gloo",
           trace: bool = False, timeout: float = 120.0, wall_timeout: float | None = None,
           fault_rank: int | None = None, fault_plan: int = 0, threads: int = 1,
           capture: bool = True, p2p: str | None = None, nnodes: int = 1, node_rank: int = 0,
           rdzv_endpoint: str | None = None, rdzv_id: str = "pipeplan") -> dict[str, Any] | None:
    """Run ``plans`` in sequence on ``nproc`` processes of this node (``nnodes`` nodes in all) with the
    point-to-point posting policy ``p2p`` (default: the backend's); returns ``{"runs": [result, ...]}`` on
    the node of global rank 0, None on the others. Raises :class:`PlanError` before launching when the policy
    could deadlock on NCCL, :class:`RunFailed` when a rank fails."""
    policy = p2p or default_policy(backend)
    if policy not in POLICIES:
        raise PlanError(f"unknown p2p policy {policy!r}; known: {', '.join(POLICIES)}")
    if backend == "nccl":
        for plan in plans:
            check_p2p(plan, policy)
        import torch

        if not torch.cuda.is_available():  # (each rank died in torch.cuda.set_device: 114 lines of tracebacks)
            raise PlanError("--backend nccl needs CUDA GPUs and this machine has none: use --backend gloo (the "
                            "default)")
    check_placement(nproc, nnodes, node_rank, rdzv_endpoint)
    workdir = Path(tempfile.mkdtemp(prefix="pipeplan-run-"))
    try:
        spec = {"plans": [p.to_dict() for p in plans], "check": check, "backend": backend, "trace": trace,
                "timeout": timeout, "workdir": str(workdir), "fault_rank": fault_rank, "fault_plan": fault_plan,
                "threads": threads, "p2p": policy, "nproc": nproc, "nnodes": nnodes, "node_rank": node_rank,
                "launcher": os.getpid(),
                "rendezvous": ({"file": str(workdir / "store")} if nnodes == 1 else
                               {"endpoint": rdzv_endpoint, "id": rdzv_id})}
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "executor.supervise", str(spec_path)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("OMP_NUM_THREADS", str(threads))
        try:
            with stopped_by_sigterm():
                proc = subprocess.run(cmd, env=env, capture_output=capture, text=True,
                                      timeout=wall_timeout or timeout * 3 + 60)
        except subprocess.TimeoutExpired as e:
            raise RunFailed(f"the run did not finish within {e.timeout:.0f} s") from None
        if proc.returncode != 0:
            err = first_error(workdir)
            if err is not None:
                where = (f" (the first failure on node {node_rank}; a rank of another node may have failed first: "
                         f"see that node's launch)" if nnodes > 1 else "")
                raise RunFailed(f"rank {err['rank']} failed: {err['error']}{where}\n{err['traceback']}")
            tail = (proc.stderr or "")[-3000:] if capture else ""
            raise RunFailed(f"the ranks' supervisor exited with status {proc.returncode}\n{tail}")
        result_path = workdir / "result.json"
        if not result_path.exists():
            if nnodes > 1:
                return None  # global rank 0 ran on another node, which has the result
            raise RunFailed("the run finished without a result")
        return json.loads(result_path.read_text())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
