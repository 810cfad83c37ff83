"""The numpy readings of a schedule's placement -- :meth:`planner.schedules.ir.Schedule.stages_by_device`
for large placements and :func:`planner.shapes.layout_arrays` -- give what the Python loops they replaced
gave (written out here as the reference), on the builders' shapes and on random placements."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.request import Config
from planner.schedules.ir import Schedule, _stages_by_device
from planner.shapes import Layout, ScheduleCache, layout_arrays


def loop_pairs(placement: list[list[int]], devices: int) -> list[list[tuple[int, int]]]:
    """The loop :meth:`Schedule.stages_by_device` ran before (and still runs on small placements)."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(devices)]
    seen: set[tuple[int, int]] = set()
    for r, row in enumerate(placement):
        for s, d in enumerate(row):
            if (s, d) not in seen:
                seen.add((s, d))
                out[d].append((r, s))
    return out


def loop_layout(sched: Schedule, pairs: list[list[tuple[int, int]]], counts: dict, holds: dict) -> Layout:
    """The loops :meth:`planner.shapes.ScheduleCache.layout` ran before :func:`layout_arrays`."""
    per_route = Counter(sched.mb_replica)
    per_copy: Counter[tuple[int, int]] = Counter()
    for r, row in enumerate(sched.placement):
        for s, d in enumerate(row):
            per_copy[(s, d)] += per_route[r]
    return Layout(
        np.array([[s for _, s in row] for row in pairs], dtype=np.int64),
        np.array([[per_copy[(s, d)] for _, s in row] for d, row in enumerate(pairs)], dtype=float),
        np.array([[counts.get(pair, 0) for pair in row] for row in pairs], dtype=float),
        None if not holds else np.array([[holds.get(pair, 0) for pair in row] for row in pairs], dtype=float))


def same_layout(a: Layout, b: Layout) -> None:
    for name in ("stage", "per_mb", "inflight"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert (a.held is None) == (b.held is None)
    if a.held is not None:
        assert a.held.dtype == b.held.dtype and a.held.tobytes() == b.held.tobytes()


SHAPES = [
    ("1f1b", 8, 16, {}), ("gpipe", 4, 4, {}), ("interleaved", 8, 16, {"chunks": 2}), ("zb-h1", 8, 8, {}),
    ("gems", 8, 8, {}), ("hanayo", 8, 16, {"waves": 2}), ("hanayo", 64, 64, {"waves": 4}),
    ("chimera", 8, 8, {"pipelines": 1, "concat": "direct"}),
    ("chimera", 16, 48, {"pipelines": 4, "concat": "forward-doubling"}),
    ("chimera", 64, 64, {"pipelines": 32, "concat": "direct"}),  # 4096 entries: the numpy reading
    ("chimera", 128, 384, {"pipelines": 16, "concat": "backward-halving"}),
    ("1f1b-rr", 4, 8, {"replication": "2,1,1"}), ("pipedream-rr", 4, 8, {"replication": "2,1,1"}),
]


@pytest.mark.parametrize("name,D,N,params", SHAPES)
def test_builder_shapes(name: str, D: int, N: int, params: dict) -> None:
    config = Config(tensor=1, pipeline=D, data=1, micro_batch=1, schedule=name, **params)
    cache = ScheduleCache()
    sched = cache.schedule(config, N, full=False)
    pairs = sched.stages_by_device()
    assert pairs == loop_pairs(sched.placement, sched.devices)
    counts, holds = cache.inflight(config, sched), cache.held(config, sched)
    same_layout(cache.layout(config, sched), loop_layout(sched, pairs, counts, holds))


@st.composite
def placements(draw: st.DrawFn) -> tuple[Schedule, dict, dict]:
    """A random rectangular placement (stage copies on random devices, repeats allowed), micro-batch routes
    (some outside the replicas) and per-pair figures (some for pairs no device holds)."""
    D = draw(st.integers(1, 9))
    R, S = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    place = [[draw(st.integers(0, D - 1)) for _ in range(S)] for _ in range(R)]
    mbs = draw(st.lists(st.integers(-1, R + 1), max_size=20))
    pair = st.tuples(st.integers(0, R + 1), st.integers(0, S + 1))
    counts = draw(st.dictionaries(pair, st.integers(0, 2**40), max_size=30))
    holds = draw(st.dictionaries(pair, st.integers(0, 50), max_size=30))
    return Schedule("random", D, S, len(mbs), place, [[] for _ in range(D)], mb_replica=mbs), counts, holds


@settings(max_examples=300, deadline=None)
@given(placements())
def test_random_placements(case: tuple[Schedule, dict, dict]) -> None:
    sched, counts, holds = case
    ref = loop_pairs(sched.placement, sched.devices)
    assert _stages_by_device(sched.placement, sched.devices) == ref
    assert sched.stages_by_device() == ref
    if all(len(row) == len(ref[0]) for row in ref) and ref[0]:
        same_layout(layout_arrays(sched, ref, counts, holds), loop_layout(sched, ref, counts, holds))


def test_device_out_of_range_left_to_the_loop() -> None:
    assert _stages_by_device([[0, 5]], 2) is None
    with pytest.raises(IndexError):
        Schedule("x", 2, 2, 1, [[0, 5]] * 4096, [[], []]).stages_by_device()
