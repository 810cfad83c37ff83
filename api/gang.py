"""Placement and gang dispatch of jobs (no HTTP here): which agents may run a job, and the node slots of a job
that spans several nodes.

**Placement** (:func:`placement`, at job creation). A job needs ``P = t * D * W`` processes (the candidate's
:class:`planner.runspec.RunSpec`; the executor's world size). On nodes of ``G`` processes -- the plan's cluster's
``gpus_per_node``, or the job's own ``gpus_per_node``; an emulated job runs on one node unless it says otherwise
-- it takes ``n`` node slots of ``P / n`` processes, ``n`` the smallest count >= ceil(P / G) that divides ``P``
(``pipeplan run --nnodes n`` starts the same number of processes on every node). ``n = 1`` is a single-node
job, dispatched as before (:mod:`api.jobqueue`, the job row is its one slot).

**Matching** (:func:`eligible`). A job is offered to an agent whose declared device type is the plan's cluster
device (case-insensitive; both stored under the shipped description's name where one matches,
:func:`canonical_device`: an agent declaring ``NVIDIA H200``, what torch calls the GPU, or ``h200`` takes a job on
``H200-SXM-141GB``); a CPU agent (a device type :func:`planner.units.is_cpu` calls a CPU: ``cpu`` or a name starting
``cpu``, any case) takes emulated jobs of any device too, and nothing else. An agent declaring ``G > 0`` GPUs (a CPU
agent: the gloo processes it runs) takes jobs of at most ``G`` processes per node, and is the only kind that takes
slots of multi-node jobs; ``G = 0`` (not declared) takes single-node jobs of any size, as agents did before they
declared anything. Jobs stored before placement existed (no device) go to any agent.

**Gang dispatch** (``nodes > 1``; the slots are :class:`db.models.JobSlot` rows)::

    queued (forming) --every slot held--> running --result (from the node of global rank 0)--> succeeded
       ^  slot held alone past gang_wait_seconds, or its lease lost: the slot opens again
       +-- any slot's lease lost, its run failed, or its agent stopped: the whole gang stops; the job is
           queued again (failed after max_attempts counted starts; a stopping agent's does not count)

Slots are claimed by distinct agents (a unique (job, worker) constraint); the agent of node rank 0 names the
rendezvous endpoint (its host and a port it picked, sent with its claim). Nobody starts before every slot is
held: the claim that takes the last slot starts the gang (every slot gets a lease) and each agent hears it on
its next slot renewal (:func:`renew_slot`, ``start``, with ``--nnodes/--node-rank/--rdzv-endpoint``). A slot
held alone past ``gang_wait_seconds`` is given back, so two half-formed gangs cannot hold each other's agents
for ever; agents claim the oldest eligible job first, so the released ones regroup on the same job. Every
change to a forming gang's slots first bumps ``jobs.slots_version`` (a compare-and-set on ``state = 'queued'``):
on PostgreSQL that row lock, on SQLite the single writer, orders them, so the claim that counts every slot held
sees all the others and a slot cannot be given back under a starting gang. The same compare-and-set stops a
running gang once, whoever notices first (a failing node, the lease reaper, an agent that stops).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from api.errors import Conflict, NotFound
from db.models import Job, JobSlot, Worker, utcnow
from planner.units import device_noun, is_cpu

#: an agent's device type when it declares none (the agent's own default)
CPU = "cpu"


# ---- placement ---------------------------------------------------------------------------------------

def node_layout(world: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) of a job of ``world`` processes on nodes of ``gpus_per_node``: the fewest
    nodes, at least ceil(world / G), among which ``world`` divides evenly (``pipeplan run`` starts the same
    number on every node: 6 on 4-GPU nodes is 2 x 3; 5 is 5 x 1)."""
    if world < 1 or gpus_per_node < 1:
        raise ValueError(f"world ({world}) and gpus_per_node ({gpus_per_node}) must be >= 1")
    n = math.ceil(world / gpus_per_node)
    while world % n:
        n += 1
    return n, world // n


def world_size(candidate: dict[str, Any]) -> int | None:
    """P = t * D * W of a candidate document (None when it carries no configuration)."""
    from planner.runspec import RunSpec

    try:
        c = RunSpec.from_document(candidate).config
    except (KeyError, ValueError, TypeError):
        return None
    return c.tensor * c.pipeline * c.data


def canonical_device(name: str | None) -> str | None:
    """``name`` as the shipped device description it names (its name or an alias, any case:
    :meth:`planner.device.DeviceSpec.matches`), else as given. Only shipped descriptions: a declared name is never
    read as a file path."""
    if not name:
        return name
    from planner.device import shipped_device

    dev = shipped_device(name)
    return name if dev is None else dev.name


def placement(candidate: dict[str, Any], cluster: dict[str, Any], emulate: bool,
              gpus_per_node: int | None = None) -> dict[str, Any]:
    """``device_type``, ``nodes`` and ``procs_per_node`` of a job (see the module's docstring)."""
    device = canonical_device(str(cluster.get("device") or "") or None)
    world = world_size(candidate)
    if world is None:
        return {"device_type": device, "nodes": 1, "procs_per_node": None}
    g = gpus_per_node or (world if emulate else int(cluster.get("gpus_per_node") or world))
    nodes, procs = node_layout(world, g)
    return {"device_type": device, "nodes": nodes, "procs_per_node": procs}


def eligible(worker: Worker, whole: bool = False) -> ColumnElement[bool]:
    """The jobs ``worker`` may be offered (device type and size; see the module's docstring). ``whole``: an
    agent that places multi-node jobs itself (Slurm) takes any size, but no gang that is forming."""
    dev = (worker.device_type or CPU).lower()
    device = or_(Job.device_type.is_(None), func.lower(Job.device_type) == dev)
    if is_cpu(dev):
        device = or_(device, Job.emulate.is_(True))
    if whole:
        return and_(device, ~exists().where(JobSlot.job_id == Job.id, JobSlot.worker_id.is_not(None)))
    if worker.gpus > 0:
        size = or_(Job.procs_per_node.is_(None), Job.procs_per_node <= worker.gpus)
    else:
        size = Job.nodes == 1
    return and_(device, size)


def device_fits(device_type: str | None, job: Job) -> bool:
    """Whether an agent of ``device_type`` may run ``job`` by device (:func:`eligible`'s first half)."""
    dev = (device_type or CPU).lower()
    return job.device_type is None or job.device_type.lower() == dev or (is_cpu(dev) and bool(job.emulate))


def takes(worker: Worker, job: Job) -> bool:
    """:func:`eligible` for one job, in Python."""
    if not device_fits(worker.device_type, job):
        return False
    if worker.gpus > 0:
        return job.procs_per_node is None or job.procs_per_node <= worker.gpus
    return job.nodes == 1


def alive_workers(db: Session, alive_seconds: float) -> list[Worker]:
    since = utcnow() - timedelta(seconds=alive_seconds)
    return list(db.scalars(select(Worker).where(Worker.last_heartbeat >= since)))


def waiting_reason(db: Session, job: Job, alive_seconds: float, workers: list[Worker] | None = None) -> str | None:
    """Why a queued job is not running yet, in words (None when an agent that fits is idle or none is
    known to be missing; a single-node job whose fitting agents all run other jobs says so).
    ``workers``: the alive ones, when the caller has them."""
    if job.state != "queued":
        return None
    if workers is None:
        workers = alive_workers(db, alive_seconds)
    dev = job.device_type or "any"
    also = " (or a CPU agent: the job is emulated)" if job.emulate and not is_cpu(dev) else ""
    if not any(device_fits(w.device_type, job) for w in workers):
        return f"no agent with device {dev} registered{also}"
    fit = [w for w in workers if takes(w, job)]
    # what a node's devices are: GPUs, CPU processes on a CPU cluster (either for an emulated job)
    units = "GPUs (processes)" if job.emulate or dev == "any" else device_noun(dev, job.procs_per_node or 2)
    if job.nodes == 1:
        if not fit:
            return (f"no agent with device {dev} and at least {job.procs_per_node} {units} registered: "
                    f"the plan needs {job.procs_per_node} on one node")
        busy = busy_with(db, [w.id for w in fit])
        if len(busy) < len(fit):
            return None
        ahead = db.scalar(select(func.count()).select_from(Job).where(Job.state == "queued", Job.id < job.id)) or 0
        jobs = ", ".join(str(j) for j in sorted(set(busy.values())))
        return (f"every agent that fits is busy ({len(fit)} alive with device {dev}: running job {jobs}); "
                f"{ahead} queued job(s) ahead of it")
    held = sum(1 for s in job.slots if s.worker_id is not None)
    if len(fit) < job.nodes:
        return (f"needs {job.nodes} agents with device {dev} and at least {job.procs_per_node} {units} "
                f"each; {len(fit)} alive")
    return f"forming: {held} of {job.nodes} node slots held"


def busy_with(db: Session, worker_ids: list[int]) -> dict[int, int]:
    """Which of ``worker_ids`` are running a job or hold a node slot of a gang: worker id -> that job's id."""
    if not worker_ids:
        return {}
    out = dict(db.execute(select(Job.worker_id, Job.id).where(Job.state == "running",
                                                               Job.worker_id.in_(worker_ids))).all())
    for wid, jid in db.execute(select(JobSlot.worker_id, JobSlot.job_id).join(Job, Job.id == JobSlot.job_id)
                               .where(JobSlot.worker_id.in_(worker_ids), Job.state.in_(("queued", "running")))):
        out.setdefault(wid, jid)
    return out


def could_form(db: Session, job_id: int, alive_seconds: float) -> bool:
    """Whether as many alive agents fit gang ``job_id`` as it has nodes."""
    job = db.get(Job, job_id)
    return job is not None and sum(1 for w in alive_workers(db, alive_seconds) if takes(w, job)) >= job.nodes


def make_slots(job: Job) -> None:
    """The open slots of a new multi-node job."""
    if job.nodes > 1:
        job.slots = [JobSlot(node_rank=r, state="open") for r in range(job.nodes)]


# ---- the gang state machine ----------------------------------------------------------------------------

def _event(db: Session, job: Job, event: str, **kw: Any) -> None:
    """Append to the job's history and write it now (a later ``refresh`` of the row would drop it)."""
    from api.jobqueue import record_event

    record_event(job, event, **kw)
    db.flush()


#: the events of a forming gang, which repeat every ``gang_wait_seconds`` while a job waits for its nodes
FORMING_EVENTS = ("slot_claimed", "slot_timed_out", "slot_released", "slot_lease_expired")


def collapse_forming(history: list[dict[str, Any]], event: str, at: str, **kw: Any) -> list[dict[str, Any]]:
    """``history`` with forming event ``event`` added, a repeat collapsed: when the same event of the same
    worker and node rank is among the forming events since the last other event (a gang start, a stop), that
    entry keeps its first ``at``, counts the repeat (``count``), takes ``last_at`` and the newest fields, and
    moves to the end (the history stays in order of each entry's latest occurrence). A job that waits hours for
    its nodes, one claim and one time-out every ``gang_wait_seconds``, keeps one entry of each per worker and
    rank instead of two per wait."""
    key = (event, kw.get("worker_id"), kw.get("node_rank"))
    for i in range(len(history) - 1, -1, -1):
        e = history[i]
        if e.get("event") not in FORMING_EVENTS:
            break
        if (e["event"], e.get("worker_id"), e.get("node_rank")) == key:
            merged = {**e, **kw, "count": int(e.get("count", 1)) + 1, "last_at": at}
            return [*history[:i], *history[i + 1:], merged]
    return [*history, {"at": at, "event": event, **kw}]


def _forming_event(db: Session, job: Job, event: str, **kw: Any) -> None:
    """:func:`_event` for a forming gang's event, repeats collapsed (:func:`collapse_forming`)."""
    job.history = collapse_forming(list(job.history or []), event, utcnow().isoformat(), **kw)
    db.flush()


def _lock_forming(db: Session, job_id: int) -> bool:
    """Bump the version of a forming gang (compare-and-set on ``state = 'queued'``); False if it is not
    forming any more. On PostgreSQL the row stays locked until commit: slot changes of one job go one by one."""
    res = db.execute(update(Job).where(Job.id == job_id, Job.state == "queued")
                     .values(slots_version=Job.slots_version + 1))
    return res.rowcount == 1


def rdzv_id(job: Job) -> str:
    """The rendezvous id of this start of the gang (the same on every node; a new one per attempt)."""
    return f"pipeplan-job{job.id}-attempt{job.attempts}"


def claim_slot(db: Session, job_id: int, worker: Worker, lease_seconds: float, rdzv_port: int) -> JobSlot | None:
    """Take the lowest open slot of forming job ``job_id`` for ``worker``; start the gang when it was the last.
    None when the job stopped forming, has no open slot or ``worker`` holds one of it already."""
    if not _lock_forming(db, job_id):
        return None
    if db.scalar(select(JobSlot.id).where(JobSlot.job_id == job_id, JobSlot.worker_id == worker.id)) is not None:
        return None
    slot = db.scalar(select(JobSlot).where(JobSlot.job_id == job_id, JobSlot.worker_id.is_(None))
                     .order_by(JobSlot.node_rank).limit(1))
    if slot is None:
        return None
    now = utcnow()
    endpoint = f"{worker.host or worker.node}:{rdzv_port}" if slot.node_rank == 0 else None
    res = db.execute(update(JobSlot).where(JobSlot.id == slot.id, JobSlot.worker_id.is_(None))
                     .values(worker_id=worker.id, state="held", held_since=now, endpoint=endpoint,
                             lease_expires_at=now + timedelta(seconds=lease_seconds)))
    if res.rowcount != 1:
        return None
    db.refresh(slot)
    job = db.get(Job, job_id)
    assert job is not None
    db.refresh(job)
    _forming_event(db, job, "slot_claimed", worker_id=worker.id, node_rank=slot.node_rank)
    _start_if_complete(db, job, lease_seconds)
    return slot


def _start_if_complete(db: Session, job: Job, lease_seconds: float) -> bool:
    slots = list(db.scalars(select(JobSlot).where(JobSlot.job_id == job.id).order_by(JobSlot.node_rank)))
    if len(slots) != job.nodes or any(s.worker_id is None for s in slots):
        return False
    now = utcnow()
    res = db.execute(update(Job).where(Job.id == job.id, Job.state == "queued", Job.slots_version == job.slots_version)
                     .values(state="running", worker_id=slots[0].worker_id, claimed_at=now, lease_expires_at=None,
                             attempts=Job.attempts + 1))
    if res.rowcount != 1:
        return False
    db.execute(update(JobSlot).where(JobSlot.job_id == job.id)
               .values(state="running", lease_expires_at=now + timedelta(seconds=lease_seconds)))
    db.refresh(job)
    for s in slots:
        db.refresh(s)
    _event(db, job, "gang_started", attempt=job.attempts, workers=[s.worker_id for s in slots],
           endpoint=slots[0].endpoint)
    return True


def _slot(db: Session, job_id: int, node_rank: int) -> tuple[Job, JobSlot]:
    job = db.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    slot = db.scalar(select(JobSlot).where(JobSlot.job_id == job_id, JobSlot.node_rank == node_rank))
    if slot is None:
        raise NotFound(f"job {job_id} has no node slot {node_rank} ({job.nodes} node(s))")
    return job, slot


def _lost(job: Job, slot: JobSlot, worker_id: int) -> Conflict:
    return Conflict(f"worker {worker_id} does not hold node slot {slot.node_rank} of job {job.id} (the job is "
                    f"{job.state}; the slot is {slot.state}): the gang was stopped or the slot given back; stop the "
                    "run")


def _open_slot(db: Session, slot_id: int, worker_id: int) -> bool:
    res = db.execute(update(JobSlot).where(JobSlot.id == slot_id, JobSlot.worker_id == worker_id)
                     .values(worker_id=None, state="open", held_since=None, lease_expires_at=None, endpoint=None))
    return res.rowcount == 1


def renew_slot(db: Session, job_id: int, node_rank: int, worker_id: int, lease_seconds: float,
               gang_wait_seconds: float) -> dict[str, Any]:
    """A slot's agent checks in (every third of a lease): what it must do now.

    ``state``: ``waiting`` (the gang is forming: ``held`` of ``nodes`` slots), ``released`` (held alone past
    ``gang_wait_seconds``: the slot was given back; claim again), ``start`` (the gang started: run,
    with ``nnodes``, ``node_rank``, ``procs_per_node``, ``rdzv_endpoint``, ``rdzv_id``), ``succeeded`` (the
    result is in: let the run end), ``cancelled`` (stop the run). :class:`Conflict` when the slot is not this
    worker's any more (the gang was stopped): stop the run."""
    job, slot = _slot(db, job_id, node_rank)
    if slot.worker_id != worker_id:
        raise _lost(job, slot, worker_id)
    now = utcnow()
    out: dict[str, Any] = {"job_id": job.id, "node_rank": node_rank, "nodes": job.nodes,
                           "procs_per_node": job.procs_per_node, "state": job.state}
    if job.state == "cancelled":
        return out
    if job.state == "queued":
        waited = (now - slot.held_since).total_seconds() if slot.held_since is not None else 0.0
        if waited > gang_wait_seconds:
            if _lock_forming(db, job.id) and _open_slot(db, slot.id, worker_id):
                db.refresh(job)
                _forming_event(db, job, "slot_timed_out", worker_id=worker_id, node_rank=node_rank,
                               waited=round(waited, 1))
                return {**out, "state": "released"}
        db.execute(update(JobSlot).where(JobSlot.id == slot.id, JobSlot.worker_id == worker_id)
                   .values(lease_expires_at=now + timedelta(seconds=lease_seconds)))
        held = db.scalar(select(func.count()).select_from(JobSlot)
                         .where(JobSlot.job_id == job.id, JobSlot.worker_id.is_not(None)))
        return {**out, "state": "waiting", "held": held}
    if job.state == "running":
        db.execute(update(JobSlot).where(JobSlot.id == slot.id, JobSlot.worker_id == worker_id)
                   .values(lease_expires_at=now + timedelta(seconds=lease_seconds)))
        lead = db.scalar(select(JobSlot.endpoint).where(JobSlot.job_id == job.id, JobSlot.node_rank == 0))
        return {**out, "state": "start", "rdzv_endpoint": lead, "rdzv_id": rdzv_id(job), "attempt": job.attempts}
    return out  # succeeded or failed: nothing to renew


def stop_gang(db: Session, job: Job, reason: str, *, counted: bool = True, error: str | None = None,
              log_tail: str | None = None, now: datetime | None = None) -> bool:
    """Stop running gang ``job`` at once, whatever its nodes are doing: queued again with every slot open
    (failed when ``counted`` and its attempts are used up; an uncounted stop gives the attempt back). The
    agents hear it at their next renewal (409) and kill their runs. False when another stop won."""
    now = now or utcnow()
    give_up = counted and job.attempts >= job.max_attempts
    values: dict[str, Any] = {"worker_id": None, "lease_expires_at": None, "slots_version": Job.slots_version + 1}
    if give_up:
        values.update(state="failed", finished_at=now,
                      error=f"gang attempt {job.attempts} of {job.max_attempts} stopped ({reason}); giving up"
                            + (f": {error}" if error else ""))
    else:
        values.update(state="queued")
        if error:
            values["error"] = f"attempt {job.attempts}: {error}"
        if not counted:
            values["attempts"] = Job.attempts - 1
    if log_tail is not None:
        values["log_tail"] = log_tail
    res = db.execute(update(Job).where(Job.id == job.id, Job.state == "running", Job.attempts == job.attempts)
                     .values(**values))
    if res.rowcount != 1:
        return False
    db.execute(update(JobSlot).where(JobSlot.job_id == job.id)
               .values(worker_id=None, state="open", held_since=None, lease_expires_at=None, endpoint=None))
    db.refresh(job)
    _event(db, job, "gang_stopped", reason=reason, requeued=not give_up, counted=counted)
    return True


def _held_running(db: Session, job_id: int, node_rank: int, worker_id: int) -> tuple[Job, JobSlot]:
    job, slot = _slot(db, job_id, node_rank)
    if slot.worker_id != worker_id:
        raise _lost(job, slot, worker_id)
    return job, slot


def fail_slot(db: Session, job_id: int, node_rank: int, worker_id: int, error: str, log_tail: str | None) -> Job:
    """Node ``node_rank``'s run failed: the whole gang stops and is queued again (a counted attempt). After
    the job succeeded (a node that failed on the way out) the failure is only recorded."""
    job, slot = _held_running(db, job_id, node_rank, worker_id)
    if job.state == "running":
        if not stop_gang(db, job, f"node {node_rank} (worker {worker_id}) failed", error=f"node {node_rank}: {error}",
                         log_tail=log_tail):
            db.refresh(job)
    else:
        _event(db, job, "slot_failed", worker_id=worker_id, node_rank=node_rank, error=error[:500])
    return job


def finish_slot(db: Session, job_id: int, node_rank: int, worker_id: int) -> Job:
    """Node ``node_rank``'s run exited 0 without the result (global rank 0 ran elsewhere): its slot is done."""
    job, slot = _held_running(db, job_id, node_rank, worker_id)
    if job.state == "queued":  # (a done slot is not leased: expiry would never open it again for the forming gang)
        raise Conflict(f"job {job_id} has not started (its gang is still forming): node {node_rank} cannot have "
                       "run it; release the slot instead")
    if slot.state != "done":
        db.execute(update(JobSlot).where(JobSlot.id == slot.id, JobSlot.worker_id == worker_id)
                   .values(state="done", lease_expires_at=None))
        _event(db, job, "slot_done", worker_id=worker_id, node_rank=node_rank)
    if job.state == "running" and db.scalar(select(func.count()).select_from(JobSlot).where(
            JobSlot.job_id == job.id, JobSlot.state != "done")) == 0:
        stop_gang(db, job, "every node ended without posting the result", error="no node posted the result")
    return job


def release_slot(db: Session, job_id: int, node_rank: int, worker_id: int) -> Job:
    """The slot's agent is stopping: a forming gang's slot opens again; a running gang stops and is queued
    again without counting the attempt."""
    job, slot = _held_running(db, job_id, node_rank, worker_id)
    if job.state == "queued":
        if _lock_forming(db, job.id) and _open_slot(db, slot.id, worker_id):
            db.refresh(job)
            _forming_event(db, job, "slot_released", worker_id=worker_id, node_rank=node_rank)
    elif job.state == "running":
        stop_gang(db, job, f"node {node_rank}'s agent (worker {worker_id}) stopped", counted=False)
    return job


def runs_as_gang(db: Session, job: Job) -> bool:
    """Whether ``job`` is claimed slot by slot (some slot held), not whole."""
    return job.nodes > 1 and db.scalar(select(JobSlot.id).where(JobSlot.job_id == job.id,
                                                               JobSlot.worker_id.is_not(None)).limit(1)) is not None


def running_rank(db: Session, job: Job, worker_id: int) -> int | None:
    """The node rank ``worker_id`` holds in running gang ``job`` (None: none)."""
    return db.scalar(select(JobSlot.node_rank).where(JobSlot.job_id == job.id, JobSlot.worker_id == worker_id,
                                                     JobSlot.state.in_(("running", "done"))))


def expire_slots(db: Session, now: datetime | None = None) -> list[int]:
    """Slots whose lease ran out: a forming gang's slot opens again; a running gang stops (counted). Returns
    the ids of the running jobs stopped."""
    now = now or utcnow()
    stopped = []
    rows = db.execute(select(JobSlot.id, JobSlot.job_id, JobSlot.node_rank, JobSlot.worker_id, Job.state)
                      .join(Job, Job.id == JobSlot.job_id)
                      .where(JobSlot.lease_expires_at < now, JobSlot.worker_id.is_not(None),
                             JobSlot.state.in_(("held", "running")), Job.state.in_(("queued", "running")))).all()
    for slot_id, job_id, rank, worker_id, state in rows:
        job = db.get(Job, job_id)
        if job is None or job_id in stopped:
            continue
        db.refresh(job)
        if state == "queued":
            if _lock_forming(db, job_id) and _open_slot(db, slot_id, worker_id):
                db.refresh(job)
                _forming_event(db, job, "slot_lease_expired", worker_id=worker_id, node_rank=rank)
        elif stop_gang(db, job, f"node {rank}'s agent (worker {worker_id}) stopped renewing its lease", now=now):
            stopped.append(job_id)
    return stopped


def forming_slots_of(db: Session, worker_id: int) -> list[tuple[int, int]]:
    """(job id, node rank) of the forming gangs' slots ``worker_id`` holds."""
    return [(j, r) for j, r in db.execute(
        select(JobSlot.job_id, JobSlot.node_rank).join(Job, Job.id == JobSlot.job_id)
        .where(JobSlot.worker_id == worker_id, Job.state == "queued"))]


def not_holding(worker_id: int) -> ColumnElement[bool]:
    """Jobs of which ``worker_id`` holds no slot (an agent takes at most one slot of a job)."""
    return ~exists().where(JobSlot.job_id == Job.id, JobSlot.worker_id == worker_id)
