"""The validator's quick acceptance (on the simulator's plan and replay) never accepts a schedule that
the rule-by-rule checks reject, and accepts the schedules the builders make."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import build
from planner.schedules.ir import Action, Schedule
from planner.schedules.validate import _check_rules, _passes, validate
from planner.simulate import ScheduleError

BUILT = [("gpipe", 4, 6, {}), ("1f1b", 5, 7, {}), ("chimera", 4, 8, {}), ("chimera", 8, 8, {"pipelines": 2}),
         ("chimera", 4, 12, {"concat": "forward-doubling"}), ("chimera", 8, 3, {}),
         ("hanayo", 3, 5, {"waves": 2})]


def copy(s: Schedule) -> Schedule:
    return Schedule(s.name, s.devices, s.stages, s.microbatches, [list(r) for r in s.placement],
                    [list(r) for r in s.actions], list(s.mb_replica), dict(s.params))


def by_rules_ok(s: Schedule) -> bool:
    try:
        _check_rules(s)
    except ScheduleError:
        return False
    return True


@pytest.mark.parametrize("name,d,n,kw", BUILT)
def test_builders_pass_quickly(name, d, n, kw):
    s = build(name, d, n, **kw)
    assert _passes(s)
    assert by_rules_ok(s)


def mutate(s: Schedule, how: str, d: int, i: int, j: int) -> None:
    row = s.actions[d]
    if not row:
        return
    i, j = i % len(row), j % len(row)
    a = row[i]
    if how == "swap":
        row[i], row[j] = row[j], row[i]
    elif how == "drop":
        del row[i]
    elif how == "dup":
        row.insert(j, a)
    elif how == "replica":
        row[i] = a._replace(replica=(a.replica + 1) % len(s.placement))
    elif how == "mb":
        row[i] = a._replace(mb=(a.mb + 1) % s.microbatches)
    elif how == "kind" and a.kind in ("F", "B", "I", "W"):  # an inserted STEP has no compute kind to swap
        row[i] = a._replace(kind={"F": "B", "B": "I", "I": "W", "W": "F"}[a.kind])
    elif how == "span":
        row[i] = a._replace(span=a.span + 1)
    elif how == "move":  # to another device's list
        del row[i]
        s.actions[(d + 1) % s.devices].insert(j % (len(s.actions[(d + 1) % s.devices]) + 1), a)
    elif how == "step":
        row.insert(j, Action("STEP"))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(BUILT), st.lists(st.tuples(
    st.sampled_from(["swap", "drop", "dup", "replica", "mb", "kind", "span", "move", "step"]),
    st.integers(0, 15), st.integers(0, 200), st.integers(0, 200)), min_size=1, max_size=2))
def test_quick_acceptance_implies_the_rules(case, mutations):
    name, d, n, kw = case
    s = copy(build(name, d, n, **kw))
    for how, dev, i, j in mutations:
        mutate(s, how, dev % s.devices, i, j)
    quick, rules = _passes(s), by_rules_ok(s)
    if quick:
        assert rules, "quick acceptance of a schedule the rules reject"
    elif rules:  # the quick check leaves only schedules with actions other than F/B/I/W to the rules
        assert any(a.kind not in "FBIW" for row in s.actions for a in row)
    if not rules:
        with pytest.raises(ScheduleError):
            validate(s)


def test_messages_name_the_rule():
    s = copy(build("1f1b", 2, 2))
    s.actions[0].append(Action("F", 0, 1))
    with pytest.raises(ScheduleError, match=r"micro-batch 1, stage 0, replica 0: 2 forwards"):
        validate(s)

    s = copy(build("1f1b", 2, 2))
    row = s.actions[1]  # 1F0 1B0 1F1 1B1: a backward before its own forward
    row[0], row[1] = row[1], row[0]
    with pytest.raises(ScheduleError, match=r"device 1: 1B0 at #0 needs 1F0, which comes later \(#1\)"):
        validate(s)

    s = copy(build("gpipe", 2, 2))
    s.actions[1] = [Action("F", 1, 1), Action("B", 1, 1), Action("F", 1, 0), Action("B", 1, 0)]
    s.actions[0] = [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)]
    with pytest.raises(ScheduleError, match=r"deadlock: device 0 is stuck at action #\d+ .*waiting for"):
        validate(s)

    s = copy(build("chimera", 4, 4))
    a = s.actions[0][0]
    s.actions[0][0] = a._replace(mb=next(m for m, r in enumerate(s.mb_replica) if r != a.replica))
    with pytest.raises(ScheduleError, match=r"belongs to replica"):
        validate(s)

    s = copy(build("chimera", 4, 8, concat="forward-doubling"))
    d, i = next((d, i) for d, row in enumerate(s.actions) for i, a in enumerate(row)
                if a.kind == "F" and a.span == 2 and a.stage == 1)
    a = s.actions[d][i]
    s.actions[d][i:i + 1] = [a._replace(span=1), a._replace(mb=a.mb + 1, span=1)]
    with pytest.raises(ScheduleError, match=r"does not match the forwards of stage 0"):
        validate(s)


@pytest.mark.parametrize("name,d,n,kw", BUILT)
def test_lowered_schedules(name, d, n, kw):
    from planner.schedules import lower

    low = lower(build(name, d, n, **kw), eager="all")
    validate(low)  # its lowering: checked on the compute-only form
    row = low.actions[0]
    i = next((i for i, a in enumerate(row) if a.kind in ("SEND_F", "SEND_B")), None)
    if i is None:
        return
    del row[i]  # a message never sent: only the rule-by-rule checks see it
    with pytest.raises(ScheduleError, match="sends and"):
        validate(low)
