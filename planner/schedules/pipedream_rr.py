"""PipeDream-RR: PipeDream's asynchronous pipeline (no flush, weight stashing) on stages replicated unevenly
(Harlap et al., "PipeDream: Fast and Efficient Pipeline Parallel DNN Training", 2018, sections 3.2-3.3; notes
in ``/work/shared/papers/pipedream-notes.md``) -- the asynchronous twin of :mod:`planner.schedules.one_f_one_b_rr`.

* **Work scheduling** (3.2): the lists, the routes and the round-robin assignment are 1F1B-RR's (replica
  ``m mod r_s`` of stage ``s`` runs micro-batch ``m``, ``c_s`` forwards before its first backward,
  :func:`planner.schedules.one_f_one_b_rr.lists`); NOAM is ``ceil(M / r_0)``.
* **Weight stashing** (3.3): a forward runs on the newest weights of its stage replica and stashes them for its
  own backward, and the replica's optimizer steps after every backward (``params["update"] =
  "per-microbatch"``, the executor's rule for :mod:`planner.schedules.pipedream`). A replica keeps one weight
  version per micro-batch in flight on it, so stage ``s`` holds ``weight_versions[s] = min(c_s, ceil(N / r_s))``
  versions (its replicas' peak in-flight count, :func:`planner.schedules.one_f_one_b_rr.stage_inflight`); each
  version is the stage's weights (``param_bytes``), costed by :mod:`planner.memory` beside the model state.
  Vertical sync (3.3) is not modelled, as for ``pipedream``.
* **Weight synchronisation among a stage's replicas**: PipeDream aggregates the ``r_s`` replicas' updates on a
  parameter server and pushes the newest version to them asynchronously (its section 4, "Parameter State").
  Here the aggregation happens once per window of ``N`` micro-batches, on the IR's one ``ALLREDUCE`` per stage
  replica (:func:`planner.schedules.ir.lower`): each replica adds the other replicas' updates of the window to
  its own (plain SGD: the sum of their applied gradients), so after the window every replica holds the weights
  updated by every micro-batch once (``params["replica_sync"] = "per-window"``). Between two windows a
  replica sees only its own updates: a staleness of at most one window, where PipeDream's parameter server
  gives one round. The all-reduce is the one 1F1B-RR pays and the A(j, m) program costs
  (:mod:`planner.replicated`).

As for ``pipedream``, the lists are **one steady window of N micro-batches** whose start-up and tail overlap the
neighbouring windows in a real run (``synchronous=False``): the simulator times the window as 1F1B-RR's lists,
so the two variants tie in time, and the asynchronous one costs its stashed versions in memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules import one_f_one_b_rr as rr
from planner.schedules.ir import Action, Schedule

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def weight_versions(reps: Sequence[int], microbatches: int) -> list[int]:
    """Per stage, the weight versions a replica keeps at most: one per micro-batch in flight on it."""
    return rr.stage_inflight(reps, microbatches)


def _schedule(devices: int, microbatches: int, replication: str | Sequence[int],
              acts: list[list[Action]] | None) -> Schedule:
    base = rr._schedule(devices, microbatches, replication, acts)
    reps = rr.parse_replication(replication, devices)
    return Schedule("pipedream-rr", base.devices, base.stages, base.microbatches, base.placement, base.actions,
                    base.mb_replica,
                    params={**base.params, "update": "per-microbatch", "replica_sync": "per-window"},
                    weight_versions=weight_versions(reps, microbatches), synchronous=False)


def shape(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    return _schedule(devices, microbatches, replication or (1,) * devices, None)


def inflight(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> dict[tuple[int, int], int]:
    """Per (route naming the stage replica, stage), the most micro-batches alive at once: 1F1B-RR's."""
    return rr.inflight(devices, microbatches, replication)


def build(devices: int, microbatches: int, replication: str | Sequence[int] = "") -> Schedule:
    reps = rr.parse_replication(replication or (1,) * devices, devices)
    return _schedule(devices, microbatches, reps, rr.lists(devices, microbatches, reps))
