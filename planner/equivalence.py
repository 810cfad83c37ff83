"""Candidates that run the same thing: one row each, the others kept as ``alternatives``.

Two ranked candidates are the same configuration when they share t, D, W, e, etp, the rank order, b, N and
recomputation and their devices compute the same layers of the same micro-batches in the same order. That is
decided from the action lists the executor runs (:mod:`planner.schedules.ir`), not from a list of schedule names, in
a canonical form per device:

- each compute action becomes ``(kind, replica, first layer, end layer, micro-batch, span)`` through the
  candidate's partition (stage ``s`` holds layers ``partition[s]``);
- an input-gradient ``I`` directly followed by the weight-gradient ``W`` of the same layers and micro-batch
  is one backward ``B`` (zero-bubble H1 splits B into I and W, ZB-H1 paper section 2) where I's gradient
  is not sent to another device in between (the first stage, or a stage whose upstream stage is local);
- consecutive forwards of one micro-batch over adjacent layers on one device are one forward (and
  backwards, in reverse layer order, one backward): the stages of one device that run back to back are
  one stage (Hanayo's waves, or any pipeline schedule, on D = 1);
- the layers each device holds (every replica's: Chimera's and GEMS's second copy is memory too) are part
  of what runs.

Candidates that do not fit are collapsed alike (their lists built from the run spec when they were
rejected before simulation): with D = 2 and N = 1, 1F1B and GPipe run ``F0 B0`` on each device, one row
whether it fits or not.

With D = 1, for instance, 1F1B, GPipe, zero-bubble H1 and Hanayo with any number of waves all run
``F0 B0`` when N = 1: plain data parallelism, shown once as "data parallel". (With N > 1 GPipe runs every
forward first and holds N micro-batches of activations: a different configuration, and a separate row.)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

from planner.request import ASYNC_SCHEDULES
from planner.runspec import schedule_microbatches
from planner.schedules import inflight, inflight_exact, splits_backward
from planner.schedules.ir import Schedule

Step = tuple[str, int, int, int, int, int]  # kind, replica, first layer, end layer, micro-batch, span


def canonical(actions: Sequence[Any], partition: Sequence[Sequence[int]],
              placement: Sequence[Sequence[int]]) -> list[Step]:
    """One device's compute actions in the canonical form (module docstring). ``placement[r][s]``: the
    device of stage ``s`` of replica ``r``."""
    out: list[Step] = []
    for a in actions:
        if a.kind not in ("F", "B", "I", "W"):
            continue
        lo, hi = partition[a.stage]
        step = (a.kind, a.replica, lo, hi, a.mb, a.span)
        if out:
            k, r, plo, phi, mb, span = out[-1]
            same_mb = (r, mb, span) == (a.replica, a.mb, a.span)
            row = placement[a.replica]
            # I's gradient goes upstream right after I; merged with W only where nothing is sent
            local = a.stage == 0 or row[a.stage - 1] == row[a.stage]
            if a.kind == "W" and k == "I" and same_mb and (plo, phi) == (lo, hi) and local:
                out[-1] = ("B", r, lo, hi, mb, span)
                continue
            if a.kind == k == "F" and same_mb and phi == lo:
                out[-1] = ("F", r, plo, hi, mb, span)
                continue
            if a.kind == "B" and k == "B" and same_mb and hi == plo:
                out[-1] = ("B", r, lo, phi, mb, span)
                continue
        out.append(step)
    return out


def held(sched: Any, device: int, partition: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The layer ranges ``device`` holds (weights, gradients, optimizer state), adjacent stages of one
    replica merged: a second replica's copy (Chimera, GEMS) is held memory too."""
    ranges: list[tuple[int, int, int]] = sorted((r, *partition[s]) for r, s in sched.stages_on(device))
    out: list[tuple[int, int, int]] = []
    for r, lo, hi in ranges:
        if out and out[-1][0] == r and out[-1][2] == lo:
            out[-1] = (r, out[-1][1], hi)
        else:
            out.append((r, lo, hi))
    return sorted((lo, hi) for _r, lo, hi in out)


def full_schedule(cand: Any) -> Schedule | None:
    """The action lists ``cand`` runs: the simulated ones, or -- for a candidate rejected before it was
    simulated, whose costs hold at most the schedule's shape (empty lists, :meth:`planner.shapes.ScheduleCache.
    schedule` with ``full=False``) -- built from its run spec, as the executor builds them. None when there is
    no partition (rejected before partitioning) or the schedule cannot be built."""
    if not cand.partition:
        return None
    if _simulated(cand):
        return cand.costs.schedule
    try:
        return cand.run_spec.schedule()
    except ValueError:
        return None


def _simulated(cand: Any) -> bool:
    """Whether ``cand``'s costs hold its full lists (every device computes: empty lists are a shape only)."""
    costs = getattr(cand, "costs", None)
    return costs is not None and costs.schedule is not None and all(costs.schedule.actions)


def _same_figures(a: Any, b: Any) -> bool:
    """Whether two rows read the same: predicted time and per-device memory. Twins that were not simulated
    (rejected for memory before it) have the same figures -- the memory model counts what the lists hold and
    keep in flight -- so rows whose figures differ need no lists built to be told apart."""
    return a.iteration_time == b.iteration_time and len(a.memory) == len(b.memory) and all(
        math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a.memory, b.memory, strict=True))


def _same_inflight(a: Any, b: Any) -> bool:
    """False when a split backward meets an unsplit one on two or more devices, or when the in-flight
    micro-batches per (replica, stage) of the two schedules, known without their lists
    (:func:`planner.schedules.inflight`), differ where both are exact: their lists differ too."""
    ca, cb = a.config, b.config
    # a split backward (I, then W) on two or more devices sends some stage's gradient upstream between its I
    # and W: never a plain B (canonical), so a split and an unsplit schedule differ there
    if ca.pipeline > 1 and splits_backward(ca.schedule) != splits_backward(cb.schedule):
        return False
    if not (inflight_exact(ca.schedule) and inflight_exact(cb.schedule)):
        return True
    n = schedule_microbatches(ca, a.microbatches)
    try:
        fa = inflight(ca.schedule, ca.pipeline, n, **ca.schedule_params())
        fb = inflight(cb.schedule, cb.pipeline, schedule_microbatches(cb, b.microbatches), **cb.schedule_params())
    except ValueError:
        return True
    return fa is None or fb is None or fa == fb


def _device_signature(sched: Schedule, part: Sequence[Sequence[int]], device: int) -> tuple[Any, ...]:
    """What ``device`` holds and runs under ``sched`` with stage partition ``part`` (canonical form)."""
    return tuple(held(sched, device, part)), tuple(canonical(sched.actions[device], part, sched.placement))


def _signature(cand: Any) -> tuple[Any, ...] | None:
    """What runs and what is held, device by device; None when it cannot be told (no partition)."""
    sched = full_schedule(cand)
    if sched is None:
        return None
    return tuple(_device_signature(sched, cand.partition, d) for d in range(len(sched.actions)))


def _key(cand: Any) -> tuple[Any, ...]:
    c = cand.config
    return (c.tensor, c.pipeline, c.data, c.expert, c.expert_tensor, c.order, c.micro_batch, cand.microbatches,
            c.recompute, c.schedule in ASYNC_SCHEDULES)


def schedule_label(config: Any) -> str:
    """The schedule and its parameters, e.g. ``hanayo(waves=2)`` (t, D, W, b are the row's columns)."""
    extra = ",".join(f"{k}={v}" for k, v in config.schedule_params().items())
    return config.schedule + (f"({extra})" if extra else "")


def describe(cand: Any) -> str:
    """The row's name: what a configuration without a pipeline is (D = 1; "fully sharded" where the weights are,
    :mod:`planner.fsdp`; an asynchronous schedule's name beside it: a PipeDream row at D = 1 read "data parallel"
    as the synchronous row above it did), else its schedule."""
    c = cand.config
    if c.pipeline > 1:
        return schedule_label(c)
    data = "fully sharded data parallel" if getattr(cand, "shard_parameters", False) else "data parallel"
    parts = [p for p, on in (("tensor parallel", c.tensor > 1), (data, c.data > 1)) if on]
    name = " + ".join(parts) or "single device"
    if c.schedule in ASYNC_SCHEDULES:  # (its weights are updated as the schedule says: not a synchronous row's twin)
        return name + f" ({schedule_label(c)}: asynchronous)"
    sig = _signature(cand)
    if sig is not None and any(_in_flight(dev) > 1 for dev in sig):
        name += f" ({schedule_label(c)} order)"
    return name


def _in_flight(steps: tuple[Any, Sequence[Step]]) -> int:
    live: set[tuple[int, int]] = set()
    peak = 0
    for kind, r, _lo, _hi, mb, _span in steps[1]:
        if kind == "F":
            live.add((r, mb))
            peak = max(peak, len(live))
        elif kind in ("B", "W"):
            live.discard((r, mb))
    return peak


class Twins:
    """Candidates sorted into classes that run the same thing, as they arrive: :meth:`add` returns the
    class's first member. Only candidates that share t, D, W, e, b, N and recomputation are compared, device by
    device from the last (where schedules differ soonest), each device's form computed once."""

    def __init__(self, forms: dict[tuple[int, int], tuple[Any, ...]] | None = None) -> None:
        self.groups: dict[tuple[Any, ...], list[Any]] = {}
        self.forms: dict[tuple[int, int], tuple[Any, ...]] = forms if forms is not None else {}
        self._schedules: dict[int, Schedule | None] = {}

    def _schedule(self, c: Any) -> Schedule | None:
        if id(c) not in self._schedules:
            self._schedules[id(c)] = full_schedule(c)
        return self._schedules[id(c)]

    def _form(self, c: Any, d: int) -> tuple[Any, ...]:
        f = self.forms.get((id(c), d))
        if f is None:
            sched = self._schedule(c)
            assert sched is not None
            f = self.forms[(id(c), d)] = _device_signature(sched, c.partition, d)
        return f

    def same(self, a: Any, b: Any) -> bool:
        if not (_simulated(a) and _simulated(b)) and not (_same_figures(a, b) and _same_inflight(a, b)):
            return False  # building lists is costly (D x N actions): only for rows that may be the same
        sa, sb = self._schedule(a), self._schedule(b)
        if sa is None or sb is None:
            return False
        n = len(sa.actions)
        return n == len(sb.actions) and all(self._form(a, d) == self._form(b, d) for d in reversed(range(n)))

    def add(self, cand: Any) -> Any:
        group = self.groups.setdefault(_key(cand), [])
        twin = next((o for o in group if self.same(o, cand)), None)
        if twin is None:
            group.append(cand)
            return cand
        return twin


class TopDistinct:
    """The search's pruning threshold counted over classes of twins: the k-th best time among the best
    times of the classes (infinite until there are k), so that the k rows left after :func:`collapse` are
    still the exact top k."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.twins = Twins()
        self.best: dict[int, float] = {}  # id of the class's first member -> its best time
        self.kth = math.inf

    def add(self, cand: Any) -> None:
        first = id(self.twins.add(cand))
        if cand.iteration_time < self.best.get(first, math.inf):
            self.best[first] = cand.iteration_time
            if len(self.best) >= self.k:
                self.kth = heapq.nsmallest(self.k, self.best.values())[-1]


def collapse(cands: list[Any], twins: Twins | None = None) -> list[Any]:
    """``cands`` (ranked, best first) with every candidate that runs the same thing as a better-ranked one
    removed and its schedule's label added to that one's ``alternatives`` (its time to ``alternative_times``);
    every kept candidate gets its ``name``. ``twins``: the forms already computed (:class:`TopDistinct`'s)."""
    twins = Twins(forms=twins.forms if twins is not None else None)
    kept: list[Any] = []
    for cand in cands:
        first = twins.add(cand)
        if first is not cand:
            first.alternatives.append(schedule_label(cand.config))
            first.alternative_times.append(cand.iteration_time)
            continue
        cand.name = describe(cand)
        kept.append(cand)
    return kept
