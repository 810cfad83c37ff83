"""Schedule validator, modelled on ``torch.distributed.pipelining``'s checks of action lists.

``validate(schedule)`` raises :class:`ScheduleError` naming the device, the action and the rule when

1. an action is malformed: stage, replica, micro-batch or peer out of range, a stage run on a device that
   does not hold it, a micro-batch run by a replica it does not belong to, a backward covering several
   micro-batches;
2. the work is not exactly once: each (replica, stage, micro-batch) of the micro-batch's replica needs
   exactly one F and either one B or one I and one W (zero-bubble split); forward spans must agree
   between consecutive stages (a doubled forward sends one message);
3. an order rule breaks: F of stage s before F of stage s-1 of the same micro-batch and replica; B
   before its own F or before B of stage s+1; W before its I. Where both actions sit on the same device
   the list order is checked directly (the error names both positions);
4. in a lowered schedule, a send has no receive (or the reverse), or the peers do not match the
   placement; and replaying the lists -- receives block until their message has been sent, sends do
   not block (the executor posts them asynchronously), all-reduces are posted asynchronously and waited
   for by STEP -- deadlocks. The replay is the simulator's (:func:`planner.schedules.replay.replay_lowered`),
   which reports what each stuck device waits for.

Compute-only schedules are checked as the executor will run them, lowered. They are first checked
on the simulator's integer encoding of the schedule (:class:`planner.schedules.encoded.EncodedSchedule`) and its
replay with the communication implied, which covers every rule above at a fraction of the cost; so is
a lowered schedule whose lists are exactly :func:`lower`'s of its compute-only form. A schedule that
fails there, or another lowered one, goes through the rule-by-rule checks, which name the error.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from planner.schedules.encoded import EncodedSchedule, replay_encoded
from planner.schedules.ir import (
    ALL_KINDS,
    ALLREDUCE,
    COMM_KINDS,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    STEP,
    B,
    F,
    I,
    Schedule,
    W,
    builder_eager,
    lower,
)
from planner.schedules.replay import canonical_compute_only, replay_lowered
from planner.schedules.timing import ScheduleError, UnitCosts


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule (see the module docstring)."""
    D, S, N, R = schedule.devices, schedule.stages, schedule.microbatches, schedule.replicas
    if D < 1 or S < 1 or N < 1:
        raise ScheduleError(f"devices, stages and microbatches must be >= 1 (got {D}, {S}, {N})")
    if len(schedule.actions) != D:
        raise ScheduleError(f"schedule has {len(schedule.actions)} action lists for {D} devices")
    for r, row in enumerate(schedule.placement):
        if len(row) != S:
            raise ScheduleError(f"placement of replica {r} names {len(row)} devices for {S} stages")
        for s, d in enumerate(row):
            if not 0 <= d < D:
                raise ScheduleError(f"placement: stage {s} of replica {r} on device {d}, outside 0..{D - 1}")
    if len(schedule.mb_replica) != N or any(not 0 <= r < R for r in schedule.mb_replica):
        raise ScheduleError(f"mb_replica must give a replica in 0..{R - 1} for each of the {N} micro-batches")

    compute = canonical_compute_only(schedule) if schedule.lowered else schedule
    if compute is not None and _passes(compute):
        return  # (a valid compute-only schedule's lowering is valid: its messages match by construction)
    _check_rules(schedule)


def _check_rules(schedule: Schedule) -> None:
    """The rules one by one (after the checks of sizes and placement), raising on the first broken."""
    S, N, R = schedule.stages, schedule.microbatches, schedule.replicas
    place = schedule.placement
    counts: Counter[tuple[str, int, int, int]] = Counter()
    spans: dict[tuple[int, int, int], int] = {}  # (replica, stage, first mb) of forwards -> span
    position: dict[tuple[str, int, int, int], tuple[int, int]] = {}
    for d, row in enumerate(schedule.actions):
        for i, a in enumerate(row):
            where = f"device {d}, action #{i} ({a})"
            if a.kind not in ALL_KINDS:
                raise ScheduleError(f"{where}: unknown kind {a.kind!r}")
            if a.kind == STEP:
                continue
            if not 0 <= a.replica < R:
                raise ScheduleError(f"{where}: replica {a.replica} outside 0..{R - 1}")
            if not 0 <= a.stage < S:
                raise ScheduleError(f"{where}: stage {a.stage} outside 0..{S - 1}")
            if place[a.replica][a.stage] != d:
                raise ScheduleError(f"{where}: stage {a.stage} of replica {a.replica} is placed on device "
                                    f"{place[a.replica][a.stage]}, not {d}")
            if a.kind == ALLREDUCE:
                continue
            if a.span < 1 or a.mb < 0 or a.mb + a.span > N:
                raise ScheduleError(f"{where}: micro-batches {a.mb}..{a.mb + a.span - 1} outside 0..{N - 1}")
            if a.span > 1 and a.kind not in (F, SEND_F, RECV_F):
                raise ScheduleError(f"{where}: only a forward may cover several micro-batches")
            for m in a.mbs:
                if schedule.mb_replica[m] != a.replica:
                    raise ScheduleError(f"{where}: micro-batch {m} belongs to replica "
                                        f"{schedule.mb_replica[m]}, not {a.replica}")
            if a.kind in COMM_KINDS:
                _check_peer(schedule, d, i, a)
                continue
            if a.kind == F:
                spans[(a.replica, a.stage, a.mb)] = a.span
            for m in a.mbs:
                key = (a.kind, a.replica, a.stage, m)
                counts[key] += 1
                position[key] = (d, i)

    for m in range(N):
        r = schedule.mb_replica[m]
        for s in range(S):
            nf, nb, ni, nw = (counts[(k, r, s, m)] for k in (F, B, I, W))
            what = f"micro-batch {m}, stage {s}, replica {r}"
            if nf != 1:
                raise ScheduleError(f"{what}: {nf} forwards (need exactly one)")
            if not ((nb == 1 and ni == 0 and nw == 0) or (nb == 0 and ni == 1 and nw == 1)):
                raise ScheduleError(f"{what}: {nb} B, {ni} I, {nw} W (need one B, or one I and one W)")
    for (r, s, m), span in spans.items():
        if s > 0 and spans.get((r, s - 1, m)) != span:
            raise ScheduleError(f"forward of micro-batches {m}..{m + span - 1} at stage {s} (replica {r}) "
                                f"does not match the forwards of stage {s - 1}")

    # same-device order rules, with both positions named
    for (k, r, s, m), (d, i) in position.items():
        deps: list[tuple[str, int, int, int]] = []
        if k == F and s > 0:
            deps.append((F, r, s - 1, m))
        elif k in (B, I):
            deps.append((F, r, s, m))
            if s < S - 1:
                deps.append((B if (B, r, s + 1, m) in position else I, r, s + 1, m))
        elif k == W:
            deps.append((I, r, s, m))
        for dep in deps:
            dd, j = position[dep]
            if dd == d and j > i:
                raise ScheduleError(f"device {d}: {schedule.actions[d][i]} at #{i} needs "
                                    f"{schedule.actions[d][j]}, which comes later (#{j}) on the same device")

    lowered = schedule if schedule.lowered else lower(schedule, eager=builder_eager(schedule))
    if schedule.lowered:
        _check_messages(lowered)
    replay_lowered(lowered, UnitCosts())  # raises ScheduleError on deadlock


def _passes(schedule: Schedule) -> bool:
    """True when the compute-only ``schedule`` (whose sizes and placement are checked) breaks no rule,
    decided on the simulator's plan: the plan exists (kinds, ranges, placement, no unit of work twice,
    only forwards span several micro-batches), the producer table holds exactly one F and one B or one
    I and one W per (stage, micro-batch) of the micro-batch's replica and nothing else, forward spans
    agree, same-device inputs come earlier in the list, and the replay with unit costs finishes."""
    try:
        plan = EncodedSchedule.encode(schedule, builder_eager(schedule))
    except ValueError:
        return False
    if plan is None or not plan.in_order:
        return False
    S, N, R = schedule.stages, schedule.microbatches, schedule.replicas
    done = np.asarray(plan.producer).reshape(4, R, S, N) >= 0  # kinds F, B, I, W
    own = done[:, np.asarray(schedule.mb_replica), :, np.arange(N)]  # (micro-batch, kind, stage)
    f, b, i, w = own[:, 0], own[:, 1], own[:, 2], own[:, 3]
    if not (f.all() and ((b & ~i & ~w) | (~b & i & w)).all()) or done.sum() != own.sum():
        return False
    if any(a.span > 1 for a in plan.acts):  # (when every forward runs one micro-batch, spans agree)
        for k, s, m, r, span, _ in plan.acts:
            if k == F and s > 0:
                prev = plan.acts[plan.producer[(r * S + s - 1) * N + m]]
                if prev.mb != m or prev.span != span:
                    return False
    return replay_encoded(plan, UnitCosts()) is not None



def _check_peer(schedule: Schedule, d: int, i: int, a) -> None:  # type: ignore[no-untyped-def]
    place = schedule.placement[a.replica]
    S = schedule.stages
    other = {SEND_F: a.stage + 1, RECV_F: a.stage - 1, SEND_B: a.stage - 1, RECV_B: a.stage + 1}[a.kind]
    if not 0 <= other < S:
        raise ScheduleError(f"device {d}, action #{i} ({a}): no stage {other} to exchange with")
    if a.peer != place[other]:
        raise ScheduleError(f"device {d}, action #{i} ({a}): peer is device {a.peer} but stage {other} "
                            f"is on device {place[other]}")


def _check_messages(schedule: Schedule) -> None:
    """Every send has exactly one receive and the reverse."""
    sends: Counter[tuple[str, int, int, int]] = Counter()
    recvs: Counter[tuple[str, int, int, int]] = Counter()
    for row in schedule.actions:
        for a in row:
            if a.kind == SEND_F:
                sends[(F, a.replica, a.stage + 1, a.mb)] += 1
            elif a.kind == SEND_B:
                sends[(B, a.replica, a.stage - 1, a.mb)] += 1
            elif a.kind == RECV_F:
                recvs[(F, a.replica, a.stage, a.mb)] += 1
            elif a.kind == RECV_B:
                recvs[(B, a.replica, a.stage, a.mb)] += 1
    for key in sends.keys() | recvs.keys():
        if sends[key] != 1 or recvs[key] != 1:
            kind, r, s, m = key
            what = "activation" if kind == F else "gradient"
            raise ScheduleError(f"{what} for stage {s}, micro-batch {m}, "
                                f"replica {r}: {sends[key]} sends and {recvs[key]} receives (need one each)")
