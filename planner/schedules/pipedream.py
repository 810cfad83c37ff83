"""PipeDream: asynchronous 1F1B without a flush, with weight stashing (Harlap et al., "PipeDream: Fast
and Efficient Pipeline Parallel DNN Training", 2018 / SOSP'19, sections 3.2-3.3; notes in
``/work/shared/papers/pipedream-notes.md``).

* **Work scheduling** (3.2, "1F1B"): in the start-up phase the input stage admits NOAM micro-batches,
  ``NOAM = ceil(#machines / #machines in the input stage)`` (= ``D`` with one device per stage); in the
  steady state every stage alternates one forward and one backward. There is no flush: the optimizer
  step runs after **every** micro-batch's backward, on each stage independently
  (``params["update"] = "per-microbatch"``; the executor applies it per micro-batch, not at ``STEP``).
* **Weight stashing** (3.3): a forward uses the newest weights and stashes them for its own backward, so
  a stage keeps one weight version per micro-batch in flight on it: stage ``s`` of ``D`` (one device
  per stage) has ``D - s`` in flight in the steady state -- ``weight_versions[s] = D - s``; the input
  stage's ``D`` is NOAM. (Vertical sync is not modelled.)

What the action lists hold: PipeDream never drains, so the IR represents **one steady window of N
micro-batches** in 1F1B order -- the order of one-stage 1F1B
(:func:`planner.schedules.one_f_one_b.stage_order`): the lists start with the start-up forwards and end
with the trailing backwards, which in a real run overlap the neighbouring windows. ``synchronous=False``
marks that the simulator's makespan of the window over-counts the start-up/drain, which PipeDream
pays once per training run rather than per window.
"""

from __future__ import annotations

import math

from planner.schedules.common import check_positive, no_lists
from planner.schedules.ir import Action, Schedule
from planner.schedules.one_f_one_b import stage_inflight, stage_order

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def noam(devices: int, input_stage_devices: int = 1) -> int:
    """NUM_OPT_ACTIVE_MINIBATCHES (PipeDream 3.2): ``ceil(#machines / #machines in the input stage)``."""
    return math.ceil(devices / input_stage_devices)


def weight_versions(devices: int) -> list[int]:
    """Stage ``s`` stashes one version per micro-batch in flight on it: ``D - s`` (NOAM for s = 0)."""
    return [noam(devices) - s for s in range(devices)]


def _schedule(devices: int, microbatches: int, acts: list[list[Action]]) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    D, N = devices, microbatches
    return Schedule("pipedream", D, D, N, [list(range(D))], acts,
                    params={"update": "per-microbatch", "noam": noam(D)},
                    weight_versions=weight_versions(D), synchronous=False)


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    return _schedule(devices, microbatches, no_lists(devices))


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once in the window: 1F1B's ``min(D-s, N)``."""
    return stage_inflight(devices, microbatches)


def build(devices: int, microbatches: int) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    return _schedule(devices, microbatches, [stage_order(s, devices, microbatches) for s in range(devices)])
