"""``GET /plans/{id}/candidates/{rank}/export?format=...``: a stored candidate in a training framework's
terms (:mod:`planner.export`). A schedule the framework lacks is answered 422 with the closest it has,
the predicted cost of switching to it -- both configurations predicted in a planner process, as
timelines are (:mod:`api.planrun`) -- and the plan's fastest candidate that it runs."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api import crud
from api.errors import InputError


def switch_cost(profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any],
                framework: str, spec: dict[str, Any], closest: dict[str, Any], reason: str,
                others: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """The refusal's closest configuration and cost sentence; runs in a planner process. ``closest`` and ``others``:
    the framework's stand-ins (:attr:`planner.export.UnsupportedSchedule.choices`); the one named is the fastest
    that fits, as ``pipeplan export`` names it (:func:`planner.export.switch.best_closest`), ``closest`` its run
    spec, ``cost`` :func:`planner.export.switch.switch_cost`'s sentence for it."""
    from planner.cluster import Cluster
    from planner.export.common import UnsupportedSchedule
    from planner.export.switch import best_closest
    from planner.export.switch import switch_cost as cost
    from planner.profile import ModelProfile
    from planner.request import TrainingRequest
    from planner.runspec import RunSpec

    err = UnsupportedSchedule(framework, RunSpec.model_validate(spec), RunSpec.model_validate(closest), reason,
                              tuple(RunSpec.model_validate(o) for o in others))
    prof, cl = ModelProfile.model_validate(profile), Cluster.model_validate(cluster)
    req = TrainingRequest.model_validate(request)
    err = best_closest(err, prof, cl, req)[0]
    return {"cost": cost(err, prof, cl, req), "closest": err.closest.model_dump(mode="json")}


def candidate_export(db: Session, runner: Any, timeout: float, plan_id: int, rank: int, fmt: str) -> dict[str, Any]:
    """The export document: ``format``, ``files`` (``name``, ``content``, ``media_type``; the first is the
    main one), ``notes``, ``label``."""
    from planner.export import ExportError, ExportInput, UnsupportedSchedule, framework
    from planner.export.common import best_supported_note, export_same_run
    from planner.runspec import RunSpec

    row = crud.get_candidate(db, plan_id, rank)
    prof, cl = crud.plan_models(db, plan_id)
    module = framework(fmt)
    spec = RunSpec.from_document(row.body)
    try:
        inp = ExportInput.from_profile(spec, prof, gpus_per_node=cl.gpus_per_node,
                                       predicted=row.body.get("iteration_time"), candidate=rank,
                                       shard_optimizer=bool(row.body.get("shard_optimizer")),
                                       shard_parameters=bool(row.body.get("shard_parameters")))
    except ExportError as e:
        raise InputError(str(e)) from None
    try:
        exported = export_same_run(module, inp, row.body.get("alternatives") or ())
    except UnsupportedSchedule as err:
        profile, cluster, request = crud.plan_inputs(db, plan_id)  # for a planner process
        status, payload = runner.task("switch_cost", (profile, cluster, request, err.framework,
                                                       err.spec.model_dump(mode="json"),
                                                       err.closest.model_dump(mode="json"), err.reason,
                                                       [o.model_dump(mode="json") for o in err.others]),
                                      timeout).result(timeout=timeout + 10)
        cost = payload["cost"] if status == "ok" else f"its cost could not be predicted ({payload})"
        if status == "ok":  # the stand-in the cost is of: of those alike, one that fits, the fastest
            err = err.with_closest(RunSpec.model_validate(payload["closest"]))
        cands = [c.body for c in crud.get_plan(db, plan_id).candidates]
        # the rank the path takes: /candidates/{rank} counts from 0, as candidate_index does
        ref = "rank {i} (candidate_index {i}, #{n} on the plan page)"
        raise InputError(err.describe(cost) + " " + best_supported_note(module.TITLE, module.check, cands, ref=ref)
                         + ".") from None
    except ExportError as e:
        raise InputError(str(e)) from None
    return {"format": exported.format, "label": spec.config.label(), "notes": list(exported.notes),
            "files": [{"name": f.name, "content": f.content, "media_type": f.media_type} for f in exported.files]}
