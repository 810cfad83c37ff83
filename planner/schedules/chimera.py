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

How the merge works (the hint of the paper's figure 3): each pipeline's 1F1B lists are timed alone in
unit slots (F = B = 1, where the paper proves the merge conflict-free for even D); every device then
runs the actions it holds in slot order, and where two pipelines want the same slot the action of the
*later stage* goes first (it is closer to the end of its pipeline, so delaying it would delay the
backward chain). Units of a concatenation are offset by their work per device, ``2 * D`` slots for a
basic unit, so that a unit's first forwards land in the previous unit's tail bubbles. Timed with F = 1,
B = 2 the result is the paper's "practical" schedule: bubble ratio (D-2)/(3N/2+D-2) for N = D, e.g.
makespan 16 for D = 4 and 36 for D = 8; with F = B, (D-2)/(2N+D-2).

Gradient synchronisation (section 3.2): the all-reduce of a stage replica whose gradients are complete
while the device still has computation left is issued eagerly, right after its last backward (in the
paper's figure 4(b), stage 3 on P0 and P3); the middle stages, finished last, are all-reduced at the
end ("eager-sync-opt"). ``eager="auto"`` finds these stages with a unit-cost simulation; ``"all"``
and ``"none"`` force the choice.
"""

from __future__ import annotations

from planner.schedules.common import check_positive
from planner.schedules.ir import Action, B, F, Schedule

CONCAT_METHODS = ("direct", "forward-doubling", "backward-halving")


def placement(devices: int, pipelines: int) -> list[list[int]]:
    """``placement[r][s]`` for the ``2f`` pipelines (section 3.6)."""
    D, f = devices, pipelines
    down = [[(i * (D // f) + s) % D for s in range(D)] for i in range(f)]
    up = [list(reversed(row)) for row in down]
    return down + up


def split_evenly(items: list[int], parts: int) -> list[list[int]]:
    """Contiguous, as even as possible, earlier parts larger."""
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for p in range(parts):
        n = q + (1 if p < r else 0)
        out.append(items[i:i + n])
        i += n
    return out


def _one_f_one_b_pairs(stage: int, depth: int, groups: list[list[int]]) -> list[Action]:
    """1F1B order of one stage of one pipeline over forward groups (each group one forward action
    covering its micro-batches, backwards one per micro-batch). With single-micro-batch groups this is
    plain 1F1B (warm-up ``min(D-1-s, n)``)."""
    n = len(groups)
    warmup = min(depth - 1 - stage, n)
    out = [Action(F, stage, g[0], span=len(g)) for g in groups[:warmup]]
    bwd = [m for g in groups for m in g]
    bi = 0
    per_group = max(len(g) for g in groups) if groups else 1
    for g in groups[warmup:]:
        out.append(Action(F, stage, g[0], span=len(g)))
        for _ in range(per_group):
            if bi < len(bwd):
                out.append(Action(B, stage, bwd[bi]))
                bi += 1
    out.extend(Action(B, stage, m) for m in bwd[bi:])
    return out


def _slot_times(depth: int, groups: list[list[int]]) -> list[list[tuple[float, Action]]]:
    """Start slot of every action of one pipeline timed alone with F(group) = B = 1 (unit slots)."""
    from planner.simulate import UnitCosts, simulate  # local: simulate imports the IR only

    lists = [_one_f_one_b_pairs(s, depth, groups) for s in range(depth)]
    nmb = max((m for g in groups for m in g), default=-1) + 1
    sched = Schedule("pipe", depth, depth, nmb, [list(range(depth))], lists)
    res = simulate(sched, _SlotCosts())  # type: ignore[arg-type]
    return [[(start, a) for a, start, _ in row if a.kind in (F, B)] for row in res.timeline]


class _SlotCosts:
    """F of any span = B = 1 slot (section 3.5: doubled forward and single backward are 'equal')."""

    def compute(self, kind: str, stage: int, span: int, device: int) -> float:
        return 1.0

    def p2p(self, kind: str, stage: int, span: int, src: int, dst: int) -> float:
        return 0.0

    def allreduce(self, stage: int, replica: int, device: int) -> float:
        return 0.0

    def step(self, device: int) -> float:
        return 0.0


def build(devices: int, microbatches: int, pipelines: int = 1, concat: str = "direct",
          eager: str = "auto") -> Schedule:
    check_positive(devices=devices, microbatches=microbatches, pipelines=pipelines)
    D, N, f = devices, microbatches, pipelines
    if D % 2:
        raise ValueError(f"chimera needs an even number of devices (pipeline stages), got devices={D}")
    if (D // 2) % f:
        raise ValueError(f"chimera: pipelines (f={f}) must divide devices/2 = {D // 2}")
    if concat not in CONCAT_METHODS:
        raise ValueError(f"chimera: concat must be one of {', '.join(CONCAT_METHODS)}, got {concat!r}")
    if eager not in ("auto", "all", "none"):
        raise ValueError(f"chimera: eager must be 'auto', 'all' or 'none', got {eager!r}")
    place = placement(D, f)
    P = 2 * f

    # units: (list of micro-batch ids, span of forwards)
    units: list[tuple[list[int], int]] = []
    if N <= D or concat == "direct":
        for start in range(0, N, D):
            units.append((list(range(start, min(N, start + D))), 1))
    else:
        K, rest = divmod(N, D)
        doubled = K // 2
        for u in range(doubled):
            units.append((list(range(2 * D * u, 2 * D * (u + 1))), 2))
        tail = list(range(2 * D * doubled, N))
        for start in range(0, len(tail), D):
            units.append((tail[start:start + D], 1))

    mb_replica = [0] * N
    per_dev: list[list[tuple[float, int, int, Action]]] = [[] for _ in range(D)]
    offset = 0.0
    timing_cache: dict[tuple[int, ...], list[list[tuple[float, Action]]]] = {}
    for mbs, span in units:
        shares = split_evenly(mbs, P) if span == 1 else [
            [m for pair in part for m in pair] for part in split_evenly(
                [mbs[i:i + 2] for i in range(0, len(mbs), 2)], P)]  # type: ignore[misc]
        unit_work = 0
        for r, share in enumerate(shares):
            if not share:
                continue
            for m in share:
                mb_replica[m] = r
            groups = [share[i:i + span] for i in range(0, len(share), span)]
            shape = tuple(len(g) for g in groups)
            if shape not in timing_cache:
                local = [list(range(sum(shape[:i]), sum(shape[:i + 1]))) for i in range(len(shape))]
                timing_cache[shape] = _slot_times(D, local)
            times = timing_cache[shape]
            unit_work += len(groups) + len(share)
            for s in range(D):
                d = place[r][s]
                for start, a in times[s]:
                    per_dev[d].append((offset + start, -s, r, Action(a.kind, s, share[a.mb], r, a.span)))
        # the next unit starts after this unit's work per device: unit_work sums, over the pipelines,
        # the actions of one stage, and a device holds one stage of every pipeline
        offset += unit_work
    acts = [[a for *_, a in sorted(row, key=lambda t: (t[0], t[1], t[2]))] for row in per_dev]
    params = {"pipelines": f, "concat": concat, "eager": eager}
    sched = Schedule("chimera", D, D, N, place, acts, mb_replica=mb_replica, params=params)
    sched.params["eager"] = _eager_set(sched) if eager == "auto" else eager
    return sched


def _eager_set(sched: Schedule) -> list[int]:
    """Stages whose gradients are complete, on every device that holds them, while that device still has
    computation left (section 3.2: those all-reduces can hide in the bubbles)."""
    from planner.simulate import simulate

    res = simulate(Schedule(sched.name, sched.devices, sched.stages, sched.microbatches, sched.placement,
                            sched.actions, sched.mb_replica, {**sched.params, "eager": "none"}))
    early = set(range(sched.stages))
    for row in res.timeline:
        comp = [(a, e) for a, _, e in row if a.kind in (F, B)]
        if not comp:
            continue
        end_of_compute = comp[-1][1]
        last: dict[int, float] = {}
        for a, e in comp:
            if a.kind == B:
                last[a.stage] = e
        early -= {s for s, e in last.items() if e >= end_of_compute}
    return sorted(early)
