"""PipeDream-2BW: double-buffered weight updates (Narayanan et al., "Memory-Efficient Pipeline-Parallel
DNN Training", ICML 2021, section 3; summarised in Chimera section 2 and Table 2).

* **1F1B, no flush** (3.1): stages run the 1F1B order of PipeDream in a steady state that never drains.
* **Gradient accumulation** (3.1): the weights are updated once every ``N`` micro-batches
  (``params["update"] = "every-N"``), with ``N >= D`` ("m >= d" in the paper) so that a micro-batch's
  forward and backward see at most one update in between -- ``microbatches < devices`` raises
  ValueError.
* **Double buffering** (3.1): hence two weight versions per stage suffice -- the one in-flight
  micro-batches started with and the newest: ``weight_versions = [2] * D`` (Chimera Table 2: 2 M_theta).
  The update of version ``t`` is applied with gradients of version ``t-1`` (1-stale), which the
  executor handles; ``synchronous=False``.

Like :mod:`planner.schedules.pipedream`, the action lists represent **one steady window of N
micro-batches** in 1F1B order (the order of :func:`planner.schedules.one_f_one_b.stage_order`), whose
start-up and tail overlap the neighbouring windows in a real run.
"""

from __future__ import annotations

from planner.schedules.common import check_positive, no_lists
from planner.schedules.ir import Action, Schedule
from planner.schedules.one_f_one_b import stage_inflight, stage_order

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def _schedule(devices: int, microbatches: int, acts: list[list[Action]]) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    D, N = devices, microbatches
    if N < D:
        raise ValueError(f"pipedream-2bw: microbatches (N={N}) must be >= devices (D={D}): gradients are "
                         f"accumulated over N >= D micro-batches so that two weight versions suffice "
                         f"(PipeDream-2BW 3.1)")
    return Schedule("pipedream-2bw", D, D, N, [list(range(D))], acts, params={"update": "every-N"},
                    weight_versions=[2] * D, synchronous=False)


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    return _schedule(devices, microbatches, no_lists(devices))


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once in the window: 1F1B's ``min(D-s, N)``."""
    return stage_inflight(devices, microbatches)


def build(devices: int, microbatches: int) -> Schedule:
    acts = [stage_order(s, devices, microbatches) for s in range(devices)]
    return _schedule(devices, microbatches, acts)
