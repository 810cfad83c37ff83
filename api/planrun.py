"""Planner processes: plan requests (and candidate timelines) run in the background, each in a process of
its own (the planner is CPU-bound Python: in the API process it would hold the GIL and slow every request).

Each planner process

* comes from a forkserver that has the planner imported, so starting one is cheap;
* has an address-space limit (``RLIMIT_AS``, ``PIPEPLAN_PLAN_MEMORY_BYTES``, which bounds its resident
  memory too): a request that would take the host's memory fails with a message naming the setting, and
  the API lives on;
* dies with the API: ``PR_SET_PDEATHSIG`` kills it when its parent (the forkserver, which exits when the
  API process does, even on ``kill -9``) goes away; Ctrl-C and SIGTERM of the process group are ignored
  by it, the API stops it itself;
* runs at a lower CPU priority (``nice`` 10) than the API, which answers first when the cores are busy;
* is killed past its timeout.

Durable: the plan row is the queue and its lease says who runs it (:mod:`api.planqueue`). The runner renews
the lease while the process works; on shutdown (SIGTERM) it kills its processes and puts their plans back
in the queue; every ``reaper_interval`` (:meth:`PlanRunner.poll`) it requeues plans whose runner's lease
ran out (an API that died) and takes queued ones. Two API processes on one database each run some plans,
none twice.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import resource
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api import crud, planqueue
from api.settings import Settings

log = logging.getLogger("pipeplan.api.plans")

_CTX: Any = None
PR_SET_PDEATHSIG = 1
#: planner processes run at a lower CPU priority than the API process (``nice``)
PLANNER_NICENESS = 10


def _context() -> Any:
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["api.planrun", "api.timelines", "planner.search"])
    return _CTX


def compute(profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Run the planner on stored JSON documents; the ``plan --json`` object."""
    from planner.cluster import Cluster
    from planner.profile import ModelProfile
    from planner.request import TrainingRequest
    from planner.search import plan

    res = plan(ModelProfile.model_validate(profile), Cluster.model_validate(cluster),
               TrainingRequest.model_validate(request))
    return res.to_dict()


def _timeline(profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any],
              cand: dict[str, Any]) -> dict[str, Any]:
    from api.timelines import simulate_candidate

    return simulate_candidate(profile, cluster, request, cand)


def _switch_cost(*args: Any) -> dict[str, Any]:
    from api.exports import switch_cost

    return switch_cost(*args)


TASKS: dict[str, Callable[..., dict[str, Any]]] = {"plan": compute, "timeline": _timeline,
                                                   "switch_cost": _switch_cost}


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent exits (``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


RESERVE_BYTES = 16 * 2**20  # what a planner process holds back to report running out of memory


def address_space() -> int:
    """This process's virtual memory size in bytes (``/proc/self/statm``; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def limit_memory(total: int) -> int:
    """Limit this process's address space to ``total`` bytes (at least 64 MiB more than it has now, so that
    it can report a failure); the limit set. Resident memory never exceeds it."""
    limit = max(total, address_space() + 64 * 2**20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def _child(conn: Any, task: str, args: tuple[Any, ...], memory: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of the terminal: the API stops us itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    try:
        os.nice(PLANNER_NICENESS)  # the API process (and /health) go first when the cores are busy planning
    except OSError:
        pass
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    # a one-shot process (it ends once its answer is sent): with the cyclic collector on, the first allocations
    # after the search (planner.gcpause.gc_paused resumes it) would visit every object the results keep alive,
    # 73-100 ms on GPT-3 175B / 1024 GPUs, to free nothing the exit does not (as the CLI: pipeplan.cli.SHORT_LIVED)
    gc.disable()
    reserve: list[bytearray] = []
    out: tuple[str, Any] | None = None
    try:
        if memory > 0:
            limit_memory(memory)
            # address space kept back for reporting: at the limit, even pickling the error message can fail
            reserve.append(bytearray(RESERVE_BYTES))
        out = ("ok", TASKS[task](*args))
    except MemoryError:
        out = None  # reported below, once this handler's traceback (and the frames holding the memory) is gone
    except (ValueError, ArithmeticError) as e:  # the planner's way of saying "this request cannot be planned"
        out = ("error", f"{type(e).__name__}: {e}")
    except BaseException as e:  # noqa: BLE001 - report anything to the parent, never hang it
        out = ("error", f"planner crashed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}")
    try:
        if out is None:
            reserve.clear()
            gc.collect()
            out = ("error", f"the planner ran out of memory: a planner process may use {memory / 2**30:.2f} GiB "
                            "(PIPEPLAN_PLAN_MEMORY_BYTES); ask for fewer GPUs, a smaller global batch or fewer "
                            "micro-batch sizes")
        try:
            conn.send(out)
        except MemoryError:  # the result itself too large to send under the limit
            out = None
            reserve.clear()
            gc.collect()
            conn.send(("error", f"the planner ran out of memory sending its result: a planner process may use "
                                f"{memory / 2**30:.2f} GiB (PIPEPLAN_PLAN_MEMORY_BYTES)"))
    finally:
        conn.close()


def _warm_up() -> None:
    """Start the forkserver (it imports the planner: seconds) before the first plan needs it."""
    try:
        from multiprocessing import forkserver

        _context()
        forkserver.ensure_running()
    except Exception:  # noqa: BLE001 - the first plan starts it then
        log.exception("could not start the forkserver ahead of time")


class PlanRunner:
    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.timeout = settings.plan_timeout_seconds
        self.name = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        workers = max(1, settings.plan_workers)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plan")
        self.side = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="timeline")
        self.futures: dict[int, Future[None]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.children: set[Any] = set()
        self.renewed = 0.0
        threading.Thread(target=_warm_up, name="forkserver", daemon=True).start()

    def submit(self, plan_id: int) -> Future[None]:
        with self.lock:
            fut = self.futures.get(plan_id)
            if fut is None or fut.done():
                fut = self.pool.submit(self._run, plan_id)
                self.futures[plan_id] = fut
            return fut

    def timeline(self, args: tuple[Any, ...]) -> Future[tuple[str, Any]]:
        """Simulate one candidate's timeline in a planner process: a future of (status, document or error)."""
        return self.side.submit(self._task, "timeline", args, self.settings.timeline_timeout_seconds)

    def task(self, name: str, args: tuple[Any, ...], timeout: float) -> Future[tuple[str, Any]]:
        """Run ``TASKS[name](*args)`` in a planner process (e.g. an export's switch cost): a future of
        (status, result or error)."""
        return self.side.submit(self._task, name, args, timeout)

    def poll(self) -> list[int]:
        """Renew the leases of this runner's plans (also while a planner process is starting), requeue plans
        whose runner stopped renewing its lease, and take the queued ones not yet taken here; the ids
        submitted. Called every ``reaper_interval`` seconds."""
        if self.stopping.is_set():
            return []
        lease = self.settings.plan_lease_seconds
        with self.sessions.begin() as db:
            now = time.monotonic()
            if now - self.renewed >= lease / 3:  # alive: every plan this runner holds stays its own
                planqueue.renew_runner(db, self.name, lease)
                self.renewed = now
            expired = planqueue.requeue_expired_plans(db, keep=self.name, max_attempts=self.settings.max_attempts)
            queued = planqueue.queued_plans(db)
        if expired:
            log.info("plans %s: their runner's lease ran out; queued again (failed after max_attempts starts)", expired)
        with self.lock:
            new = [p for p in queued if p not in self.futures]
        for pid in new:
            self.submit(pid)
        return new

    def recover(self) -> list[int]:
        ids = self.poll()
        if ids:
            log.info("taking %d queued plan(s): %s", len(ids), ids)
        return ids

    def _run(self, plan_id: int) -> None:
        if self.stopping.is_set():
            return
        lease = self.settings.plan_lease_seconds
        try:
            with self.sessions.begin() as db:
                if not planqueue.start_plan(db, plan_id, self.name, lease):
                    return
                try:
                    profile, cluster, request = crud.plan_inputs(db, plan_id)
                except crud.InputError as e:  # queued before its profile or cluster broke a rule added since
                    planqueue.fail_plan(db, plan_id, str(e), self.name)
                    return

            def renew() -> bool:
                with self.sessions.begin() as db:
                    return planqueue.renew_plan(db, plan_id, self.name, lease)

            status, payload = self._task("plan", (profile, cluster, request), self.timeout, renew, lease / 3)
            with self.sessions.begin() as db:
                if status == "stopped":  # the API is stopping: back to the queue, for the next start
                    if planqueue.release_plan(db, plan_id, self.name):
                        log.info("plan %d: stopped with the API, queued again", plan_id)
                    return
                if status == "lost":
                    log.warning("plan %d: lease lost to another runner; result dropped", plan_id)
                    return
                done = (planqueue.finish_plan(db, plan_id, payload, self.name) if status == "ok"
                        else planqueue.fail_plan(db, plan_id, payload, self.name))
                if not done:
                    log.warning("plan %d: lease lost before the end; result dropped", plan_id)
        except Exception:  # noqa: BLE001 - a plan must end failed, not stay running forever
            log.exception("plan %d failed", plan_id)
            try:
                with self.sessions.begin() as db:
                    planqueue.fail_plan(db, plan_id, "internal error while planning: " + traceback.format_exc(limit=3),
                                        self.name)
            except Exception:  # noqa: BLE001
                log.exception("could not mark plan %d failed", plan_id)
        finally:
            with self.lock:
                self.futures.pop(plan_id, None)

    def _task(self, task: str, args: tuple[Any, ...], timeout: float, renew: Callable[[], bool] | None = None,
              renew_every: float = 10.0) -> tuple[str, Any]:
        """Run ``TASKS[task](*args)`` in a planner process: ("ok", result), ("error", message), ("stopped",
        None) when the API stops meanwhile, ("lost", None) when ``renew`` says the lease is gone."""
        if self.stopping.is_set():
            return "stopped", None
        ctx = _context()
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, task, args, self.settings.plan_memory_bytes), daemon=True)
        proc.start()
        with self.lock:
            self.children.add(proc)
        child.close()
        try:
            start = last_renewal = time.monotonic()
            if renew is not None and not renew():  # starting the forkserver may take seconds: renew at once
                return "lost", None
            while True:
                if self.stopping.is_set():
                    return "stopped", None
                now = time.monotonic()
                if now - start >= timeout:
                    return "error", f"planning took longer than {timeout:g} s and was stopped"
                if parent.poll(0.2):
                    try:
                        return parent.recv()
                    except EOFError:
                        break
                if renew is not None and now - last_renewal >= renew_every:
                    last_renewal = now
                    if not renew():
                        return "lost", None
                if not proc.is_alive() and not parent.poll(0):
                    break
            if self.stopping.is_set():
                return "stopped", None
            return "error", f"the planner process died (exit code {proc.exitcode})"
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()
            with self.lock:
                self.children.discard(proc)

    def shutdown(self) -> None:
        """Stop: kill the planner processes; their plans go back to the queue (for the next start)."""
        with self.lock:
            self.stopping.set()
            for proc in list(self.children):
                proc.kill()
        self.side.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)
