"""Lower bounds of a configuration's iteration time, what the search prunes with (exact for the top k:
a configuration is simulated only while its bound is below the k-th best simulated time).

* :meth:`TimeBounds.lower_bound`, before any list is built: for every device, the first forward reaching
  one of its stages, its own computation (per micro-batch, the least F + B of the stage replicas it
  holds), then its optimizer step or the gradient travelling down the stages before it; and, where the
  in-flight counts are exact, Little's law over the micro-batches' round trips.
* :meth:`TimeBounds.prefix_bound`, for merged schedules (Chimera, Hanayo): the replayed warm-up plus the
  computation left to each device.
"""

from __future__ import annotations

import numpy as np

from planner.cost import ConfigCosts
from planner.partition import prefix_sums
from planner.schedules import inflight_exact, splits_backward
from planner.schedules.ir import Schedule
from planner.shapes import ScheduleCache, Warmup
from planner.simulate import simulate

#: per stage, the least F + B of one micro-batch; the running sums of the forwards and of the backwards of
#: the stages before it; a micro-batch's round trip
StageTerms = tuple[np.ndarray, np.ndarray, np.ndarray, float]


class TimeBounds:
    """The bounds of one search; the stage terms cached by value."""

    def __init__(self, shapes: ScheduleCache) -> None:
        self.shapes = shapes
        self._terms: dict[tuple, StageTerms] = {}

    def lower_bound(self, sched: Schedule, costs: ConfigCosts) -> float:
        """A time no schedule of this configuration can beat: for every device, the first forward
        reaching one of its stages (the forwards of the stages before it), its own computation, and then
        its own optimizer step or -- unless backwards are split, when a weight-gradient pass may come
        last -- the gradient of its last backward travelling down the stages before it followed by the
        smallest step of any device, whichever is longer."""
        cfg = costs.config
        _, pre_f, _, round_trip = self.terms(costs)
        lb = 0.0
        if inflight_exact(cfg.schedule):
            # Little's law: a micro-batch is alive at least for its round trip through every stage, and the
            # lists never keep more than ``k`` alive at once (their stage-0 in-flight peaks, exact), so
            # N micro-batches take at least N * round_trip / k (tight for GEMS' two in flight)
            counts = self.shapes.inflight(cfg, sched)
            k = sum(counts.get((r, 0), 0) for r in range(sched.replicas))
            if k > 0:
                lb = sched.microbatches * round_trip / k
        work, after = self.device_terms(sched, costs)
        head = pre_f[self.shapes.layout(cfg, sched).stage].min(axis=1)
        return max(lb, float((head + work + after).max()))

    def terms(self, costs: ConfigCosts) -> StageTerms:
        """Per stage, the least F + B of one micro-batch, the forwards and the backwards of the stages before
        it (running sums), and a micro-batch's round trip (with a split backward, forwards and
        input-gradient passes: an I frees what its F stored); cached per (stage ranges, t, schedule
        micro-batch size, recomputation, doubled forwards, split backward)."""
        cfg = costs.config
        doubled = cfg.concat in ("forward-doubling", "backward-halving")
        split = splits_backward(cfg.schedule)
        key = (tuple(info.layers for info in costs.stages), costs.t, costs.base_b, cfg.recompute, doubled, split)
        got = self._terms.get(key)
        if got is None:
            S = len(costs.stages)
            f = [min(costs.fwd(s, 1), costs.fwd(s, 2) / 2) if doubled else costs.fwd(s, 1) for s in range(S)]
            bw = [costs.bwd(s) for s in range(S)]
            chain = [costs.compute("I", s, 1, 0) for s in range(S)] if split else bw
            got = self._terms[key] = (np.add(f, bw), prefix_sums(f)[:-1], prefix_sums(bw)[:-1],
                                      sum(f) + sum(chain))
        return got

    def device_terms(self, sched: Schedule, costs: ConfigCosts) -> tuple[np.ndarray, np.ndarray]:
        """Per device, a lower bound of its computation (:meth:`lower_bound`'s per-micro-batch F + B of
        the stage replicas it holds) and of what must follow its last computation: its optimizer step,
        or -- unless backwards are split -- the gradient travelling down the stages before its stages
        and then the smallest step of any device."""
        cfg = costs.config
        work_of, _, pre_b, _ = self.terms(costs)
        split = splits_backward(cfg.schedule)
        lay = self.shapes.layout(cfg, sched)
        steps = np.asarray(costs.step_per_stage())[lay.stage].sum(axis=1)
        work = (lay.per_mb * work_of[lay.stage]).sum(axis=1)
        tail = np.zeros(len(steps)) if split else pre_b[lay.stage].min(axis=1)
        return work, np.maximum(steps, tail + steps.min())

    def prefix_bound(self, costs: ConfigCosts, warmup: Warmup) -> float | None:
        """A lower bound of the iteration time from the merged warm-up (a prefix of every device's list,
        closed under inputs, :class:`planner.shapes.Warmup`): its actions take in the full schedule exactly
        the times they take when the prefix alone is replayed (without eager all-reduces, which could only
        delay them), so device ``d`` cannot finish before the prefix's end on it plus the computation left
        to it (its total at least :meth:`lower_bound`'s) plus its step or the gradient's way down. None
        when the prefix is the whole schedule (then simulating it is simulating the schedule)."""
        shape = costs.schedule
        if warmup.backwards >= shape.microbatches * shape.stages:
            return None
        part, compiled = warmup.partial()
        res = simulate(part, costs, compiled=compiled)
        work, after = self.device_terms(shape, costs)
        bound = 0.0
        for d, st in enumerate(res.devices):
            done = st.busy - (st.step[1] - st.step[0])
            bound = max(bound, st.compute_end + max(0.0, work[d] - done) + after[d])
        return bound
