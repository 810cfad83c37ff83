"""1F1B with a flush: DAPPLE (Fan et al., 2021) and PipeDream-Flush (Narayanan et al., 2021).

Stage ``s`` of ``D`` runs ``min(D-1-s, N)`` warm-up forwards, then alternates one forward and one
backward (PipeDream section 3.3, "1F1B") and finishes with the remaining backwards; a flush (gradient
all-reduce, optimizer step) ends the iteration. Same bubble as GPipe, (D-1)/(N+D-1) (Megatron 2.2.1),
but stage ``s`` keeps at most ``min(D-s, N)`` micro-batches' activations alive instead of N.
"""

from __future__ import annotations

from planner.schedules.common import check_positive, linear_schedule
from planner.schedules.ir import Action, B, F, Schedule


def stage_order(stage: int, depth: int, microbatches: int, kind_b: str = B) -> list[Action]:
    """The 1F1B order of one stage: warm-up forwards, steady 1F1B, cool-down backwards."""
    warmup = min(depth - 1 - stage, microbatches)
    out = [Action(F, stage, m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        out.append(Action(F, stage, warmup + i))
        out.append(Action(kind_b, stage, i))
    out.extend(Action(kind_b, stage, m) for m in range(microbatches - warmup, microbatches))
    return out


def build(devices: int, microbatches: int) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches)
    acts = [stage_order(s, devices, microbatches) for s in range(devices)]
    return linear_schedule("1f1b", devices, microbatches, acts, {})
