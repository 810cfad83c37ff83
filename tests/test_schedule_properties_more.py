"""Property tests of the interleaved, ZB-H1, PipeDream, PipeDream-2BW and GEMS builders: for many
(D, N, ...) the schedule validates before and after lowering and survives the JSON and text round trips."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import build, lower
from planner.schedules.ir import Schedule, parse_action
from planner.schedules.validate import validate

SETTINGS = settings(max_examples=40, deadline=None)


def check(s: Schedule) -> None:
    validate(s)
    low = lower(s)
    validate(low)
    for sched in (s, low):
        back = Schedule.from_json(sched.to_json())
        assert back.actions == sched.actions
        assert back.to_dict() == sched.to_dict()
    for row in s.actions:
        for a in row:
            assert parse_action(str(a)) == a


@st.composite
def interleaved_args(draw):
    D = draw(st.integers(1, 16))
    v = draw(st.integers(1, 4))
    k = draw(st.integers(1, max(1, 48 // D)))
    if D * v > 32:  # keep the runs short: at most 32 stages
        v = max(1, 32 // D)
    return D, k * D, v


@SETTINGS
@given(interleaved_args())
def test_interleaved(args):
    D, N, v = args
    s = build("interleaved", D, N, chunks=v)
    assert s.stages == D * v
    check(s)


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 48))
def test_zb_h1(D, N):
    check(build("zb-h1", D, N))


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 48))
def test_pipedream(D, N):
    s = build("pipedream", D, N)
    check(s)
    assert Schedule.from_json(s.to_json()).weight_versions == s.weight_versions


@SETTINGS
@given(st.integers(1, 16), st.data())
def test_pipedream_2bw(D, data):
    N = data.draw(st.integers(D, 48))
    s = build("pipedream-2bw", D, N)
    check(s)
    back = Schedule.from_json(s.to_json())
    assert back.synchronous is False and back.params["update"] == "every-N"


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 48))
def test_gems(D, N):
    check(build("gems", D, N))
