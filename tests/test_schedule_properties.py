"""Property tests: every builder's schedules validate over many (D, N, f, concat, waves)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import build, lower
from planner.schedules.ir import Schedule
from planner.schedules.validate import validate
from planner.simulate import UnitCosts, simulate

small = settings(max_examples=40, deadline=None)


def check(s: Schedule) -> None:
    validate(s)
    validate(lower(s, eager="all"))
    res = simulate(s, UnitCosts(1, 2, comm=0.1, allreduce_time=0.5))
    busy = sum(d.busy for d in res.devices)
    assert 0 <= res.bubble_ratio < 1
    assert busy > 0


@small
@given(D=st.integers(1, 12), N=st.integers(1, 40), name=st.sampled_from(["gpipe", "1f1b"]))
def test_linear(D, N, name):
    check(build(name, D, N))


@small
@given(half=st.integers(1, 8), N=st.integers(1, 48), data=st.data(),
       concat=st.sampled_from(["direct", "forward-doubling", "backward-halving"]))
def test_chimera(half, N, data, concat):
    D = 2 * half
    f = data.draw(st.sampled_from([x for x in range(1, half + 1) if half % x == 0]))
    s = build("chimera", D, N, pipelines=f, concat=concat)
    check(s)
    # every pipeline replica of every stage is all-reduced once per device that holds it
    assert len(s.placement) == 2 * f
    counts = [s.mb_replica.count(r) for r in range(2 * f)]
    assert max(counts) - min(counts) <= 2 * (1 if concat == "direct" or N <= D else 2)


@small
@given(P=st.integers(1, 8), N=st.integers(1, 24), W=st.integers(1, 4))
def test_hanayo(P, N, W):
    s = build("hanayo", P, N, waves=W)
    assert s.stages == 2 * W * P
    check(s)
