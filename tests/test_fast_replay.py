"""The replay of compute-only schedules with implied communication (``simulate`` on a compute-only
schedule) against the replay of the explicit lowered lists (``simulate(lower(schedule))``): the same
times for every action, the same figures. The simulator must time exactly the lists the executor runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import build, lower
from planner.schedules.encoded import EncodedSchedule
from planner.schedules.ir import Action, Schedule
from planner.schedules.replay import canonical_compute_only, replay_lowered
from planner.simulate import Costs, ScheduleError, UnitCosts, simulate


class Uneven(Costs):
    """Costs that depend on the stage, the device and the peer, so a wrong cache key shows."""

    def __init__(self, comm: float, ar: float, step: float) -> None:
        self.comm, self.ar, self.step_t = comm, ar, step

    def compute(self, kind, stage, span, device):
        base = {"F": 1.0, "B": 2.0, "I": 1.25, "W": 0.75}[kind]
        return base * span * (1 + 0.125 * (stage % 3)) + 0.0625 * (device % 2)

    def p2p(self, kind, stage, span, src, dst):
        return self.comm * span * (1 + 0.5 * ((src + dst) % 2)) * (1.5 if kind == "SEND_B" else 1)

    def allreduce(self, stage, replica, device):
        return self.ar * (1 + 0.25 * (stage % 2))

    def step(self, device):
        return self.step_t * (1 + device % 2)

    def activation(self, stage):
        return 1.0 + stage % 2


def split_backward(s: Schedule, defer: bool) -> Schedule:
    """Zero-bubble style: every B becomes I followed by W (or all W at the end of the list)."""
    acts = []
    for row in s.actions:
        new, tail = [], []
        for a in row:
            if a.kind == "B":
                new.append(a._replace(kind="I"))
                (tail if defer else new).append(a._replace(kind="W"))
            else:
                new.append(a)
        acts.append(new + tail)
    return Schedule(s.name, s.devices, s.stages, s.microbatches, s.placement, acts, list(s.mb_replica),
                    dict(s.params))


def eager_of(s: Schedule):
    e = s.params.get("eager", "none")
    return "none" if e == "auto" else e


def assert_same(s: Schedule, costs: Costs) -> None:
    assert EncodedSchedule.encode(s, eager_of(s)) is not None, "the fast path should cover it"
    fast = simulate(s, costs)
    ref = replay_lowered(lower(s, eager=eager_of(s)), costs)
    assert fast.makespan == ref.makespan
    assert fast.bubble_ratio == ref.bubble_ratio
    assert [d.to_dict() for d in fast.devices] == [d.to_dict() for d in ref.devices]
    assert (fast.critical_forward, fast.critical_backward) == (ref.critical_forward, ref.critical_backward)
    assert fast.timeline == ref.timeline


def _chimera_ok(d: int, f: int) -> bool:
    return (d // 2) % f == 0


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([0.0, 0.25, 0.5, 1.5]), st.sampled_from([0.0, 0.5, 3.0]),
       st.sampled_from([0.0, 0.5]), st.booleans(), st.sampled_from([None, False, True]),
       st.sampled_from([0.0, 0.25]))
def test_implied_equals_lowered(data, comm, ar, step, uneven, split, share):
    name = data.draw(st.sampled_from(["gpipe", "1f1b", "chimera", "hanayo"]))
    if name == "chimera":
        d = data.draw(st.sampled_from([2, 4, 8]))
        f = data.draw(st.sampled_from([f for f in (1, 2) if _chimera_ok(d, f)]))
        s = build("chimera", d, data.draw(st.integers(1, 20)), pipelines=f,
                  concat=data.draw(st.sampled_from(["direct", "forward-doubling"])),
                  eager=data.draw(st.sampled_from(["auto", "all", "none"])))
    elif name == "hanayo":
        s = build("hanayo", data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8)),
                  waves=data.draw(st.integers(1, 3)))
    else:
        s = build(name, data.draw(st.integers(1, 6)), data.draw(st.integers(1, 10)))
    if split is not None and all(a.span == 1 for row in s.actions for a in row):
        s = split_backward(s, defer=split)
    costs = Uneven(comm, ar, step) if uneven else UnitCosts(1, 2, comm=comm, allreduce_time=ar,
                                                            step_time=step)
    costs.comm_share = share  # what all-reduces take from the compute beside them (planner.contention)
    assert_same(s, costs)


@pytest.mark.parametrize("name,kw", [("1f1b", {}), ("chimera", {}), ("chimera", {"pipelines": 2}),
                                     ("chimera", {"concat": "forward-doubling"}), ("hanayo", {"waves": 2})])
def test_implied_equals_lowered_larger(name, kw):
    assert_same(build(name, 8, 32, **kw), UnitCosts(1, 2, comm=0.3, allreduce_time=2, step_time=1))
    shared = UnitCosts(1, 2, comm=0.3, allreduce_time=2, step_time=1)
    shared.comm_share = 0.25
    assert_same(build(name, 8, 32, **kw), shared)


def test_deadlock_message_is_the_lowered_replays():
    s = build("gpipe", 2, 2)
    s.actions[1] = [Action("F", 1, 1), Action("B", 1, 1), Action("F", 1, 0), Action("B", 1, 0)]
    s.actions[0] = [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)]
    with pytest.raises(ScheduleError) as fast:
        simulate(s)
    with pytest.raises(ScheduleError) as ref:
        simulate(lower(s))
    assert str(fast.value) == str(ref.value)


def test_malformed_goes_through_the_lowered_replay():
    s = build("1f1b", 2, 2)
    s.actions[0].append(Action("F", 0, 0))  # a forward run twice: no plan, the lowered replay times it
    assert EncodedSchedule.encode(s, "none") is None
    assert simulate(s).makespan == replay_lowered(lower(s), UnitCosts()).makespan


def test_result_pickles_and_compares_with_its_timeline():
    import pickle

    s = build("chimera", 4, 8)
    res = simulate(s, UnitCosts(1, 2, comm=0.5))
    back = pickle.loads(pickle.dumps(res))
    assert back.timeline == res.timeline and back == res
    assert res == replay_lowered(lower(s, eager=eager_of(s)), UnitCosts(1, 2, comm=0.5))


LOWERED = [("1f1b", {}), ("chimera", {}), ("chimera", {"concat": "forward-doubling"}),
           ("hanayo", {"waves": 2})]


@pytest.mark.parametrize("name,kw", LOWERED)
def test_lowered_input_timed_like_the_lowered_replay(name, kw):
    costs = UnitCosts(1, 2, comm=0.3, allreduce_time=2, step_time=1)
    low = lower(build(name, 8, 16, **kw), eager="all")
    assert canonical_compute_only(low) is not None
    assert simulate(low, costs) == replay_lowered(low, costs)
    # an eager all-reduce moved to the end of its list is no lowering with eager="all": the explicit
    # replay times it
    row = low.actions[1]
    i = next(i for i, a in enumerate(row) if a.kind == "ALLREDUCE")
    row.insert(len(row) - 1, row.pop(i))
    assert canonical_compute_only(low) is None
    assert simulate(low, costs) == replay_lowered(low, costs)
