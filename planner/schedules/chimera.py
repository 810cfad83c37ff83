"""Chimera: bidirectional pipelines (Li & Hoefler, SC'21).

* **Section 3.1** -- ``f = 1``: a *down* pipeline maps stage ``s`` to device ``s``, an *up* pipeline
  maps it to device ``D-1-s``; the N micro-batches are split between the two as evenly as possible
  (first half down, second half up; N < D is allowed, down to N = 1, which uses the down pipeline only).
  Each pipeline runs 1F1B on its share; the two are *merged* on every device.
* **Section 3.6** -- ``f > 1`` (``f`` divides ``D/2``): down pipeline ``i`` maps stage ``s`` to device
  ``(i*D/f + s) mod D``; up pipeline ``i`` maps the stages in the reverse order of down pipeline ``i``.
  Replica (pipeline) numbering: ``0..f-1`` the down pipelines, ``f..2f-1`` the up pipelines.
* **Section 3.5** -- ``N > D``: ``K = N/D`` basic units of D micro-batches.
  ``direct``: the units are concatenated, the next unit's forwards fill the previous unit's tail.
  ``forward-doubling`` / ``backward-halving``: basic units of 2D micro-batches in which a forward runs
  two micro-batches at once (an action with ``span = 2``) and each backward one -- the two methods have
  the same schedule; they differ in what a micro-batch is (forward doubling: size B with activation
  recomputation; backward halving: size B/2 without), which is the cost model's business. ``floor(K/2)``
  such units, plus one direct basic unit of D micro-batches when K is odd.

How the pipelines are merged on the devices is :mod:`planner.schedules.merge` (shared with Hanayo).
Units of a concatenation are offset by their work per device (``2 * D`` slots for a basic unit), so a
unit's first forwards land in the previous unit's tail bubbles. Timed with F = 1, B = 2 the result is
the paper's "practical" schedule: bubble ratio (D-2)/(3N/2+D-2) for N = D (makespan 16 for D = 4, 36
for D = 8); with F = B it is (D-2)/(2N+D-2); for f > 1 there are 2(D/(2f) - 1) bubbles per device.

Gradient synchronisation (section 3.2): the all-reduce of a stage replica whose gradients are complete
while the device still has computation left is issued eagerly, right after its last backward (in the
paper's figure 4(b), stage 3 on P0 and P3); the middle stages, finished last, are all-reduced at the
end ("eager-sync-opt"). ``eager="auto"`` finds these stages with a unit-cost simulation; ``"all"``
and ``"none"`` force the choice.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TypeVar

from planner.schedules import merge
from planner.schedules.common import check_positive
from planner.schedules.ir import Action, B, F, Schedule
from planner.schedules.merge import inflight_lower_bound

CONCAT_METHODS = ("direct", "forward-doubling", "backward-halving")
T = TypeVar("T")


def placement(devices: int, pipelines: int) -> list[list[int]]:
    """``placement[r][s]`` for the ``2f`` pipelines (section 3.6)."""
    D, f = devices, pipelines
    down = [[(i * (D // f) + s) % D for s in range(D)] for i in range(f)]
    up = [list(reversed(row)) for row in down]
    return down + up


def split_evenly(items: Sequence[T], parts: int) -> list[list[T]]:
    """Contiguous, as even as possible, earlier parts larger."""
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for p in range(parts):
        n = q + (1 if p < r else 0)
        out.append(list(items[i:i + n]))
        i += n
    return out


def units(microbatches: int, devices: int, concat: str) -> list[tuple[list[int], int]]:
    """Section 3.5: the basic units, as (micro-batches, forward span)."""
    N, D = microbatches, devices
    if N <= D or concat == "direct":
        return [(list(range(s, min(N, s + D))), 1) for s in range(0, N, D)]
    K = N // D
    out = [(list(range(2 * D * u, 2 * D * (u + 1))), 2) for u in range(K // 2)]
    tail = list(range(2 * D * (K // 2), N))
    out += [(tail[s:s + D], 1) for s in range(0, len(tail), D)]
    return out


def _plan(devices: int, microbatches: int, pipelines: int, concat: str
          ) -> tuple[list[list[int]], list[int], list[tuple[int, list[list[int]], float]]]:
    """Placement, micro-batch -> pipeline, and the pipelines (with unit offsets) to merge: the placement
    and the assignment are the caller's own copies, the pipelines are shared and read-only (the planner
    asks for the shape, the in-flight counts, prefixes and the lists of one configuration in turn)."""
    place, mb_replica, pipes = _plan_shared(devices, microbatches, pipelines, concat)
    return [list(row) for row in place], list(mb_replica), pipes


@functools.lru_cache(maxsize=256)
def _plan_shared(devices: int, microbatches: int, pipelines: int, concat: str
                 ) -> tuple[list[list[int]], list[int], list[tuple[int, list[list[int]], float]]]:
    """:func:`_plan`, computed once per arguments: shared and read-only (what only reads it -- the in-flight
    counts, the warm-up prefix -- takes it directly, without the copies)."""
    check_positive(devices=devices, microbatches=microbatches, pipelines=pipelines)
    D, N, f = devices, microbatches, pipelines
    if D % 2:
        raise ValueError(f"chimera needs an even number of devices (pipeline stages), got devices={D}")
    if (D // 2) % f:
        raise ValueError(f"chimera: pipelines (f={f}) must divide devices/2 = {D // 2}")
    if concat not in CONCAT_METHODS:
        raise ValueError(f"chimera: concat must be one of {', '.join(CONCAT_METHODS)}, got {concat!r}")
    place = placement(D, f)
    P = 2 * f
    mb_replica = [0] * N
    pipes: list[tuple[int, list[list[int]], float]] = []
    offset = 0.0
    for mbs, span in units(N, D, concat):
        groups = [mbs[i:i + span] for i in range(0, len(mbs), span)]
        work = 0
        for r, share in enumerate(split_evenly(groups, P)):
            for g in share:
                for m in g:
                    mb_replica[m] = r
            pipes.append((r, share, offset))
            work += len(share) + sum(len(g) for g in share)
        # the next unit starts after this unit's work per device: a device holds one stage of every
        # pipeline, so that is the number of actions of one stage summed over the pipelines
        offset += work
    return place, mb_replica, pipes


def shape(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
          eager: str = "auto") -> Schedule:
    """The schedule without its action lists (placement and micro-batch assignment only): what the
    planner needs to bound a configuration before paying for the merge."""
    place, mb_replica, _ = _plan(devices, microbatches, pipelines, concat)
    return Schedule("chimera", devices, devices, microbatches, place, [[] for _ in range(devices)],
                    mb_replica=mb_replica, params={"pipelines": pipelines, "concat": concat, "eager": eager})


def inflight(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
             eager: str = "auto") -> dict[tuple[int, int], int]:
    """Lower bounds of the in-flight micro-batches per (replica, stage), without merging
    (:func:`planner.schedules.merge.inflight_lower_bound`)."""
    _, _, pipes = _plan_shared(devices, microbatches, pipelines, concat)
    return inflight_lower_bound(devices, pipes)


def forwards_first(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
                   eager: str = "auto") -> list[int]:
    """Per device, forwards certainly run before its first backward, without merging
    (:func:`planner.schedules.merge.forwards_first`)."""
    place, _, pipes = _plan_shared(devices, microbatches, pipelines, concat)
    return merge.forwards_first(devices, place, pipes)


def forward_span(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
                 eager: str = "auto") -> int:
    """The fewest micro-batches one forward runs (2 where every unit doubles its forwards, section 3.5)."""
    return merge.smallest_span(_plan_shared(devices, microbatches, pipelines, concat)[2])


def prefix(devices: int, microbatches: int, slots: int, pipelines: int = 1, concat: str = "direct",
           eager: str = "auto") -> list[list[Action]]:
    """The first ``slots`` unit slots of every device's list: a prefix of :func:`build`'s lists, enough
    to bound the activation memory of the warm-up without merging everything."""
    place, _, pipes = _plan_shared(devices, microbatches, pipelines, concat)
    return merge.merge_pipelines(devices, place, pipes, until=slots)


def build(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
          eager: str = "auto") -> Schedule:
    if eager not in ("auto", "all", "none"):
        raise ValueError(f"chimera: eager must be 'auto', 'all' or 'none', got {eager!r}")
    place, mb_replica, pipes = _plan(devices, microbatches, pipelines, concat)
    acts = merge.merge_pipelines(devices, place, pipes)
    params = {"pipelines": pipelines, "concat": concat, "eager": eager}
    sched = Schedule("chimera", devices, devices, microbatches, place, acts, mb_replica=mb_replica,
                     params=params)
    sched.params["eager"] = _eager_set(sched) if eager == "auto" else eager
    return sched


def _eager_set(sched: Schedule) -> list[int]:
    """Stages whose gradients are complete, on every device that holds them, while that device still has
    computation left (section 3.2: those all-reduces can hide in the bubbles).

    Judged with unit costs (F = 1 per micro-batch, B = 2): every action takes time, so on each device
    the ends of its actions increase along its list, and a stage's last backward ends before the
    device's computation does exactly when it is not the device's last action. The stages excluded are
    those whose backward ends some device's list.
    """
    early = set(range(sched.stages))
    for row in sched.actions:
        comp = [a for a in row if a.kind in (F, B)]
        if comp and comp[-1].kind == B:
            early.discard(comp[-1].stage)
    return sorted(early)
