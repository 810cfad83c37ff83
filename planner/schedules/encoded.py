"""A compute-only schedule encoded as integer arrays (:class:`EncodedSchedule`) and its fast replay
(:func:`replay_encoded`): the compute actions are replayed and the communication :func:`lower` would add
is implied at the points where it would put it, giving the same times, figures and timeline as
:func:`planner.schedules.replay.replay_lowered` of ``lower(schedule)`` (``tests/test_fast_replay.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from planner.schedules.ir import (
    ALLREDUCE,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    STEP,
    Action,
    B,
    F,
    I,
    Schedule,
    W,
    eager_stages,
    lowered_row,
)
from planner.schedules.timing import (
    AllReduces,
    Costs,
    DeviceStats,
    HostSpans,
    SimResult,
    contention_debt,
    memoised_durations,
    plain_number,
)

_KIND_CODE = {F: 0, B: 1, I: 2, W: 3}


@dataclass
class EncodedSchedule:
    """A compute-only schedule as integer arrays for :func:`replay_encoded`.

    Compute actions are numbered globally (device 0's list first, each device's list a run of numbers).
    The replay keeps, per action ``j``, two times in one flat list: slot ``j`` the end of ``j`` and slot
    ``n + j`` the arrival of the message ``j`` sends (when its consumer sits on another device), with
    ``n = len(acts)``. An action waits for at most two
    slots, ``dep_a[j]`` then ``dep_b[j]``, in the order the lowered replay checks its inputs (the first
    strictly latest one is its binding predecessor on the critical path): a forward for the forward of
    the previous stage (its end, or the arrival of its message), a backward for its own forward and
    then the gradient from the next stage, a W for its I. A missing producer is the slot
    ``2 * len(acts)``, never filled; no input is the slot ``2 * len(acts) + 1``, filled from the start.
    """

    schedule: Schedule
    acts: list[Action]  # by global number
    rows: list[range]  # per device, the global numbers of its list
    dep_a: list[int]
    dep_b: list[int]
    peer: list[int]  # device that action j sends its output to, or -1
    eager_at: list[dict[int, list[tuple[int, int]]]]  # per device, as allreduce_points gives them
    at_end: list[list[tuple[int, int]]]
    #: the computed units ``kind * R*S*N + (r * S + s) * N + m`` (kinds in the order F, B, I, W), sorted, and
    #: the action that computes each: :attr:`producer`'s entries that are not -1. Kept sparse: the dense table
    #: has a cell per replica, stage and micro-batch of every replica (each micro-batch runs in one), ~R times
    #: the actions -- 4 * R*S*N int64 is ~270 MB for Chimera at D = 256, R = 16, N = 128
    produced: np.ndarray
    produced_by: np.ndarray
    #: every input an action takes from its own device is produced earlier in the device's list
    in_order: bool
    #: per action, what its durations depend on: one number per distinct (device, kind, stage, replica,
    #: span), and one action that has it (``first[signature[j]]``)
    signature: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: per action, whether the peak of alive activations is taken after it: a forward, or an I (it adds the
    #: output gradients its W needs)
    forward: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: :meth:`host_layout` and :meth:`dep_arrays`, built on first use
    _layout: Any = field(default=None, repr=False, compare=False)
    _deps: Any = field(default=None, repr=False, compare=False)

    def dep_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:attr:`dep_a` and :attr:`dep_b` as arrays, and the first action of each device's list that has
        any (once per plan)."""
        if self._deps is None:
            self._deps = (np.array(self.dep_a, dtype=np.int64), np.array(self.dep_b, dtype=np.int64),
                          np.array([ids[0] for ids in self.rows if ids], dtype=np.int64))
        return self._deps

    def host_layout(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per device, the entries of its lowered list that :data:`planner.schedules.timing.HostSpans` keeps,
        in the list's order, as read from :func:`lowered_row` (once per plan; the replay's timeline walks the
        same rows): ``(code, source, stage, span)`` with code 0-3 a compute action (F, B, I, W; source: its
        global number), 4 the STEP, 5 a send (source: the global number of the action it follows, whose
        message it sends) and 6 an all-reduce (source: its place among the device's all-reduces); stage and span
        those of the compute action (else -1 and 1, STEP's)."""
        if self._layout is None:
            sched = self.schedule
            n = len(self.acts)
            stages = np.fromiter(map(attrgetter("stage"), self.acts), dtype=np.int64, count=n)
            spans = np.fromiter(map(attrgetter("span"), self.acts), dtype=np.int64, count=n)
            out = []
            for d, ids in enumerate(self.rows):
                row = [self.acts[j] for j in ids]
                lowered = lowered_row(row, d, sched.stages, sched.placement, self.eager_at[d], self.at_end[d])
                code = np.array(list(map(_LAYOUT_CODE.__getitem__, map(_kind_of, lowered))), dtype=np.int64)
                comp = (code >= 0) & (code <= 3)
                if int(comp.sum()) != len(ids):
                    raise AssertionError(f"device {d}: the lowered list has {int(comp.sum())} compute actions,"
                                         f" not {len(ids)}")
                nth = np.cumsum(comp) - 1  # the compute action at or before each entry
                ids_a = np.arange(ids.start, ids.stop, dtype=np.int64)
                src = np.zeros(len(code), dtype=np.int64)
                src[comp] = ids_a
                send = code == 5
                src[send] = ids_a[nth[send]]
                ar = code == 6
                src[ar] = np.arange(int(ar.sum()))
                stage = np.full(len(code), -1, dtype=np.int64)
                span = np.ones(len(code), dtype=np.int64)
                stage[comp] = stages[ids_a]
                span[comp] = spans[ids_a]
                keep = code >= 0  # not a receive
                out.append((code[keep], src[keep], stage[keep], span[keep]))
            self._layout = out
        return self._layout

    @property
    def producer(self) -> np.ndarray:
        """``producer[kind * R*S*N + (r * S + s) * N + m]``: the action that computes (kind, r, s, m), -1 where
        none does (the dense table, built on each call: :func:`planner.schedules.validate` reads it)."""
        sched = self.schedule
        out = np.full(4 * sched.replicas * sched.stages * sched.microbatches, -1, dtype=np.int64)
        out[self.produced] = self.produced_by
        return out

    @classmethod
    def encode(cls, schedule: Schedule, eager: Any) -> EncodedSchedule | None:
        """The plan, or None where the schedule is malformed (an action off its placement or out of
        range, a unit of work done twice, an unknown kind): the lowered replay reports those.
        Vectorised: the actions' fields become numpy columns and every rule is an array expression."""
        D, S, N, R = schedule.devices, schedule.stages, schedule.microbatches, schedule.replicas
        place = schedule.placement
        if len(schedule.actions) != D or any(len(row) != S or not all(0 <= d < D for d in row)
                                            for row in place):
            return None
        eager_set = eager_stages(eager, S)
        RSN = R * S * N
        acts: list[Action] = [a for row in schedule.actions for a in row]
        n = len(acts)
        lens = [len(row) for row in schedule.actions]
        starts = np.concatenate(([0], np.cumsum(lens)))
        rows = [range(int(starts[d]), int(starts[d + 1])) for d in range(D)]
        if n:
            kinds, st, mb, rep, spans, _ = zip(*acts, strict=True)
            if not _KIND_CODE.keys() >= set(kinds):
                return None  # an unknown kind
            # one letter per action: their bytes, through a table, are the kind codes
            kc = _KIND_TABLE[np.frombuffer("".join(kinds).encode("ascii"), dtype=np.uint8)]
            try:
                s_ = np.array(st, dtype=np.int64)
                m_ = np.array(mb, dtype=np.int64)
                r_ = np.array(rep, dtype=np.int64)
                span = np.array(spans, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                return None
        else:
            kc = s_ = m_ = r_ = span = np.zeros(0, dtype=np.int64)
        dev = np.repeat(np.arange(D, dtype=np.int64), lens)
        j_ = np.arange(n, dtype=np.int64)
        ok = (kc >= 0) & (r_ >= 0) & (r_ < R) & (s_ >= 0) & (s_ < S) & (m_ >= 0) & (span >= 1) & (m_ + span <= N)
        if not ok.all():
            return None
        place_a = np.array(place, dtype=np.int64).reshape(R, S)
        if (place_a[r_, s_] != dev).any() or ((span > 1) & (kc != 0)).any():
            return None  # off its placement, or a multi-micro-batch action that is not a forward
        rs = r_ * S + s_
        x = rs * N + m_
        # producer[kind * RSN + (r * S + s) * N + m]: the action that computes (kind, r, s, m); a forward
        # of span k computes k consecutive micro-batches
        owner = np.repeat(j_, span)
        cell = np.repeat(kc * RSN + x, span) + (np.arange(len(owner)) - np.repeat(starts_of(span), span))
        # the table producer[cell] = owner, kept sparse: the cells sorted, looked up by binary search
        order = np.argsort(cell, kind="stable")
        produced, produced_by = cell[order], owner[order]
        if len(produced) > 1 and (produced[1:] == produced[:-1]).any():
            return None  # a unit of work done twice

        def producer(q: np.ndarray) -> np.ndarray:
            """``producer[q]`` of the dense table: the action computing cell ``q``, -1 where none does."""
            if not len(produced):
                return np.full(len(q), -1, dtype=np.int64)
            i = np.minimum(np.searchsorted(produced, q), len(produced) - 1)
            return np.where(produced[i] == q, produced_by[i], -1)

        missing = 2 * n
        none = missing + 1

        # per (r, s): the device of stage s-1 / s+1 when it is another device, else -1
        prev_peer = np.full(R * S, -1, dtype=np.int64)
        next_peer = np.full(R * S, -1, dtype=np.int64)
        if S > 1:
            cross = place_a[:, 1:] != place_a[:, :-1]
            prev_peer.reshape(R, S)[:, 1:] = np.where(cross, place_a[:, :-1], -1)
            next_peer.reshape(R, S)[:, :-1] = np.where(cross, place_a[:, 1:], -1)

        dep_a = np.full(n, none, dtype=np.int64)
        dep_b = np.full(n, none, dtype=np.int64)
        peer = np.full(n, -1, dtype=np.int64)
        in_order = True

        def slot_of(p: np.ndarray, message: np.ndarray | bool) -> np.ndarray:
            return np.where(p >= 0, p + n * message, missing)

        # forwards: the forward of stage s-1 (its end on this device, else the arrival of its message)
        fw = kc == 0
        sel = np.nonzero(fw & (s_ > 0))[0]
        if sel.size:
            p = producer(x[sel] - N)
            multi = sel[span[sel] > 1]
            if multi.size:  # its micro-batches must come from one forward: spans agree
                sp = span[multi]
                cells = np.repeat(x[multi] - N, sp) + (np.arange(sp.sum()) - np.repeat(starts_of(sp), sp))
                if (producer(cells) != np.repeat(producer(x[multi] - N), sp)).any():
                    return None
            local = prev_peer[rs[sel]] < 0
            dep_a[sel] = slot_of(p, ~local)
            in_order &= not (local & (p > sel)).any()
        peer[fw] = next_peer[rs[fw]]
        # weight-gradient passes: their I
        sel = np.nonzero(kc == 3)[0]
        if sel.size:
            p = producer(2 * RSN + x[sel])
            dep_a[sel] = slot_of(p, False)
            in_order &= not (p > sel).any()
        # B or I: own forward, then the gradient from stage s+1 (from its B, else its I)
        bi = (kc == 1) | (kc == 2)
        sel = np.nonzero(bi)[0]
        if sel.size:
            if ((kc[sel] == 2) & (producer(RSN + x[sel]) >= 0)).any():
                return None  # both B and I of one micro-batch
            p = producer(x[sel])
            dep_a[sel] = slot_of(p, False)
            in_order &= not (p > sel).any()
            inner = sel[s_[sel] < S - 1]
            if inner.size:
                g = producer(RSN + x[inner] + N)
                g = np.where(g < 0, producer(2 * RSN + x[inner] + N), g)
                local = next_peer[rs[inner]] < 0
                dep_b[inner] = slot_of(g, ~local)
                in_order &= not (local & (g > inner)).any()
            peer[sel] = prev_peer[rs[sel]]
        eager_at, at_end = _allreduce_points(schedule, eager_set, kc, s_, r_, dev, starts)
        key = (((dev * 4 + kc) * S + s_) * R + r_) * (int(span.max()) + 1 if n else 1) + span
        signature, first = _signatures(key)
        return cls(schedule, acts, rows, dep_a.tolist(), dep_b.tolist(), peer.tolist(), eager_at, at_end,
                   produced, produced_by, bool(in_order), signature, first, (kc == 0) | (kc == 2))


#: a lowered action's kind -> its code in :meth:`EncodedSchedule.host_layout` (-1: a receive)
_LAYOUT_CODE = {**_KIND_CODE, STEP: 4, SEND_F: 5, SEND_B: 5, ALLREDUCE: 6, RECV_F: -1, RECV_B: -1}
_kind_of = attrgetter("kind")

#: byte of a kind's letter -> its code in :data:`_KIND_CODE` (-1: not a compute kind)
_KIND_TABLE = np.full(256, -1, dtype=np.int64)
for _kind, _code in _KIND_CODE.items():
    _KIND_TABLE[ord(_kind)] = _code


def _signatures(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numbers ``0..m-1`` for the distinct values of ``key`` (in increasing order of the value, as
    ``np.unique(key, return_inverse=True)`` gives them) and one position holding each: through a table
    over the values when they are few beside the actions (no sort), else ``np.unique``."""
    n = len(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    size = int(key.max()) + 1
    if size > 8 * n + 4096:
        _, first, signature = np.unique(key, return_index=True, return_inverse=True)
        return signature.reshape(-1), first
    seen = np.zeros(size, dtype=bool)
    seen[key] = True
    rank = np.cumsum(seen) - 1
    holder = np.empty(size, dtype=np.int64)
    holder[key] = np.arange(n, dtype=np.int64)  # some position with that value (any one will do)
    return rank[key], holder[np.nonzero(seen)[0]]


def _allreduce_points(schedule: Schedule, eager_set: set[int], kc: np.ndarray, s_: np.ndarray, r_: np.ndarray,
                      dev: np.ndarray, starts: np.ndarray
                      ) -> tuple[list[dict[int, list[tuple[int, int]]]], list[list[tuple[int, int]]]]:
    """:func:`planner.schedules.ir.allreduce_points` of every device, from the actions' columns (global
    numbering, device 0's list first; ``starts[d]``: where device ``d``'s list begins): per device, the
    (replica, stage) copies all-reduced right after their last gradient-producing action when the stage is
    eager -- a W, or a B or I of a (replica, stage) whose backward is not split on that device -- named by
    the replica whose copy the device holds, and the others at the end, by (stage, replica)."""
    D, S, R = schedule.devices, schedule.stages, schedule.replicas
    held = schedule.stages_by_device()
    at_end: list[list[tuple[int, int]]] = []
    eager_at: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(D)]
    copy_r = np.full(D * S, -1, dtype=np.int64)
    for d, pairs in enumerate(held):
        for r, s in pairs:
            copy_r[d * S + s] = r
    done: set[tuple[int, int, int]] = set()
    if eager_set and len(kc):
        named = copy_r[dev * S + s_]
        named = np.where(named >= 0, named, r_)
        own = (dev * R + r_) * S + s_
        split = np.zeros(D * R * S, dtype=bool)
        split[own[kc == 3]] = True
        grad = np.nonzero((kc == 3) | (((kc == 1) | (kc == 2)) & ~split[own]))[0]
        grad = grad[np.isin(s_[grad], np.fromiter(eager_set, dtype=np.int64))]
        last = np.full(D * R * S, -1, dtype=np.int64)
        np.maximum.at(last, (dev[grad] * R + named[grad]) * S + s_[grad], grad)
        for k in np.nonzero(last >= 0)[0].tolist():
            d, r, s = k // (R * S), (k // S) % R, k % S
            eager_at[d][int(last[k]) - int(starts[d])] = [(r, s)]
            done.add((d, r, s))
    for d, pairs in enumerate(held):
        at_end.append([(r, s) for r, s in sorted(pairs, key=lambda rs: (rs[1], rs[0])) if (d, r, s) not in done])
    return eager_at, at_end


def starts_of(sizes: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums of ``sizes``: where each of the concatenated runs starts."""
    return np.cumsum(sizes) - sizes


def replay_encoded(plan: EncodedSchedule, costs: Costs) -> SimResult | None:
    """Time a compute-only schedule as :func:`replay_lowered` times ``lower(schedule)``, with the
    communication implied by the placement; None on a deadlock.

    The rules are the module docstring's, at the points where :func:`lower` puts the communication:
    after a compute action whose output goes to another device, its send runs on the device's
    communication stream (in list order, from the end of the action or of the previous send, whichever
    is later) and the consumer waits for the arrival; all-reduces are posted after the last backward of
    an eager stage and at the end of the list, a stage's collective runs once every holder has posted
    it, and STEP waits for the device's all-reduces; an eager all-reduce delays the device's compute after
    it by the costs' ``comm_share`` of it (:func:`planner.schedules.timing.contention_debt`, at the post, as
    the lowered replay does). Devices are swept in the same order as in the lowered replay, and each goes as
    far as it can, so collectives and ties come out in the same order.

    The sweep computes only what later actions wait for -- the end of every action and the arrival of
    every message -- and what depends on the order of the sweep (all-reduce posts, the last action to
    end); the rest follows from those times with numpy, with the same floating-point operations in the
    same order: starts and binding predecessors (the first strictly latest of the previous action on the
    device and the two inputs), busy time (running sums in list order), alive activations (running sums
    in list order, the peak taken after forwards and I's) and send starts.
    """
    sched = plan.schedule
    D = sched.devices
    acts, rows, peer, at_end = plan.acts, plan.rows, plan.peer, plan.at_end
    dep_a, dep_b = plan.dep_a, plan.dep_b
    n = len(acts)

    cost = memoised_durations()
    share = float(getattr(costs, "comm_share", 0.0))

    # per action: duration, duration of its send (-1: it sends nothing), change of alive activations;
    # computed once per distinct signature (device, kind, stage, replica, span) and spread with numpy
    dev_of = np.repeat(np.arange(D), [len(ids) for ids in rows])
    m = len(plan.first)
    u_dur, u_send, u_delta = np.zeros(m), np.full(m, -1.0), np.zeros(m)
    weight: dict[int, float] = {}
    held: dict[int, float] = {}
    held_grads = getattr(costs, "held_grads", None)
    for u, j in enumerate(plan.first.tolist()):
        k, s, _, r, span, _ = acts[j]
        d = int(dev_of[j])
        u_dur[u] = cost((k, s, span, d), costs.compute, k, s, span, d)
        # a split backward's activations stay until its W (planner.schedules.zb_h1), and its I adds the output
        # gradients that W needs (the costs' held_grads, 0 for costs without them)
        w = weight.get(s)
        if w is None:
            w = weight[s] = float(costs.activation(s))
            held[s] = float(held_grads(s)) if held_grads is not None else 0.0
        if k == F:
            u_delta[u] = w * span
        elif k == B:
            u_delta[u] = -w
        elif k == I:
            u_delta[u] = held[s]
        else:
            u_delta[u] = -(w + held[s])
        p = peer[j]
        if p >= 0:
            sk, sspan = (SEND_F, span) if k == F else (SEND_B, 1)
            u_send[u] = cost((sk, s, sspan, d, p), costs.p2p, sk, s, sspan, d, p)
    sig = plan.signature
    dur_a = u_dur[sig]
    send_a = u_send[sig]
    dur: list[float] = dur_a.tolist()
    send_dur: list[float] = send_a.tolist()
    eager_after: dict[int, list[tuple[int, int]]] = {}  # global number -> all-reduces posted after it
    for d, ids in enumerate(rows):
        for i, keys in plan.eager_at[d].items():
            eager_after[ids[i]] = keys

    comm_busy = [0.0] * D
    ars = AllReduces(sched.placement, D, lambda s_, r_, d_: cost((ALLREDUCE, s_, r_), costs.allreduce, s_, r_, d_),
                      comm_busy)
    ar_times: list[list[list[float]]] = [[] for _ in range(D)]  # per device, [start, end] in post order
    #: action -> when its device's compute stream is free after it, where an eager all-reduce posted after it
    #: delays what follows (contention_debt); else the action's end
    free_after: dict[int, float] = {}

    def post(d: int, r: int, s: int, at: float) -> None:
        """Device ``d`` posts the all-reduce of stage ``s`` (replica ``r``)."""
        ar_times[d].append(ars.post(d, r, s, at))

    # slot j: the end of action j; n+j: the arrival of its message; 2n: never filled, 2n+1: no input.
    # Times are >= 0: -1 marks a slot not filled yet
    t: list[float] = [-1.0] * (2 * n + 1) + [0.0]
    never, now = 2 * n, 2 * n + 1
    t_comp = [0.0] * D
    t_comm = [0.0] * D
    # per device, the global numbers of its list run from pos[d] (the next to run) to hi[d]; eager[d]: the
    # actions after which it posts all-reduces, in list order, and ev[d] the next of them
    pos = [ids[0] if ids else 0 for ids in rows]
    hi = [ids[-1] + 1 if ids else 0 for ids in rows]
    eager = [sorted(ids[i] for i in plan.eager_at[d]) + [n] for d, ids in enumerate(rows)]
    ev = [0] * D
    posted_end = [False] * D
    step_at: list[tuple[float, float]] = [(0.0, 0.0)] * D
    step_du = [0.0] * D
    comp_end = [0.0] * D
    last_end, last_node = -1.0, -1
    unfinished = D
    waiting = [now] * D  # per device, the slot it waits for (a device skips its turn until it fills)

    while unfinished:
        progressed = False
        for d in range(D):
            if t[waiting[d]] < 0.0:  # still waiting for that input (or finished)
                continue
            j0 = j = pos[d]
            top = hi[d]
            tc, tm, cb = t_comp[d], t_comm[d], comm_busy[d]
            while j < top:
                stop = eager[d][ev[d]]  # run up to the next eager point (inclusive), then post there
                last = stop if stop < top else top - 1
                while j <= last:
                    q = dep_a[j]
                    ta = t[q]
                    if ta < 0.0:
                        waiting[d] = q  # an input is missing: the device waits for it
                        break
                    q = dep_b[j]
                    tb = t[q]
                    if tb < 0.0:
                        waiting[d] = q
                        break
                    # every input is there: run it
                    if ta > tc:
                        tc = ta
                    if tb > tc:
                        tc = tb
                    tc += dur[j]
                    t[j] = tc
                    if tc >= last_end:
                        last_end, last_node = tc, j
                    sd = send_dur[j]
                    if sd >= 0.0:
                        if tc > tm:
                            tm = tc
                        tm += sd
                        t[n + j] = tm
                        cb += sd
                    j += 1
                else:  # no break: the run is done
                    if last == stop:
                        ev[d] += 1
                        comm_busy[d] = cb  # the all-reduce's time adds to the same running sum, in order
                        for r, s in eager_after[stop]:
                            post(d, r, s, max(tc, tm))
                            if share > 0.0:  # what it takes from the compute after it (contention_debt)
                                tc += contention_debt(share, ars.duration(s, r, d), sum(dur[stop + 1:top]))
                                free_after[stop] = tc
                        cb = comm_busy[d]
                    continue
                break
            if j != j0:
                progressed = True
            pos[d] = j
            t_comp[d], t_comm[d], comm_busy[d] = tc, tm, cb
            if j < top:
                continue
            if not posted_end[d]:
                posted_end[d] = True
                progressed = True
                for r, s in at_end[d]:
                    post(d, r, s, max(tc, tm))
            if not ars.open[d]:
                ss = max(tc, ars.done_on[d], tm)
                du = step_du[d] = cost((STEP, d), costs.step, d)
                comp_end[d] = tc
                t_comp[d] = ss + du
                step_at[d] = (ss, ss + du)
                waiting[d] = never
                unfinished -= 1
                progressed = True
        if not progressed:
            return None

    # what follows from the times, per device (its actions are a run of global numbers): busy time and the
    # peak of alive activations, running sums in list order (the peak taken after forwards and I's)
    busy: list[float] = []
    peak: list[float] = []
    delta = u_delta[sig]
    is_f = plan.forward
    for d, ids in enumerate(rows):
        if not ids:
            busy.append(step_du[d])
            peak.append(0.0)
            continue
        lo, top = ids[0], ids[-1] + 1
        busy.append(float(np.cumsum(dur_a[lo:top])[-1]) + step_du[d])
        f_alive = np.cumsum(delta[lo:top])[is_f[lo:top]]
        peak.append(max(0.0, float(f_alive.max())) if f_alive.size else 0.0)
    row_first = {ids[0] for ids in rows if ids}
    nn = max(n, 1)  # the slot of an arrival, n + j, names its action j too

    makespan = max(max(t_comp), max(t_comm), max(ars.free)) if D else 0.0
    stats = [DeviceStats(busy[d], makespan - busy[d], plain_number(peak[d]), comm_busy[d], comp_end[d], step_at[d])
             for d in range(D)]
    bubble = 1.0 - sum(busy) / (D * makespan) if makespan > 0 else 0.0
    cf = cb = 0
    node = last_node
    while node >= 0:  # walk the critical path back, as _critical_counts does
        a = acts[node]
        if a.kind == F:
            cf += a.span
        elif a.kind != W:
            cb += 1
        # its binding predecessor: the previous action on the device, unless an input is strictly later
        # (the first such one, in the order the inputs are checked)
        if node in row_first:
            ready, bind = 0.0, -1
        else:
            ready, bind = free_after.get(node - 1, t[node - 1]), node - 1
        q = dep_a[node]
        if t[q] > ready:
            ready, bind = t[q], q % nn
        q = dep_b[node]
        if t[q] > ready:
            bind = q % nn
        node = bind

    def timeline() -> list[list[tuple[Action, float, float]]]:
        """The lowered lists (as :func:`lower` writes them) with the times of the replay: an action
        starts when the device is free and its inputs are there, a send at the end of its action or of
        the device's previous send."""
        start: list[float] = [0.0] * n
        send_start: list[float] = [0.0] * n
        for ids in rows:
            free = sent = 0.0
            for j in ids:
                ready = free
                for q in (dep_a[j], dep_b[j]):
                    if t[q] > ready:
                        ready = t[q]
                start[j] = ready
                end = t[j]
                if send_dur[j] >= 0.0:
                    send_start[j] = end if end > sent else sent
                    sent = t[n + j]
                free = free_after.get(j, end)
        out = []
        for d, ids in enumerate(rows):
            ars = iter(ar_times[d])
            ci = 0  # position in ``ids`` of the next compute action
            line: list[tuple[Action, float, float]] = []
            row = [acts[j] for j in ids]
            for a in lowered_row(row, d, sched.stages, sched.placement, plan.eager_at[d], at_end[d]):
                k = a.kind
                if k == RECV_F or k == RECV_B:  # just before its consumer: the arrival it waits for
                    j = ids[ci]
                    q = dep_a[j] if n <= dep_a[j] < 2 * n else dep_b[j]
                    line.append((a, t[q], t[q]))
                elif k == SEND_F or k == SEND_B:  # just after its producer
                    j = ids[ci - 1]
                    line.append((a, send_start[j], t[n + j]))
                elif k == ALLREDUCE:
                    ar = next(ars)
                    line.append((a, ar[0], ar[1]))
                elif k == STEP:
                    line.append((a, *step_at[d]))
                else:
                    j = ids[ci]
                    ci += 1
                    line.append((a, start[j], t[j]))
            out.append(line)
        return out

    def spans() -> HostSpans:
        """:meth:`SimResult.host_spans` without the timeline: the times :func:`timeline` gives its entries,
        with numpy (the same comparisons, per action, as its loop makes), placed by :meth:`host_layout`."""
        tt = np.fromiter(t, dtype=np.float64, count=len(t))
        end = tt[:n]
        # when the device is free before action j: after the previous action (free_after, else its end),
        # from 0 for the first of a row; then each input strictly later, in the order the loop checks them
        ready = np.zeros(n)
        if n > 1:
            ready[1:] = end[:-1]
            if free_after:
                after = np.fromiter(free_after.keys(), dtype=np.int64, count=len(free_after))
                keep = after < n - 1
                ready[after[keep] + 1] = np.fromiter(free_after.values(), dtype=np.float64,
                                                     count=len(free_after))[keep]
        da, db, firsts = plan.dep_arrays()
        ready[firsts] = 0.0
        for deps in (da, db):
            ti = tt[deps]
            ready = np.where(ti > ready, ti, ready)
        # a send starts at the end of its action or the arrival of the device's previous send, if later
        send_start = np.zeros(n)
        senders = np.nonzero(send_a >= 0.0)[0]
        if senders.size:
            prev = np.zeros(senders.size)
            prev[1:] = tt[n + senders[:-1]]
            prev[np.nonzero(np.diff(dev_of[senders], prepend=-1))[0]] = 0.0
            e = end[senders]
            send_start[senders] = np.where(e > prev, e, prev)
        out = []
        for d, (code, src, stage, span) in enumerate(plan.host_layout()):
            start = np.empty(len(code))
            stop = np.empty(len(code))
            m = code <= 3
            start[m], stop[m] = ready[src[m]], end[src[m]]
            m = code == 5
            start[m], stop[m] = send_start[src[m]], tt[n + src[m]]
            m = code == 6
            if m.any():
                ar = np.array(ar_times[d], dtype=np.float64).reshape(-1, 2)
                start[m], stop[m] = ar[src[m], 0], ar[src[m], 1]
            m = code == 4
            start[m], stop[m] = step_at[d]
            out.append((np.minimum(code, 5), stage, span, start, stop))
        return out

    return SimResult(makespan, bubble, stats, cf, cb, timeline, spans)
