"""A warm-up built from a shorter one of the same lists (:class:`planner.shapes.Warmup`'s ``extends``, what
:meth:`planner.shapes.ScheduleCache.warmup` does for the S, 2S, 3S rounds) holds the arrays read from the
start."""

from __future__ import annotations

import numpy as np
import pytest

from planner.request import Config
from planner.shapes import ScheduleCache, Warmup

ARRAYS = ("stage", "coef", "forward", "input_grad", "weight_grad")


def same(a: Warmup, b: Warmup) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert a.backwards == b.backwards and a.lists == b.lists
    act = np.linspace(1.0, 3.0, a.shape.stages)
    assert a.peaks(act) == b.peaks(act)
    assert a.peaks(act, act / 7) == b.peaks(act, act / 7)


@pytest.mark.parametrize("name,D,N,params", [
    ("chimera", 8, 8, {"pipelines": 1, "concat": "direct"}),
    ("chimera", 16, 64, {"pipelines": 2, "concat": "forward-doubling"}),
    ("chimera", 32, 96, {"pipelines": 8, "concat": "direct"}),
    ("hanayo", 8, 16, {"waves": 2}),
    ("hanayo", 16, 16, {"waves": 4}),
])
def test_extended_warmups_read_as_from_the_start(name: str, D: int, N: int, params: dict) -> None:
    config = Config(tensor=1, pipeline=D, data=1, micro_batch=1, schedule=name, **params)
    cache = ScheduleCache()
    S = cache.schedule(config, N, full=False).stages
    rounds = (S, 2 * S, 3 * S, 40 * S)  # the last: the whole schedule (no action past the third round's or some)
    got = [cache.warmup(config, N, slots) for slots in rounds]
    assert all(w is not None for w in got)
    fresh_cache = ScheduleCache()
    for w in got:
        assert w is not None
        fresh = fresh_cache.warmup(config, N, w.slots)  # the first of its key in that cache: read from the start
        fresh_cache = ScheduleCache()
        assert fresh is not None
        same(w, fresh)
    # a shorter warm-up asked after a longer one is read from the start (the longer is no prefix of it)
    again = ScheduleCache()
    long, short = again.warmup(config, N, 3 * S), again.warmup(config, N, S)
    assert long is not None and short is not None
    same(short, got[0])
