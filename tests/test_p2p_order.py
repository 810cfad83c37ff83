"""Posting policies and the NCCL-semantics deadlock checker (pure Python, no processes): the checker flags the
textbook send-then-receive deadlock and the prefetch policy, and passes the grouped policy for every builder
over many (D, N, v, f, waves) -- in both stream models; ``pipeplan run --backend nccl`` refuses a deadlocking
policy before launching anything."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from executor.p2p_order import (
    Finish,
    Op,
    Post,
    ProgramOp,
    Wait,
    action_label,
    check_programs,
    check_schedule,
    message_key,
    message_order,
    posting_plan,
    receive_order,
)
from pipeplan.cli import app
from planner.schedules import BUILDERS, build, lower
from planner.schedules.ir import COMPUTE_KINDS, RECV_B, RECV_F, SEND_B, SEND_F, Schedule

P2P_KINDS = (SEND_F, SEND_B, RECV_F, RECV_B)


def send(peer: int, key: str) -> Op:
    return Op(True, peer, key, f"send {key}>{peer}")


def recv(peer: int, key: str) -> Op:
    return Op(False, peer, key, f"recv {key}<{peer}")


# ---- the A/B example -------------------------------------------------------------------------------------

def test_send_then_receive_deadlocks_ungrouped() -> None:
    """A posts [send s1 to B] then [recv r1 from B]; B posts [send r1 to A] then [recv s1 from A]."""
    a: list[ProgramOp] = [Post((send(1, "s1"),)), Post((recv(1, "r1"),)), Wait(1, "consume r1"), Finish()]
    b: list[ProgramOp] = [Post((send(0, "r1"),)), Post((recv(0, "s1"),)), Wait(1, "consume s1"), Finish()]
    for streams in ("pair", "rank"):
        problem = check_programs([a, b], streams)
        assert problem is not None and problem.kind == "deadlock"
        assert problem.ranks == [0, 1] and sorted(problem.cycle) == [0, 1]
        first = problem.blocked[0]
        assert (first.rank, first.step, first.op, first.waits_for) == (0, "consume r1", "send s1>1", 1)
        assert "rank 0 stuck at consume r1: its op send s1>1" in problem.message


def test_send_grouped_with_adjacent_receive_completes() -> None:
    a: list[ProgramOp] = [Post((send(1, "s1"), recv(1, "r1"))), Wait(0, "consume r1"), Finish()]
    b: list[ProgramOp] = [Post((send(0, "r1"), recv(0, "s1"))), Wait(0, "consume s1"), Finish()]
    assert check_programs([a, b], "pair") is None
    assert check_programs([a, b], "rank") is None


def test_out_of_order_receives_are_a_mismatch() -> None:
    """NCCL ignores tags: the second receive would get the first message."""
    a: list[ProgramOp] = [Post((send(1, "m1"), send(1, "m2"))), Finish()]
    b: list[ProgramOp] = [Post((recv(0, "m2"), recv(0, "m1"))), Finish()]
    problem = check_programs([a, b])
    assert problem is not None and problem.kind == "mismatch" and problem.ranks == [0, 1]
    lonely: list[ProgramOp] = [Post((send(1, "m1"),)), Finish()]
    problem = check_programs([lonely, [Finish()]])
    assert problem is not None and problem.kind == "unmatched" and "send m1>1 has no counterpart" in problem.message


def test_one_stream_per_rank_is_stricter_than_per_pair() -> None:
    """Rank 0's receive of y queues behind its send of x on a rank's single stream (what torch's batched NCCL
    p2p does), but rank 1 posts the receive of x only after a chain that needs y: 0 -> 1 -> 2 -> 0."""
    r0: list[ProgramOp] = [Post((send(1, "x"),)), Post((recv(2, "y"),)), Wait(1, "y"), Post((send(2, "w"),)), Finish()]
    r1: list[ProgramOp] = [Post((recv(2, "v"),)), Wait(0, "v"), Post((recv(0, "x"),)), Wait(1, "x"), Finish()]
    r2: list[ProgramOp] = [Post((send(0, "y"),)), Post((recv(0, "w"),)), Wait(1, "w"), Post((send(1, "v"),)), Finish()]
    assert check_programs([r0, r1, r2], "pair") is None
    problem = check_programs([r0, r1, r2], "rank")
    assert problem is not None and problem.kind == "deadlock" and problem.cycle == [0, 1, 2]
    assert [b.op for b in problem.blocked] == ["send x>1", "recv v<2", "send y>0"]


# ---- the policies on real schedules ----------------------------------------------------------------------

def _naive_runs(schedule: Schedule) -> list[list[ProgramOp]]:
    """Each run of consecutive sends/receives as one group in list order (grouped without the message-order
    cut): what the checker showed deadlocking, kept here as the reason for the cut."""
    out: list[list[ProgramOp]] = []
    for row in schedule.actions:
        prog: list[ProgramOp] = []
        g, i = 0, 0
        while i < len(row):
            if row[i].kind not in P2P_KINDS:
                i += 1
                continue
            run = []
            while i < len(row) and row[i].kind in P2P_KINDS:
                run.append(row[i])
                i += 1
            prog.append(Post(tuple(Op(a.kind in (SEND_F, SEND_B), a.peer, message_key(a), action_label(a))
                                   for a in run)))
            prog += [Wait(g, action_label(a)) for a in run if a.kind in (RECV_F, RECV_B)]
            g += 1
        out.append([*prog, Finish()])
    return out


def test_naive_run_grouping_deadlocks_interleaved() -> None:
    sched = lower(build("interleaved", 2, 4, chunks=2))
    problem = check_programs(_naive_runs(sched), "pair")
    assert problem is not None and problem.kind == "deadlock" and problem.ranks == [0, 1]
    assert check_schedule(sched, "grouped", "pair") is None


@pytest.mark.parametrize("name,kw", [("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}), ("chimera", {}),
                                     ("hanayo", {"waves": 2}), ("zb-h1", {}), ("gems", {}), ("pipedream", {}),
                                     ("pipedream-2bw", {})])
def test_prefetch_deadlocks_on_nccl(name: str, kw: dict[str, Any]) -> None:
    """Every receive in one group ahead of the sends: each rank's first send queues behind its receives."""
    sched = lower(build(name, 4, 4, **kw))
    for streams in ("pair", "rank"):
        problem = check_schedule(sched, "prefetch", streams)
        assert problem is not None and problem.kind == "deadlock", (name, streams)
        assert len(problem.cycle) >= 2 and set(problem.cycle) <= set(problem.ranks)
    assert check_schedule(sched, "grouped") is None


def _plan_is_well_formed(sched: Schedule, device: int, policy: str, send_order: bool = True) -> None:
    """Every send/receive posted exactly once; a send after its producer (no compute between the posting
    point and the send), a receive at or before its RECV action; per peer, receives in the peer's send order
    (``send_order``: not so with ``ungrouped``, which posts them in list order)."""
    row = sched.actions[device]
    where = {a: i for i, a in enumerate(row)}
    plan = posting_plan(sched, device, policy)
    posted = [a for g in plan for a in g.ops]
    assert sorted(map(str, posted)) == sorted(str(a) for a in row if a.kind in P2P_KINDS)
    assert len(set(posted)) == len(posted)
    for g in plan:
        for a in g.ops:
            assert g.at <= where[a]
            if a.kind in (SEND_F, SEND_B):
                assert not any(row[j].kind in COMPUTE_KINDS for j in range(g.at, where[a]))
    if not send_order:
        return
    recvs = [a for a in posted if a.kind in (RECV_F, RECV_B)]
    by_peer = {p: [a for a in recvs if a.peer == p] for p in {a.peer for a in recvs}}
    assert [a for p in sorted(by_peer) for a in by_peer[p]] == receive_order(sched, device)


@st.composite
def schedules(draw: st.DrawFn, name: str) -> Schedule:
    """A schedule of builder ``name`` with drawn parameters (ranges as in tests/test_schedule_properties*)."""
    if name == "chimera":
        half = draw(st.integers(1, 4))
        f = draw(st.sampled_from([x for x in range(1, half + 1) if half % x == 0]))
        concat = draw(st.sampled_from(["direct", "forward-doubling", "backward-halving"]))
        return build(name, 2 * half, draw(st.integers(1, 16)), pipelines=f, concat=concat)
    D = draw(st.integers(1, 8))
    if name == "interleaved":
        v = draw(st.integers(1, 3))
        return build(name, D, D * draw(st.integers(1, max(1, 16 // D))), chunks=v)
    if name == "hanayo":
        return build(name, D, draw(st.integers(1, 12)), waves=draw(st.integers(1, 3)))
    if name == "pipedream-2bw":
        return build(name, D, draw(st.integers(D, 16)))
    return build(name, D, draw(st.integers(1, 16)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_grouped_never_deadlocks(name: str, data: st.DataObject) -> None:
    s = data.draw(schedules(name))
    for eager in ("none", "all"):
        sched = lower(s, eager=eager)
        order = message_order(sched)
        assert sorted(order.values()) == list(range(len(order)))
        for d in range(sched.devices):
            _plan_is_well_formed(sched, d, "grouped")
        for streams in ("pair", "rank"):
            problem = check_schedule(sched, "grouped", streams)
            assert problem is None, f"{name} {sched.params} eager={eager} streams={streams}: {problem}"


def test_prefetch_plan_is_well_formed() -> None:
    sched = lower(build("chimera", 4, 8))
    for d in range(4):
        _plan_is_well_formed(sched, d, "prefetch")
        _plan_is_well_formed(sched, d, "ungrouped", send_order=False)
    with pytest.raises(ValueError, match="unknown p2p policy"):
        posting_plan(sched, 0, "eager")
    with pytest.raises(ValueError, match="lowered"):
        posting_plan(build("1f1b", 2, 2), 0, "grouped")


def test_pair_warm_up_order_is_deadlock_free() -> None:
    """executor.comm.warm_up_pairs: every rank takes the pairs in one global order, one group per pair."""
    pairs = sorted({(min(a, b), max(a, b)) for a, b in [(0, 1), (1, 2), (2, 3), (0, 3), (1, 3), (0, 2)]})
    programs: list[list[ProgramOp]] = []
    for r in range(4):
        prog: list[ProgramOp] = []
        for a, b in pairs:
            if r in (a, b):
                peer = b if r == a else a
                prog.append(Post((send(peer, f"{r}>{peer}"), recv(peer, f"{peer}>{r}"))))
                prog.append(Wait(len([s for s in prog if isinstance(s, Post)]) - 1, f"pair {a}-{b}"))
        programs.append([*prog, Finish()])
    assert check_programs(programs, "rank") is None


# ---- pipeplan run --backend nccl refuses before launching ------------------------------------------------

def test_cli_refuses_nccl_deadlock_before_launch() -> None:
    res = CliRunner().invoke(app, ["run", "-s", "1f1b", "-D", "2", "-N", "4", "--backend", "nccl",
                                   "--p2p", "prefetch"])
    assert res.exit_code == 2, res.output
    assert "p2p policy 'prefetch' would deadlock on NCCL" in res.output
    assert "ranks 0, 1 wait for each other" in res.output and "rank 0 stuck at" in res.output


def test_cli_rejects_unknown_policy() -> None:
    res = CliRunner().invoke(app, ["run", "-s", "1f1b", "-D", "2", "-N", "4", "--p2p", "eager"])
    assert res.exit_code == 2 and "unknown p2p policy 'eager'" in res.output
