"""Plan requests run in the background: a small thread pool hands each one to a separate process (the
planner is CPU-bound Python: in the API process it would hold the GIL and slow every request), waits for
it with a timeout, and stores the ranked candidates. Processes come from a forkserver that has the
planner imported, so starting one is cheap, and a plan that runs past the timeout is killed.

Durable: the plan row is the queue. A plan is marked running by a compare-and-set; on startup every plan
left queued or running (the API stopped meanwhile) is queued again (:meth:`PlanRunner.recover`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api import crud

log = logging.getLogger("pipeplan.api.plans")

_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["api.planrun", "planner.search"])
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


def _child(conn: Any, profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any]) -> None:
    try:
        conn.send(("ok", compute(profile, cluster, request)))
    except (ValueError, ArithmeticError) as e:  # the planner's way of saying "this request cannot be planned"
        conn.send(("error", f"{type(e).__name__}: {e}"))
    except BaseException as e:  # noqa: BLE001 - report anything to the parent, never hang it
        conn.send(("error", f"planner crashed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()


class PlanRunner:
    def __init__(self, sessions: sessionmaker[Session], workers: int, timeout: float) -> None:
        self.sessions = sessions
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="plan")
        self.futures: dict[int, Future[None]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.children: set[Any] = set()

    def submit(self, plan_id: int) -> Future[None]:
        with self.lock:
            fut = self.futures.get(plan_id)
            if fut is None or fut.done():
                fut = self.pool.submit(self._run, plan_id)
                self.futures[plan_id] = fut
            return fut

    def recover(self) -> list[int]:
        with self.sessions.begin() as db:
            ids = crud.requeue_unfinished_plans(db)
        for pid in ids:
            self.submit(pid)
        if ids:
            log.info("re-queued %d unfinished plan(s): %s", len(ids), ids)
        return ids

    def _run(self, plan_id: int) -> None:
        if self.stopping.is_set():
            return
        try:
            with self.sessions.begin() as db:
                if not crud.start_plan(db, plan_id):
                    return
                profile, cluster, request = crud.plan_inputs(db, plan_id)
            status, payload = self._compute(profile, cluster, request)
            if status == "stopped":  # the API is shutting down: the row stays running, recovered on restart
                return
            with self.sessions.begin() as db:
                if status == "ok":
                    crud.finish_plan(db, plan_id, payload)
                else:
                    crud.fail_plan(db, plan_id, payload)
        except Exception:  # noqa: BLE001 - a plan must end failed, not stay running forever
            log.exception("plan %d failed", plan_id)
            try:
                with self.sessions.begin() as db:
                    crud.fail_plan(db, plan_id, "internal error while planning: " + traceback.format_exc(limit=3))
            except Exception:  # noqa: BLE001
                log.exception("could not mark plan %d failed", plan_id)
        finally:
            with self.lock:
                self.futures.pop(plan_id, None)

    def _compute(self, profile: dict[str, Any], cluster: dict[str, Any],
                 request: dict[str, Any]) -> tuple[str, Any]:
        ctx = _context()
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, profile, cluster, request), daemon=True)
        proc.start()
        child.close()
        with self.lock:
            self.children.add(proc)
        try:
            waited = 0.0
            while waited < self.timeout:
                if self.stopping.is_set():
                    return "stopped", None
                if parent.poll(0.2):
                    try:
                        return parent.recv()
                    except EOFError:
                        break
                waited += 0.2
                if not proc.is_alive() and not parent.poll(0):
                    break
            else:
                return "error", f"planning took longer than {self.timeout:g} s and was stopped"
            return "error", f"the planner process died (exit code {proc.exitcode})"
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()
            with self.lock:
                self.children.discard(proc)

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            for proc in list(self.children):
                proc.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)
