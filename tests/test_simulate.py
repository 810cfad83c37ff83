"""Simulator semantics: communication overlap, all-reduce, costs, errors."""

from __future__ import annotations

import pytest

from planner.schedules import build, lower
from planner.schedules.ir import Action
from planner.simulate import Costs, ScheduleError, UnitCosts, simulate


def test_lowered_and_compute_only_agree():
    for name, kw in [("1f1b", {}), ("chimera", {}), ("hanayo", {"waves": 2}), ("gpipe", {})]:
        s = build(name, 4, 8, **kw)
        a = simulate(s, UnitCosts(1, 2, comm=0.5))
        b = simulate(lower(s, eager=s.params.get("eager", "none") if s.params.get("eager") != "auto"
                           else "none"), UnitCosts(1, 2, comm=0.5))
        assert a.makespan == b.makespan


def test_comm_on_critical_path_of_one_microbatch():
    # one micro-batch through D stages: D forwards, D backwards, 2(D-1) messages in sequence
    D = 4
    res = simulate(build("1f1b", D, 1), UnitCosts(1, 2, comm=0.25))
    assert res.makespan == pytest.approx(D * 3 + 2 * (D - 1) * 0.25)


def test_comm_overlaps_when_there_is_slack():
    # GPipe, many micro-batches: sends overlap the next forward, only the fill/drain see comm
    D, N, c = 2, 8, 0.5
    res = simulate(build("gpipe", D, N), UnitCosts(1, 2, comm=c))
    assert res.makespan == pytest.approx((N + D - 1) * 3 + 2 * c)


def test_allreduce_exposed_at_end_and_step():
    s = build("1f1b", 2, 2)
    res = simulate(s, UnitCosts(1, 2, allreduce_time=5, step_time=1))
    base = simulate(s, UnitCosts(1, 2)).makespan
    # device 0 finishes last; its all-reduce (5) and step (1) follow its last backward
    assert res.makespan == pytest.approx(base + 5 + 1)


def test_eager_allreduce_hides_in_bubbles():
    s = build("chimera", 8, 8)  # eager="auto" chooses the early stages
    assert s.params["eager"], "some stages should be all-reduced eagerly"
    costs = UnitCosts(1, 2, allreduce_time=3)
    eager = simulate(s, costs).makespan
    lazy = simulate(build("chimera", 8, 8, eager="none"), costs).makespan
    assert eager < lazy


def test_busy_idle_bubble_consistent():
    res = simulate(build("chimera", 4, 4))
    for d in res.devices:
        assert d.busy + d.idle == pytest.approx(res.makespan)
        assert d.busy == 12
    assert res.bubble_ratio == pytest.approx(1 - sum(d.busy for d in res.devices) / (4 * res.makespan))


def test_timeline_covers_every_action_once():
    s = build("hanayo", 4, 4, waves=2)
    res = simulate(s)
    for d, row in enumerate(res.timeline):
        comp = [a for a, _, _ in row if a.kind in "FBIW"]
        assert sorted(map(str, comp)) == sorted(map(str, s.actions[d]))
        ends = [e for a, _, e in row if a.kind in "FBIW"]
        assert ends == sorted(ends)


def test_stage_dependent_costs():
    class Heavy(Costs):
        def compute(self, kind, stage, span, device):
            return (3.0 if stage == 0 else 1.0) * (1 if kind == "F" else 2) * span

    res = simulate(build("1f1b", 2, 4), Heavy())
    assert res.makespan == pytest.approx(4 * 9)  # stage 0 is the bottleneck and never waits


def test_negative_cost_rejected():
    with pytest.raises(ScheduleError, match="finite"):
        simulate(build("1f1b", 2, 2), UnitCosts(-1, 2))


def test_deadlock_named():
    s = build("gpipe", 2, 2)
    s.actions[1] = [Action("F", 1, 1), Action("B", 1, 1), Action("F", 1, 0), Action("B", 1, 0)]
    s.actions[0] = [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)]
    with pytest.raises(ScheduleError, match="device 0 is stuck .*waiting for"):
        simulate(s)
