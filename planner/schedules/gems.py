"""GEMS: memory-aware model parallelism with two model replicas (Jain et al., "GEMS: GPU-Enabled
Memory-Aware Model-Parallelism System for Distributed DNN Training", SC'20, "MAST"; as summarised in
Chimera section 2 and Table 2).

* **Placement**: two replicas of the ``D``-stage model; replica 0 maps stage ``s`` to device ``s``,
  replica 1 maps it to device ``D-1-s`` (the same two directions as Chimera's down/up pipelines), so
  every device holds two stages (Chimera: "each worker maintains the weights of two pipeline stages").
* **Micro-batches alternate** between the replicas: ``mb_replica[m] = m mod 2``.
* **At most two micro-batches in flight** (Chimera section 2): micro-batch ``m+1`` is injected when
  micro-batch ``m`` has finished its forward pass on its last stage -- which sits on the device that
  holds the *first* stage of the other replica -- and travels behind ``m``'s backward pass, which moves
  across the devices in the same direction. Micro-batch ``m+2`` starts once ``m`` is done.
* **Order on every device**: for each micro-batch in turn its forward, then its backward, on the stage
  of its replica that the device holds: ``F(m), B(m), F(m+1), B(m+1), ...``. A device thus runs the
  backward of ``m`` before the forward of ``m+1`` (both arrive together in the sweep), freeing ``m``'s
  activations before storing ``m+1``'s: at most **one** micro-batch's activations are alive on a device
  (Chimera: "GEMS injects only one micro-batch ... the activations of the forward pass on one
  micro-batch are stored", Table 2: ``M_a``).

Bubble: each micro-batch's forward and backward sweep the devices almost serially. With ``F = 1``,
``B = 2`` the simulator gives a makespan of exactly ``N(2D+1) + D-1`` (micro-batch ``m+1``'s forward on
a device waits for ``m``'s backward there), for ``3N`` units of work per device: a bubble ratio that
tends to ``(D-1)/(D+1/2)`` and does not fall with ``N`` (Chimera section 2: "cannot be alleviated by a
larger N").
"""

from __future__ import annotations

from planner.schedules.common import check_positive, no_lists
from planner.schedules.ir import Action, B, F, Schedule

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def placement(devices: int) -> list[list[int]]:
    return [list(range(devices)), list(reversed(range(devices)))]


def shape(devices: int, microbatches: int) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    check_positive(devices=devices, microbatches=microbatches)
    D, N = devices, microbatches
    return Schedule("gems", D, D, N, placement(D), no_lists(D), mb_replica=[m % 2 for m in range(N)])


def inflight(devices: int, microbatches: int) -> dict[tuple[int, int], int]:
    """Per (replica, stage): one micro-batch (a device runs its backward before the next forward); a
    replica that gets no micro-batch (N = 1) has none."""
    check_positive(devices=devices, microbatches=microbatches)
    return {(r, s): 1 for r in range(min(2, microbatches)) for s in range(devices)}


def build(devices: int, microbatches: int) -> Schedule:
    sched = shape(devices, microbatches)
    D, N, place, mb_replica = devices, microbatches, sched.placement, sched.mb_replica
    acts = sched.actions
    for m in range(N):
        r = mb_replica[m]
        for s in range(D):
            d = place[r][s]
            acts[d].append(Action(F, s, m, r))
            acts[d].append(Action(B, s, m, r))
    return sched
