"""Hanayo: wave-like pipelines (Liu et al., SC'23, sections 3.2-3.4).

The model is cut into ``S = 2*W*P`` stages (``W`` = waves, ``P`` = devices) placed zigzag: stage ``s``
with ``k = s mod 2P`` sits on device ``k`` when ``k < P`` and on device ``2P-1-k`` otherwise, so every
micro-batch goes down the devices and back up, W times ("V"s, section 3.2). One model copy, no replicas:
device ``d`` holds the 2W stages ``d, 2P-1-d, 2P+d, ...``. ``W = 1`` is Chimera-wave: Chimera on 2P devices
with 2N micro-batches with the blocks of the two halves swapped (figure 5), same slots, same makespan.

The order on each device comes from the same merge as Chimera's (:mod:`planner.schedules.merge`): the
single pipeline of S stages is timed alone with 1F1B in unit slots and the devices run what they hold
by list scheduling with those slots as priorities.

:func:`bubble_ratio_closed_form` is the paper's eq. (1). The simulator differs from it, and by how much
was measured (T_B = 2 T_F, T_C = 0): P = 8, W = 1 gives 0.452 by eq. (1) but 0.368 simulated at N = 8 and
0.226 at N = 16; P = 8, W = 4: 0.136 by eq. (1), 0.127 simulated at N = 8. Why: eq. (1) has no N. It sums
the bubble *types* of figure 7 (zone A: waiting for forward activations, B: forward/backward imbalance,
C: backward tails, D: NCCL cross-communication batching) for an idealised wave and divides by an
idealised runtime, so it is a per-configuration constant. The simulator replays the actual action
lists: the start-up and drain bubbles are fixed in size while the busy time grows with N, so the
simulated ratio falls as N grows, and communication (T_C) only costs what it does not overlap.
Both agree on the trend the paper argues: the ratio falls strictly as W grows.
"""

from __future__ import annotations

from planner.schedules import merge
from planner.schedules.common import check_positive
from planner.schedules.ir import Action, Schedule
from planner.schedules.merge import inflight_lower_bound


def placement(devices: int, waves: int) -> list[list[int]]:
    P = devices
    out = []
    for s in range(2 * waves * P):
        k = s % (2 * P)
        out.append(k if k < P else 2 * P - 1 - k)
    return [out]


def shape(devices: int, microbatches: int, waves: int = 1) -> Schedule:
    """The schedule without its action lists (see :func:`planner.schedules.chimera.shape`)."""
    check_positive(devices=devices, microbatches=microbatches, waves=waves)
    place = placement(devices, waves)
    return Schedule("hanayo", devices, len(place[0]), microbatches, place, [[] for _ in range(devices)],
                    params={"waves": waves})


def inflight(devices: int, microbatches: int, waves: int = 1) -> dict[tuple[int, int], int]:
    """Lower bounds of the in-flight micro-batches per stage, without merging."""
    check_positive(devices=devices, microbatches=microbatches, waves=waves)
    return inflight_lower_bound(2 * waves * devices, [(0, [[m] for m in range(microbatches)], 0.0)])


def forwards_first(devices: int, microbatches: int, waves: int = 1) -> list[int]:
    """Per device, forwards certainly run before its first backward, without merging
    (:func:`planner.schedules.merge.forwards_first`)."""
    check_positive(devices=devices, microbatches=microbatches, waves=waves)
    return merge.forwards_first(devices, placement(devices, waves), [(0, [[m] for m in range(microbatches)], 0.0)])


def prefix(devices: int, microbatches: int, slots: int, waves: int = 1) -> list[list[Action]]:
    """The first ``slots`` unit slots of every device's list (see :func:`planner.schedules.chimera.prefix`)."""
    check_positive(devices=devices, microbatches=microbatches, waves=waves)
    return merge.merge_pipelines(devices, placement(devices, waves), [(0, [[m] for m in range(microbatches)], 0.0)],
                           until=slots)


def build(devices: int, microbatches: int, waves: int = 1) -> Schedule:
    check_positive(devices=devices, microbatches=microbatches, waves=waves)
    place = placement(devices, waves)
    acts = merge.merge_pipelines(devices, place, [(0, [[m] for m in range(microbatches)], 0.0)])
    return Schedule("hanayo", devices, len(place[0]), microbatches, place, acts, params={"waves": waves})


def bubble_ratio_closed_form(devices: int, waves: int, t_f: float = 1.0, t_b: float = 2.0,
                             t_c: float = 0.0) -> float:
    """Hanayo eq. (1), with P = devices, W = waves, T_F/T_B the forward/backward time of a device's
    share of the model and T_C the communication time, as the paper writes it:

        (T_B/W + (1 + 2W + 2/P + (P-2)/3) T_C)
        / (P/(P-1) T_F + (1/(2W) + P/(P-1)) T_B + ((P-2)/2 + 4W) T_C)

    With T_B = 2 T_F and T_C = 0 this is (2P-2)/(3PW+P-1).
    """
    P, W = devices, waves
    if P < 2:
        return 0.0
    num = t_b / W + (1 + 2 * W + 2 / P + (P - 2) / 3) * t_c
    den = P / (P - 1) * t_f + (1 / (2 * W) + P / (P - 1)) * t_b + ((P - 2) / 2 + 4 * W) * t_c
    return num / den
