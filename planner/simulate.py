"""Discrete-event simulator of a lowered schedule (see :mod:`planner.schedules.ir`).

Each device runs its action list in order on three resources:

* a **compute stream** for F/B/I/W and STEP: an action starts when the stream is free and its inputs
  are there (the producing action's end on the same device, or the arrival of the received message);
* a **send stream** for SEND_F/SEND_B: a send starts when its data has been produced and the device's
  previous send has finished; the message arrives ``p2p`` later. Receives are posted ahead of time
  (prefetching, Hanayo 4.2) and occupy no stream: the consumer waits for the arrival only;
* a **collective stream** for ALLREDUCE, posted without blocking the device: a stage's all-reduce runs
  once every device holding the stage has posted it and their collective streams are free.

So point-to-point communication overlaps computation on both sides, and an ALLREDUCE placed early in
the list (eager, Chimera 3.2) overlaps the computation that follows it. STEP waits for all of its
device's all-reduces. What is not overlapped is what the figures show.

Outputs (:class:`SimResult`): makespan, per-device busy/idle time, bubble ratio
``1 - sum(busy) / (devices * makespan)``, per-device peak count of micro-batches whose activations are
alive (a forward adds the micro-batches it runs, B or I of the same stage frees one), the critical-path
counts Cf and Cb of Chimera section 3.4 (forward and backward passes on the chain of actions that
determines the makespan), and the (start, end) of every action.

Two replays apply these rules. :func:`_replay_lowered` runs explicit lowered lists, action by action.
A compute-only schedule is not lowered first: :func:`_replay_implied` runs its compute actions, encoded
as integers (:class:`_ImpliedPlan`), and adds the communication where :func:`~planner.schedules.ir.lower`
would put it -- a send after each compute action whose consumer sits on another device (the consumer
waits for the arrival), the all-reduces after the last backward of an eager stage or at the end, then
STEP. It gives the same times, figures and timeline as replaying ``lower(schedule)`` (the timeline's
lowered actions are built when first asked for); ``tests/test_fast_replay.py`` checks that on many
schedules, since the simulator must time exactly the lists the executor runs.

The same replay, run with unit costs, is the validator's deadlock check: a device that waits for an
action no other device can ever run is reported with what it waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
    allreduce_points,
    builder_eager,
    eager_stages,
    lower,
    lowered_row,
)


class ScheduleError(ValueError):
    """A schedule breaks a rule; the message names the device, the action and the rule."""


class Costs:
    """Durations of actions. Subclass it (the planner's cost model does) or use :class:`UnitCosts`.

    ``compute(kind, stage, span, device)`` for F/B/I/W; ``p2p(kind, stage, span, src, dst)`` for a
    send of activations (SEND_F, the output of ``stage``) or gradients (SEND_B, the input gradient of
    ``stage``); ``allreduce(stage, replica, device)`` for a stage's gradient all-reduce; ``step(device)``.
    Results are cached per distinct argument tuple within one simulation.
    """

    def compute(self, kind: str, stage: int, span: int, device: int) -> float:
        raise NotImplementedError

    def p2p(self, kind: str, stage: int, span: int, src: int, dst: int) -> float:
        return 0.0

    def allreduce(self, stage: int, replica: int, device: int) -> float:
        return 0.0

    def step(self, device: int) -> float:
        return 0.0

    def activation(self, stage: int) -> float:
        """Weight of one micro-batch's stashed activations of ``stage`` in ``peak_activations``
        (1 by default: the peak counts (stage, micro-batch) pairs; the planner gives bytes)."""
        return 1.0


@dataclass
class UnitCosts(Costs):
    """Stage-independent costs, as in the papers' figures: forward ``fwd`` per micro-batch, backward
    ``bwd``; a split backward costs ``input_grad`` + ``weight_grad`` (default half of ``bwd`` each)."""

    fwd: float = 1.0
    bwd: float = 2.0
    comm: float = 0.0
    input_grad: float | None = None
    weight_grad: float | None = None
    allreduce_time: float = 0.0
    step_time: float = 0.0

    def compute(self, kind: str, stage: int, span: int, device: int) -> float:
        if kind == F:
            return self.fwd * span
        if kind == B:
            return self.bwd
        if kind == I:
            return self.input_grad if self.input_grad is not None else self.bwd / 2
        return self.weight_grad if self.weight_grad is not None else self.bwd / 2

    def p2p(self, kind: str, stage: int, span: int, src: int, dst: int) -> float:
        return self.comm * (span if kind == SEND_F else 1)

    def allreduce(self, stage: int, replica: int, device: int) -> float:
        return self.allreduce_time

    def step(self, device: int) -> float:
        return self.step_time


@dataclass
class DeviceStats:
    busy: float
    idle: float
    peak_activations: float  # peak of alive (stage, micro-batch) activations, weighted by Costs.activation
    comm: float  # time its communication stream was busy
    compute_end: float = 0.0  # end of its last F/B/I/W
    step: tuple[float, float] = (0.0, 0.0)  # (start, end) of its optimizer step

    def to_dict(self) -> dict[str, Any]:
        return {"busy": self.busy, "idle": self.idle, "peak_activations": self.peak_activations,
                "comm": self.comm, "compute_end": self.compute_end, "step": list(self.step)}


Timeline = list[list[tuple[Action, float, float]]]


@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    devices: list[DeviceStats]
    critical_forward: int  # Chimera's C_f
    critical_backward: int  # Chimera's C_b
    #: the timeline, or a function that builds it on first use (see :attr:`timeline`)
    _timeline: Timeline | Callable[[], Timeline] = field(repr=False, compare=False)

    @property
    def timeline(self) -> Timeline:
        """Per device, ``(action, start, end)`` of every action of its lowered list, in list order (a
        receive: the arrival of its message, twice; an all-reduce: when the collective ran). Built on
        first use: most callers want the figures only, and the lowered lists are ~3x the actions."""
        if callable(self._timeline):
            self._timeline = self._timeline()
        return self._timeline

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SimResult):
            return NotImplemented
        return self.to_dict() == other.to_dict() and self.timeline == other.timeline

    __hash__ = None  # type: ignore[assignment]  # mutable, like any non-frozen dataclass

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the timeline itself (the function that builds it does not pickle)."""
        return {**self.__dict__, "_timeline": self.timeline}

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "critical_forward": self.critical_forward,
            "critical_backward": self.critical_backward,
            "devices": [d.to_dict() for d in self.devices],
        }
        if timeline:
            out["timeline"] = [[[str(a), s, e] for a, s, e in row] for row in self.timeline]
        return out


def compile_schedule(schedule: Schedule) -> Any:
    """The integer encoding :func:`simulate` replays (None where only the explicit replay applies).
    Pass it back as ``simulate(schedule, costs, compiled=...)`` to time one schedule under many costs
    (the planner's search does); it is only valid while the schedule is not modified."""
    if schedule.lowered:
        return None
    return _ImpliedPlan.encode(schedule, builder_eager(schedule))


def simulate(schedule: Schedule, costs: Costs | None = None, compiled: Any = None) -> SimResult:
    """Time ``schedule`` under ``costs`` (default F=1, B=2).

    A compute-only schedule is timed as ``lower(schedule)`` is, without building the lowered lists:
    :func:`_replay_implied` replays the compute actions and adds the communication the placement
    implies at the points where :func:`lower` puts it (same rules, same times: the tests compare the
    two). Lowered schedules, and the compute-only ones it does not cover (malformed or deadlocked: the
    explicit replay names the error), go through :func:`_replay_lowered`.
    """
    costs = costs or UnitCosts()
    if schedule.lowered:
        compute = _canonical_compute_only(schedule)
        if compute is None:
            return _replay_lowered(schedule, costs)
        schedule = compute  # its lists are lower(compute)'s: time them as such
    eager = builder_eager(schedule)
    plan = compiled if compiled is not None else _ImpliedPlan.encode(schedule, eager)
    if plan is not None:
        res = _replay_implied(plan, costs)
        if res is not None:
            return res
    return _replay_lowered(lower(schedule, eager=eager), costs)


def _canonical_compute_only(schedule: Schedule) -> Schedule | None:
    """The compute-only form of a lowered ``schedule`` when its lists are exactly what :func:`lower`
    makes of that form (with the eager stages its params record), else None."""
    eager = schedule.params.get("eager")
    if isinstance(eager, str) or not isinstance(eager, (list, tuple)):
        return None
    compute = schedule.compute_only()
    try:
        again = lower(compute, eager=eager)
    except (ValueError, TypeError, IndexError, KeyError):  # not a lowering of anything
        return None
    return compute if again.actions == schedule.actions else None


class _AllReduces:
    """The all-reduce rendezvous both replays use: a device posts a stage's all-reduce without blocking;
    once every device holding the stage has posted it, it runs on their collective streams, from when the
    last post came and every member's stream is free. ``post`` returns the [start, end] it will get."""

    def __init__(self, placement: list[list[int]], devices: int, duration: Callable[[int, int, int], float],
                 comm_busy: list[float]) -> None:
        self.holders: dict[int, int] = {}  # stage -> how many devices post its all-reduce
        for row in placement:
            for st in range(len(row)):
                self.holders[st] = self.holders.get(st, 0) + 1
        self.posts: dict[int, list[tuple[int, float, list[float]]]] = {}  # stage -> (device, time, slot)
        self.open = [0] * devices  # all-reduces a device has posted that have not run yet
        self.done_on = [0.0] * devices  # when a device's last all-reduce ends
        self.free = [0.0] * devices  # each device's collective stream
        self.duration, self.comm_busy = duration, comm_busy

    def post(self, d: int, r: int, s: int, at: float) -> list[float]:
        slot = [0.0, 0.0]
        posts = self.posts.setdefault(s, [])
        posts.append((d, at, slot))
        self.open[d] += 1
        if len(posts) == self.holders[s]:
            begin = max(max(p[1] for p in posts), max(self.free[p[0]] for p in posts))
            du = self.duration(s, r, d)
            for dd, _, sl in posts:
                self.free[dd] = begin + du
                self.comm_busy[dd] += du
                self.open[dd] -= 1
                self.done_on[dd] = max(self.done_on[dd], begin + du)
                sl[0], sl[1] = begin, begin + du
        return slot


def _memoised_durations() -> Callable[..., float]:
    """``duration(key, fn, *args)``: ``fn(*args)`` once per key, checked finite and >= 0."""
    cache: dict[tuple, float] = {}

    def duration(key: tuple, fn: Callable[..., float], *args: Any) -> float:
        v = cache.get(key)
        if v is None:
            v = float(fn(*args))
            if v < 0 or v != v:
                raise ScheduleError(f"cost of {key} is {v}: durations must be finite and >= 0")
            cache[key] = v
        return v

    return duration


def _replay_lowered(schedule: Schedule, costs: Costs) -> SimResult:
    """The replay of explicit lowered lists (see the module docstring)."""
    D = schedule.devices
    acts = schedule.actions
    place = schedule.placement

    dur = _memoised_durations()

    # end time of compute results: (kind, replica, stage, mb) -> (end, device, index)
    done: dict[tuple[str, int, int, int], float] = {}
    arrival: dict[tuple[str, int, int, int], float] = {}  # message (SEND kind, r, stage, mb) -> time
    recvd: dict[tuple[int, str, int, int, int], float] = {}  # (device, RECV kind, r, stage, mb) -> time
    t_comp = [0.0] * D
    t_comm = [0.0] * D
    step_at: list[tuple[float, float]] = [(0.0, 0.0)] * D
    comp_end = [0.0] * D
    busy = [0.0] * D
    comm_busy = [0.0] * D
    alive = [0.0] * D
    peak = [0.0] * D
    act_w: dict[int, float] = {}
    ars = _AllReduces(place, D, lambda s_, r_, d_: dur((ALLREDUCE, s_, r_), costs.allreduce, s_, r_, d_), comm_busy)
    ar_slots: list[tuple[int, int, list[float]]] = []  # (device, timeline index, [start, end]) to fill in
    pos = [0] * D
    timeline: list[list[tuple[Action, float, float]]] = [[] for _ in range(D)]
    # for the critical path: per (device, index) the binding predecessor (device, index) or None
    cause: dict[tuple[int, int], tuple[int, int] | None] = {}
    where: dict[tuple[str, int, int, int], tuple[int, int]] = {}  # compute/send key -> (device, index)
    last_on: list[tuple[int, int] | None] = [None] * D  # last compute action on each device
    remaining = sum(len(r) for r in acts)
    last_end, last_node = -1.0, None

    while remaining:
        progressed = False
        for d in range(D):
            row = acts[d]
            i = pos[d]
            n = len(row)
            while i < n:
                a = row[i]
                k, s, m, r = a.kind, a.stage, a.mb, a.replica
                if k == F or k == B or k == I or k == W:
                    ready = t_comp[d]
                    binding = last_on[d]
                    ok = True
                    if k == F:
                        if s > 0:
                            if place[r][s - 1] == d:
                                for mm in range(m, m + a.span):
                                    t = done.get((F, r, s - 1, mm))
                                    if t is None:
                                        ok = False
                                        break
                                    if t > ready:
                                        ready, binding = t, where[(F, r, s - 1, mm)]
                            else:
                                t = recvd.get((d, RECV_F, r, s, m))
                                if t is None:
                                    ok = False
                                elif t > ready:
                                    ready, binding = t, where[(SEND_F, r, s - 1, m)]
                    elif k == W:
                        t = done.get((I, r, s, m))
                        if t is None:
                            ok = False
                        elif t > ready:
                            ready, binding = t, where[(I, r, s, m)]
                    else:  # B or I: own forward, then the gradient from stage s+1
                        t = done.get((F, r, s, m))
                        if t is None:
                            ok = False
                        else:
                            if t > ready:
                                ready, binding = t, where[(F, r, s, m)]
                            if s < len(place[r]) - 1:
                                if place[r][s + 1] == d:
                                    t = done.get((B, r, s + 1, m))
                                    key = (B, r, s + 1, m)
                                    if t is None:
                                        key = (I, r, s + 1, m)
                                        t = done.get(key)
                                    if t is None:
                                        ok = False
                                    elif t > ready:
                                        ready, binding = t, where[key]
                                else:
                                    t = recvd.get((d, RECV_B, r, s, m))
                                    if t is None:
                                        ok = False
                                    elif t > ready:
                                        ready, binding = t, where[(SEND_B, r, s + 1, m)]
                    if not ok:
                        break
                    du = dur((k, s, a.span, d), costs.compute, k, s, a.span, d)
                    end = ready + du
                    t_comp[d] = end
                    busy[d] += du
                    for mm in range(m, m + a.span):
                        done[(k, r, s, mm)] = end
                        where[(k, r, s, mm)] = (d, i)
                    if k == F or k == B or k == I:
                        w = act_w.get(s)
                        if w is None:
                            w = act_w[s] = float(costs.activation(s))
                        if k == F:
                            alive[d] += w * a.span
                            if alive[d] > peak[d]:
                                peak[d] = alive[d]
                        else:
                            alive[d] -= w
                    cause[(d, i)] = binding
                    last_on[d] = (d, i)
                    if end >= last_end:
                        last_end, last_node = end, (d, i)
                    timeline[d].append((a, ready, end))
                elif k == SEND_F or k == SEND_B:
                    src_kind = F if k == SEND_F else None
                    if src_kind:
                        t = done.get((F, r, s, m))
                        key = (F, r, s, m)
                    else:
                        key = (B, r, s, m)
                        t = done.get(key)
                        if t is None:
                            key = (I, r, s, m)
                            t = done.get(key)
                    if t is None:
                        break
                    start = max(t, t_comm[d])
                    du = dur((k, s, a.span, d, a.peer), costs.p2p, k, s, a.span, d, a.peer)
                    end = start + du
                    t_comm[d] = end
                    comm_busy[d] += du
                    for mm in range(m, m + a.span):
                        arrival[(k, r, s, mm)] = end
                        where[(k, r, s, mm)] = (d, i)
                    cause[(d, i)] = where[key]
                    timeline[d].append((a, start, end))
                elif k == RECV_F or k == RECV_B:
                    src_stage = s - 1 if k == RECV_F else s + 1
                    t = arrival.get((SEND_F if k == RECV_F else SEND_B, r, src_stage, m))
                    if t is None:
                        break
                    recvd[(d, k, r, s, m)] = t
                    timeline[d].append((a, t, t))
                elif k == ALLREDUCE:
                    ar_slots.append((d, len(timeline[d]), ars.post(d, r, s, max(t_comp[d], t_comm[d]))))
                    timeline[d].append((a, 0.0, 0.0))  # filled in once the collective has run
                elif k == STEP:
                    if ars.open[d]:
                        break
                    start = max(t_comp[d], ars.done_on[d], t_comm[d])
                    du = dur((STEP, d), costs.step, d)
                    comp_end[d] = t_comp[d]
                    step_at[d] = (start, start + du)
                    t_comp[d] = start + du
                    busy[d] += du
                    timeline[d].append((a, start, start + du))
                else:
                    raise ScheduleError(f"device {d} action #{i}: unknown kind {k!r}")
                i += 1
                remaining -= 1
                progressed = True
            pos[d] = i
        if not progressed:
            stuck = [(d, acts[d][pos[d]]) for d in range(D) if pos[d] < len(acts[d])]
            raise ScheduleError("deadlock: " + "; ".join(_waiting_for(schedule, d, a, pos) for d, a in stuck))

    for d, i, (start, end) in ar_slots:
        timeline[d][i] = (timeline[d][i][0], start, end)
    makespan = max(max(t_comp), max(t_comm), max(ars.free)) if D else 0.0
    total_busy = sum(busy)
    stats = [DeviceStats(busy[d], makespan - busy[d], _num(peak[d]), comm_busy[d], comp_end[d], step_at[d])
             for d in range(D)]
    bubble = 1.0 - total_busy / (D * makespan) if makespan > 0 else 0.0
    cf, cb = _critical_counts(acts, cause, last_node)
    return SimResult(makespan, bubble, stats, cf, cb, timeline)


_KIND_CODE = {F: 0, B: 1, I: 2, W: 3}


@dataclass
class _ImpliedPlan:
    """A compute-only schedule as integer arrays for :func:`_replay_implied`.

    Compute actions are numbered globally (device 0's list first). The replay keeps, per action ``j``,
    two times in one flat list: slot ``2j`` the end of ``j`` and slot ``2j + 1`` the arrival of the
    message ``j`` sends (when its consumer sits on another device). An action waits for at most two
    slots, ``dep_a[j]`` then ``dep_b[j]``, in the order the lowered replay checks its inputs (the first
    strictly latest one is its binding predecessor on the critical path): a forward for the forward of
    the previous stage (its end, or the arrival of its message), a backward for its own forward and
    then the gradient from the next stage, a W for its I. A missing producer is the slot
    ``2 * len(acts)``, never filled; no input is the slot ``2 * len(acts) + 1``, filled from the start.
    """

    schedule: Schedule
    acts: list[Action]  # by global number
    rows: list[list[int]]  # per device, the global numbers of its list
    dep_a: list[int]
    dep_b: list[int]
    peer: list[int]  # device that action j sends its output to, or -1
    eager_at: list[dict[int, list[tuple[int, int]]]]  # per device, as allreduce_points gives them
    at_end: list[list[tuple[int, int]]]
    #: producer[kind * R*S*N + (r * S + s) * N + m]: the action that computes (kind, r, s, m) (kinds in
    #: the order F, B, I, W), -1 where none does
    producer: np.ndarray
    #: every input an action takes from its own device is produced earlier in the device's list
    in_order: bool
    #: per action, what its durations depend on: one number per distinct (device, kind, stage, replica,
    #: span), and one action that has it (``first[signature[j]]``)
    signature: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def encode(cls, schedule: Schedule, eager: Any) -> _ImpliedPlan | None:
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
        rows = [list(range(int(starts[d]), int(starts[d + 1]))) for d in range(D)]
        if n:
            kinds, st, mb, rep, spans, _ = zip(*acts, strict=True)
            code = _KIND_CODE
            kc = np.array([code.get(k, -1) for k in kinds], dtype=np.int64)
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
        if len(np.unique(cell)) != len(cell):
            return None  # a unit of work done twice
        producer = np.full(4 * RSN, -1, dtype=np.int64)
        producer[cell] = owner
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
            return np.where(p >= 0, 2 * p + message, missing)

        # forwards: the forward of stage s-1 (its end on this device, else the arrival of its message)
        fw = kc == 0
        sel = np.nonzero(fw & (s_ > 0))[0]
        if sel.size:
            p = producer[x[sel] - N]
            multi = sel[span[sel] > 1]
            if multi.size:  # its micro-batches must come from one forward: spans agree
                sp = span[multi]
                cells = np.repeat(x[multi] - N, sp) + (np.arange(sp.sum()) - np.repeat(starts_of(sp), sp))
                if (producer[cells] != np.repeat(producer[x[multi] - N], sp)).any():
                    return None
            local = prev_peer[rs[sel]] < 0
            dep_a[sel] = slot_of(p, ~local)
            in_order &= not (local & (p > sel)).any()
        peer[fw] = next_peer[rs[fw]]
        # weight-gradient passes: their I
        sel = np.nonzero(kc == 3)[0]
        if sel.size:
            p = producer[2 * RSN + x[sel]]
            dep_a[sel] = slot_of(p, False)
            in_order &= not (p > sel).any()
        # B or I: own forward, then the gradient from stage s+1 (from its B, else its I)
        bi = (kc == 1) | (kc == 2)
        sel = np.nonzero(bi)[0]
        if sel.size:
            if ((kc[sel] == 2) & (producer[RSN + x[sel]] >= 0)).any():
                return None  # both B and I of one micro-batch
            p = producer[x[sel]]
            dep_a[sel] = slot_of(p, False)
            in_order &= not (p > sel).any()
            inner = sel[s_[sel] < S - 1]
            if inner.size:
                g = producer[RSN + x[inner] + N]
                g = np.where(g < 0, producer[2 * RSN + x[inner] + N], g)
                local = next_peer[rs[inner]] < 0
                dep_b[inner] = slot_of(g, ~local)
                in_order &= not (local & (g > inner)).any()
            peer[sel] = prev_peer[rs[sel]]
        eager_at: list[dict[int, list[tuple[int, int]]]] = []
        at_end: list[list[tuple[int, int]]] = []
        held = schedule.stages_by_device()
        for d in range(D):
            here, end = allreduce_points(schedule, d, eager_set, held[d])
            eager_at.append(here)
            at_end.append(end)
        key = (((dev * 4 + kc) * S + s_) * R + r_) * (int(span.max()) + 1 if n else 1) + span
        _, first, signature = np.unique(key, return_index=True, return_inverse=True)
        return cls(schedule, acts, rows, dep_a.tolist(), dep_b.tolist(), peer.tolist(), eager_at, at_end,
                   producer, bool(in_order), signature.reshape(-1), first)


def starts_of(sizes: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums of ``sizes``: where each of the concatenated runs starts."""
    return np.cumsum(sizes) - sizes


def _replay_implied(plan: _ImpliedPlan, costs: Costs) -> SimResult | None:
    """Time a compute-only schedule as :func:`_replay_lowered` times ``lower(schedule)``, with the
    communication implied by the placement; None on a deadlock.

    The rules are the module docstring's, at the points where :func:`lower` puts the communication:
    after a compute action whose output goes to another device, its send runs on the device's
    communication stream (in list order, from the end of the action or of the previous send, whichever
    is later) and the consumer waits for the arrival; all-reduces are posted after the last backward of
    an eager stage and at the end of the list, a stage's collective runs once every holder has posted
    it, and STEP waits for the device's all-reduces. Devices are swept in the same order as in the
    lowered replay, and each goes as far as it can, so collectives and ties come out in the same order.
    """
    sched = plan.schedule
    D = sched.devices
    acts, rows, peer, at_end = plan.acts, plan.rows, plan.peer, plan.at_end
    dep_a, dep_b = plan.dep_a, plan.dep_b
    n = len(acts)

    cost = _memoised_durations()

    # per action: duration, duration of its send (-1: it sends nothing), change of alive activations;
    # computed once per distinct signature (device, kind, stage, replica, span) and spread with numpy
    dev_of = np.repeat(np.arange(D), [len(ids) for ids in rows])
    m = len(plan.first)
    u_dur, u_send, u_delta = np.zeros(m), np.full(m, -1.0), np.zeros(m)
    weight: dict[int, float] = {}
    for u, j in enumerate(plan.first.tolist()):
        k, s, _, r, span, _ = acts[j]
        d = int(dev_of[j])
        u_dur[u] = cost((k, s, span, d), costs.compute, k, s, span, d)
        if k != W:
            w = weight.get(s)
            if w is None:
                w = weight[s] = float(costs.activation(s))
            u_delta[u] = w * span if k == F else -w
        p = peer[j]
        if p >= 0:
            sk, sspan = (SEND_F, span) if k == F else (SEND_B, 1)
            u_send[u] = cost((sk, s, sspan, d, p), costs.p2p, sk, s, sspan, d, p)
    sig = plan.signature
    dur: list[float] = u_dur[sig].tolist()
    send_dur: list[float] = u_send[sig].tolist()
    delta: list[float] = u_delta[sig].tolist()
    is_f = [a[0] == F for a in acts]
    eager_after: dict[int, list[tuple[int, int]]] = {}  # global number -> all-reduces posted after it
    for d, ids in enumerate(rows):
        for i, keys in plan.eager_at[d].items():
            eager_after[ids[i]] = keys

    comm_busy = [0.0] * D
    ars = _AllReduces(sched.placement, D, lambda s_, r_, d_: cost((ALLREDUCE, s_, r_), costs.allreduce, s_, r_, d_),
                      comm_busy)
    ar_times: list[list[list[float]]] = [[] for _ in range(D)]  # per device, [start, end] in post order

    def post(d: int, r: int, s: int, at: float) -> None:
        """Device ``d`` posts the all-reduce of stage ``s`` (replica ``r``)."""
        ar_times[d].append(ars.post(d, r, s, at))

    # slot 2j: the end of action j; 2j+1: the arrival of its message; 2n: never filled, 2n+1: no input
    t: list[float | None] = [None] * (2 * n + 1) + [0.0]
    never, now = 2 * n, 2 * n + 1
    start = [0.0] * n
    send_start = [0.0] * n
    cause = [-1] * n  # the binding predecessor of each action, for the critical path (-1: none)
    t_comp = [0.0] * D
    t_comm = [0.0] * D
    busy = [0.0] * D
    alive = [0.0] * D
    peak = [0.0] * D
    last_on = [-1] * D  # last compute action run on each device
    pos = [0] * D
    posted_end = [False] * D
    step_at: list[tuple[float, float]] = [(0.0, 0.0)] * D
    comp_end = [0.0] * D
    last_end, last_node = -1.0, -1
    unfinished = D
    waiting = [now] * D  # per device, the slot it waits for (a device skips its turn until it fills)

    while unfinished:
        progressed = False
        for d in range(D):
            if t[waiting[d]] is None:  # still waiting for that input (or finished)
                continue
            row = rows[d]
            i = pos[d]
            nd = len(row)
            tc, tm, prev = t_comp[d], t_comm[d], last_on[d]
            while i < nd:
                j = row[i]
                ready, bind = tc, prev
                q = dep_a[j]
                tq = t[q]
                if tq is not None:
                    if tq > ready:
                        ready, bind = tq, q >> 1
                    q = dep_b[j]
                    tq = t[q]
                if tq is not None:  # every input is there: run it
                    if tq > ready:
                        ready, bind = tq, q >> 1
                    du = dur[j]
                    end = ready + du
                    t[2 * j] = end
                    start[j] = ready
                    cause[j] = bind
                    tc, prev = end, j
                    busy[d] += du
                    dl = delta[j]
                    if dl:
                        alive[d] += dl
                        if is_f[j] and alive[d] > peak[d]:
                            peak[d] = alive[d]
                    if end >= last_end:
                        last_end, last_node = end, j
                    sd = send_dur[j]
                    if sd >= 0:
                        ss = end if end > tm else tm
                        tm = ss + sd
                        send_start[j] = ss
                        t[2 * j + 1] = tm
                        comm_busy[d] += sd
                    if j in eager_after:
                        for r, s in eager_after[j]:
                            post(d, r, s, max(tc, tm))
                    i += 1
                    progressed = True
                    continue
                waiting[d] = q  # an input is missing: the device waits for it
                break
            pos[d] = i
            t_comp[d], t_comm[d], last_on[d] = tc, tm, prev
            if i < nd:
                continue
            if not posted_end[d]:
                posted_end[d] = True
                progressed = True
                for r, s in at_end[d]:
                    post(d, r, s, max(tc, tm))
            if not ars.open[d]:
                ss = max(tc, ars.done_on[d], tm)
                du = cost((STEP, d), costs.step, d)
                comp_end[d] = tc
                t_comp[d] = ss + du
                busy[d] += du
                step_at[d] = (ss, ss + du)
                waiting[d] = never
                unfinished -= 1
                progressed = True
        if not progressed:
            return None

    makespan = max(max(t_comp), max(t_comm), max(ars.free)) if D else 0.0
    stats = [DeviceStats(busy[d], makespan - busy[d], _num(peak[d]), comm_busy[d], comp_end[d], step_at[d])
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
        node = cause[node]

    def timeline() -> list[list[tuple[Action, float, float]]]:
        """The lowered lists (as :func:`lower` writes them) with the times of the replay."""
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
                    q = dep_a[j] if dep_a[j] & 1 else dep_b[j]
                    line.append((a, t[q], t[q]))  # type: ignore[arg-type]
                elif k == SEND_F or k == SEND_B:  # just after its producer
                    j = ids[ci - 1]
                    line.append((a, send_start[j], t[2 * j + 1]))  # type: ignore[arg-type]
                elif k == ALLREDUCE:
                    ar = next(ars)
                    line.append((a, ar[0], ar[1]))
                elif k == STEP:
                    line.append((a, *step_at[d]))
                else:
                    j = ids[ci]
                    ci += 1
                    line.append((a, start[j], t[2 * j]))  # type: ignore[arg-type]
            out.append(line)
        return out

    return SimResult(makespan, bubble, stats, cf, cb, timeline)


def _num(x: float) -> float:
    return int(x) if float(x).is_integer() else x



def _waiting_for(sched: Schedule, d: int, a: Action, pos: list[int]) -> str:
    """Explain what device ``d``'s next action ``a`` waits for."""
    k, s, m, r = a.kind, a.stage, a.mb, a.replica
    place = sched.placement
    need: str
    if k == F:
        need = f"the forward of stage {s - 1} ({Action(F, s - 1, m, r)})" if s > 0 else "nothing"
        if s > 0 and place[r][s - 1] != d:
            need = f"the message {Action(RECV_F, s, m, r)} from device {place[r][s - 1]}"
    elif k in (B, I):
        need = f"{Action(F, s, m, r)} and the gradient from stage {s + 1}"
    elif k == W:
        need = f"{Action(I, s, m, r)}"
    elif k == RECV_F:
        need = f"{Action(SEND_F, s - 1, m, r)} on device {a.peer}"
    elif k == RECV_B:
        need = f"{Action(SEND_B, s + 1, m, r)} on device {a.peer}"
    elif k in (SEND_F, SEND_B):
        need = "the computation that produces it"
    else:
        need = "its all-reduces, which wait for every device holding the stage to post them"
    return f"device {d} is stuck at action #{pos[d]} ({a}), waiting for {need}"


def _critical_counts(acts: list[list[Action]], cause: dict[tuple[int, int], tuple[int, int] | None],
                     node: tuple[int, int] | None) -> tuple[int, int]:
    """Walk back from the compute action that ends last along the dependencies that bound each start;
    count forward passes (per micro-batch run) and backward passes (B or I) on the way: Chimera 3.4's
    C_f and C_b."""
    cf = cb = 0
    while node is not None:
        d, i = node
        a = acts[d][i]
        if a.kind == F:
            cf += a.span
        elif a.kind in (B, I):
            cb += 1
        node = cause.get(node)
    return cf, cb
