"""The predicted cost of switching a candidate to the closest schedule a framework has: both
configurations predicted by the planner's own path (:func:`planner.search.predict`: schedule, partition,
memory check, simulation), so the difference is the model's, not a rule of thumb."""

from __future__ import annotations

import math

from planner.cluster import Cluster
from planner.export.common import UnsupportedSchedule
from planner.jsondoc import flag
from planner.profile import ModelProfile
from planner.request import ADAM_OPTIMIZER_BYTES, Config, TrainingRequest


def _predict(profile: ModelProfile, cluster: Cluster, request: TrainingRequest, config: Config) -> tuple[float, str]:
    from planner.search import predict

    cand = predict(profile, cluster, request, config)
    return cand.iteration_time, ("" if cand.fits else cand.reason)


def request_of(doc: dict, global_batch: int) -> TrainingRequest:
    """The request a stored candidate (``plan --json``'s, which carries no request) was planned under, as far as
    its cost depends on it: the sharded optimizer (or all the state sharded) and the model state per parameter it held
    (``state_bytes_per_param`` at its W, the inverse of :meth:`TrainingRequest.state_bytes_per_param`: Adam's
    12 optimizer bytes of them split over W when sharded), and the memory reserve it was checked with."""
    shard = flag(doc, "shard_optimizer")
    whole = flag(doc, "shard_parameters")  # all the state sharded (planner.fsdp)
    W = int(doc.get("data") or 1)
    state = doc.get("state_bytes_per_param")
    kw: dict = {"global_batch": global_batch, "shard_optimizer": shard, "shard_parameters": whole}
    if isinstance(state, int | float) and state > 0 and whole:
        kw["bytes_per_param"] = state * W
    elif isinstance(state, int | float) and state > 0:
        total = state + (ADAM_OPTIMIZER_BYTES * (1 - 1 / W) if shard and W > 1 else 0.0)
        if not shard or total >= ADAM_OPTIMIZER_BYTES:  # (under Adam's 12 bytes: a custom optimizer, left default)
            kw["bytes_per_param"] = total
    reserve = doc.get("memory_reserve")
    if isinstance(reserve, int | float) and reserve >= 0:
        kw["memory_reserve_bytes"] = float(reserve)
    return TrainingRequest(**kw)


def best_closest(err: UnsupportedSchedule, profile: ModelProfile, cluster: Cluster,
                 request: TrainingRequest | None = None) -> tuple[UnsupportedSchedule, float, str]:
    """The refusal naming, of the framework's stand-ins for the candidate (:attr:`UnsupportedSchedule.choices`,
    most alike first), the one to export: the first that fits in memory by the planner's prediction, the fastest
    of those (ties: the more alike); when none fits, the most alike. With its predicted iteration time (inf when
    it does not fit) and why it does not fit ("" when it does). ``request`` default: the candidate's global
    batch."""
    req = request or TrainingRequest(global_batch=err.spec.global_batch)
    req = req.model_copy(update={"global_batch": err.spec.global_batch})
    costs = [_predict(profile, cluster, req, s.config) for s in err.choices]
    fitting = [i for i, (t, why) in enumerate(costs) if not why and math.isfinite(t)]
    best = min(fitting, key=lambda i: (costs[i][0], i)) if fitting else 0
    t, why = costs[best]
    return (err if best == 0 else err.with_closest(err.choices[best])), t, why


def switch_cost(err: UnsupportedSchedule, profile: ModelProfile, cluster: Cluster,
                request: TrainingRequest | None = None) -> str:
    """``predicted X s per iteration against Y s for <schedule> (+d s, +p%)``, with the reason when the
    closest configuration does not fit in memory. ``request`` default: the candidate's global batch."""
    req = request or TrainingRequest(global_batch=err.spec.global_batch)
    req = req.model_copy(update={"global_batch": err.spec.global_batch})
    ours, _ = _predict(profile, cluster, req, err.spec.config)
    theirs, why = _predict(profile, cluster, req, err.closest.config)
    name = err.spec.config.schedule
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return (f"predicted time {theirs:.4g} s per iteration against {ours:.4g} s for {name}"
                + (f" ({why})" if why else ""))
    diff = theirs - ours
    out = (f"predicted {theirs:.4g} s per iteration against {ours:.4g} s for {name} "
           f"({diff:+.4g} s, {100 * diff / ours:+.1f}%)")
    return out + (f"; and it does not fit: {why}" if why else "")


def refusal(err: UnsupportedSchedule, profile: ModelProfile | None, cluster: Cluster | None,
            request: TrainingRequest | None = None) -> str:
    """The refusal's message with the predicted cost of switching when profile and cluster are known."""
    if profile is None or cluster is None:
        return err.describe("give the profile and cluster to predict the cost of switching to it")
    return err.describe(switch_cost(err, profile, cluster, request))
