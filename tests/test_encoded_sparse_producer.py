"""The simulator's plan (:class:`planner.schedules.encoded.EncodedSchedule`) keeps its producer table sparse (the
computed cells sorted, looked up by binary search) instead of a dense ``4 * R*S*N`` array: the plan must be the
one the dense table gives. Checked against a reference written per action from the definitions of
:meth:`EncodedSchedule.encode`'s docstring, and on malformed schedules it must reject (a unit done twice)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.request import Config
from planner.schedules import build
from planner.schedules.encoded import EncodedSchedule
from planner.schedules.ir import Action, B, F, I, Schedule, W
from planner.schedules.timing import UnitCosts
from planner.shapes import ScheduleCache
from planner.simulate import builder_eager, simulate

KINDS = {F: 0, B: 1, I: 2, W: 3}


def _reference(sched: Schedule) -> tuple[dict[int, int], list[int], list[int], list[int]]:
    """The dense producer table (as a dict of its cells that are not -1), dep_a, dep_b and peer, per action."""
    S, N, R, place = sched.stages, sched.microbatches, sched.replicas, sched.placement
    RSN = R * S * N
    acts = [a for row in sched.actions for a in row]
    n = len(acts)
    prod: dict[int, int] = {}
    for j, a in enumerate(acts):
        for m in range(a.mb, a.mb + a.span):
            prod[KINDS[a.kind] * RSN + (a.replica * S + a.stage) * N + m] = j
    missing, none = 2 * n, 2 * n + 1

    def slot(cell: int, remote: bool) -> int:
        p = prod.get(cell, -1)
        return p + n * remote if p >= 0 else missing

    dep_a, dep_b, peer = [none] * n, [none] * n, [-1] * n
    for j, a in enumerate(acts):
        r, s, m = a.replica, a.stage, a.mb
        x = (r * S + s) * N + m
        d = place[r][s]
        if a.kind == F:
            if s > 0:
                dep_a[j] = slot(x - N, place[r][s - 1] != d)
            if s < S - 1 and place[r][s + 1] != d:
                peer[j] = place[r][s + 1]
        elif a.kind == W:
            dep_a[j] = slot(2 * RSN + x, False)
        else:  # B or I
            dep_a[j] = slot(x, False)
            if s < S - 1:
                cell = RSN + x + N if prod.get(RSN + x + N, -1) >= 0 else 2 * RSN + x + N
                dep_b[j] = slot(cell, place[r][s + 1] != d)
            if s > 0 and place[r][s - 1] != d:
                peer[j] = place[r][s - 1]
    return prod, dep_a, dep_b, peer


@pytest.mark.parametrize("name,D,N,params", [
    ("1f1b", 4, 8, {}), ("gpipe", 3, 5, {}), ("zb-h1", 4, 8, {}), ("interleaved", 4, 8, {"chunks": 2}),
    ("chimera", 4, 8, {"pipelines": 2}), ("chimera", 8, 16, {"pipelines": 4}),
    ("chimera", 8, 16, {"pipelines": 2, "concat": "forward-doubling"}), ("hanayo", 4, 8, {"waves": 2}),
    ("gems", 4, 8, {}),
])
def test_sparse_producer_gives_the_dense_plan(name: str, D: int, N: int, params: dict) -> None:
    sched = build(name, D, N, **params)
    plan = EncodedSchedule.encode(sched, builder_eager(sched))
    assert plan is not None
    prod, dep_a, dep_b, peer = _reference(sched)
    dense = plan.producer
    assert len(dense) == 4 * sched.replicas * sched.stages * sched.microbatches
    assert {i: int(v) for i, v in enumerate(dense.tolist()) if v >= 0} == prod
    assert (plan.dep_a, plan.dep_b, plan.peer) == (dep_a, dep_b, peer)
    simulate(sched, UnitCosts())  # and it replays


def test_a_unit_done_twice_is_still_rejected() -> None:
    sched = build("1f1b", 2, 2)
    rows = [list(row) for row in sched.actions]
    rows[0].insert(1, Action(F, 0, 0))  # the forward of (stage 0, micro-batch 0) twice
    bad = Schedule(sched.name, sched.devices, sched.stages, sched.microbatches, sched.placement, rows,
                   sched.mb_replica, sched.params, sched.weight_versions, sched.synchronous)
    assert EncodedSchedule.encode(bad, builder_eager(bad)) is None
    rows = [list(row) for row in sched.actions]
    rows[1].append(Action(I, 1, 1))  # a B and an I of (stage 1, micro-batch 1)
    bad = Schedule(sched.name, sched.devices, sched.stages, sched.microbatches, sched.placement, rows,
                   sched.mb_replica, sched.params, sched.weight_versions, sched.synchronous)
    assert EncodedSchedule.encode(bad, builder_eager(bad)) is None


@pytest.mark.parametrize("name,D,N,params", [("chimera", 8, 16, {"pipelines": 4}), ("hanayo", 4, 8, {"waves": 2}),
                                             ("1f1b", 4, 8, {}), ("interleaved", 4, 8, {"chunks": 2})])
def test_layout_without_kept_inflight_counts_is_the_same(name: str, D: int, N: int, params: dict) -> None:
    """:meth:`planner.shapes.ScheduleCache.layout` does not keep the in-flight lower bounds of merged schedules
    (computed for it alone): its arrays are those built from the kept counts."""
    config = Config(tensor=1, pipeline=D, data=1, micro_batch=1, schedule=name, **params)
    fresh, kept = ScheduleCache(), ScheduleCache()
    sched = kept.schedule(config, N, full=False)
    kept.inflight(config, sched)  # asked first: kept, then read by the layout
    a, b = fresh.layout(config, fresh.schedule(config, N, full=False)), kept.layout(config, sched)
    for field in ("stage", "per_mb", "inflight", "held"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y)), field
    assert fresh.inflight(config, sched) == kept.inflight(config, sched)
