"""1F1B with a flush: DAPPLE (Fan et al., 2021) and PipeDream-Flush (Narayanan et al., 2021).

Stage ``s`` of ``D`` runs ``min(D-1-s, N)`` warm-up forwards, then alternates one forward and one
backward (PipeDream section 3.3, "1F1B") and finishes with the remaining backwards; a flush (gradient
all-reduce, optimizer step) ends the iteration. Same bubble as GPipe, (D-1)/(N+D-1) (Megatron 2.2.1),
but stage ``s`` keeps at most ``min(D-s, N)`` micro-batches' activations alive instead of N.
"""

from __future__ import annotations

from planner.schedules.common import check_positive, linear_schedule, no_lists
from planner.schedules.ir import Action, B, F, Schedule

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    check_positive(devices=devices, microbatches=microbatches)
    return linear_schedule("1f1b", devices, microbatches, no_lists(devices), {})


def stage_inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica 0, stage s), the most micro-batches alive at once in :func:`stage_order`:
    ``min(D-s, N)`` (the warm-up forwards and one more before the first backward)."""
    check_positive(devices=devices, microbatches=microbatches)
    return {(0, s): min(devices - s, microbatches) for s in range(devices)}


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once (:func:`stage_inflight`)."""
    return stage_inflight(devices, microbatches)


def stage_order(stage: int, depth: int, microbatches: int, kind_b: str = B) -> list[Action]:
    """The 1F1B order of one stage: warm-up forwards, steady 1F1B, cool-down backwards."""
    warmup = min(depth - 1 - stage, microbatches)
    new = tuple.__new__  # Action(kind, stage, mb) without its keyword-handling constructor (3x cheaper)
    out = [new(Action, (F, stage, m, 0, 1, -1)) for m in range(warmup)]
    for i in range(microbatches - warmup):
        out.append(new(Action, (F, stage, warmup + i, 0, 1, -1)))
        out.append(new(Action, (kind_b, stage, i, 0, 1, -1)))
    out.extend(new(Action, (kind_b, stage, m, 0, 1, -1)) for m in range(microbatches - warmup, microbatches))
    return out


def build(devices: int, microbatches: int) -> Schedule:
    sched = shape(devices, microbatches)
    sched.actions = [stage_order(s, devices, microbatches) for s in range(devices)]
    return sched
