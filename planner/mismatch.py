"""Warnings about the inputs of a plan: a profile timed on one device used for a cluster of another, and
micro-batch sizes the profile has no times near (:func:`size_warnings`).

A profile's times are its device's (``ModelProfile.device``: the GPU's name, or ``cpu``); the planner
applies them to the cluster's devices (``Cluster.device``) as they are. When the two differ, every
predicted time is the profile's device's, not the cluster's, and the user must be told (issue 13: an A100
profile planned on the local CPU cluster predicted 2.6 ms where the run took a hundred times longer).
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.cluster import Cluster
from planner.device import name_key, shipped_device
from planner.jsondoc import integer
from planner.profile import ModelProfile, other_runtime, runtime_words
from planner.request import TrainingRequest


def same_device(a: str, b: str) -> bool:
    """Whether two device names are one device: the same but for case and separators, or both names of one
    shipped description (:meth:`planner.device.DeviceSpec.matches`: a profile measured on a GPU carries torch's
    name for it, ``NVIDIA H100 80GB HBM3``, where the cluster says ``H100-SXM5-80GB``)."""
    if name_key(a) == name_key(b):
        return True
    dev = shipped_device(a)
    return dev is not None and dev.matches(b)


def device_warnings(profile: ModelProfile, cluster: Cluster, request: TrainingRequest | None = None) -> list[str]:
    """One sentence per problem (empty: none); ``request``: the plan's (its optimizer)."""
    out = []
    if request is not None and request.shard_parameters:
        out.append("the plan shards the weights, gradients and optimizer state over the data-parallel replicas (FSDP): "
                   "the predictions are for a runtime that does (torchtitan; the exports set it); pipeplan's executor "
                   "runs plain SGD on whole weights and gradients, so a job it runs is timed and sized differently")
    elif request is not None and request.shard_optimizer:
        out.append("the plan shards the optimizer state over the data-parallel replicas (ZeRO-1): the predictions "
                   "are for a runtime that does (the exports set it); pipeplan's executor runs plain SGD on whole "
                   "gradients, so a job it runs is timed and sized differently")
    shared = int(profile.environment.get("concurrent_processes", "1") or 1)
    if cluster.host is not None and shared > 1:
        out.append(f"profile {profile.name!r} was timed in {shared} processes at once and cluster {cluster.name!r} "
                   f"costs the sharing of its host's cores itself (host.effective_cores): the sharing is counted "
                   f"twice (profile the model in one process)")
    # the entries of planner.analytic.runtime_environment that are not pipeplan's executor's, in the words every
    # other place says them with
    runtime = runtime_words(other_runtime(profile.environment))
    if runtime:  # planner.analytic.runtime_environment: a runtime other than pipeplan's executor
        out.append(f"profile {profile.name!r} describes a training runtime with {' and '.join(runtime)}: the "
                   f"predictions are for that runtime; a job run by pipeplan's executor (sends overlapped, whole "
                   f"on every tensor-parallel rank; all-reduce after each stage's backward) is timed differently")
    mismatch = device_mismatch(profile, cluster)
    if mismatch is None:
        return out
    return out + [f"{mismatch}: the predicted times are {profile.device}'s, not the cluster's "
                  f"(profile the model on {cluster.device}, or pick a profile of that device)"]


def device_mismatch(profile: ModelProfile, cluster: Cluster) -> str | None:
    """``profile 'P' was timed on 'X' but cluster 'C' has 'Y' devices`` where the profile's device is not the
    cluster's (:func:`same_device`), else None: the start of every warning about it (plan, predict, calibrate)."""
    if same_device(profile.device, cluster.device):
        return None
    return (f"profile {profile.name!r} was timed on {profile.device!r} but cluster {cluster.name!r} has "
            f"{cluster.device!r} devices")


def sharded_words(candidate: dict) -> str | None:
    """What a candidate document's plan shards over its data-parallel replicas that pipeplan's executor does not
    (it keeps whole weights and optimizer state and all-reduces the gradients): ``"the weights, gradients and
    optimizer state (FSDP)"``, ``"the optimizer state (ZeRO-1)"``, or None (W = 1, or nothing sharded)."""
    data = integer(candidate.get("data"))  # (a hand-edited document's odd values say nothing is sharded: a note)
    if data is None or data <= 1:
        return None
    if candidate.get("shard_parameters") is True:
        return "the weights, gradients and optimizer state (FSDP)"
    if candidate.get("shard_optimizer") is True:
        return "the optimizer state (ZeRO-1)"
    return None


def unsharded_run_note(candidate: dict) -> str | None:
    """The note a job or run of ``candidate`` by pipeplan's executor needs when its plan shards (:func:`sharded_words`):
    what ran is unsharded."""
    words = sharded_words(candidate)
    if words is None:
        return None
    return (f"the plan shards {words} over the data-parallel replicas; pipeplan's executor does not (whole weights, "
            "gradients all-reduced after each stage's backward), so the measured run is of that, not of the plan's "
            "sharded runtime")


def size_warnings(profile: ModelProfile, sizes: Iterable[int]) -> list[str]:
    """One sentence when a candidate's micro-batch size lies outside the sizes ``profile`` has layer times
    for (empty: none): its times are extrapolated (:func:`planner.profile.interpolate_time`: beyond the
    largest size the per-sample time held at least at that size's, below the smallest clamped between
    proportional and that size's), a rule and not a measurement. On this CPU the rule took a gpt-tiny block
    at 16 samples from the measured 8 (1.17 ms forward) to 2.35 ms where 16 measured 1.94 ms, and the plan
    page's first candidate, data parallel at b = 16, was predicted 65 ms where its runs took 45-64 ms."""
    have = sorted(set.intersection(*(set(layer.fwd_time) for layer in profile.layers)))
    if not have:
        return []
    outside = sorted({b for b in sizes if b < have[0] or b > have[-1]})
    if not outside:
        return []
    return [f"candidates with micro-batch size {', '.join(map(str, outside))} are timed outside the sizes profile "
            f"{profile.name!r} has ({', '.join(map(str, have))}): their layer times are extrapolated, not "
            f"{'measured' if profile.source == 'measured' else 'computed'} (profile those sizes too: "
            f"--micro-batches {','.join(map(str, sorted(set(have) | set(outside))))})"]
