"""Database operations of the API (no HTTP here): create, list, get and delete of profiles, clusters, plans,
jobs and workers. Apart: the lease state machines (jobs :mod:`api.jobqueue`, plans :mod:`api.planqueue`),
the predicted-vs-measured comparison (:mod:`api.comparison`), the gauges (:mod:`api.metrics`)."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer, selectinload

from api.cluster_versions import calibration_jobs_of
from api.errors import Busy, Conflict, InputError, NotFound, stored
from api.gang import canonical_device
from api.jobqueue import get_job, record_event
from db.models import CandidateRow, CandidateTimeline, ClusterRow, Job, PlanRequest, Profile, Result, Worker, utcnow
from planner.cluster import Cluster
from planner.profile import ModelProfile
from planner.request import TrainingRequest
from planner.reserve import CPU_RESERVE_BYTES, reserve_error, resolve_reserve
from planner.units import devices

__all__ = ["Busy", "Conflict", "InputError", "NotFound", "get_job"]


def check_text(value: str, field: str, max_length: int = 200) -> str:
    if len(value) > max_length:
        raise InputError(f"{field}: at most {max_length} characters, got {len(value)}")
    if "\x00" in value:
        raise InputError(f"{field}: must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{field}: not valid Unicode text ({e.reason})") from None
    return value


# ---- profiles and clusters ------------------------------------------------------------------------

T = TypeVar("T")


def stored_once(db: Session, add: Callable[[], tuple[T, bool]]) -> tuple[T, bool]:
    """``add()`` -- :func:`add_profile` or :func:`add_cluster` of an upload, :func:`create_plan` of a request: a
    look-up by content (or request) hash, then an insert -- where identical uploads may arrive at once: one that
    committed between this request's look-up and its insert fails the insert on the unique hash; the request's
    transaction (it holds nothing but that insert) is rolled back and the look-up finds the stored row (200, as
    for an upload sent after it). An insert that failed on a foreign key (the plan's profile or cluster deleted
    meanwhile) is looked up again the same way, and the second look-up says what is missing (422). Not for a
    session with other work in it (the seeding): the rollback would drop that too."""
    try:
        return add()
    except IntegrityError:
        db.rollback()
        return add()


def add_profile(db: Session, profile: ModelProfile) -> tuple[Profile, bool]:
    """Store ``profile`` unless one with the same content hash exists; return (row, created)."""
    check_text(profile.name, "name")
    check_text(profile.device, "device")
    check_text(profile.dtype, "dtype", 32)
    h = profile.content_hash()
    row = db.scalar(select(Profile).where(Profile.content_hash == h))
    if row is not None:
        return row, False
    row = Profile(content_hash=h, name=profile.name, device=profile.device, dtype=profile.dtype,
                  source=profile.source, num_layers=len(profile.layers), total_params=float(profile.total_params),
                  body=profile.model_dump(mode="json"))
    db.add(row)
    db.flush()
    return row, True


def _listed(db: Session, model: Any, name: str | None, device: str | None, limit: int, offset: int) -> list[Any]:
    """Rows of a versioned input table (profiles, clusters) by id, filtered by name and device; the
    documents are not loaded (a list shows summaries)."""
    q = select(model).options(defer(model.body)).order_by(model.id)
    if name is not None:
        q = q.where(model.name == name)
    if device is not None:
        q = q.where(model.device == device)
    return list(db.scalars(q.limit(limit).offset(offset)))


def _got(db: Session, model: Any, what: str, row_id: int) -> Any:
    row = db.get(model, row_id)
    if row is None:
        raise NotFound(f"{what} {row_id} not found")
    return row


def _delete_unused(db: Session, model: Any, what: str, used_by: Any, row_id: int) -> None:
    """Delete an input row unless a plan refers to it (``used_by``: the plan column naming it)."""
    row = _got(db, model, what, row_id)
    used = db.scalar(select(func.count()).select_from(PlanRequest).where(used_by == row_id))
    if used:
        raise Conflict(f"{what} {row_id} is used by {used} plan(s); delete is refused to keep them valid")
    db.delete(row)
    try:
        db.flush()
    except IntegrityError:  # a plan of it was stored between the count and the delete (its foreign key)
        raise Conflict(f"{what} {row_id} is used by a plan stored meanwhile; delete is refused to keep it "
                       "valid") from None


def list_profiles(db: Session, name: str | None, device: str | None, limit: int, offset: int) -> list[Profile]:
    return _listed(db, Profile, name, device, limit, offset)


def get_profile(db: Session, profile_id: int) -> Profile:
    return _got(db, Profile, "profile", profile_id)


def delete_profile(db: Session, profile_id: int) -> None:
    _delete_unused(db, Profile, "profile", PlanRequest.profile_id, profile_id)


def add_cluster(db: Session, cluster: Cluster, max_gpus: int) -> tuple[ClusterRow, bool]:
    check_text(cluster.name, "name")
    check_text(cluster.device, "device")
    if cluster.gpus > max_gpus:
        raise InputError(f"nodes * gpus_per_node = {cluster.gpus} exceeds this server's limit of {max_gpus} GPUs")
    h = cluster.content_hash()
    row = db.scalar(select(ClusterRow).where(ClusterRow.content_hash == h))
    if row is not None:
        return row, False
    row = ClusterRow(content_hash=h, name=cluster.name, device=cluster.device, gpus=cluster.gpus,
                     body=cluster.model_dump(mode="json"), calibration_jobs=calibration_jobs_of(cluster))
    db.add(row)
    db.flush()
    return row, True


def list_clusters(db: Session, name: str | None, device: str | None, limit: int, offset: int) -> list[ClusterRow]:
    return _listed(db, ClusterRow, name, device, limit, offset)


def get_cluster(db: Session, cluster_id: int) -> ClusterRow:
    return _got(db, ClusterRow, "cluster", cluster_id)


def delete_cluster(db: Session, cluster_id: int) -> None:
    _delete_unused(db, ClusterRow, "cluster", PlanRequest.cluster_id, cluster_id)


# ---- plans ----------------------------------------------------------------------------------------------

def request_hash(profile_id: int, cluster_id: int, request: dict[str, Any]) -> str:
    data = json.dumps({"profile": profile_id, "cluster": cluster_id, "request": request}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def create_plan(db: Session, profile_id: int, cluster_id: int, request: dict[str, Any], *, max_gpus: int,
                max_unfinished: int) -> tuple[PlanRequest, bool]:
    """A new queued plan request, or the stored one with the same inputs (not failed): (row, created).
    :class:`Busy` when ``max_unfinished`` plans are already queued or running. Identical requests at once: the
    unique index of live plans (db.models.PlanRequest) fails all inserts but one; run it in :func:`stored_once`,
    which answers those with the stored row."""
    profile = db.get(Profile, profile_id)
    if profile is None:
        raise InputError(f"profile_id: profile {profile_id} not found")
    cluster = db.get(ClusterRow, cluster_id)
    if cluster is None:
        raise InputError(f"cluster_id: cluster {cluster_id} not found")
    gpus = request.get("gpus")
    if gpus is not None and gpus > cluster.gpus:
        raise InputError(f"gpus: budget {gpus} exceeds the cluster's {devices(cluster.device, cluster.gpus)}")
    if (gpus or cluster.gpus) > max_gpus:
        raise InputError(f"gpus: a plan may use at most {max_gpus} GPUs; cluster {cluster_id} has {cluster.gpus}: "
                         "give a smaller 'gpus' budget")
    cl = cluster_model(cluster)
    resolved, _ = resolve_reserve(TrainingRequest.model_validate(request), cl)  # the request's, or the device's
    given = request.get("memory_reserve_bytes") is not None
    if (why := reserve_error(resolved.memory_reserve_bytes or 0, cl.memory_bytes, given)) is not None:
        raise InputError(why)
    h = request_hash(profile_id, cluster_id, request)
    existing = db.scalar(select(PlanRequest).where(PlanRequest.request_hash == h, PlanRequest.status != "failed")
                         .order_by(PlanRequest.id.desc()).limit(1))
    if existing is not None:
        return existing, False
    profile_model(profile)
    from api.planqueue import unfinished_count

    waiting = unfinished_count(db)
    if waiting >= max_unfinished:
        raise Busy(f"the plan queue is full ({waiting} plans queued or running, the limit is {max_unfinished} "
                   "(PIPEPLAN_MAX_QUEUED_PLANS)): retry later", retry_after=10)
    row = PlanRequest(profile_id=profile_id, cluster_id=cluster_id, request=request, request_hash=h,
                      status="queued", attempts=0)
    db.add(row)
    db.flush()
    return row, True


def get_plan(db: Session, plan_id: int) -> PlanRequest:
    row = db.get(PlanRequest, plan_id)
    if row is None:
        raise NotFound(f"plan {plan_id} not found")
    return row


def list_plans(db: Session, status: str | None, profile_id: int | None, limit: int, offset: int) -> list[PlanRequest]:
    q = select(PlanRequest).options(defer(PlanRequest.summary)).order_by(PlanRequest.id)
    if status is not None:
        q = q.where(PlanRequest.status == status)
    if profile_id is not None:
        q = q.where(PlanRequest.profile_id == profile_id)
    return list(db.scalars(q.limit(limit).offset(offset)))


def count_candidates(db: Session, plan_ids: list[int]) -> dict[int, int]:
    if not plan_ids:
        return {}
    rows = db.execute(select(CandidateRow.plan_id, func.count()).where(CandidateRow.plan_id.in_(plan_ids))
                      .group_by(CandidateRow.plan_id))
    return {pid: n for pid, n in rows}


def profile_model(row: Profile) -> ModelProfile:
    """The stored profile as a model, held to today's rules: a row stored by an earlier version may break a
    rule added since (:func:`api.errors.stored`: 422 naming the row, the field and the rule)."""
    return stored(ModelProfile, row.body, f"profile {row.id}", "upload a corrected profile (POST /profiles)")


def cluster_model(row: ClusterRow) -> Cluster:
    """The stored cluster as a model, held to today's rules (as :func:`profile_model`)."""
    return stored(Cluster, row.body, f"cluster {row.id}", "upload a corrected cluster (POST /clusters)")


def plan_inputs(db: Session, plan_id: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The plan's profile and cluster documents, each checked against today's rules (:func:`profile_model`,
    :func:`cluster_model`), and its request: what a planner process is given."""
    row = get_plan(db, plan_id)
    profile, cluster = get_profile(db, row.profile_id), get_cluster(db, row.cluster_id)
    profile_model(profile)
    cluster_model(cluster)
    return profile.body, cluster.body, row.request


def plan_models(db: Session, plan_id: int) -> tuple[ModelProfile, Cluster]:
    """The plan's profile and cluster as models (:func:`profile_model`, :func:`cluster_model`), for work done
    in the API's own process."""
    row = get_plan(db, plan_id)
    return profile_model(get_profile(db, row.profile_id)), cluster_model(get_cluster(db, row.cluster_id))


def plan_document(row: PlanRequest) -> dict[str, Any]:
    """The stored plan as ``pipeplan plan --json`` prints it."""
    summary = row.summary or {}
    return {"candidates": [c.body for c in row.candidates], **summary}


# ---- jobs -----------------------------------------------------------------------------------------------

def create_job(db: Session, spec: dict[str, Any], default_attempts: int, max_node_processes: int = 256) -> Job:
    plan = db.get(PlanRequest, spec["plan_id"])
    if plan is None:
        raise InputError(f"plan_id: plan {spec['plan_id']} not found")
    if plan.status != "done":
        raise Conflict(f"plan_id: plan {plan.id} is {plan.status}; jobs can be made from done plans only"
                       + (f" (error: {plan.error})" if plan.error else ""))
    n = len(plan.candidates)
    if n == 0:
        raise InputError(f"candidate_index: plan {plan.id} has no candidates (no configuration fits; its "
                         f"'rejected' says why): nothing to run")
    if spec["candidate_index"] >= n:
        raise InputError(f"candidate_index: plan {plan.id} has {n} candidate(s) (0..{n - 1}), "
                         f"got {spec['candidate_index']}")
    from api.gang import make_slots, placement

    if not spec["emulate"]:
        _model_fits_profile(db, plan, spec["model"])
    candidate = plan.candidates[spec["candidate_index"]].body
    _executor_runs(plan.id, spec["candidate_index"], candidate)
    where = placement(candidate, get_cluster(db, plan.cluster_id).body, bool(spec["emulate"]),
                      spec.get("gpus_per_node"))
    _node_holds(plan.id, spec, where, max_node_processes)
    # an emulated job builds no model (JobCreate): stored as "", the column holds a name or nothing
    job = Job(plan_id=plan.id, candidate_index=spec["candidate_index"], model=spec["model"] or "",
              iterations=spec["iterations"], emulate=spec["emulate"], state="queued", attempts=0,
              max_attempts=spec.get("max_attempts") or default_attempts, history=[], **where)
    make_slots(job)
    record_event(job, "created", **where)
    db.add(job)
    db.flush()
    return job


def _node_holds(plan_id: int, spec: dict[str, Any], where: dict[str, Any], max_node_processes: int) -> None:
    """An agent starts a node's processes together on its host, each a gloo process of about
    planner.reserve.CPU_RESERVE_BYTES before any model (executor/cli.py refuses more than the host's available
    memory holds, after the claim). The API does not know an agent's memory; it refuses a placement of more than
    ``max_node_processes`` (PIPEPLAN_MAX_NODE_PROCESSES) per node here: an emulated job of a 1024-GPU plan, placed
    on one node, was queued as 1 node x 1024 processes (about 320 GiB) and failed on the CPU agent."""
    procs, nodes = where.get("procs_per_node"), where["nodes"]
    if procs is None or procs <= max_node_processes:
        return
    field = "gpus_per_node" if spec.get("gpus_per_node") else "candidate_index"
    how = ("gpus_per_node" if spec.get("gpus_per_node") else
           "an emulated job runs on one node unless gpus_per_node says otherwise" if spec["emulate"] else
           "the plan's cluster's gpus_per_node")
    world = procs * nodes
    raise InputError(
        f"{field}: candidate {spec['candidate_index']} of plan {plan_id} needs t*D*W = {world} processes, placed as "
        f"{nodes} node(s) x {procs} processes ({how}); this server places at most {max_node_processes} processes "
        f"on one node (PIPEPLAN_MAX_NODE_PROCESSES: an agent starts them on one host, each about "
        f"{CPU_RESERVE_BYTES / 2**20:.0f} MiB before any model, planner.reserve; {procs} need about "
        f"{procs * CPU_RESERVE_BYTES / 2**30:.0f} GiB): give a gpus_per_node of at most {max_node_processes} to "
        f"spread it over agents, or dispatch a candidate with fewer processes")


def _executor_runs(plan_id: int, index: int, candidate: dict[str, Any]) -> None:
    """A candidate pipeplan's executor does not run (planner.runspec.executor_refusal: the planner ranks for
    any runtime) is refused here, not queued to fail on the agent ("the run exited with code 2")."""
    from planner.runspec import config_of, executor_refusal

    try:
        refusal = executor_refusal(config_of(candidate))
    except ValueError:  # a row stored under earlier rules: the placement below names what is wrong with it
        return
    if refusal is not None:
        raise InputError(f"candidate_index: candidate {index} of plan {plan_id} is not run by pipeplan's executor "
                         f"({refusal}); export it to a framework that runs it, or dispatch another candidate")


def _model_fits_profile(db: Session, plan: PlanRequest, model: str) -> None:
    """A real run builds ``model`` and cuts it by the plan's partition, which covers the plan's profile's
    layers; a model of another layer count would fail on the agent after a claim ("partition does not cover
    the model", executor/plan.py): refused here, naming the presets that fit or emulation (which runs the
    profile's own layers with any model)."""
    from planner.model import PRESETS, get_model

    profile = get_profile(db, plan.profile_id)
    env = (profile.body or {}).get("environment") or {}
    try:
        spec_name = json.loads(env.get("model_spec", "{}")).get("name")
    except (ValueError, AttributeError, RecursionError):
        spec_name = None
    named = env.get("model") or spec_name or profile.name  # the model the profile is of
    if named in PRESETS and named != model:
        # (a bert-tiny run of a gpt-tiny plan ran, was compared with gpt-tiny's prediction and fitted in calibration)
        raise InputError(f"model: {model}, but plan {plan.id}'s profile {profile.name!r} is of {named}: a run of "
                         f"another model measures something other than what was predicted; use {named}, or "
                         "emulate the profile (\"emulate\": true, no model needed)")
    have, want = get_model(model).profile_layers, profile.num_layers
    if have == want:
        return
    fit = sorted(n for n, s in PRESETS.items() if s.profile_layers == want)
    use = f"use a model of {want} layers ({', '.join(fit)}), or " if fit else ""
    raise InputError(f"model: {model} has {have} layers (embedding, {have - 2} blocks, head) but plan {plan.id}'s "
                     f"profile {profile.name!r} has {want}: the run would fail; {use}emulate the profile "
                     f"(\"emulate\": true, no model needed)")


def list_jobs(db: Session, state: str | None, plan_id: int | None, limit: int, offset: int) -> list[Job]:
    q = select(Job).options(selectinload(Job.slots)).order_by(Job.id)
    if state is not None:
        q = q.where(Job.state == state)
    if plan_id is not None:
        q = q.where(Job.plan_id == plan_id)
    return list(db.scalars(q.limit(limit).offset(offset)))


def iteration_times(db: Session, job_ids: list[int]) -> dict[int, tuple[float | None, float | None]]:
    """Each job's (predicted, measured) iteration time in seconds: its candidate's prediction and, once it has
    a result, the measured one (None where there is none), in one query."""
    if not job_ids:
        return {}
    q = (select(Job.id, CandidateRow.iteration_time, Result.iteration_time)
         .outerjoin(CandidateRow, (CandidateRow.plan_id == Job.plan_id) & (CandidateRow.rank == Job.candidate_index))
         .outerjoin(Result, Result.job_id == Job.id)
         .where(Job.id.in_(job_ids)))
    return {jid: (pred, meas) for jid, pred, meas in db.execute(q)}


def plan_clusters(db: Session, plan_ids: list[int]) -> dict[int, int]:
    """Each plan's cluster id: the cluster version it was made on (api/cluster_versions.py), in one query."""
    if not plan_ids:
        return {}
    q = select(PlanRequest.id, PlanRequest.cluster_id).where(PlanRequest.id.in_(set(plan_ids)))
    return {pid: cid for pid, cid in db.execute(q)}


def get_result(db: Session, job_id: int) -> Result:
    """The job's measured result; 404 saying why there is none: not yet (queued or running), or never (it
    failed or was cancelled without one)."""
    job = get_job(db, job_id)
    res = db.scalar(select(Result).where(Result.job_id == job_id))
    if res is None:
        if job.state in ("failed", "cancelled"):
            raise NotFound(f"job {job_id} {job.state} without a result")
        raise NotFound(f"job {job_id} has no result yet (it is {job.state})")
    return res


def job_candidate(db: Session, job: Job) -> dict[str, Any]:
    row = db.scalar(select(CandidateRow).where(CandidateRow.plan_id == job.plan_id,
                                               CandidateRow.rank == job.candidate_index))
    return row.body if row is not None else {}


# ---- workers --------------------------------------------------------------------------------------------

def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def register_worker(db: Session, spec: dict[str, Any], *, credential: str | None = None,
                    admin: bool = False) -> tuple[Worker, bool, str | None]:
    """Register an agent by its unique name: (row, created, new credential or None).

    A new name gets a new worker and its own credential (returned once; only its hash is stored). A known
    name is updated only by that worker itself (``credential`` is its own, which it keeps) or by the admin
    (who gets the worker a fresh credential, cutting off the old one): the shared registration token alone
    never hands over an existing identity (:class:`Conflict`)."""
    for f in ("name", "node", "device_type"):
        check_text(spec[f], f)
    if spec.get("host") is not None:
        check_text(spec["host"], "host")
    row = db.scalar(select(Worker).where(Worker.name == spec["name"]))
    created, issued = row is None, None
    if row is None:
        row = Worker(name=spec["name"])
        db.add(row)
    elif row.token_hash is None or (credential is not None and row.token_hash == token_hash(credential)):
        pass  # a row from before credentials existed, or the worker itself
    elif not admin:
        raise Conflict(f"name: worker {spec['name']!r} is registered (id {row.id}); re-registering it needs its own "
                       "credential (or the admin token); choose another name")
    if row.token_hash is None or (admin and not created and credential is None):
        issued = "pw_" + secrets.token_urlsafe(32)
        row.token_hash = token_hash(issued)
    row.node, row.gpus, row.device_type = spec["node"], spec["gpus"], canonical_device(spec["device_type"])
    row.host = spec.get("host")
    row.last_heartbeat = utcnow()
    db.flush()
    return row, created, issued


def worker_by_credential(db: Session, credential: str) -> Worker | None:
    return db.scalar(select(Worker).where(Worker.token_hash == token_hash(credential)))


def get_worker(db: Session, worker_id: int) -> Worker:
    row = db.get(Worker, worker_id)
    if row is None:
        raise NotFound(f"worker {worker_id} not found (register first)")
    return row


def heartbeat(db: Session, worker_id: int, declared: dict[str, Any] | None = None) -> Worker:
    """The worker is alive; ``declared`` (GPUs, device type, host; each optional) updates what it has."""
    row = get_worker(db, worker_id)
    row.last_heartbeat = utcnow()
    for k, v in (declared or {}).items():
        if v is not None:
            if isinstance(v, str):
                check_text(v, k)
            setattr(row, k, canonical_device(v) if k == "device_type" else v)
    return row


def list_workers(db: Session, limit: int, offset: int) -> list[Worker]:
    return list(db.scalars(select(Worker).order_by(Worker.id).limit(limit).offset(offset)))


def alive(worker: Worker, alive_seconds: float, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    return (now - worker.last_heartbeat).total_seconds() <= alive_seconds


# ---- candidate timelines (stored apart from the candidates) ------------------------------------------

def get_candidate(db: Session, plan_id: int, rank: int) -> CandidateRow:
    """Candidate ``rank`` (0 = best) of a plan."""
    plan = get_plan(db, plan_id)
    if plan.status in ("queued", "running"):  # (it had "no candidate 0": a 404 a client does not retry)
        raise Conflict(f"plan {plan_id} is {plan.status}: its candidates are known once it is done "
                       f"(GET /plans/{plan_id} until its status is done)")
    row = db.scalar(select(CandidateRow).where(CandidateRow.plan_id == plan_id, CandidateRow.rank == rank))
    if row is None:
        n = count_candidates(db, [plan_id]).get(plan_id, 0)
        raise NotFound(f"plan {plan_id} has no candidate {rank} ({n} candidate(s), status {plan.status})")
    return row


def get_timeline(db: Session, plan_id: int, rank: int) -> dict[str, Any] | None:
    return db.scalar(select(CandidateTimeline.body).where(CandidateTimeline.plan_id == plan_id,
                                                           CandidateTimeline.rank == rank))


def store_timeline(db: Session, plan_id: int, rank: int, body: dict[str, Any]) -> None:
    """Keep a computed timeline (a concurrent request that stored it first wins; the two are equal)."""
    if get_timeline(db, plan_id, rank) is None:
        db.add(CandidateTimeline(plan_id=plan_id, rank=rank, body=body))
        db.flush()
