"""GPipe (Huang et al., 2019; Chimera section 2, figure 2): every device runs all N forwards of its stage,
then all N backwards. Bubble ratio (D-1)/(N+D-1) with F and B of any length; N activations alive."""

from __future__ import annotations

from planner.schedules.common import check_positive, linear_schedule
from planner.schedules.ir import Action, B, F, Schedule


def build(devices: int, microbatches: int) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    acts = [[Action(F, s, m) for m in range(microbatches)] + [Action(B, s, m) for m in range(microbatches)]
            for s in range(devices)]
    return linear_schedule("gpipe", devices, microbatches, acts, {})
