"""Cluster calibration from finished jobs (issue 11 item 5): versions, the fit, prediction errors.

A cluster as uploaded is version 1 of itself. ``calibrate`` fits :class:`planner.cluster.Calibration` to the
finished jobs of every version (:func:`planner.calibrate.fit`, starting from the uncalibrated base) and stores the
result as a new :class:`db.models.ClusterRow` (``base_id`` the uploaded cluster, ``version`` one past the largest
its lineage has handed out, :func:`next_version`): plans made before keep the version they used (their
``cluster_id``), and a plan requested on any version of the cluster afterwards is made on the newest
(:func:`newest_version`). ``errors`` reports each job's measured iteration time against the prediction of the
uncalibrated cluster and of the newest calibration. "Before" is the uncalibrated model in both answers, as in
``pipeplan calibrate``: the fit starts there (its factors are absolute, with the prior at (1, 1, 0)) and replaces
the newest version's calibration rather than refining it. ``calibrate`` also gives each job's prediction on the
newest version as it was (``predicted_given``, None when it had no calibration; ``given_label`` names it), so that
what plans on the cluster predicted until now is shown beside the fit's starting point and its result
(:class:`planner.calibrate.JobError`). Both answers carry ``warnings``: a line for each factor the fit left at a
bound of its physical range (:func:`planner.calibrate.bound_warning`), which says that the model and the
measurements disagree for a reason the factors do not describe.

Calibrating again when nothing changed (the same jobs give the same factors as the newest version's) stores
nothing: the answer is the newest version with ``unchanged`` true (:func:`same_fit`).

A job counts when it succeeded with a stored result and, unless ``include_emulated``, its compute was real; the
newest ``MAX_JOBS`` count. An emulated run is never fitted: it replayed the simulator's own times on CPU processes
(its compute slept them, and on a cluster other than this machine its messages waited them too), so it says nothing
about the devices the factors correct. With ``include_emulated`` it is listed (:func:`emulated_row`) against the
prediction its own comparison uses (:func:`api.comparison.emulation_prediction`, "the simulator on its own terms"),
with a ``note``, and left out of the medians; a QA walkthrough saw one scored against the GPU cluster's 46.00 ms
(-42.8%) where its comparison said 24.74 ms, and fitted with the real jobs, which it made worse (0.0% -> 12.8%).
"""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from api.cluster_versions import calibration_jobs_of, describe, newest_versions
from api.comparison import emulation_prediction
from api.crud import Conflict, InputError, cluster_model, get_cluster, profile_model
from db.models import CandidateRow, ClusterRow, Job, PlanRequest, Profile, Result
from planner.calibrate import Observation, fit, predicted, warnings_of, with_calibration
from planner.cluster import Cluster
from planner.limits import MAX_CALIBRATION_RUNS
from planner.profile import ModelProfile
from planner.request import TrainingRequest
from planner.runspec import config_of

#: the newest finished jobs a fit or an error report reads (each costs a few simulations in the API process)
MAX_JOBS = MAX_CALIBRATION_RUNS


def base_of(db: Session, cluster_id: int) -> ClusterRow:
    """The uploaded cluster (version 1) of ``cluster_id``'s lineage."""
    row = get_cluster(db, cluster_id)
    if row.base_id is not None:
        base = db.get(ClusterRow, row.base_id)
        if base is not None:
            return base
    return row


def versions(db: Session, cluster_id: int) -> list[ClusterRow]:
    """Every version of ``cluster_id``'s lineage, oldest first."""
    base = base_of(db, cluster_id)
    rows = list(db.scalars(select(ClusterRow).where(ClusterRow.base_id == base.id)))
    return [base] + sorted(rows, key=lambda r: (r.version, r.id))


def newest_version(db: Session, cluster_id: int) -> int:
    """The id of the newest version of ``cluster_id``'s lineage (``cluster_id`` itself when never
    calibrated); unknown ids are returned as they are (the caller reports them)."""
    if db.get(ClusterRow, cluster_id) is None:
        return cluster_id
    return versions(db, cluster_id)[-1].id


def _uncalibrated(row: ClusterRow) -> Cluster:
    return with_calibration(cluster_model(row), None)


def _split(done: list[tuple[Observation, Result]]) -> tuple[list[Observation], list[dict[str, Any]]]:
    """:func:`finished`'s jobs as the real-compute ones' observations (what a fit reads) and the emulated ones'
    rows (:func:`emulated_row`: listed, never fitted)."""
    return [o for o, r in done if not r.emulated], [emulated_row(o, r) for o, r in done if r.emulated]


def emulated_row(o: Observation, res: Result) -> dict[str, Any]:
    """An emulated run's row of the jobs table: measured against the prediction its comparison uses
    (:func:`api.comparison.emulation_prediction`), no prediction before or after (a calibration does not change
    what it replayed), and a note saying why it is not fitted (module docstring)."""
    own = emulation_prediction(res)
    against = (f"its comparison (GET /jobs/{o.job_id}/comparison) scores it against {own * 1e3:.2f} ms, the "
               f"simulator on its own terms (measured/that {o.measured / own:.3f})" if own is not None else
               "it reported no prediction of its own")
    return {"job_id": o.job_id, "label": o.config.label(), "measured": o.measured, "emulated": True,
            "predicted_before": None, "predicted_after": None, "relative_error_before": None,
            "relative_error_after": None, "predicted_emulation": own,
            "relative_error_emulation": (o.measured - own) / own if own is not None else None,
            "note": f"emulated: not fitted and not in the medians, its compute slept the simulator's own times, so it "
                    f"says nothing about the cluster's devices; {against}"}


def finished(db: Session, cluster_id: int, include_emulated: bool = False) -> list[tuple[Observation, Result]]:
    """The finished jobs of every version of the cluster, each as an observation with its result, oldest first."""
    ids = [r.id for r in versions(db, cluster_id)]
    q = (select(Job, Result, PlanRequest, CandidateRow)
         .join(Result, Result.job_id == Job.id)
         .join(PlanRequest, PlanRequest.id == Job.plan_id)
         .join(CandidateRow, (CandidateRow.plan_id == Job.plan_id) & (CandidateRow.rank == Job.candidate_index))
         .where(PlanRequest.cluster_id.in_(ids), Job.state == "succeeded")
         .order_by(Job.id.desc()).limit(MAX_JOBS))
    if not include_emulated:
        q = q.where(Result.emulated.is_(False))
    profiles: dict[int, ModelProfile] = {}
    out = []
    for job, res, plan, cand in db.execute(q):
        if plan.profile_id not in profiles:
            prow = db.get(Profile, plan.profile_id)
            if prow is None:  # pragma: no cover - profiles in use cannot be deleted
                continue
            profiles[plan.profile_id] = profile_model(prow)
        body = cand.body or {}
        config = config_of(body)  # (with PipeDream's replication, where it has one)
        # what the job ran: pipeplan's executor keeps whole weights and optimizer state and all-reduces the
        # gradients whatever the plan shards (planner.mismatch), so its time is predicted unsharded
        request = TrainingRequest.model_validate(plan.request).model_copy(
            update={"shard_optimizer": False, "shard_parameters": False})
        out.append((Observation(profiles[plan.profile_id], request, config, float(res.iteration_time), job.id), res))
    return out[::-1]


def _errors(obs: list[Observation], before: Cluster, after: Cluster) -> list[dict[str, Any]]:
    rows = []
    for o in obs:
        p0, p1 = predicted(o, before), predicted(o, after)
        rows.append({"job_id": o.job_id, "label": o.config.label(), "measured": o.measured,
                     "predicted_before": p0, "predicted_after": p1,
                     "relative_error_before": (o.measured - p0) / p0, "relative_error_after": (o.measured - p1) / p1})
    return rows


def _summary(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [abs(r[key]) for r in rows if r[key] is not None and math.isfinite(r[key])]
    return median(vals) if vals else None


#: the fields of a stored calibration that say what was fitted (``notes`` only say how; they name the versions)
FIT_FIELDS = ("compute_scale", "link_scale", "action_overhead", "jobs", "fitted")


def same_fit(stored: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether a stored calibration (a cluster body's ``calibration``) has the factors, job count and fitted
    names of ``new`` (floats to 1e-12 relative: a JSON round trip through PostgreSQL keeps them exactly, this
    only guards the comparison)."""
    if not stored:
        return False
    for k in FIT_FIELDS:
        a, b = stored.get(k), new.get(k)
        if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
            if not math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0):
                return False
        elif a != b:
            return False
    return True


def next_version(db: Session, base: ClusterRow) -> int:
    """The number of a new version of ``base``'s lineage: one past the largest ever handed out, kept on the base
    row (``last_version``, migration 0008), so that the number of a deleted version is not given again; counted
    up in the database (one UPDATE of the base row: two calibrations at once get two numbers)."""
    stored = max(base.version, db.scalar(select(func.max(ClusterRow.version)).where(ClusterRow.base_id == base.id))
                 or 1)
    got = db.execute(update(ClusterRow).where(ClusterRow.id == base.id)
                     .values(last_version=case((ClusterRow.last_version > stored, ClusterRow.last_version),
                                               else_=stored) + 1)
                     .returning(ClusterRow.last_version)).scalar()
    if got is None:  # deleted since the lineage was read (DELETE /clusters/{id} of an uploaded one no plan uses)
        raise Conflict(f"cluster {base.id} was deleted meanwhile; its versions are clusters of their own now")
    return int(got)


def calibrate(db: Session, cluster_id: int, include_emulated: bool = False) -> dict[str, Any]:
    """Fit the factors to the lineage's finished jobs and store them as a new version (module docstring)."""
    lineage = versions(db, cluster_id)
    base = lineage[0]
    done = finished(db, cluster_id, include_emulated)
    obs, emulated = _split(done)
    if not obs:
        raise Conflict(f"cluster {cluster_id}: no finished job with a measured result to calibrate from"
                       + (f" ({len(done)} emulated run(s): they replay the simulator's own times, so they say "
                          "nothing about the devices and are never fitted)" if done else
                          "" if include_emulated else " (emulated runs are left out; include_emulated=true lists "
                          "them, never fits them)"))
    given = cluster_model(lineage[-1])  # what plans on the cluster use now; the fit starts uncalibrated
    try:
        res = fit(given, obs, notes=f"fitted by the API to {len(obs)} finished job(s) of cluster "
                  f"{base.id} (versions {', '.join(str(r.version) for r in lineage)})")
    except ValueError as e:
        raise InputError(str(e)) from None
    fitted = res.calibration.model_dump(mode="json")
    unchanged = lineage[-1].version > 1 and same_fit((lineage[-1].body or {}).get("calibration"), fitted)
    cluster = with_calibration(_uncalibrated(base), res.calibration)
    h = cluster.content_hash()
    row = lineage[-1] if unchanged else db.scalar(select(ClusterRow).where(ClusterRow.content_hash == h))
    if row is None:
        row = ClusterRow(content_hash=h, name=base.name, device=base.device, gpus=base.gpus,
                         body=cluster.model_dump(mode="json"), base_id=base.id, version=next_version(db, base),
                         calibration_jobs=calibration_jobs_of(cluster))
        db.add(row)
        db.flush()
    newest = newest_versions(db, [row]).get(base.id)
    stored = (row.body or {}).get("calibration") if unchanged else fitted
    return {"cluster_id": row.id, "base_id": base.id, "version": row.version, **describe(row, newest),
            "calibration": stored, "unchanged": unchanged, "warnings": warnings_of(stored),
            "given_label": describe(lineage[-1], newest)["label"] if given.calibration is not None else None,
            "rounds": res.rounds, "jobs": _in_order([j.to_dict() for j in res.jobs], emulated)}


def _in_order(rows: list[dict[str, Any]], emulated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fitted jobs' rows and the emulated ones', oldest job first."""
    return sorted(rows + emulated, key=lambda r: r["job_id"]) if emulated else rows


def errors(db: Session, cluster_id: int, include_emulated: bool = False) -> dict[str, Any]:
    """Each finished real job's error against the uncalibrated cluster and against the newest version (an
    emulated one, with ``include_emulated``: :func:`emulated_row`)."""
    lineage = versions(db, cluster_id)
    base, newest = lineage[0], lineage[-1]
    obs, emulated = _split(finished(db, cluster_id, include_emulated))
    after = cluster_model(newest)
    try:
        rows = _in_order(_errors(obs, _uncalibrated(base), after), emulated)
    except ValueError as e:
        raise InputError(str(e)) from None
    return {"cluster_id": cluster_id, "base_id": base.id, "newest_id": newest.id, "newest_version": newest.version,
            "versions": [{"id": r.id, "version": r.version} for r in lineage],
            "calibration": newest.body.get("calibration"), "warnings": warnings_of(newest.body.get("calibration")),
            "median_abs_error_before": _summary(rows, "relative_error_before"),
            "median_abs_error_after": _summary(rows, "relative_error_after"), "jobs": rows}
