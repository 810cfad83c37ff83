"""Merging pipelines onto shared devices: the construction behind Chimera (3.1, 3.5, 3.6) and Hanayo (3.2).

Each pipeline (a replica of the stages, with its own micro-batches) is first scheduled *alone* with
1F1B, in unit slots (a forward of any span and a backward each take one slot): that gives every action a
**slot**, its start time if the pipeline had the machine to itself. Devices then run the actions they
hold by list scheduling in unit slots: whenever a device is free it runs, among the next actions of the
(replica, stage) lists it holds whose inputs are there, the one with the smallest slot; where two want
the same slot, the action of the later stage goes first (it is closer to the end of its pipeline, and
delaying it would delay the backward chain). For two pipelines at f = 1 this reproduces the paper's
conflict-free merge (figure 3), and for f > 1 its (D/f - 2) bubbles; a static merge by slot alone does
not (it makes a device wait for a late action while another is ready).

The result is a per-device order; the order, not these unit slots, is what the simulator then times
with the real costs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from planner.schedules.ir import Action, B, F

#: (replica, stage, unit) -> ordered actions of that stage replica in one unit, with priority keys
StageLists = dict[tuple[int, int, int], list[tuple[tuple[float, ...], Action]]]


def one_f_one_b_groups(stage: int, depth: int, groups: Sequence[Sequence[int]]) -> list[Action]:
    """1F1B order of one stage over forward *groups* (a group is one forward action covering its
    micro-batches; backwards are one per micro-batch). Single-micro-batch groups give plain 1F1B with
    ``min(depth-1-stage, n)`` warm-up forwards (PipeDream 3.3)."""
    n = len(groups)
    warmup = min(depth - 1 - stage, n)
    out = [Action(F, stage, g[0], span=len(g)) for g in groups[:warmup]]
    bwd = [m for g in groups for m in g]
    bi = 0
    for g in groups[warmup:]:
        out.append(Action(F, stage, g[0], span=len(g)))
        for _ in range(len(g)):
            out.append(Action(B, stage, bwd[bi]))
            bi += 1
    out.extend(Action(B, stage, m) for m in bwd[bi:])
    return out


def pipeline_slots(depth: int, groups: Sequence[Sequence[int]]) -> list[list[tuple[int, Action]]]:
    """Per stage, (slot, action) of one pipeline of ``depth`` stages run alone with 1F1B, every action one
    slot long. Computed by a direct replay (each stage its own device, no communication)."""
    lists = [one_f_one_b_groups(s, depth, groups) for s in range(depth)]
    fdone: dict[tuple[int, int], int] = {}  # (stage, first mb of group) -> end slot
    bdone: dict[tuple[int, int], int] = {}  # (stage, mb) -> end slot
    group_of: dict[int, int] = {m: g[0] for g in groups for m in g}
    pos = [0] * depth
    free = [0] * depth
    out: list[list[tuple[int, Action]]] = [[] for _ in range(depth)]
    remaining = sum(len(x) for x in lists)
    while remaining:
        progressed = False
        for s in range(depth):
            row = lists[s]
            while pos[s] < len(row):
                a = row[pos[s]]
                if a.kind == F:
                    dep = fdone.get((s - 1, a.mb)) if s > 0 else 0
                else:
                    f_end = fdone.get((s, group_of[a.mb]))
                    nxt = bdone.get((s + 1, a.mb)) if s < depth - 1 else 0
                    dep = None if f_end is None or nxt is None else max(f_end, nxt)
                if dep is None:
                    break
                start = max(free[s], dep)
                free[s] = start + 1
                if a.kind == F:
                    fdone[(s, a.mb)] = start + 1
                else:
                    bdone[(s, a.mb)] = start + 1
                out[s].append((start, a))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B lists of one pipeline cannot deadlock
            raise RuntimeError("1F1B pipeline replay made no progress")
    return out


def list_schedule(devices: int, placement: Sequence[Sequence[int]], lists: StageLists) -> list[list[Action]]:
    """Per-device action order by list scheduling in unit slots (see the module docstring).

    ``lists[(r, s, u)]`` is stage replica (r, s)'s own order in unit ``u`` (of a concatenation), with a
    priority key per action (smaller first); that order is kept, while lists of different units
    interleave by priority. Returns ``actions[d]``.
    """
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


def merge_pipelines(devices: int, placement: Sequence[Sequence[int]],
                    pipelines: Sequence[tuple[int, Sequence[Sequence[int]], float]]) -> list[list[Action]]:
    """Merge 1F1B pipelines onto devices.

    ``pipelines`` lists ``(replica, forward groups, slot offset)``; several entries may share a replica
    (consecutive units of a concatenation, offset so that a unit follows the previous one).
    """
    depth = len(placement[0])
    lists: StageLists = {}
    cache: dict[tuple[int, ...], list[list[tuple[int, Action]]]] = {}
    for u, (r, groups, offset) in enumerate(pipelines):
        if not groups:
            continue
        shape = tuple(len(g) for g in groups)
        if shape not in cache:
            local, i = [], 0
            for n in shape:
                local.append(list(range(i, i + n)))
                i += n
            cache[shape] = pipeline_slots(depth, local)
        flat = [m for g in groups for m in g]
        for s, row in enumerate(cache[shape]):
            dst = lists.setdefault((r, s, u), [])
            for slot, a in row:
                dst.append(((offset + slot, -s, r), Action(a.kind, s, flat[a.mb], r, a.span)))
    return list_schedule(devices, placement, lists)
