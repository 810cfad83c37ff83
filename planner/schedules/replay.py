"""The replay of explicit lowered lists, action by action (the rules: :mod:`planner.simulate`); with unit
costs, the validator's deadlock check, reporting what each stuck device waits for. Also
:func:`canonical_compute_only`: whether a lowered schedule is exactly :func:`lower` of its compute-only
form (then :mod:`planner.schedules.encoded` times and checks it faster)."""

from __future__ import annotations

from planner.schedules.ir import (
    ALLREDUCE,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    STEP,
    Action,
    B,
    F,
    I,
    Schedule,
    W,
    lower,
)
from planner.schedules.timing import (
    AllReduces,
    Costs,
    DeviceStats,
    ScheduleError,
    SimResult,
    contention_debt,
    memoised_durations,
    plain_number,
)


def canonical_compute_only(schedule: Schedule) -> Schedule | None:
    """The compute-only form of a lowered ``schedule`` when its lists are exactly what :func:`lower`
    makes of that form (with the eager stages its params record), else None."""
    eager = schedule.params.get("eager")
    if isinstance(eager, str) or not isinstance(eager, (list, tuple)):
        return None
    compute = schedule.compute_only()
    try:
        again = lower(compute, eager=eager)
    except (ValueError, TypeError, IndexError, KeyError):  # not a lowering of anything
        return None
    return compute if again.actions == schedule.actions else None



def replay_lowered(schedule: Schedule, costs: Costs) -> SimResult:
    """The replay of explicit lowered lists (see the module docstring)."""
    D = schedule.devices
    acts = schedule.actions
    place = schedule.placement

    dur = memoised_durations()
    share = float(getattr(costs, "comm_share", 0.0))

    # end time of compute results: (kind, replica, stage, mb) -> (end, device, index)
    done: dict[tuple[str, int, int, int], float] = {}
    arrival: dict[tuple[str, int, int, int], float] = {}  # message (SEND kind, r, stage, mb) -> time
    recvd: dict[tuple[int, str, int, int, int], float] = {}  # (device, RECV kind, r, stage, mb) -> time
    t_comp = [0.0] * D
    t_comm = [0.0] * D
    step_at: list[tuple[float, float]] = [(0.0, 0.0)] * D
    comp_end = [0.0] * D
    busy = [0.0] * D
    comm_busy = [0.0] * D
    alive = [0.0] * D
    peak = [0.0] * D
    act_w: dict[int, float] = {}
    held: dict[int, float] = {}  # a split backward's output gradients kept from I to W (the costs' held_grads)
    held_grads = getattr(costs, "held_grads", None)
    ars = AllReduces(place, D, lambda s_, r_, d_: dur((ALLREDUCE, s_, r_), costs.allreduce, s_, r_, d_), comm_busy)
    ar_slots: list[tuple[int, int, list[float]]] = []  # (device, timeline index, [start, end]) to fill in
    pos = [0] * D
    timeline: list[list[tuple[Action, float, float]]] = [[] for _ in range(D)]
    # for the critical path: per (device, index) the binding predecessor (device, index) or None
    cause: dict[tuple[int, int], tuple[int, int] | None] = {}
    where: dict[tuple[str, int, int, int], tuple[int, int]] = {}  # compute/send key -> (device, index)
    last_on: list[tuple[int, int] | None] = [None] * D  # last compute action on each device
    remaining = sum(len(r) for r in acts)
    last_end, last_node = -1.0, None

    while remaining:
        progressed = False
        for d in range(D):
            row = acts[d]
            i = pos[d]
            n = len(row)
            while i < n:
                a = row[i]
                k, s, m, r = a.kind, a.stage, a.mb, a.replica
                if k == F or k == B or k == I or k == W:
                    ready = t_comp[d]
                    binding = last_on[d]
                    ok = True
                    if k == F:
                        if s > 0:
                            if place[r][s - 1] == d:
                                for mm in range(m, m + a.span):
                                    t = done.get((F, r, s - 1, mm))
                                    if t is None:
                                        ok = False
                                        break
                                    if t > ready:
                                        ready, binding = t, where[(F, r, s - 1, mm)]
                            else:
                                t = recvd.get((d, RECV_F, r, s, m))
                                if t is None:
                                    ok = False
                                elif t > ready:
                                    ready, binding = t, where[(SEND_F, r, s - 1, m)]
                    elif k == W:
                        t = done.get((I, r, s, m))
                        if t is None:
                            ok = False
                        elif t > ready:
                            ready, binding = t, where[(I, r, s, m)]
                    else:  # B or I: own forward, then the gradient from stage s+1
                        t = done.get((F, r, s, m))
                        if t is None:
                            ok = False
                        else:
                            if t > ready:
                                ready, binding = t, where[(F, r, s, m)]
                            if s < len(place[r]) - 1:
                                if place[r][s + 1] == d:
                                    t = done.get((B, r, s + 1, m))
                                    key = (B, r, s + 1, m)
                                    if t is None:
                                        key = (I, r, s + 1, m)
                                        t = done.get(key)
                                    if t is None:
                                        ok = False
                                    elif t > ready:
                                        ready, binding = t, where[key]
                                else:
                                    t = recvd.get((d, RECV_B, r, s, m))
                                    if t is None:
                                        ok = False
                                    elif t > ready:
                                        ready, binding = t, where[(SEND_B, r, s + 1, m)]
                    if not ok:
                        break
                    du = dur((k, s, a.span, d), costs.compute, k, s, a.span, d)
                    end = ready + du
                    t_comp[d] = end
                    busy[d] += du
                    for mm in range(m, m + a.span):
                        done[(k, r, s, mm)] = end
                        where[(k, r, s, mm)] = (d, i)
                    if k == F or k == B or k == I or k == W:
                        w = act_w.get(s)
                        if w is None:
                            w = act_w[s] = float(costs.activation(s))
                            held[s] = float(held_grads(s)) if held_grads is not None else 0.0
                        if k == F or k == I:  # a split backward's I keeps the output gradients for its W
                            alive[d] += w * a.span if k == F else held[s]
                            if alive[d] > peak[d]:
                                peak[d] = alive[d]
                        else:  # B, or W: a split backward's activations stay until its W
                            alive[d] -= w if k == B else (w + held[s])
                    cause[(d, i)] = binding
                    last_on[d] = (d, i)
                    if end >= last_end:
                        last_end, last_node = end, (d, i)
                    timeline[d].append((a, ready, end))
                elif k == SEND_F or k == SEND_B:
                    src_kind = F if k == SEND_F else None
                    if src_kind:
                        t = done.get((F, r, s, m))
                        key = (F, r, s, m)
                    else:
                        key = (B, r, s, m)
                        t = done.get(key)
                        if t is None:
                            key = (I, r, s, m)
                            t = done.get(key)
                    if t is None:
                        break
                    start = max(t, t_comm[d])
                    du = dur((k, s, a.span, d, a.peer), costs.p2p, k, s, a.span, d, a.peer)
                    end = start + du
                    t_comm[d] = end
                    comm_busy[d] += du
                    for mm in range(m, m + a.span):
                        arrival[(k, r, s, mm)] = end
                        where[(k, r, s, mm)] = (d, i)
                    cause[(d, i)] = where[key]
                    timeline[d].append((a, start, end))
                elif k == RECV_F or k == RECV_B:
                    src_stage = s - 1 if k == RECV_F else s + 1
                    t = arrival.get((SEND_F if k == RECV_F else SEND_B, r, src_stage, m))
                    if t is None:
                        break
                    recvd[(d, k, r, s, m)] = t
                    timeline[d].append((a, t, t))
                elif k == ALLREDUCE:
                    ar_slots.append((d, len(timeline[d]), ars.post(d, r, s, max(t_comp[d], t_comm[d]))))
                    timeline[d].append((a, 0.0, 0.0))  # filled in once the collective has run
                    if share > 0.0:  # what it takes from the compute after it (contention_debt)
                        rest = sum([dur((b.kind, b.stage, b.span, d), costs.compute, b.kind, b.stage, b.span, d)
                                    for b in row[i + 1:] if b.kind in (F, B, I, W)])
                        t_comp[d] += contention_debt(share, ars.duration(s, r, d), rest)
                elif k == STEP:
                    if ars.open[d]:
                        break
                    start = max(t_comp[d], ars.done_on[d], t_comm[d])
                    du = dur((STEP, d), costs.step, d)
                    comp_end[d] = t_comp[d]
                    step_at[d] = (start, start + du)
                    t_comp[d] = start + du
                    busy[d] += du
                    timeline[d].append((a, start, start + du))
                else:
                    raise ScheduleError(f"device {d} action #{i}: unknown kind {k!r}")
                i += 1
                remaining -= 1
                progressed = True
            pos[d] = i
        if not progressed:
            stuck = [(d, acts[d][pos[d]]) for d in range(D) if pos[d] < len(acts[d])]
            raise ScheduleError("deadlock: " + "; ".join(_waiting_for(schedule, d, a, pos) for d, a in stuck))

    for d, i, (start, end) in ar_slots:
        timeline[d][i] = (timeline[d][i][0], start, end)
    makespan = max(max(t_comp), max(t_comm), max(ars.free)) if D else 0.0
    total_busy = sum(busy)
    stats = [DeviceStats(busy[d], makespan - busy[d], plain_number(peak[d]), comm_busy[d], comp_end[d], step_at[d])
             for d in range(D)]
    bubble = 1.0 - total_busy / (D * makespan) if makespan > 0 else 0.0
    cf, cb = _critical_counts(acts, cause, last_node)
    return SimResult(makespan, bubble, stats, cf, cb, timeline)


def _waiting_for(sched: Schedule, d: int, a: Action, pos: list[int]) -> str:
    """Explain what device ``d``'s next action ``a`` waits for."""
    k, s, m, r = a.kind, a.stage, a.mb, a.replica
    place = sched.placement
    need: str
    if k == F:
        need = f"the forward of stage {s - 1} ({Action(F, s - 1, m, r)})" if s > 0 else "nothing"
        if s > 0 and place[r][s - 1] != d:
            need = f"the message {Action(RECV_F, s, m, r)} from device {place[r][s - 1]}"
    elif k in (B, I):
        need = f"{Action(F, s, m, r)} and the gradient from stage {s + 1}"
    elif k == W:
        need = f"{Action(I, s, m, r)}"
    elif k == RECV_F:
        need = f"{Action(SEND_F, s - 1, m, r)} on device {a.peer}"
    elif k == RECV_B:
        need = f"{Action(SEND_B, s + 1, m, r)} on device {a.peer}"
    elif k in (SEND_F, SEND_B):
        need = "the computation that produces it"
    else:
        need = "its all-reduces, which wait for every device holding the stage to post them"
    return f"device {d} is stuck at action #{pos[d]} ({a}), waiting for {need}"


def _critical_counts(acts: list[list[Action]], cause: dict[tuple[int, int], tuple[int, int] | None],
                     node: tuple[int, int] | None) -> tuple[int, int]:
    """Walk back from the compute action that ends last along the dependencies that bound each start;
    count forward passes (per micro-batch run) and backward passes (B or I) on the way: Chimera 3.4's
    C_f and C_b."""
    cf = cb = 0
    while node is not None:
        d, i = node
        a = acts[d][i]
        if a.kind == F:
            cf += a.span
        elif a.kind in (B, I):
            cb += 1
        node = cause.get(node)
    return cf, cb
