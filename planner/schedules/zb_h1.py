"""ZB-H1: zero-bubble pipeline with 1F1B's memory (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024, section 3.1 "Handcrafted schedules", figure 3 top).

The backward is split (section 2) into ``I`` -- the gradient w.r.t. the stage input, on the critical
path between stages -- and ``W`` -- the gradient w.r.t. the weights, which nothing downstream waits
for and which can run any time after its ``I``.

Rules (section 3.1):

* **Same warm-up as 1F1B**: stage ``d`` runs ``min(D-d-1, N)`` forwards first, then alternates one
  ``F`` and one ``I`` in 1F1B order and drains the remaining ``I``; the ``F``/``I`` order is exactly
  1F1B's with ``B`` replaced by ``I``.
* **Memory**: a micro-batch's activations stay until its ``W`` -- the weight gradients need each GEMM's
  input and the gradient that reached its output (section 2; the paper counts the memory a pending ``W``
  keeps) -- so an ``F`` adds one and its ``W`` frees it (the simulator's count). With the deferral below
  every stage then peaks at ``min(D, N)``, 1F1B's peak at stage 0: "ZB-H1 ... the same peak memory as
  1F1B", where 1F1B's later stages hold fewer (``min(D-d, N)``).
* **W deferred into the bubbles**: stage ``d`` runs the ``W`` of a micro-batch ``d`` ``I`` s after that
  micro-batch's own ``I`` (the rest at the end). Stage 0 runs each ``W`` right after its ``I`` -- in
  the cool-down its ``I`` s arrive with gaps that the ``W`` s fill; the last stage defers ``D-1`` of
  them, so its ``F`` and ``I`` -- on everybody's critical path -- run back to back and the deferred
  ``W`` s fill its tail, where 1F1B's last stage idles ("we adjust the starting points of W passes").

Bubble (section 3.1, the paper calls the input-gradient pass ``B``): ZB-H1 has
``(D-1)(T_F + T_I - T_W)`` against 1F1B's ``(D-1)(T_F + T_I + T_W)``. With ``T_F = T_I = T_W = 1`` the
simulator gives exactly ``3N + (D-1)`` against 1F1B's ``3(N + D - 1)`` (tests check both).
"""

from __future__ import annotations

from collections import deque

from planner.schedules.common import check_positive, linear_schedule, no_lists
from planner.schedules.ir import Action, I, Schedule, W
from planner.schedules.one_f_one_b import stage_order

#: :func:`inflight` (``min(D, N)`` on every stage: a ``W`` frees what its ``F`` stored) is exact
INFLIGHT_EXACT = True
#: the backward is split into I and W: a weight-gradient pass, not a gradient travelling down, may end a list
SPLIT_BACKWARD = True


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    check_positive(devices=devices, microbatches=microbatches)
    return linear_schedule("zb-h1", devices, microbatches, no_lists(devices), {})


def device_order(stage: int, devices: int, microbatches: int) -> list[Action]:
    """1F1B's F/I order with each W inserted ``d`` I's after its own I (the rest at the end)."""
    lag = stage
    new = tuple.__new__  # Action(W, stage, mb) without its keyword-handling constructor
    out: list[Action] = []
    pending: deque[int] = deque()  # micro-batches whose I ran and whose W has not
    for a in stage_order(stage, devices, microbatches, kind_b=I):
        out.append(a)
        if a[0] == I:
            pending.append(a[2])
            if len(pending) > lag:
                out.append(new(Action, (W, stage, pending.popleft(), 0, 1, -1)))
    out.extend(new(Action, (W, stage, m, 0, 1, -1)) for m in pending)
    return out


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once (until their ``W``): ``min(D, N)``, each
    stage's 1F1B count ``min(D-s, N)`` plus the ``s`` whose ``W`` it defers."""
    check_positive(devices=devices, microbatches=microbatches)
    return {(0, s): min(devices, microbatches) for s in range(devices)}


def held_at_peak(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the I's whose output gradients stage ``s`` holds (until their W) where its alive
    activations peak: ``min(s + 1, N)``. Counted in list order as the simulator counts (an F adds an activation,
    an I a held gradient, a W frees one of each; the peak taken after F's and I's), every list position's
    (activations, held) pair is at most (``min(D, N)``, ``min(s + 1, N)``), and some position has both at once:
    in the steady state the I after an F finds the ``D - s`` micro-batches of 1F1B's count and the ``s`` whose W
    it defers alive, and the ``s`` deferred I's and its own held. So the stage's peak is exactly
    ``min(D, N) * activation + min(s + 1, N) * held_grads``, whatever the two sizes, known before the lists
    are built (``tests/test_builders_more.py`` checks it against the built lists)."""
    check_positive(devices=devices, microbatches=microbatches)
    return {(0, s): min(s + 1, microbatches) for s in range(devices)}


def build(devices: int, microbatches: int) -> Schedule:
    sched = shape(devices, microbatches)
    sched.actions = [device_order(d, devices, microbatches) for d in range(devices)]
    return sched
