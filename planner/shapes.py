"""The schedules of one search and what is derived from their shapes, built once and cached by value:
per (schedule, D, schedule micro-batches, parameters) -- t, W, b and recomputation do not change the
lists -- the shape (placement and micro-batch assignment, :func:`planner.schedules.shape`), the full
lists, their compiled form for the simulator, the (replica, stage) pairs each device holds, the
builder's in-flight counts, and the :class:`Layout` the memory model and the bounds read."""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import numpy as np

from planner.request import Config
from planner.schedules import BUILDERS, SCHEDULE_PARAMETERS, build, held_at_peak, inflight, inflight_exact, shape
from planner.schedules.ir import Action, B, F, I, Schedule, W
from planner.simulate import compile_schedule

#: (schedule name, D, schedule micro-batches, sorted parameters): what a schedule's lists depend on
ScheduleKey = tuple[str, int, int, tuple]


def schedule_key(config: Config, microbatches: int) -> ScheduleKey:
    """The cache key of ``config``'s schedule with ``microbatches`` schedule micro-batches."""
    # (Config.schedule_params()'s items sorted by name, read directly: thousands of calls per search)
    return (config.schedule, config.pipeline, microbatches,
            tuple((k, v) for k in _PARAMETER_NAMES if (v := getattr(config, k)) is not None))


#: the schedule parameters' names, sorted (:func:`schedule_key`)
_PARAMETER_NAMES = tuple(sorted(SCHEDULE_PARAMETERS))


@dataclass
class Layout:
    """Which (replica, stage) pairs each device of a schedule's shape holds, as ``(devices, h)`` arrays
    (every builder gives each device the same number ``h`` of pairs), with the micro-batches per replica
    and the in-flight counts per pair: what the per-device memory and time bounds are computed from."""

    stage: np.ndarray
    per_mb: np.ndarray  # micro-batches of each pair's replica
    inflight: np.ndarray  # in-flight micro-batches of each pair (exact, or a lower bound)
    #: of a split backward, the output gradients each pair holds where its activations peak (None where the
    #: schedule holds none, or the builder does not say: :func:`planner.schedules.held_at_peak`)
    held: np.ndarray | None = None


class Warmup:
    """The first ``slots`` unit slots of a merged schedule's lists (Chimera, Hanayo: their builder's
    ``prefix``), what the memory check before merging and :meth:`planner.bounds.TimeBounds.prefix_bound`
    read. The lists depend on the schedule's structure alone -- (schedule, D, schedule micro-batches,
    parameters, slots): the merge orders actions by unit slots, not by their costs
    (:mod:`planner.schedules.merge`) -- so they are merged once per search and shared by every t, W, b and
    recomputation with that structure; what depends on the costs is computed from these arrays.

    ``stage``, ``coef`` and ``forward`` are ``(devices, longest list)`` arrays in list order, padded at the
    end: the stage of each action, what it adds to the alive micro-batches (a forward its span, a B or W
    minus one -- a split backward's activations stay until its W --, an I nothing), and whether it is a
    forward."""

    def __init__(self, shape: Schedule, lists: list[list[Action]], slots: int,
                 extends: Warmup | None = None) -> None:
        """``extends``: a warm-up of the same lists with fewer slots (each of its lists a prefix of the one in
        ``lists``): its arrays are copied and only the actions past it are read, instead of every action again
        (the memory check merges S, 2S, then 3S slots: at D = 256 the third round's lists hold up to ~200k
        actions, a third of them new). The arrays are the same as read from the start: each entry is of its
        own action, and the padding is zeros in both."""
        self.shape, self.lists, self.slots = shape, lists, slots
        lens = [len(row) for row in lists]
        start = [len(row) for row in extends.lists] if extends is not None else [0] * len(lists)
        tails = [row[k:] for row, k in zip(lists, start, strict=True)]
        news = [len(row) for row in tails]
        D, L, n = len(lists), max(lens, default=0), sum(news)
        self.stage = np.zeros((D, L), dtype=np.int64)
        self.coef = np.zeros((D, L))
        self.forward = np.zeros((D, L), dtype=bool)
        #: where the I and W actions are (a split backward's I adds the output gradients its W frees)
        self.input_grad = np.zeros((D, L), dtype=bool)
        self.weight_grad = np.zeros((D, L), dtype=bool)
        backwards = 0
        if extends is not None:
            done = extends.stage.shape[1]  # its padding is zeros, as these arrays' is
            for name in ("stage", "coef", "forward", "input_grad", "weight_grad"):
                getattr(self, name)[:, :done] = getattr(extends, name)
            backwards = extends.backwards
        if n:
            # every row at once: the new actions' fields as flat columns, placed at (device, position in its list)
            kinds, stages, _, _, spans, _ = zip(*(a for row in tails for a in row), strict=True)
            code = np.frombuffer("".join(kinds).encode("ascii"), dtype=np.uint8)
            if len(code) != n:
                raise ValueError("a warm-up holds compute actions only (F, B, I, W)")
            fwd, bwd = code == ord(F), (code == ord(B)) | (code == ord(I))
            frees = (code == ord(B)) | (code == ord(W))  # a split backward's activations stay until its W
            at = (np.repeat(np.arange(D), news),
                  np.repeat(start, news) + np.arange(n) - np.repeat(np.cumsum(news) - news, news))
            self.input_grad[at] = code == ord(I)
            self.weight_grad[at] = code == ord(W)
            self.stage[at] = stages
            self.forward[at] = fwd
            self.coef[at] = np.where(fwd, np.array(spans, dtype=float), np.where(frees, -1.0, 0.0))
            backwards += int(bwd.sum())
        #: B and I actions in the lists (all of them: the prefix is the whole schedule)
        self.backwards = backwards
        self._compiled: Any = None
        self._part: Schedule | None = None

    def peaks(self, activation: np.ndarray, held: np.ndarray | None = None) -> list[float]:
        """Per device, the peak of its alive activations in these lists with ``activation[s]`` per
        micro-batch of stage ``s``, counted as the simulator counts them (:func:`planner.schedules.encoded.
        replay_encoded`; :meth:`planner.memory.MemoryModel.list_peaks` reads a full schedule's lists through it)
        (in list order, a forward adds span times its stage's figure, B takes one away, a split backward's I
        adds ``held[s]`` -- the output gradients its W needs -- and its W takes both away; the peak taken after
        forwards and I's; the running sums are sequential, ``np.cumsum`` along each row, so the same additions
        in the same order give the same numbers). ``held`` None: none kept (the additions of an I are 0)."""
        if not self.stage.shape[1]:
            return [0.0] * len(self.lists)
        if held is None or not np.any(held):
            alive = np.cumsum(self.coef * activation[self.stage], axis=1)
        else:
            act, kept = activation[self.stage], held[self.stage]
            alive = np.cumsum(np.where(self.input_grad, kept,
                                       np.where(self.weight_grad, -(act + kept), self.coef * act)), axis=1)
        top = np.where(self.forward | self.input_grad, alive, -np.inf).max(axis=1)
        return np.maximum(top, 0.0).tolist()

    def partial(self) -> tuple[Schedule, Any]:
        """These lists as a schedule of their own (no eager all-reduces) and its compiled form for
        :func:`planner.simulate.simulate` (built once)."""
        if self._part is None:
            shape = self.shape
            self._part = Schedule(shape.name, shape.devices, shape.stages, shape.microbatches, shape.placement,
                                  self.lists, shape.mb_replica, {**shape.params, "eager": "none"},
                                  shape.weight_versions, shape.synchronous)
            self._compiled = compile_schedule(self._part)
        return self._part, self._compiled


class _Recent(OrderedDict[ScheduleKey, Any]):
    """A dict that keeps its ``size`` most recently used entries."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get(self, key: ScheduleKey, default: Any = None) -> Any:  # type: ignore[override]
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key: ScheduleKey, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


#: full action lists (and their compiled form) kept at once: a list of D x N actions takes ~130 bytes per
#: action (measured: 1F1B, D=26, N=32768: 222 MB), so the cache of a search over many micro-batch counts
#: is bounded by entries, not grown with every (schedule, D, N) the search simulates
FULL_SCHEDULES_KEPT = 8


class ScheduleCache:
    """Schedules and their shape-derived figures, keyed by :func:`schedule_key`. The shapes and the figures
    derived from them are small and all kept; the full lists only for the ``FULL_SCHEDULES_KEPT`` most
    recently used keys (a search visits candidates best bound first, and those share few keys)."""

    def __init__(self) -> None:
        self._schedules: dict[ScheduleKey, Schedule] = _Recent(FULL_SCHEDULES_KEPT)
        self._shapes: dict[ScheduleKey, Schedule] = {}
        self._compiled: dict[ScheduleKey, Any] = _Recent(FULL_SCHEDULES_KEPT)
        self._pairs: dict[ScheduleKey, list[list[tuple[int, int]]]] = {}
        self._inflight: dict[ScheduleKey, dict[tuple[int, int], int]] = {}
        self._held: dict[ScheduleKey, dict[tuple[int, int], int]] = {}
        self._layouts: dict[ScheduleKey, Layout] = {}
        self._warmups: dict[tuple[ScheduleKey, int], Warmup | None] = {}
        self._longest_warmup: dict[ScheduleKey, Warmup] = {}
        self._forwards_first: dict[ScheduleKey, tuple[np.ndarray, int] | None] = {}

    def schedule(self, config: Config, microbatches: int, full: bool = True) -> Schedule:
        """The schedule of ``config`` with ``microbatches`` schedule micro-batches. ``full=False`` may leave
        the action lists empty (placement and micro-batch assignment only, :func:`planner.schedules.shape`)."""
        key = schedule_key(config, microbatches)
        sched = self._schedules.get(key)
        if sched is None and not full:
            sched = self._shapes.get(key)
            if sched is None:
                sched = self._shapes[key] = shape(config.schedule, config.pipeline, microbatches,
                                                  **config.schedule_params())
        elif sched is None:
            sched = self._schedules[key] = build(config.schedule, config.pipeline, microbatches,
                                                 **config.schedule_params())
        return sched

    def warmup(self, config: Config, microbatches: int, slots: int) -> Warmup | None:
        """The first ``slots`` unit slots of the merged lists of ``config``'s schedule with ``microbatches``
        schedule micro-batches (:class:`Warmup`), or None where the builder merges nothing (no
        ``prefix``). Kept for the whole search: a prefix of a few slots per device is small."""
        key = (schedule_key(config, microbatches), slots)
        if key in self._warmups:
            return self._warmups[key]
        prefix = getattr(sys.modules[BUILDERS[config.schedule].__module__], "prefix", None)
        got = None
        if prefix is not None:
            # the longest warm-up of these lists built so far, when shorter: its arrays are this one's start
            before = self._longest_warmup.get(key[0])
            got = Warmup(self.schedule(config, microbatches, full=False),
                         prefix(config.pipeline, microbatches, slots, **config.schedule_params()), slots,
                         before if before is not None and before.slots < slots else None)
            if before is None or before.slots < slots:
                self._longest_warmup[key[0]] = got
        self._warmups[key] = got
        return got

    def forwards_first(self, config: Config, sched: Schedule) -> tuple[np.ndarray, int] | None:
        """Per device of ``sched``'s shape, the forwards its list certainly runs before its first backward,
        all alive when it starts (the builder's ``forwards_first``): a count of its first unit slots where the
        stages are not known (merged lists, :func:`planner.schedules.merge.forwards_first`), or a count per
        stage it holds, in :class:`Layout` order (interleaved); with the fewest micro-batches one forward runs
        (the builder's ``forward_span``, else 1). None where the builder has no such function."""
        key = schedule_key(config, sched.microbatches)
        if key in self._forwards_first:
            return self._forwards_first[key]
        module = sys.modules[BUILDERS[config.schedule].__module__]
        fn, span = getattr(module, "forwards_first", None), getattr(module, "forward_span", None)
        got = None
        if fn is not None:
            params = config.schedule_params()
            got = (np.array(fn(config.pipeline, sched.microbatches, **params), dtype=float),
                   1 if span is None else span(config.pipeline, sched.microbatches, **params))
        self._forwards_first[key] = got
        return got

    def compiled(self, config: Config, sched: Schedule) -> Any:
        """:func:`planner.simulate.compile_schedule` of ``config``'s full schedule ``sched``."""
        key = schedule_key(config, sched.microbatches)
        got = self._compiled.get(key)
        if got is None:
            got = self._compiled[key] = compile_schedule(sched)
        return got

    def pairs(self, config: Config, sched: Schedule) -> list[list[tuple[int, int]]]:
        """Per device of ``sched``'s shape, the (replica, stage) pairs it holds."""
        key = schedule_key(config, sched.microbatches)
        got = self._pairs.get(key)
        if got is None:
            got = self._pairs[key] = sched.stages_by_device()
        return got

    def inflight(self, config: Config, sched: Schedule, keep: bool = True) -> dict[tuple[int, int], int]:
        """:func:`planner.schedules.inflight` of ``sched``'s shape: per (replica, stage), the micro-batches
        alive at once (exact, or a lower bound: :func:`planner.schedules.inflight_exact`); ``keep``: kept for
        the next call (computed ones are)."""
        key = schedule_key(config, sched.microbatches)
        got = self._inflight.get(key)
        if got is None:
            got = inflight(config.schedule, sched.devices, sched.microbatches, **config.schedule_params()) or {}
            if keep:
                self._inflight[key] = got
        return got

    def held(self, config: Config, sched: Schedule) -> dict[tuple[int, int], int]:
        """:func:`planner.schedules.held_at_peak` of ``sched``'s shape: per (replica, stage), a split backward's
        held output gradients where its activations peak (empty where the schedule holds none)."""
        key = schedule_key(config, sched.microbatches)
        got = self._held.get(key)
        if got is None:
            got = self._held[key] = held_at_peak(config.schedule, sched.devices, sched.microbatches,
                                                 **config.schedule_params()) or {}
        return got

    def layout(self, config: Config, sched: Schedule) -> Layout:
        """:class:`Layout` of ``sched``'s shape."""
        key = schedule_key(config, sched.microbatches)
        got = self._layouts.get(key)
        if got is None:
            pairs = self.pairs(config, sched)
            h = len(pairs[0])
            if any(len(row) != h for row in pairs) or h == 0:
                held = ", ".join(f"device {d}: {len(row)}" for d, row in enumerate(pairs))
                raise ValueError(f"{sched.name} on D={sched.devices}: devices hold different numbers of stage "
                                 f"copies ({held}); the planner needs as many on every device"
                                 + (" (gems: an even D)" if sched.name == "gems" else ""))
            # the in-flight counts, not kept where this layout is all that reads them: only the exact counts
            # are asked for again (:meth:`planner.bounds.TimeBounds.lower_bound`, :meth:`planner.memory.
            # MemoryModel.partition_fitting`), and Chimera's lower bounds at D = 256 hold ~1M (replica, stage)
            # entries per search (~150 MB); asked for anyway, they are computed again, the same
            counts = self.inflight(config, sched, keep=inflight_exact(config.schedule))
            holds = self.held(config, sched)
            got = self._layouts[key] = layout_arrays(sched, pairs, counts, holds)
        return got


def layout_arrays(sched: Schedule, pairs: list[list[tuple[int, int]]], counts: dict[tuple[int, int], int],
                  holds: dict[tuple[int, int], int]) -> Layout:
    """The :class:`Layout` of ``sched``'s shape from its devices' (replica, stage) ``pairs`` (all rows of one
    length), the in-flight ``counts`` and the ``holds`` per pair (absent pairs: 0; ``holds`` empty: none).

    With numpy over the placement rather than Python loops over its R x S entries: Chimera with f pipelines
    puts 2f stage copies on every device (D x 2f = 65536 pairs at D = 256, f = 128), and the loops took
    ~0.2 s per layout there, ~3 s of a 256-layer search. The figures are the same: the micro-batches through
    a stage copy are sums of whole numbers (exact in float64), and the counts are read per pair as before."""
    D, h = len(pairs), len(pairs[0])
    R = len(sched.placement)
    S = len(sched.placement[0]) if R else 0
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(pairs)), dtype=np.int64, count=2 * D * h)
    stage = np.ascontiguousarray(flat[1::2]).reshape(D, h)
    # micro-batches through each stage copy (s, d): those of every replica (route) placing stage s on d
    place = np.array(sched.placement, dtype=np.int64).reshape(R, S)
    routes = np.array(sched.mb_replica, dtype=np.int64)
    per_route = np.bincount(routes[(routes >= 0) & (routes < R)], minlength=R).astype(float)
    per_copy = np.bincount((np.arange(S) * D + place).ravel(), weights=np.repeat(per_route, S), minlength=S * D)
    per_mb = per_copy[stage * D + np.arange(D)[:, None]]

    def per_pair(values: dict[tuple[int, int], int]) -> np.ndarray:
        return np.fromiter(map(values.get, chain.from_iterable(pairs), repeat(0)), dtype=float,
                           count=D * h).reshape(D, h)

    return Layout(stage, per_mb, per_pair(counts), per_pair(holds) if holds else None)
