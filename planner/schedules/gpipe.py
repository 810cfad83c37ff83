"""GPipe (Huang et al., 2019; Chimera section 2, figure 2): every device runs all N forwards of its stage,
then all N backwards. Bubble ratio (D-1)/(N+D-1) with F and B of any length; N activations alive."""

from __future__ import annotations

from planner.schedules.common import check_positive, linear_schedule, no_lists
from planner.schedules.ir import Action, B, F, Schedule

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    check_positive(devices=devices, microbatches=microbatches)
    return linear_schedule("gpipe", devices, microbatches, no_lists(devices), {})


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once: all N."""
    check_positive(devices=devices, microbatches=microbatches)
    return {(0, s): microbatches for s in range(devices)}


def build(devices: int, microbatches: int) -> Schedule:
    sched = shape(devices, microbatches)
    sched.actions = [[Action(F, s, m) for m in range(microbatches)] + [Action(B, s, m) for m in range(microbatches)]
                     for s in range(devices)]
    return sched
