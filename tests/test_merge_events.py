"""The event-driven list scheduling of :mod:`planner.schedules.merge` against a slot-by-slot scan of
every device over the written-out lists (its first implementation), and Chimera's eager stages against
their definition."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from planner.schedules import build, chimera, hanayo, merge
from planner.schedules.ir import Action, B, F
from planner.schedules.merge import StageLists
from planner.simulate import simulate


def slot_scan(devices: int, placement: Sequence[Sequence[int]], lists: StageLists,
              until: int | None = None) -> list[list[Action]]:
    """The list scheduling as first written: at every slot, scan every free device's lists."""
    S = len(placement[0])
    dev_keys: list[list[tuple[int, int, int]]] = [[] for _ in range(devices)]
    for key in sorted(lists):
        dev_keys[placement[key[0]][key[1]]].append(key)
    heads = dict.fromkeys(lists, 0)
    fdone: dict[tuple[int, int, int], int] = {}
    bdone: dict[tuple[int, int, int], int] = {}
    free = [0] * devices
    out: list[list[Action]] = [[] for _ in range(devices)]
    remaining = sum(len(v) for v in lists.values())
    times = [0]
    seen_times = {0}
    while remaining:
        if not times:
            raise RuntimeError("list scheduling made no progress: the stage lists are inconsistent")
        t = heapq.heappop(times)
        seen_times.discard(t)
        for d in range(devices):
            if free[d] > t:
                continue
            best: tuple[tuple[float, ...], tuple[int, int, int], Action] | None = None
            for key in dev_keys[d]:
                i = heads[key]
                row = lists[key]
                if i >= len(row):
                    continue
                prio, a = row[i]
                r, s = key[0], key[1]
                if a.kind == F:
                    ok = s == 0 or all(fdone.get((r, s - 1, m), t + 1) <= t for m in a.mbs)
                else:
                    ok = fdone.get((r, s, a.mb), t + 1) <= t and (
                        s == S - 1 or bdone.get((r, s + 1, a.mb), t + 1) <= t)
                if ok and (best is None or prio < best[0]):
                    best = (prio, key, a)
            if best is None:
                continue
            _, key, a = best
            heads[key] += 1
            remaining -= 1
            end = t + 1
            if a.kind == F:
                for m in a.mbs:
                    fdone[(a.replica, a.stage, m)] = end
            else:
                bdone[(a.replica, a.stage, a.mb)] = end
            free[d] = end
            if end not in seen_times:
                seen_times.add(end)
                heapq.heappush(times, end)
            out[d].append(a)
    return out


CHIMERA = [(D, N, f, c) for D in (2, 4, 6, 8, 16) for N in (1, 3, 4, 8, 13, 16, 33) for f in (1, 2, 4)
           for c in ("direct", "forward-doubling") if (D // 2) % f == 0]
HANAYO = [(P, N, w) for P in (1, 2, 3, 4, 8) for N in (1, 2, 5, 8, 17) for w in (1, 2, 3)]


@pytest.fixture
def scan(monkeypatch):
    """Build with the slot scan instead of the event-driven scheduler."""
    def use() -> None:
        def scan_written_out(devices, placement, pipelines, until=None):
            return slot_scan(devices, placement, merge.stage_lists(len(placement[0]), pipelines), until)
        monkeypatch.setattr(merge, "merge_pipelines", scan_written_out)
    return use


@pytest.mark.parametrize("D,N,f,concat", CHIMERA)
def test_chimera_orders_match_slot_scan(D, N, f, concat, scan):
    fast = chimera.build(D, N, pipelines=f, concat=concat, eager="none")
    scan()
    ref = chimera.build(D, N, pipelines=f, concat=concat, eager="none")
    assert fast.actions == ref.actions


@pytest.mark.parametrize("P,N,w", HANAYO)
def test_hanayo_orders_match_slot_scan(P, N, w, scan):
    fast = hanayo.build(P, N, waves=w)
    scan()
    assert fast.actions == hanayo.build(P, N, waves=w).actions


def eager_by_simulation(sched) -> list[int]:
    """Section 3.2's definition, by a unit-cost simulation: stages whose last backward on every device
    holding them ends before that device's computation does."""
    res = simulate(build("chimera", sched.devices, sched.microbatches, pipelines=sched.params["pipelines"],
                         concat=sched.params["concat"], eager="none"))
    early = set(range(sched.stages))
    for row in res.timeline:
        comp = [(a, e) for a, _, e in row if a.kind in (F, B)]
        if not comp:
            continue
        last = {a.stage: e for a, e in comp if a.kind == B}
        early -= {s for s, e in last.items() if e >= comp[-1][1]}
    return sorted(early)


@pytest.mark.parametrize("D,N,f,concat", CHIMERA)
def test_chimera_eager_set_matches_definition(D, N, f, concat):
    sched = build("chimera", D, N, pipelines=f, concat=concat)
    assert sched.params["eager"] == eager_by_simulation(sched)


@pytest.mark.parametrize("D,N,f,concat", [(8, 16, 1, "direct"), (8, 13, 2, "forward-doubling"), (16, 33, 4, "direct")])
def test_prefix_asked_again_is_the_prefix(D, N, f, concat):
    """A prefix asked for again after the merge went further (the same structure under another schedule
    key: Chimera's concatenations coincide for N < 2D) is read from the scheduler's marks, not merged
    again: it is the prefix a fresh scheduler gives, and the merge goes on from where it was."""
    place, _, pipes = chimera._plan(D, N, f, concat)
    key = (D, tuple(map(tuple, place)), tuple((r, tuple(map(tuple, g)), o) for r, g, o in pipes))
    merge._suspended.kept = OrderedDict()
    for until in (D, 2 * D):
        merge.merge_pipelines(D, place, pipes, until=until)
    sched = merge._suspended.kept[key]
    again = merge.merge_pipelines(D, place, pipes, until=D)
    assert merge._suspended.kept[key] is sched  # read from the marks: the same scheduler, not a new one
    assert again == merge.ListScheduler(D, place, pipes).run(D)
    assert merge.merge_pipelines(D, place, pipes, until=3 * D) == merge.ListScheduler(D, place, pipes).run(3 * D)
    assert merge.merge_pipelines(D, place, pipes) == chimera.build(D, N, pipelines=f, concat=concat).actions
