"""Discrete-event simulator of a lowered schedule (see :mod:`planner.schedules.ir`).

Each device runs its action list in order on three resources:

* a **compute stream** for F/B/I/W and STEP: an action starts when the stream is free and its inputs
  are there (the producing action's end on the same device, or the arrival of the received message);
* a **send stream** for SEND_F/SEND_B: a send starts when its data has been produced and the device's
  previous send has finished; the message arrives ``p2p`` later. Receives are posted ahead of time
  (prefetching, Hanayo 4.2) and occupy no stream: the consumer waits for the arrival only;
* a **collective stream** for ALLREDUCE, posted without blocking the device: a stage's all-reduce runs
  once every device holding the stage has posted it and their collective streams are free.

So point-to-point communication overlaps computation on both sides, and an ALLREDUCE placed early in
the list (eager, Chimera 3.2) overlaps the computation that follows it -- and slows it: the costs'
``comm_share`` of the all-reduce (or of the compute left, if shorter) delays the device's compute after
the post (:func:`planner.schedules.timing.contention_debt`, :mod:`planner.contention`). STEP waits for all
of its device's all-reduces. What is not overlapped is what the figures show.

Outputs (:class:`SimResult`): makespan, per-device busy/idle time, bubble ratio
``1 - sum(busy) / (devices * makespan)``, per-device peak count of micro-batches whose activations are
alive (a forward adds the micro-batches it runs, B -- or a split backward's W -- of the same stage frees
one), the critical-path counts Cf and Cb of Chimera section 3.4 (forward and backward passes on the chain
of actions that determines the makespan), and the (start, end) of every action.

Two replays apply these rules, below this module in :mod:`planner.schedules` (the validator uses them
too): :func:`~planner.schedules.replay.replay_lowered` runs explicit lowered lists, action by action.
A compute-only schedule is not lowered first: :func:`~planner.schedules.encoded.replay_encoded` runs its
compute actions, encoded as integers (:class:`~planner.schedules.encoded.EncodedSchedule`), and adds
the communication where :func:`~planner.schedules.ir.lower`
would put it -- a send after each compute action whose consumer sits on another device (the consumer
waits for the arrival), the all-reduces after the last backward of an eager stage or at the end, then
STEP. It gives the same times, figures and timeline as replaying ``lower(schedule)`` (the timeline's
lowered actions are built when first asked for); ``tests/test_fast_replay.py`` checks that on many
schedules, since the simulator must time exactly the lists the executor runs.

The same replay, run with unit costs, is the validator's deadlock check: a device that waits for an
action no other device can ever run is reported with what it waits for.
"""

from __future__ import annotations

from typing import Any

from planner.schedules.encoded import EncodedSchedule, replay_encoded
from planner.schedules.ir import Schedule, builder_eager, lower
from planner.schedules.replay import canonical_compute_only, replay_lowered
from planner.schedules.timing import Costs, DeviceStats, ScheduleError, SimResult, UnitCosts

__all__ = ["Costs", "DeviceStats", "ScheduleError", "SimResult", "UnitCosts", "compile_schedule", "simulate"]


def compile_schedule(schedule: Schedule) -> Any:
    """The integer encoding :func:`simulate` replays (None where only the explicit replay applies).
    Pass it back as ``simulate(schedule, costs, compiled=...)`` to time one schedule under many costs
    (the planner's search does); it is only valid while the schedule is not modified."""
    if schedule.lowered:
        return None
    return EncodedSchedule.encode(schedule, builder_eager(schedule))


def simulate(schedule: Schedule, costs: Costs | None = None, compiled: Any = None) -> SimResult:
    """Time ``schedule`` under ``costs`` (default F=1, B=2).

    A compute-only schedule is timed as ``lower(schedule)`` is, without building the lowered lists:
    :func:`replay_encoded` replays the compute actions and adds the communication the placement
    implies at the points where :func:`lower` puts it (same rules, same times: the tests compare the
    two). Lowered schedules, and the compute-only ones it does not cover (malformed or deadlocked: the
    explicit replay names the error), go through :func:`replay_lowered`.
    """
    costs = costs or UnitCosts()
    if schedule.lowered:
        compute = canonical_compute_only(schedule)
        if compute is None:
            return replay_lowered(schedule, costs)
        schedule = compute  # its lists are lower(compute)'s: time them as such
    eager = builder_eager(schedule)
    plan = compiled if compiled is not None else EncodedSchedule.encode(schedule, eager)
    if plan is not None:
        res = replay_encoded(plan, costs)
        if res is not None:
            return res
    return replay_lowered(lower(schedule, eager=eager), costs)


