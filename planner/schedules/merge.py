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


def list_schedule(devices: int, placement: Sequence[Sequence[int]], lists: StageLists,
                  until: int | None = None) -> list[list[Action]]:
    """Per-device action order by list scheduling in unit slots (see the module docstring).

    ``lists[(r, s, u)]`` is stage replica (r, s)'s own order in unit ``u`` (of a concatenation), with a
    priority key per action (smaller first); that order is kept, while lists of different units
    interleave by priority. Returns ``actions[d]``.

    Slot by slot: every action lasts one slot, so every device is free at the start of every slot. The
    head of each list becomes a *candidate* of its device at the slot its last input ends; at each slot
    every device that has candidates runs the one with the smallest priority (ties: the first list in
    key order), and what that action unblocks becomes a candidate at the next slot. Only devices with
    candidates are visited, and slots where nothing becomes ready are skipped.

    ``until``: stop before that slot; the lists returned are then prefixes of the full ones (the order is
    decided slot by slot), which is enough to bound what the beginning of a schedule needs.
    """
    S = len(placement[0])
    keys = sorted(lists)
    rows = [lists[key] for key in keys]
    dev_of = [placement[r][s] for r, s, _ in keys]
    head = [0] * len(keys)
    end_f: dict[tuple[int, int, int], int] = {}  # (replica, stage, mb) -> end slot of its forward
    end_b: dict[tuple[int, int, int], int] = {}  # ... of its backward
    waiting: dict[tuple[str, int, int, int], list[int]] = {}  # unscheduled input -> lists waiting for it
    ready: list[list[tuple[tuple[float, ...], int]]] = [[] for _ in range(devices)]  # (prio, list)
    later: dict[int, list[int]] = {}  # slot -> lists whose head becomes a candidate then
    active: set[int] = set()  # devices with candidates
    out: list[list[Action]] = [[] for _ in range(devices)]

    def examine(k: int, now: int) -> None:
        """Make the head of list ``k`` a candidate (now or at the slot its inputs end), or wait for its
        first unscheduled input."""
        row, i = rows[k], head[k]
        if i >= len(row):
            return
        prio, a = row[i]
        r, s, _ = keys[k]
        at = 0  # the slot its last input ends
        if a.kind == F:
            if s > 0:
                for m in range(a.mb, a.mb + a.span):
                    end = end_f.get((r, s - 1, m))
                    if end is None:
                        waiting.setdefault((F, r, s - 1, m), []).append(k)
                        return
                    if end > at:
                        at = end
        else:
            end = end_f.get((r, s, a.mb))
            if end is None:
                waiting.setdefault((F, r, s, a.mb), []).append(k)
                return
            at = end
            if s < S - 1:
                end = end_b.get((r, s + 1, a.mb))
                if end is None:
                    waiting.setdefault((B, r, s + 1, a.mb), []).append(k)
                    return
                if end > at:
                    at = end
        if at <= now:
            d = dev_of[k]
            heapq.heappush(ready[d], (prio, k))
            active.add(d)
        else:
            later.setdefault(at, []).append(k)

    for k in range(len(keys)):
        examine(k, 0)
    remaining = sum(len(row) for row in rows)
    t = 0
    while remaining and (until is None or t < until):
        for k in later.pop(t, ()):
            d = dev_of[k]
            heapq.heappush(ready[d], (rows[k][head[k]][0], k))
            active.add(d)
        if not active:
            if not later:
                raise RuntimeError("list scheduling made no progress: the stage lists are inconsistent")
            t = min(later)
            continue
        end = t + 1
        for d in list(active):
            rdy = ready[d]
            _, k = heapq.heappop(rdy)
            if not rdy:
                active.discard(d)
            a = rows[k][head[k]][1]
            head[k] += 1
            remaining -= 1
            out[d].append(a)
            r, s = a.replica, a.stage
            if a.kind == F:
                for m in range(a.mb, a.mb + a.span):
                    end_f[(r, s, m)] = end
                    for waiter in waiting.pop((F, r, s, m), ()):
                        examine(waiter, t)
            else:
                end_b[(r, s, a.mb)] = end
                for waiter in waiting.pop((B, r, s, a.mb), ()):
                    examine(waiter, t)
            examine(k, t)
        t = end
    return out


def merge_pipelines(devices: int, placement: Sequence[Sequence[int]],
                    pipelines: Sequence[tuple[int, Sequence[Sequence[int]], float]],
                    until: int | None = None) -> list[list[Action]]:
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
    return list_schedule(devices, placement, lists, until)


def inflight_floor(depth: int, pipelines: Sequence[tuple[int, Sequence[Sequence[int]], float]]
                   ) -> dict[tuple[int, int], int]:
    """Per (replica, stage), micro-batches whose activations are certainly alive at once in the merged
    schedule, known without merging: each (replica, stage, unit) list keeps its 1F1B order, in which
    ``min(depth-1-s, n) + 1`` forward groups precede the first backward, and forwards of other units
    of the same stage only add to that count. The planner uses it to reject configurations that
    cannot fit before paying for the merge."""
    out: dict[tuple[int, int], int] = {}
    for r, groups, _ in pipelines:
        if not groups:
            continue
        for s in range(depth):
            w = min(depth - 1 - s, len(groups))
            count = sum(len(g) for g in groups[:w + 1])
            if count > out.get((r, s), 0):
                out[(r, s)] = count
    return out
