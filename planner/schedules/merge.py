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

import functools
import heapq
import threading
from collections import OrderedDict
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


#: one action of a stage's template row: (unit slot, is backward, first local micro-batch, span)
TemplateAction = tuple[int, bool, int, int]
Pipelines = Sequence[tuple[int, Sequence[Sequence[int]], float]]


@functools.lru_cache(maxsize=512)
def template(depth: int, shape: tuple[int, ...]) -> list[list[TemplateAction]]:
    """Per stage, the slots of one pipeline of ``depth`` stages run alone with 1F1B, every action one slot long,
    for forward groups of sizes ``shape`` over local micro-batches ``0..n-1``, as :data:`TemplateAction` rows
    per stage (shared by units, and by schedules, of the same shape; read-only). A direct replay -- each stage
    in turn runs what it can, an action starting when its stage is free and its input has ended -- on flat
    integer tables (a replay's slots depend on the dependencies only, not on the order it visits the stages
    in; ``tests/test_search_fast_paths.py`` compares it with a replay of :class:`Action` records)."""
    M = sum(shape)
    groups, group_first = [], []
    for size in shape:
        first = len(group_first)
        groups.append(range(first, first + size))
        group_first.extend([first] * size)
    # per stage, the 1F1B order of one_f_one_b_groups as (is B, mb, span), written without its actions: the
    # groups are consecutive ranges from 0, so the backwards run the local micro-batches 0..M-1 in order
    rows = []
    for s in range(depth):
        warm = min(depth - 1 - s, len(groups))
        row = [(False, g.start, len(g)) for g in groups[:warm]]
        bi = 0  # the next backward's micro-batch
        for g in groups[warm:]:
            row.append((False, g.start, len(g)))
            row.extend([(True, m, 1) for m in range(bi, bi + len(g))])
            bi += len(g)
        row.extend([(True, m, 1) for m in range(bi, M)])
        rows.append(row)
    f_end = [-1] * (depth * M)  # end slot of the forward of (stage, first mb of its group); -1: not yet
    b_end = [-1] * (depth * M)
    free, pos = [0] * depth, [0] * depth
    out: list[list[TemplateAction]] = [[] for _ in range(depth)]
    remaining = sum(len(row) for row in rows)
    last = depth - 1
    while remaining:
        progressed = False
        for s in range(depth):
            row, i, f, o, base = rows[s], pos[s], free[s], out[s], s * M
            top = len(row)
            while i < top:
                isb, lm, span = row[i]
                if isb:
                    dep = f_end[base + group_first[lm]]
                    if dep < 0:
                        break
                    if s < last:
                        nxt = b_end[base + M + lm]
                        if nxt < 0:
                            break
                        if nxt > dep:
                            dep = nxt
                elif s:
                    dep = f_end[base - M + lm]
                    if dep < 0:
                        break
                else:
                    dep = 0
                start = f if f > dep else dep
                f = start + 1
                if isb:
                    b_end[base + lm] = f
                else:
                    f_end[base + lm] = f
                o.append((start, isb, lm, span))
                i += 1
            if i != pos[s]:
                progressed = True
                remaining -= i - pos[s]
                pos[s], free[s] = i, f
        if not progressed:  # pragma: no cover - 1F1B lists of one pipeline cannot deadlock
            raise RuntimeError("1F1B pipeline replay made no progress")
    return out


def stage_lists(depth: int, pipelines: Pipelines) -> StageLists:
    """The lists :class:`ListScheduler` orders, written out: ``lists[(r, s, u)]`` is stage replica (r, s)'s
    1F1B order in unit ``u`` with its priority ``(offset + slot, -s, r)`` per action."""
    lists: StageLists = {}
    for u, (r, groups, offset) in enumerate(pipelines):
        if not groups:
            continue
        flat = [m for g in groups for m in g]
        for s, row in enumerate(template(depth, tuple(len(g) for g in groups))):
            lists[(r, s, u)] = [((offset + slot, -s, r), Action(B if isb else F, s, flat[lm], r, span))
                                for slot, isb, lm, span in row]
    return lists


class ListScheduler:
    """Per-device action order by list scheduling in unit slots (see the module docstring).

    The lists are those of :func:`stage_lists` -- stage replica (r, s)'s own 1F1B order in unit ``u``,
    with priority ``(offset + slot, -s, r)`` per action (smaller first) -- but they are never written
    out: each list reads its unit's shared :func:`template` row, and an :class:`Action` is created only
    when it is scheduled. A list's order is kept, while lists of different units interleave by priority.

    Slot by slot: every action lasts one slot, so every device is free at the start of every slot. The
    head of each list becomes a *candidate* of its device at the slot its last input ends; at each slot
    every device that has candidates runs the one with the smallest priority (ties: the first list in
    (r, s, u) order), and what that action unblocks becomes a candidate at the next slot. Only devices
    with candidates are visited, and slots where nothing becomes ready are skipped. Priorities, inputs
    and heap entries are plain integers.

    :meth:`run` ``(until)`` stops before that slot -- the lists so far are then prefixes of the full ones
    (the order is decided slot by slot), which is enough to bound what the beginning of a schedule
    needs -- and a later :meth:`run` goes on from there.
    """

    def __init__(self, devices: int, placement: Sequence[Sequence[int]], pipelines: Pipelines) -> None:
        S, R = len(placement[0]), len(placement)
        M = 1 + max((m for _, groups, _ in pipelines for g in groups for m in g), default=0)
        units = [(r, u, template(S, tuple(len(g) for g in groups)), [m for g in groups for m in g], offset)
                 for u, (r, groups, offset) in enumerate(pipelines) if groups]
        owner = [-1] * M
        for r, _, _, flat, offset in units:
            if offset != int(offset):
                raise ValueError(f"unit offsets must be whole slots, got {offset}")
            for m in flat:
                if owner[m] not in (-1, r):
                    raise ValueError(f"micro-batch {m} is in pipelines of two replicas")
                owner[m] = r
        units.sort(key=lambda x: (x[0], x[1]))
        # lists in (r, s, u) order; per list its template row, micro-batches, device, priority of slot 0,
        # stage, replica, and the index of (stage s, micro-batch 0) in end_f / end_b (a micro-batch
        # belongs to one replica)
        SR = S * R
        self.rows: list[list[TemplateAction]] = []
        self.flats: list[list[int]] = []
        self.base: list[int] = []
        self.pbase: list[int] = []
        self.dev: list[int] = []
        self.stage_of: list[int] = []
        self.replica_of: list[int] = []
        i = 0
        while i < len(units):
            j = i
            while j < len(units) and units[j][0] == units[i][0]:
                j += 1
            r = units[i][0]
            for s in range(S):
                d, b0, p0 = placement[r][s], s * M, (S - 1 - s) * R + r
                for _, _, t_rows, flat, offset in units[i:j]:
                    self.rows.append(t_rows[s])
                    self.flats.append(flat)
                    self.base.append(b0)
                    self.pbase.append(int(offset) * SR + p0)
                    self.dev.append(d)
                    self.stage_of.append(s)
                    self.replica_of.append(r)
            i = j
        self.S, self.M, self.SR, self.L = S, M, SR, len(self.rows)
        self.end_f = [-1] * (S * M)  # end slot of the forward of (stage, mb); -1: not scheduled yet
        self.end_b = [-1] * (S * M)
        self.wait_f: dict[int, list[int]] = {}  # unscheduled forward -> lists waiting for it
        self.wait_b: dict[int, list[int]] = {}
        self.head = [0] * self.L
        self.ready: list[list[int]] = [[] for _ in range(devices)]  # heap of priority * L + list
        self.later: dict[int, list[int]] = {}  # slot -> lists whose head becomes a candidate then
        self.active: set[int] = set()  # devices with candidates
        self.out: list[list[Action]] = [[] for _ in range(devices)]
        self.remaining = sum(len(row) for row in self.rows)
        self.t = 0
        self.started = False
        #: slot -> per device, the length of its list when :meth:`run` stopped before that slot: the prefix
        #: ``run(until)`` gave, read again without merging from the start (:func:`merge_pipelines`)
        self.marks: dict[int, list[int]] = {}

    def run(self, until: int | None = None) -> list[list[Action]]:
        """Schedule up to slot ``until`` (everything: None); returns the per-device lists so far (live:
        a later :meth:`run` appends to them)."""
        rows, head, ready, later, active, out = self.rows, self.head, self.ready, self.later, self.active, self.out
        dev, pbase, stage_of, replica_of, flats, base = (self.dev, self.pbase, self.stage_of, self.replica_of,
                                                         self.flats, self.base)
        end_f, end_b, wait_f, wait_b = self.end_f, self.end_b, self.wait_f, self.wait_b
        S, M, SR, L = self.S, self.M, self.SR, self.L
        push, pop = heapq.heappush, heapq.heappop
        last = S - 1
        new = tuple.__new__  # Action(...) without its keyword-handling constructor (3x cheaper)

        def examine(k: int, now: int) -> None:
            """Make the head of list ``k`` a candidate (now or at the slot its inputs end), or wait for
            its first unscheduled input."""
            row, i = rows[k], head[k]
            if i >= len(row):
                return
            slot, isb, lm, span = row[i]
            if not isb:
                at = 0
                if stage_of[k]:
                    prev, flat = base[k] - M, flats[k]
                    if span == 1:  # (the common case, without the loop)
                        x = prev + flat[lm]
                        at = end_f[x]
                        if at < 0:
                            got = wait_f.get(x)
                            if got is None:
                                wait_f[x] = [k]
                            else:
                                got.append(k)
                            return
                    else:
                        for j in range(lm, lm + span):
                            end = end_f[prev + flat[j]]
                            if end < 0:
                                wait_f.setdefault(prev + flat[j], []).append(k)
                                return
                            if end > at:
                                at = end
            else:
                x = base[k] + flats[k][lm]
                at = end_f[x]
                if at < 0:
                    got = wait_f.get(x)
                    if got is None:
                        wait_f[x] = [k]
                    else:
                        got.append(k)
                    return
                if stage_of[k] < last:
                    x += M
                    end = end_b[x]
                    if end < 0:
                        got = wait_b.get(x)
                        if got is None:
                            wait_b[x] = [k]
                        else:
                            got.append(k)
                        return
                    if end > at:
                        at = end
            if at <= now:
                d = dev[k]
                push(ready[d], (pbase[k] + slot * SR) * L + k)
                active.add(d)
            else:
                later.setdefault(at, []).append(k)

        if not self.started:
            self.started = True
            # at slot 0 nothing has run: a list headed by a forward of stage 0 is a candidate, one headed by a
            # forward of a later stage waits for the previous stage's forward of its first micro-batch
            # (what examine() finds, without its general case)
            for k in range(L):
                row = rows[k]
                if not row:
                    continue
                slot, isb, lm, _ = row[0]
                if isb:
                    examine(k, 0)
                elif stage_of[k]:
                    x = base[k] - M + flats[k][lm]
                    got = wait_f.get(x)
                    if got is None:
                        wait_f[x] = [k]
                    else:
                        got.append(k)
                else:
                    d = dev[k]
                    push(ready[d], (pbase[k] + slot * SR) * L + k)
                    active.add(d)
        remaining, t = self.remaining, self.t
        while remaining and (until is None or t < until):
            for k in later.pop(t, ()):
                d = dev[k]
                push(ready[d], (pbase[k] + rows[k][head[k]][0] * SR) * L + k)
                active.add(d)
            if not active:
                if not later:
                    raise RuntimeError("list scheduling made no progress: the stage lists are inconsistent")
                t = min(later)
                continue
            end = t + 1
            for d in list(active):
                rdy = ready[d]
                k = pop(rdy) % L
                if not rdy:
                    active.discard(d)
                _, isb, lm, span = rows[k][head[k]]
                head[k] += 1
                remaining -= 1
                s, flat = stage_of[k], flats[k]
                if isb:
                    m = flat[lm]
                    out[d].append(new(Action, (B, s, m, replica_of[k], 1, -1)))
                    x = base[k] + m
                    end_b[x] = end
                    waiting = wait_b.pop(x, None)
                    if waiting is not None:
                        for waiter in waiting:
                            examine(waiter, t)
                else:
                    out[d].append(new(Action, (F, s, flat[lm], replica_of[k], span, -1)))
                    for j in range(lm, lm + span):
                        x = base[k] + flat[j]
                        end_f[x] = end
                        waiting = wait_f.pop(x, None)
                        if waiting is not None:
                            for waiter in waiting:
                                examine(waiter, t)
                examine(k, t)
            t = end
        self.remaining, self.t = remaining, t
        if until is not None:
            self.marks[until] = [len(row) for row in out]
        return out


#: the schedulers the last prefixes were merged with, per thread, so that a later full merge of the same
#: pipelines (the planner's pattern: bound the warm-up, later build) goes on instead of starting over
_suspended = threading.local()
_SUSPENDED_KEPT = 64


def merge_pipelines(devices: int, placement: Sequence[Sequence[int]], pipelines: Pipelines,
                    until: int | None = None) -> list[list[Action]]:
    """Merge 1F1B pipelines onto devices (:class:`ListScheduler`); with ``until``, only the first slots.

    ``pipelines`` lists ``(replica, forward groups, slot offset)``; several entries may share a replica
    (consecutive units of a concatenation, offset so that a unit follows the previous one).
    """
    key = (devices, tuple(map(tuple, placement)),
           tuple((r, tuple(map(tuple, groups)), offset) for r, groups, offset in pipelines))
    kept: OrderedDict[tuple, ListScheduler] | None = getattr(_suspended, "kept", None)
    if kept is None:
        kept = _suspended.kept = OrderedDict()
    sched = kept.pop(key, None)
    if sched is not None and until is not None and sched.t > until:
        lengths = sched.marks.get(until)
        if lengths is not None:  # a prefix it gave before (the same structure under another schedule key)
            kept[key] = sched
            return [row[:n] for row, n in zip(sched.out, lengths, strict=True)]
        sched = None
    if sched is None:
        sched = ListScheduler(devices, placement, pipelines)
    out = sched.run(until)
    if until is None:
        return out
    kept[key] = sched
    while len(kept) > _SUSPENDED_KEPT:
        kept.popitem(last=False)
    return [list(row) for row in out]


def inflight_lower_bound(depth: int, pipelines: Pipelines) -> dict[tuple[int, int], int]:
    """Per (replica, stage), micro-batches whose activations are certainly alive at once in the merged
    schedule, known without merging: each (replica, stage, unit) list keeps its 1F1B order, in which
    ``min(depth-1-s, n) + 1`` forward groups precede the first backward, and forwards of other units
    of the same stage only add to that count. The planner uses it to reject configurations that
    cannot fit before paying for the merge."""
    out: dict[tuple[int, int], int] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for r, groups, _ in pipelines:
        sizes = tuple(len(g) for g in groups)
        if not groups or (r, sizes) in seen:  # units of the same shape give the same counts
            continue
        seen.add((r, sizes))
        before = [0]  # before[i]: micro-batches in the first i groups
        for n in sizes:
            before.append(before[-1] + n)
        for s in range(depth):
            count = before[min(depth - s, len(sizes))]
            if count > out.get((r, s), 0):
                out[(r, s)] = count
    return out


def forwards_first(devices: int, placement: Sequence[Sequence[int]], pipelines: Pipelines) -> list[int]:
    """Per device, forwards certainly run before its first backward in the merged lists, known without
    merging (a count the memory check multiplies by the smallest activation of the device's stages).

    In unit slots no backward of stage ``s`` (of S) can run before slot ``2S - 1 - s``: its micro-batch's
    forward through every stage and backward down to ``s + 1`` take one slot each. So a device runs only
    forwards until ``tau``, the least of these slots over the stages it holds. And it runs one in every slot
    before ``tau`` while it has a candidate (:class:`ListScheduler` runs, at every slot, one candidate on each
    device that has one): the forwards of stage 0 wait for nothing, and each (replica, stage 0, unit) list
    starts with ``min(S, n)`` of its ``n`` forward groups before its first backward
    (:func:`one_f_one_b_groups`). A device holding stage 0 of some pipelines thus runs a forward in each
    of its first ``min(tau, sum of those)`` slots, before any backward; others are counted as 0."""
    S = len(placement[0])
    tau = [-1] * devices
    for row in placement:
        for s, d in enumerate(row):
            first_b = 2 * S - 1 - s
            if tau[d] < 0 or first_b < tau[d]:
                tau[d] = first_b
    ready = [0] * devices
    for r, groups, _ in pipelines:
        if groups:
            ready[placement[r][0]] += min(S, len(groups))
    return [min(t, n) if t >= 0 else 0 for t, n in zip(tau, ready, strict=True)]


def smallest_span(pipelines: Pipelines) -> int:
    """The fewest micro-batches a forward of these pipelines runs (a forward group's size): what each forward
    of :func:`forwards_first` adds at least to the alive activations, in micro-batches of its stage."""
    return min((len(g) for _, groups, _ in pipelines for g in groups), default=1)
