"""1F1B-RR: PipeDream's stages replicated unevenly, with a flush (Harlap et al., "PipeDream: Fast and Efficient
Pipeline Parallel DNN Training", 2018, sections 3.2 "Partitioning" and "Work Scheduling"; notes in
``/work/shared/papers/pipedream-notes.md``).

Stage ``s`` runs on ``r_s`` devices (``replication = (r_0, ..., r_{S-1})``, PipeDream's A(j, m) gives it,
:func:`planner.partition.pipedream_partition`); the devices are numbered stage by stage, replica ``k`` of
stage ``s`` on device ``sum(r_0..r_{s-1}) + k``. Micro-batch ``m`` goes to replica ``m mod r_s`` of every
stage (PipeDream's deterministic round-robin, "minibatchID mod stageReplicaID"), and its backward runs on
the replica that ran its forward.

**In the IR** (:mod:`planner.schedules.ir`) this is nothing new: the schedule has ``R = lcm(r_0..r_{S-1})``
routes (the IR's replicas), route ``rho`` passing through replica ``rho mod r_s`` of stage ``s``
(``placement[rho][s]``), and micro-batch ``m`` takes route ``m mod R`` (``mb_replica``) -- so it meets
replica ``m mod r_s`` of every stage. Several routes share a stage replica's device and its weights: the
IR's rule that weights belong to a (stage, device) (:meth:`Schedule.stages_by_device` names each once)
gives one ``ALLREDUCE`` per stage replica, among the ``r_s`` devices of the stage -- PipeDream's weight
synchronisation, ``4 (r-1) |w| / r`` bytes per worker with a parameter server, a ring all-reduce's
``2 (r-1)/r |w|`` each way in :mod:`planner.cost`.

**Work scheduling**: each replica runs 1F1B over its own micro-batches (in order): ``c_s`` forwards, then
one backward and one forward alternately, then the remaining backwards. ``c_s`` is PipeDream's in-flight
count: the devices from stage ``s`` to the output, shared by the ``r_s`` replicas,
``ceil(sum_{t >= s} r_t / r_s)`` (NOAM for the input stage, ``ceil(M / r_0)``; ``D - s`` with one device
per stage, as 1F1B), raised where needed so that a stage's replicas together admit at least what the next
stage's replicas take before their first backward (``c_s r_s >= c_{s+1} r_{s+1}``, no deadlock). A flush
(all-reduce, optimizer step) ends the iteration, so the optimizer sees exactly data parallelism's
gradient of the whole batch (``synchronous``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.schedules.common import check_positive, no_lists
from planner.schedules.ir import Action, B, F, Schedule

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def parse_replication(replication: str | Sequence[int], devices: int | None = None) -> tuple[int, ...]:
    """``"2,1,1"`` or ``(2, 1, 1)`` as a tuple of positive replica counts; ValueError naming the rule when
    it is malformed or (``devices`` given) does not add up to the devices."""
    if isinstance(replication, str):
        try:
            items = replication.replace(" ", "").split(",")
            if "" in items:  # '2,,1' or '' or '2,1,': a count left out is no count of 1 or of 0
                raise ValueError
            reps = tuple(int(x) for x in items)
        except ValueError:
            raise ValueError(f"replication must be replica counts separated by commas, e.g. '2,1,1', "
                             f"got {replication!r}") from None
    else:
        reps = tuple(int(x) for x in replication)
    if not reps or any(r < 1 for r in reps):
        raise ValueError(f"replication: every stage needs at least one replica, got {replication!r}")
    if devices is not None and sum(reps) != devices:
        raise ValueError(f"replication {','.join(map(str, reps))} uses {sum(reps)} devices, not {devices}")
    return reps


def replication_label(reps: Sequence[int]) -> str:
    return ",".join(str(r) for r in reps)


def routes(reps: Sequence[int]) -> int:
    """The IR's replicas: ``lcm(r_0, ..., r_{S-1})``."""
    return math.lcm(*reps)


def first_device(reps: Sequence[int]) -> list[int]:
    """Device of replica 0 of each stage (stages numbered from the input)."""
    out, d = [], 0
    for r in reps:
        out.append(d)
        d += r
    return out


def warmup_counts(reps: Sequence[int]) -> list[int]:
    """Per stage, ``c_s``: the forwards a replica runs before its first backward (module docstring)."""
    S = len(reps)
    c = [0] * S
    for s in range(S - 1, -1, -1):
        c[s] = math.ceil(sum(reps[s:]) / reps[s])
        if s < S - 1:
            c[s] = max(c[s], math.ceil(c[s + 1] * reps[s + 1] / reps[s]))
    return c


def _microbatches_of(stage_reps: int, k: int, microbatches: int) -> list[int]:
    return list(range(k, microbatches, stage_reps))


def _schedule(devices: int, microbatches: int, replication: str | Sequence[int],
              acts: list[list[Action]] | None) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    reps = parse_replication(replication, devices)
    S, R = len(reps), routes(reps)
    first = first_device(reps)
    placement = [[first[s] + rho % reps[s] for s in range(S)] for rho in range(R)]
    mb_route = [m % R for m in range(microbatches)]
    return Schedule("1f1b-rr", devices, S, microbatches, placement,
                    acts if acts is not None else no_lists(devices), mb_route,
                    params={"replication": replication_label(reps), "noam": math.ceil(devices / reps[0])})


def lists(devices: int, microbatches: int, reps: Sequence[int]) -> list[list[Action]]:
    """Every device's compute-only list: replica ``k`` of stage ``s`` runs 1F1B over micro-batches
    ``k, k + r_s, ...`` with ``c_s`` forwards first (:func:`replica_order`, :func:`warmup_counts`)."""
    c, R, first = warmup_counts(reps), routes(reps), first_device(reps)
    acts: list[list[Action]] = [[] for _ in range(devices)]
    for s, r in enumerate(reps):
        for k in range(r):
            acts[first[s] + k] = replica_order(s, _microbatches_of(r, k, microbatches), c[s], R)
    return acts


def shape(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    return _schedule(devices, microbatches, replication or (1,) * devices, None)


def inflight(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> dict[tuple[int, int], int]:
    """Per (route naming the stage replica, stage), the most micro-batches alive at once on it:
    ``min(c_s, its micro-batches)``."""
    check_positive(devices=devices, microbatches=microbatches)
    reps = parse_replication(replication or (1,) * devices, devices)
    c = warmup_counts(reps)
    return {(k, s): min(c[s], len(_microbatches_of(r, k, microbatches)))
            for s, r in enumerate(reps) for k in range(r)}


def stage_inflight(reps: Sequence[int], microbatches: int) -> list[int]:
    """Per stage, the most micro-batches alive at once on any of its replicas (:func:`inflight`'s peak over
    the stage's replicas): ``min(c_s, ceil(N / r_s))``, replica 0 having the most micro-batches."""
    c = warmup_counts(reps)
    return [min(c[s], len(_microbatches_of(r, 0, microbatches))) for s, r in enumerate(reps)]


def replica_order(stage: int, mbs: Sequence[int], count: int, route_of: int) -> list[Action]:
    """1F1B over ``mbs`` (in order) with ``count`` forwards before the first backward; each action names
    its micro-batch's route."""
    warm = min(count - 1, len(mbs))
    out = [Action(F, stage, m, m % route_of) for m in mbs[:warm]]
    for i in range(len(mbs) - warm):
        out.append(Action(F, stage, mbs[warm + i], mbs[warm + i] % route_of))
        out.append(Action(B, stage, mbs[i], mbs[i] % route_of))
    out.extend(Action(B, stage, m, m % route_of) for m in mbs[len(mbs) - warm:])
    return out


def build(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> Schedule:
    if not replication:
        replication = (1,) * devices
    reps = parse_replication(replication, devices)
    return _schedule(devices, microbatches, reps, lists(devices, microbatches, reps))
