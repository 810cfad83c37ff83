"""The IR's text and JSON forms, lowering and the validator's error messages."""

from __future__ import annotations

import pytest

from planner.schedules import build, lower, parameters
from planner.schedules.ir import Action, Schedule, parse_action
from planner.schedules.validate import validate
from planner.simulate import ScheduleError


@pytest.mark.parametrize("text", ["0F1", "3B0", "2I3", "2W3", "r1:0F2", "1F2-3", "4ALLREDUCE",
                                  "r3:4ALLREDUCE", "STEP", "2SEND_F5", "1RECV_B0"])
def test_action_text_round_trip(text):
    assert str(parse_action(text)) == text


@pytest.mark.parametrize("bad", ["", "F1", "0X1", "0F", "STEP1", "1F3-2", "r:0F1"])
def test_parse_action_rejects(bad):
    with pytest.raises(ValueError, match="cannot parse action"):
        parse_action(bad)


def test_torch_style_strings():
    # torch.distributed.pipelining writes stage, kind, micro-batch: "0F1"
    a = parse_action("0F1")
    assert (a.stage, a.kind, a.mb) == (0, "F", 1)


@pytest.mark.parametrize("name,kw", [("chimera", {"concat": "forward-doubling"}), ("hanayo", {"waves": 2}),
                                     ("1f1b", {}), ("gpipe", {})])
def test_json_round_trip(name, kw):
    s = build(name, 4, 16, **kw)
    for sched in (s, lower(s, eager="all")):
        back = Schedule.from_json(sched.to_json())
        assert back.actions == sched.actions
        assert back.placement == sched.placement and back.mb_replica == sched.mb_replica
        assert back.lowered == sched.lowered
        validate(back)


def test_from_dict_names_missing_field():
    d = build("1f1b", 2, 2).to_dict()
    del d["placement"]
    with pytest.raises(ValueError, match="placement"):
        Schedule.from_dict(d)


def test_lower_adds_matching_messages():
    s = lower(build("1f1b", 3, 2))
    sends = [a for row in s.actions for a in row if a.kind.startswith("SEND")]
    recvs = [a for row in s.actions for a in row if a.kind.startswith("RECV")]
    assert len(sends) == len(recvs) == 2 * 2 * 2  # 2 boundaries x 2 micro-batches x (act + grad)
    for row in s.actions:
        assert row[-1].kind == "STEP"
        assert sum(a.kind == "ALLREDUCE" for a in row) == 1


def test_lower_twice_rejected():
    with pytest.raises(ValueError, match="already lowered"):
        lower(lower(build("1f1b", 2, 2)))


def test_build_rejects_unknown():
    with pytest.raises(ValueError, match="unknown schedule"):
        build("nope", 2, 2)
    with pytest.raises(ValueError, match="does not take 'waves'"):
        build("1f1b", 2, 2, waves=2)
    with pytest.raises(ValueError, match="devices must be a positive integer"):
        build("1f1b", 0, 2)
    with pytest.raises(ValueError, match="even number of devices"):
        build("chimera", 3, 2)
    with pytest.raises(ValueError, match="must divide devices/2"):
        build("chimera", 8, 8, pipelines=3)
    assert "waves" in parameters("hanayo")


def _broken(mutator):
    s = build("1f1b", 3, 3)
    mutator(s)
    with pytest.raises(ScheduleError) as e:
        validate(s)
    return str(e.value)


def test_validator_missing_backward():
    msg = _broken(lambda s: s.actions[2].pop())
    assert "micro-batch 2, stage 2" in msg and "need one B" in msg


def test_validator_duplicate_forward():
    msg = _broken(lambda s: s.actions[0].insert(0, Action("F", 0, 0)))
    assert "2 forwards" in msg


def test_validator_wrong_device():
    def move(s):
        s.actions[1].append(s.actions[0].pop())
    assert "is placed on device 0, not 1" in _broken(move)


def test_validator_same_device_order():
    def swap(s):  # backward before its forward on device 2
        row = s.actions[2]
        i = next(i for i, a in enumerate(row) if a == Action("F", 2, 0))
        j = next(i for i, a in enumerate(row) if a == Action("B", 2, 0))
        row[i], row[j] = row[j], row[i]
    msg = _broken(swap)
    assert "device 2" in msg and "comes later" in msg


def test_validator_cross_device_deadlock():
    def cross(s):  # device 1 wants micro-batch 2's forward before 0's, device 0 blocks on 0's gradient
        s.actions[0] = [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("F", 0, 2),
                        Action("B", 0, 1), Action("B", 0, 2)]
        s.actions[1] = [Action("F", 1, 2), Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0),
                        Action("B", 1, 1), Action("B", 1, 2)]
    msg = _broken(cross)
    assert "deadlock" in msg and "device 0 is stuck" in msg


def test_validator_lowered_message_mismatch():
    s = lower(build("1f1b", 2, 2))
    s.actions[1] = [a for a in s.actions[1] if not (a.kind == "RECV_F" and a.mb == 1)]
    with pytest.raises(ScheduleError):
        validate(s)


def test_validator_peer_mismatch():
    s = lower(build("1f1b", 3, 1))
    row = s.actions[0]
    i = next(i for i, a in enumerate(row) if a.kind == "SEND_F")
    row[i] = row[i]._replace(peer=2)
    with pytest.raises(ScheduleError, match="peer is device 2"):
        validate(s)
