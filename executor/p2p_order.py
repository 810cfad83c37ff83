"""When each rank posts its point-to-point operations (the *posting policy*), and a pure-Python check that a
policy cannot deadlock under NCCL's semantics. No torch here, so a plan is checked before anything is launched.

Policies (what :class:`executor.comm.P2P` posts, as ``batch_isend_irecv`` groups, and where):

* ``prefetch`` (gloo default; Hanayo section 4.2): every receive of the iteration in one group before the first
  action, in the order each peer sends (:func:`receive_order`); every send in a group of its own at its
  ``SEND_*`` action. Fine on gloo, whose operations progress independently; a deadlock on NCCL (see below:
  the checker finds one for every schedule of every builder with two or more devices).
* ``grouped`` (NCCL default): each run of consecutive ``SEND_*``/``RECV_*`` actions of a rank's lowered list
  (compute ends a run, an all-reduce post does not) is posted as *one* group when the rank reaches the run --
  as ``torch.distributed.pipelining`` batches a step's send with the next receive. Cut naively, such runs
  still deadlock under NCCL for interleaved, Chimera and Hanayo lists (the checker below finds e.g.
  interleaved D=2 N=4 v=2: each rank sends a gradient and only in a later run receives the other's -- the
  A/B pattern of :mod:`executor.comm` across runs). So the cut follows one global order of the iteration's
  messages (:func:`message_order`, causal): a rank's sends and receives are sorted by it, and the group of a
  run is the shortest next slice of that sequence holding the run's own operations; receives that come
  earlier in the order than those are posted early with it (never a send: its producer has not run yet).
  Every rank's groups then follow the same order, which excludes a deadlock: the earliest message not yet
  delivered has both its groups posted and started (everything before them, on either rank, is earlier
  and delivered), so it is delivered. Per direction both sides post in that order, so messages pair right.
* ``ungrouped``: every send and receive in a group of its own at its list position (the naive policy; kept
  for the checker and its tests).

A receive is waited for at its ``RECV_*`` action (just before its consumer), sends at ``STEP``.

**NCCL semantics** (:func:`check_programs`). NCCL ignores tags and matches the k-th send from ``a`` to ``b``
with the k-th receive on ``b`` from ``a``. A rank's groups are queued in posting order on FIFO streams: with
``streams="pair"`` one stream per pair of ranks (a group can start when it is at the head of every stream it
uses), with ``streams="rank"`` one stream per rank (what torch does with NCCL: every batched group of the
default process group runs on that group's single communicator stream, one group after the other). A started
group completes only when every operation in it is matched by the peer's operation, which must itself be
posted and belong to a started group; a ``RECV`` wait (and everything the rank does after it) blocks until
the group holding the receive has completed, and ``STEP`` until every group has. The example of
:mod:`executor.comm` -- A posts ``[send to B]`` then ``[recv from B]`` while B posts ``[send to A]`` then
``[recv from A]`` -- never completes: each send waits for a receive queued behind the peer's own send. The
model is conservative (NCCL may complete a small send into the peer's buffer early), so a policy it passes
does not deadlock for these reasons; one it fails may still happen to run.

Collectives (the stage all-reduces) use their own communicators and are waited for only at ``STEP``, after
every point-to-point operation; they are not modelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from planner.schedules.ir import (
    ALLREDUCE,
    COMPUTE_KINDS,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    STEP,
    Action,
    Schedule,
)

POLICIES = ("prefetch", "grouped", "ungrouped")
STREAMS = ("pair", "rank")
_SENDS = (SEND_F, SEND_B)
_RECVS = (RECV_F, RECV_B)


def default_policy(backend: str) -> str:
    """``grouped`` for NCCL (the only policy of the three that is deadlock-free there), ``prefetch`` else."""
    return "grouped" if backend == "nccl" else "prefetch"


def message_key(a: Action) -> tuple[str, int, int, int]:
    """The message a send or receive moves: (SEND kind, replica, producing stage, first mb)."""
    if a.kind in _SENDS:
        return a.kind, a.replica, a.stage, a.mb
    if a.kind == RECV_F:
        return SEND_F, a.replica, a.stage - 1, a.mb
    return SEND_B, a.replica, a.stage + 1, a.mb


def action_label(a: Action) -> str:
    """``2SEND_F3>1`` / ``3RECV_F3<2``: the action with its peer (as :meth:`Schedule.to_text` writes it)."""
    if a.kind in _SENDS:
        return f"{a}>{a.peer}"
    if a.kind in _RECVS:
        return f"{a}<{a.peer}"
    return str(a)


def _send_positions(schedule: Schedule, peer: int) -> dict[tuple[str, int, int, int], int]:
    return {message_key(a): i for i, a in enumerate(schedule.actions[peer]) if a.kind in _SENDS}


def receive_order(schedule: Schedule, device: int) -> list[Action]:
    """``device``'s receives ordered per peer as the peer's list sends them (peers in device order)."""
    by_peer: dict[int, list[Action]] = {}
    for a in schedule.actions[device]:
        if a.kind in _RECVS:
            by_peer.setdefault(a.peer, []).append(a)
    out: list[Action] = []
    for peer in sorted(by_peer):
        pos = _send_positions(schedule, peer)
        out += sorted(by_peer[peer], key=lambda a: pos[message_key(a)])
    return out


@dataclass(frozen=True)
class Group:
    """One ``batch_isend_irecv`` call: ``ops`` posted together just before action ``at`` of the list runs."""

    at: int
    ops: tuple[Action, ...]


def posting_plan(schedule: Schedule, device: int, policy: str,
                 order: dict[tuple[str, int, int, int], int] | None = None) -> list[Group]:
    """The groups ``device`` posts in one iteration under ``policy``, in posting order (module docstring);
    ``order`` is :func:`message_order` of the schedule when the caller has it already."""
    if policy not in POLICIES:
        raise ValueError(f"unknown p2p policy {policy!r}; known: {', '.join(POLICIES)}")
    if not schedule.lowered:
        raise ValueError("posting_plan needs a lowered schedule (planner.schedules.ir.lower)")
    acts = schedule.actions[device]
    p2p = [i for i, a in enumerate(acts) if a.kind in _SENDS or a.kind in _RECVS]
    if policy == "ungrouped":
        return [Group(i, (acts[i],)) for i in p2p]
    if policy == "prefetch":
        recvs = tuple(receive_order(schedule, device))
        head = [Group(0, recvs)] if recvs else []
        return head + [Group(i, (acts[i],)) for i in p2p if acts[i].kind in _SENDS]
    # grouped: one group per run of consecutive sends/receives, cut from the rank's ops in message order
    order = order if order is not None else message_order(schedule)
    mine = sorted((a for a in acts if a.kind in _SENDS or a.kind in _RECVS), key=lambda a: order[message_key(a)])
    rank_of = {a: k for k, a in enumerate(mine)}
    groups: list[Group] = []
    taken = 0  # ops of ``mine`` posted so far (always a prefix)
    i = 0
    while i < len(acts):
        if not _in_run(acts[i]):
            i += 1
            continue
        start, last = i, -1
        while i < len(acts) and _in_run(acts[i]):
            if acts[i].kind in _SENDS or acts[i].kind in _RECVS:
                last = max(last, rank_of[acts[i]])
            i += 1
        if last >= taken:
            groups.append(Group(start, tuple(mine[taken:last + 1])))
            taken = last + 1
    return groups


def _in_run(a: Action) -> bool:
    """Part of a run of point-to-point actions: sends, receives and the (asynchronous) all-reduce posts."""
    return a.kind in _SENDS or a.kind in _RECVS or a.kind == ALLREDUCE


def message_order(schedule: Schedule) -> dict[tuple[str, int, int, int], int]:
    """A total order of the iteration's messages (``message_key -> position``) that respects causality: a
    message comes after every message its sender received before producing it. The lists are run without
    timing, in rounds: each round every device (in device order) runs at most one compute action, once its
    receives have arrived, and a message is numbered when its send is reached. (Letting each device run as
    far as it can per round is as valid but makes larger groups.) Raises ValueError when the lists wait on
    each other."""
    acts = schedule.actions
    pos = [0] * len(acts)
    order: dict[tuple[str, int, int, int], int] = {}
    progress = True
    while progress:
        progress = False
        for d, row in enumerate(acts):
            computed = False
            while pos[d] < len(row):
                a = row[pos[d]]
                if a.kind in _RECVS and message_key(a) not in order:
                    break
                if a.kind in COMPUTE_KINDS:
                    if computed:
                        break
                    computed = True
                if a.kind in _SENDS:
                    order[message_key(a)] = len(order)
                pos[d] += 1
                progress = True
    stuck = [d for d, row in enumerate(acts) if pos[d] < len(row)]
    if stuck:
        raise ValueError("the lists wait on each other: device(s) " + ", ".join(
            f"{d} at {action_label(acts[d][pos[d]])}" for d in stuck))
    return order


# ---- the checker ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One send or receive: ``key`` names the message (equal on both sides), ``label`` is for reports."""

    send: bool
    peer: int
    key: Hashable
    label: str


@dataclass(frozen=True)
class Post:
    """Post ``ops`` as one group (the rank's next group number)."""

    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Wait:
    """Block until the rank's group number ``group`` has completed (a receive is consumed next)."""

    group: int
    label: str


@dataclass(frozen=True)
class Finish:
    """Block until every group the rank posted has completed (``STEP``)."""

    label: str = "STEP"


ProgramOp = Post | Wait | Finish


@dataclass
class Blocked:
    """A rank that cannot go on: stuck at ``step``, because ``op`` (in its group number ``group``) waits for
    rank ``waits_for`` (``reason`` says how)."""

    rank: int
    step: str
    group: int
    op: str
    waits_for: int
    reason: str

    def __str__(self) -> str:
        return f"rank {self.rank} stuck at {self.step}: its op {self.op} (group #{self.group}) {self.reason}"


@dataclass
class Problem:
    """Why a policy fails: ``kind`` is ``deadlock``, ``mismatch`` (messages paired out of order) or
    ``unmatched`` (a send or receive without its counterpart); ``ranks`` are those involved."""

    kind: str
    ranks: list[int]
    message: str
    blocked: list[Blocked] = field(default_factory=list)
    cycle: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


def _pair_ops(programs: Sequence[Sequence[ProgramOp]]) -> tuple[dict[tuple[int, int, int], tuple[int, int, int]],
                                                           Problem | None]:
    """Partner of every op, ``(rank, group, index) -> (rank, group, index)``: the k-th send from a to b with the
    k-th receive on b from a. A problem when the keys or the counts disagree."""
    sends: dict[tuple[int, int], list[tuple[int, int, int, Op]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int, int, Op]]] = {}
    for r, prog in enumerate(programs):
        g = 0
        for step in prog:
            if isinstance(step, Post):
                for j, op in enumerate(step.ops):
                    if not 0 <= op.peer < len(programs) or op.peer == r:
                        return {}, Problem("unmatched", [r], f"rank {r}: {op.label} names no other rank")
                    direction = (r, op.peer) if op.send else (op.peer, r)
                    (sends if op.send else recvs).setdefault(direction, []).append((r, g, j, op))
                g += 1
    partner: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for direction in sorted(set(sends) | set(recvs)):
        ss, rr = sends.get(direction, []), recvs.get(direction, [])
        a, b = direction
        for k, (s, r) in enumerate(zip(ss, rr, strict=False)):
            if s[3].key != r[3].key:
                return {}, Problem("mismatch", [a, b], f"messages from rank {a} to rank {b} pair out of order: "
                                   f"send #{k} is {s[3].label} but receive #{k} is {r[3].label} (NCCL matches "
                                   f"by order, not by tag)")
            partner[s[:3]] = r[:3]
            partner[r[:3]] = s[:3]
        if len(ss) != len(rr):
            extra = ss[len(rr)][3].label if len(ss) > len(rr) else rr[len(ss)][3].label
            return {}, Problem("unmatched", [a, b], f"rank {a} sends {len(ss)} message(s) to rank {b}, which "
                               f"receives {len(rr)}: {extra} has no counterpart")
    return partner, None


def check_programs(programs: Sequence[Sequence[ProgramOp]], streams: str = "pair") -> Problem | None:
    """Run ``programs`` (one per rank) under the NCCL semantics of the module docstring; None when every rank
    reaches its end, else the :class:`Problem` (for a deadlock: every blocked rank and a cycle of ranks
    waiting for each other)."""
    if streams not in STREAMS:
        raise ValueError(f"streams must be one of {', '.join(STREAMS)}, got {streams!r}")
    partner, problem = _pair_ops(programs)
    if problem is not None:
        return problem
    n = len(programs)
    ops: list[list[tuple[Op, ...]]] = [[s.ops for s in prog if isinstance(s, Post)] for prog in programs]
    left = [[len(g) for g in rank_ops] for rank_ops in ops]  # ops of each group not completed yet
    done_op: set[tuple[int, int, int]] = set()
    started = [[False] * len(g) for g in ops]
    posted = [0] * n
    pc = [0] * n
    completed = [0] * n  # groups completed, per rank
    # per rank: stream name -> queue of its incomplete posted groups in posting order
    queues: list[dict[int, deque[int]]] = [{} for _ in range(n)]

    def streams_of(r: int, g: int) -> set[int]:
        return {-1} if streams == "rank" else {op.peer for op in ops[r][g]}

    to_start: list[tuple[int, int]] = []
    to_advance: deque[int] = deque(range(n))

    def complete(r: int, g: int, j: int) -> None:
        done_op.add((r, g, j))
        left[r][g] -= 1
        if left[r][g] == 0:
            completed[r] += 1
            for s in streams_of(r, g):
                q = queues[r][s]
                assert q[0] == g
                q.popleft()
                if q:
                    to_start.append((r, q[0]))
            to_advance.append(r)

    while to_advance or to_start:
        while to_advance:
            r = to_advance.popleft()
            prog = programs[r]
            while pc[r] < len(prog):
                step = prog[pc[r]]
                if isinstance(step, Post):
                    g = posted[r]
                    posted[r] += 1
                    if not step.ops:  # nothing to match: complete at once, occupies no stream
                        completed[r] += 1
                    else:
                        for s in streams_of(r, g):
                            queues[r].setdefault(s, deque()).append(g)
                        to_start.append((r, g))
                elif isinstance(step, Wait):
                    if step.group >= posted[r] or left[r][step.group]:
                        break
                elif completed[r] < posted[r]:
                    break
                pc[r] += 1
        while to_start:
            r, g = to_start.pop()
            if started[r][g] or left[r][g] == 0 or any(queues[r][s][0] != g for s in streams_of(r, g)):
                continue
            started[r][g] = True
            for j in range(len(ops[r][g])):
                p, pg, pj = partner[(r, g, j)]
                if (r, g, j) not in done_op and pg < posted[p] and started[p][pg]:
                    complete(r, g, j)
                    complete(p, pg, pj)
    if all(pc[r] == len(programs[r]) for r in range(n)):
        return None
    return _deadlock(programs, ops, partner, done_op, started, posted, pc, queues, streams_of)


def _deadlock(programs: Sequence[Sequence[ProgramOp]], ops: list[list[tuple[Op, ...]]],
              partner: dict[tuple[int, int, int], tuple[int, int, int]], done_op: set[tuple[int, int, int]],
              started: list[list[bool]], posted: list[int], pc: list[int], queues: list[dict[int, deque[int]]],
              streams_of: object) -> Problem:
    """The report of a run that stopped short: what every blocked rank waits for, and a cycle of ranks."""
    assert callable(streams_of)
    blocked: dict[int, Blocked] = {}
    for r, prog in enumerate(programs):
        if pc[r] == len(prog):
            continue
        step = prog[pc[r]]
        if isinstance(step, Wait):
            g = step.group
        else:  # Finish: the earliest incomplete group
            g = min(q[0] for q in queues[r].values() if q)
        while not started[r][g]:  # queued behind an earlier group of this rank: that one blocks
            g = min(queues[r][s][0] for s in streams_of(r, g))
        j = next(j for j in range(len(ops[r][g])) if (r, g, j) not in done_op)
        p, pg, pj = partner[(r, g, j)]
        theirs = ops[p][pg][pj].label
        if pg >= posted[p]:
            reason = f"waits for rank {p} to post {theirs} (not posted yet)"
        else:
            reason = f"waits for rank {p}'s {theirs} (its group #{pg}), queued behind rank {p}'s unfinished groups"
        label = step.label
        blocked[r] = Blocked(r, label, g, ops[r][g][j].label, p, reason)
    first = min(blocked)
    seen: list[int] = []
    r = first
    while r not in seen:
        seen.append(r)
        r = blocked[r].waits_for
    cycle = seen[seen.index(r):]
    lines = [str(blocked[c]) for c in cycle]
    msg = (f"deadlock under NCCL semantics: ranks {', '.join(map(str, cycle))} wait for each other in a cycle "
           f"(blocked: ranks {', '.join(map(str, sorted(blocked)))})\n  " + "\n  ".join(lines))
    return Problem("deadlock", sorted(blocked), msg, [blocked[k] for k in sorted(blocked)], cycle)


def programs(schedule: Schedule, policy: str) -> list[list[ProgramOp]]:
    """Every device's iteration under ``policy`` as checker steps (the walk of :class:`executor.comm.P2P`)."""
    out: list[list[ProgramOp]] = []
    order = message_order(schedule) if policy == "grouped" else None
    for d, acts in enumerate(schedule.actions):
        plan = posting_plan(schedule, d, policy, order)
        by_at: dict[int, list[int]] = {}
        group_of: dict[Action, int] = {}
        for g, grp in enumerate(plan):
            by_at.setdefault(grp.at, []).append(g)
            for a in grp.ops:
                group_of[a] = g
        prog: list[ProgramOp] = []
        for i, a in enumerate(acts):
            for g in by_at.get(i, ()):
                prog.append(Post(tuple(Op(o.kind in _SENDS, o.peer, message_key(o), action_label(o))
                                       for o in plan[g].ops)))
            if a.kind in _RECVS:
                prog.append(Wait(group_of[a], action_label(a)))
            elif a.kind == STEP:
                prog.append(Finish())
        if not prog or not isinstance(prog[-1], Finish):
            prog.append(Finish("end of list"))
        out.append(prog)
    return out


def check_schedule(schedule: Schedule, policy: str, streams: str = "rank") -> Problem | None:
    """:func:`check_programs` on the lowered ``schedule`` posted under ``policy`` (ranks are the devices of one
    pipeline copy: data-parallel copies and tensor ranks exchange nothing point-to-point between them)."""
    return check_programs(programs(schedule, policy), streams)
