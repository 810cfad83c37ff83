"""What a timed replay of a schedule reads and gives: the cost interface (:class:`Costs`, :class:`UnitCosts`),
the result (:class:`DeviceStats`, :class:`SimResult`), :class:`ScheduleError`, and what both replays
(:mod:`planner.schedules.replay`, :mod:`planner.schedules.encoded`) share: the all-reduce rendezvous and
memoised, checked durations. The rules they apply are :mod:`planner.simulate`'s docstring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.schedules.ir import (
    ALLREDUCE,
    SEND_B,
    SEND_F,
    STEP,
    Action,
    B,
    F,
    I,
    W,
)


class ScheduleError(ValueError):
    """A schedule breaks a rule; the message names the device, the action and the rule."""


class Costs:
    """Durations of actions. Subclass it (the planner's cost model does) or use :class:`UnitCosts`.

    ``compute(kind, stage, span, device)`` for F/B/I/W; ``p2p(kind, stage, span, src, dst)`` for a
    send of activations (SEND_F, the output of ``stage``) or gradients (SEND_B, the input gradient of
    ``stage``); ``allreduce(stage, replica, device)`` for a stage's gradient all-reduce; ``step(device)``.
    Results are cached per distinct argument tuple within one simulation.

    ``comm_share``: of the compute throughput, what a collective running beside it holds (its NCCL channels'
    SMs, :mod:`planner.contention`); the replays charge it to the compute that follows an eager all-reduce on
    its device (:func:`contention_debt`). 0: collectives cost compute nothing.
    """

    comm_share: float = 0.0

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

#: per device, ``(code, stage, span, start, end)`` arrays of the timeline's compute actions, optimizer steps
#: and copies (sends and all-reduces), in the timeline's order (:meth:`SimResult.host_spans`); stage and span
#: are a compute action's (-1 and 1 for the others)
HostSpans = list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

#: :data:`HostSpans`' codes: F, B, I, W 0-3, STEP 4, a send or an all-reduce 5
SPAN_CODE = {F: 0, B: 1, I: 2, W: 3, STEP: 4, SEND_F: 5, SEND_B: 5, ALLREDUCE: 5}
SPAN_KIND = (F, B, I, W, STEP)


def timeline_spans(timeline: Timeline) -> HostSpans:
    """:data:`HostSpans` read from a timeline: its entries of the kinds :data:`SPAN_CODE` names, in order."""
    out = []
    for row in timeline:
        code, stage, span, start, end = [], [], [], [], []
        for a, s, e in row:
            c = SPAN_CODE.get(a.kind)
            if c is None:
                continue
            code.append(c)
            stage.append(a.stage if c < 4 else -1)
            span.append(a.span if c < 4 else 1)
            start.append(s)
            end.append(e)
        out.append((np.array(code, dtype=np.int64), np.array(stage, dtype=np.int64),
                     np.array(span, dtype=np.int64), np.array(start, dtype=np.float64),
                     np.array(end, dtype=np.float64)))
    return out


@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    devices: list[DeviceStats]
    critical_forward: int  # Chimera's C_f
    critical_backward: int  # Chimera's C_b
    #: the timeline, or a function that builds it on first use (see :attr:`timeline`)
    _timeline: Timeline | Callable[[], Timeline] = field(repr=False, compare=False)
    #: a function giving :meth:`host_spans` without building the timeline (the encoded replay's), or None
    _spans: Callable[[], HostSpans] | None = field(default=None, repr=False, compare=False)

    @property
    def timeline(self) -> Timeline:
        """Per device, ``(action, start, end)`` of every action of its lowered list, in list order (a
        receive: the arrival of its message, twice; an all-reduce: when the collective ran). Built on
        first use: most callers want the figures only, and the lowered lists are ~3x the actions."""
        if callable(self._timeline):
            self._timeline = self._timeline()
        return self._timeline

    def host_spans(self) -> HostSpans:
        """Per device, :data:`HostSpans`: the timeline's compute actions, steps, sends and all-reduces, in
        the timeline's order, with their times (:func:`planner.cost.experienced_concurrency` reads these).
        Read from the timeline when it is built, else from the replay without building it."""
        spans = getattr(self, "_spans", None)
        if spans is not None and callable(self._timeline):
            return spans()
        return timeline_spans(self.timeline)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SimResult):
            return NotImplemented
        return self.to_dict() == other.to_dict() and self.timeline == other.timeline

    __hash__ = None  # type: ignore[assignment]  # mutable, like any non-frozen dataclass

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the timeline itself (the function that builds it does not pickle)."""
        return {**self.__dict__, "_timeline": self.timeline, "_spans": None}

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



class AllReduces:
    """The all-reduce rendezvous both replays use: a device posts a stage's all-reduce without blocking;
    once every device holding the stage has posted it, it runs on their collective streams, from when the
    last post came and every member's stream is free. ``post`` returns the [start, end] it will get."""

    def __init__(self, placement: list[list[int]], devices: int, duration: Callable[[int, int, int], float],
                 comm_busy: list[float]) -> None:
        self.holders: dict[int, int] = {}  # stage -> how many devices post its all-reduce (one per copy)
        for st in range(len(placement[0]) if placement else 0):
            self.holders[st] = len({row[st] for row in placement})
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


def contention_debt(share: float, allreduce: float, remaining: float) -> float:
    """What an all-reduce of ``allreduce`` seconds posted in the middle of a device's list (an eager one,
    Chimera 3.2) takes from the compute the device runs beside it: ``share`` (:attr:`Costs.comm_share`) of
    the overlap, taken as the all-reduce or the ``remaining`` compute seconds of the list, whichever is
    shorter. Both replays add it to the device's compute stream at the post, so what follows starts so much
    later; an all-reduce posted after the last compute (not eager) costs nothing."""
    if share <= 0.0 or remaining <= 0.0:
        return 0.0
    return share * min(allreduce, remaining)


def memoised_durations() -> Callable[..., float]:
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



def plain_number(x: float) -> float:
    return int(x) if float(x).is_integer() else x



