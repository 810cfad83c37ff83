"""Lower bounds of a configuration's iteration time, what the search prunes with (exact for the top k:
a configuration is simulated only while its bound is below the k-th best simulated time).

Every bound here is a property of the simulator's rules (:mod:`planner.simulate`), true of any action lists of the
configuration's shape: a device runs its compute actions one at a time, an action starts no earlier than its inputs
end (a forward of stage s after the forward of stage s-1 of its micro-batch, a backward -- or a split backward's I
-- of stage s after the forward of s and the backward (I) of s+1 of its micro-batch, a W after its I; an input made
on another device is there once its message has arrived, at least the message's time (:meth:`ConfigCosts.p2p`)
after its action ended), communication takes no negative time, a stage's all-reduce is posted no earlier than the
end of that stage's last gradient-producing action on the device, and STEP starts after the device's last compute
action and its all-reduces. Durations are the cost model's work (:meth:`ConfigCosts.fwd`, ``bwd``; with the
executor's per-action overheads and a shared host's slowdown the simulated durations are only longer,
:meth:`ConfigCosts.compute`), read at the fastest clock a power-limited GPU can hold
(:meth:`ConfigCosts.fastest_clock`: the clock a candidate holds, :mod:`planner.power`, is found from its simulated
step, and none runs the matrix engines faster), so a bound computed with them holds for the simulation. In the
bounds of the candidates the search reaches (``allreduce``), the chains below (a micro-batch's forwards through the
stages, its backwards down) carry the messages between their devices (:func:`_messages`): on GPT-3 175B / 1024
A100s they bring 1F1B's release bound from a median 0.984 of the simulated time to 0.998
(``tests/test_bounds_tight.py``).

* :meth:`TimeBounds.lower_bound`, before any list is built, per device ``d`` (its end is at most the
  makespan): ``compute_end(d) + after(d)`` with

  - ``compute_end(d) >= head(d) + work(d)``: nothing runs before the first forward can reach one of its
    stages (``head``: the forward chain of one micro-batch up to that stage) and its computation is
    sequential (``work``: per micro-batch, the least F + B of each stage replica it holds);
  - with ``allreduce`` (the bound asked when a candidate is reached; prepare's skips this numpy work for the thousands
    it never reaches): ``compute_end(d) >= tau + late(tau)`` for every ``tau = T1(p)`` of a (replica, stage) pair ``p``
    it holds (the backward window, "fill" of the pipeline): ``T1(p)``, the earliest start of any backward of ``p``'s
    stage ``s``, is one micro-batch's forward through all ``S`` stages and its backward down to ``s + 1`` (PipeDream
    3.2's round trip; the 1F1B bubble of Megatron-LM 2.2.1 is what it leaves idle before the first backward), and
    ``late(tau)`` is the work of the pairs ``q`` with ``T1(q) >= tau`` that cannot start before ``T1(q)``: all their
    backwards and, where the schedule's in-flight counts ``K_q`` are exact (a list holds at most ``K_q`` forwards of
    ``q`` before its first backward), their last ``N_q - K_q`` forwards;
  - ``after(d)``: its optimizer step plus, with ``allreduce=True``, the all-reduces that follow its last compute
    action (:meth:`TimeBounds.allreduces_after`: every stage's posted at the end of its list, one after another,
    else at least the smallest of its stages', the one whose gradient that action completes), or -- unless
    backwards are split, when a weight-gradient pass may come last -- the gradient of its last backward
    travelling down the stages before it, followed by the smallest all-reduce and step of any device,
    whichever is longer;

  and, where the in-flight counts are exact, Little's law over the micro-batches' round trips.
* :meth:`TimeBounds.work_bound`, with no term of any stage (what the search orders its candidates by until it reaches
  them, :meth:`planner.search.Planner.prepare`): the makespan is at least the busiest device's compute, so at
  least the mean of the pipeline's ``D`` devices': its micro-batches each through every layer of the model once,
  forward and backward, at the fastest clock. A layer counts its compute (:meth:`ConfigCosts.model_compute`) and,
  with experts, its all-to-alls at the least of any device's group (:meth:`ConfigCosts.model_ep_in`); what else an
  action adds -- collectives, overheads, a shared host's slowdown -- is left out; a doubled forward counts at its
  cheaper half, and a split backward's I and W together hold at least B.
* :meth:`TimeBounds.prefix_bound`, for merged schedules (Chimera, Hanayo): the replayed warm-up plus the
  computation left to each device.
"""

from __future__ import annotations

import numpy as np

from planner.cost import ConfigCosts
from planner.partition import prefix_sums
from planner.placement import link_key
from planner.request import Config
from planner.schedules import BACKWARD_HALVING, PROFILE_DRIVEN, inflight_exact, splits_backward
from planner.schedules.ir import SEND_B, SEND_F, Schedule
from planner.shapes import ScheduleCache, Warmup
from planner.simulate import simulate

#: :meth:`TimeBounds.work_bound` sums the layers in another order than the stages' durations it bounds: it is taken
#: this much lower, far beyond any rounding of those sums, so that it never exceeds the bound it stands in for
WORK_MARGIN = 1e-9

#: entries of one block of the arrays that grow with the stage copies a device holds, a block of devices at a
#: time (a few MB): :meth:`TimeBounds.device_terms`' (devices, h, h), :func:`_single_machine`'s (devices, kappas)
_BLOCK = 1 << 17


def _doubles_forwards(cfg: Config) -> bool:
    """Whether some forward action of ``cfg``'s lists may run two micro-batches (Chimera 3.5's forward doubling, and
    backward halving's merged forwards): its bounds take the cheaper of one forward and half of a doubled one."""
    return cfg.concat in ("forward-doubling", BACKWARD_HALVING)


class StageTerms:
    """Per-stage figures of one (partition, t, micro-batch size, recomputation, forward doubling, split backward), the
    bounds' inputs: ``work`` the least F + B of one micro-batch (``fwd`` its F part, ``bwd`` its backward), ``head``
    the forward chain of one micro-batch up to each stage, ``down`` the backward chain below each stage (both with
    the messages between stages on other devices), ``window`` the earliest start of a backward of each stage
    (:math:`T_1`), and ``round_trip`` one micro-batch through every stage and back (with a split backward, forwards
    and input-gradient passes: a micro-batch stays alive until its W, at least that long)."""

    __slots__ = ("bwd", "down", "drain", "fwd", "head", "round_trip", "weight", "window", "work")

    def __init__(self, work: tuple[np.ndarray, ...], messages: tuple[np.ndarray, np.ndarray], split: bool) -> None:
        """``work``: :func:`_work`'s per-stage figures; ``messages``: :func:`_messages`' (``up``: the forward
        output of stage s reaching stage s+1, ``down``: the gradient of stage s reaching stage s-1)."""
        f, chain_f, bw, chain_b = work
        up, down_msg = messages
        S = len(f)
        self.fwd, self.bwd = f, bw
        self.work = self.fwd + self.bwd
        # a chain's steps, each a compute action and the message to the next stage's
        step_f, step_b = chain_f + up, chain_b + down_msg
        self.head = prefix_sums(step_f)[:-1]
        # the backward (I) chain below each stage: from the gradient stage s sends, down to stage 0's end
        self.down = prefix_sums(chain_b)[:-1] + prefix_sums(down_msg)[1:]
        # a split backward's W part (0 otherwise): its I is the rest
        self.weight = self.bwd - chain_b if split else np.zeros(S)
        # T1(s): forwards through all S stages, then backwards (I) of stages S-1 .. s+1, each gradient's message
        # to the stage below it included (the last, from s+1, reaches s)
        through = float(np.sum(chain_f) + np.sum(up))
        below = prefix_sums(step_b)
        self.window = through + (below[-1] - below[1:])
        self.round_trip = float(np.sum(f) + np.sum(up)) + float(np.sum(chain_b) + np.sum(down_msg))
        # after a forward of stage s ends: its message, its micro-batch's forwards beyond s and backwards (I) down
        # to 0
        ahead = prefix_sums(step_f)
        self.drain = (ahead[-1] - ahead[1:]) + up + float(np.sum(chain_b) + np.sum(down_msg))


def _work(costs: ConfigCosts, doubled: bool, split: bool) -> tuple[np.ndarray, ...]:
    """Per stage: the F of one micro-batch (a doubled forward runs two in one action), the F of one action on a
    chain, the backward (a split backward: I + W, at least B -- a stage the executor does not split pays a whole
    backward in W: :meth:`planner.cost.ConfigCosts.split_backward`) and the backward on a chain (I when split).
    The work, as F and B: a shared host's core share is the configuration's own, not these cached terms'."""
    S = len(costs.stages)
    f = [min(costs.fwd(s, 1), costs.fwd(s, 2) / 2) if doubled else costs.fwd(s, 1) for s in range(S)]
    chain_f = [min(costs.fwd(s, 1), costs.fwd(s, 2)) if doubled else f[s] for s in range(S)]
    bw = [costs.work("I", s, 1) + costs.work("W", s, 1) if split else costs.bwd(s) for s in range(S)]
    chain_b = [costs.work("I", s, 1) for s in range(S)] if split else bw
    return np.asarray(f), np.asarray(chain_f), np.asarray(bw), np.asarray(chain_b)


def _messages(costs: ConfigCosts, doubled: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, the least time of the message a forward (``up``: to stage s+1) and a backward or its I
    (``down``: to stage s-1) of one action of it sends, over the replicas' placements of the two stages
    (:meth:`ConfigCosts.p2p`: 0 where both sit on one device and with a blocking runtime, whose actions hold their
    sends): a consumer on another device waits for the arrival, its sender's end plus the message at least
    (:func:`planner.schedules.encoded.replay_encoded`); a doubled forward may send one micro-batch or two."""
    S = len(costs.stages)
    place = costs.schedule.placement
    up, down = np.zeros(S), np.zeros(S)
    spans = (1, 2) if doubled else (1,)
    for s in range(S - 1):
        pairs = {(row[s], row[s + 1]) for row in place}  # (replicas often share a pair)
        up[s] = min(costs.p2p(SEND_F, s, k, a, b) if a != b else 0.0 for a, b in pairs for k in spans)
        down[s + 1] = min(costs.p2p(SEND_B, s + 1, 1, b, a) if a != b else 0.0 for a, b in pairs)
    return up, down


class TimeBounds:
    """The bounds of one search; the stage terms and all-reduce times cached by value."""

    def __init__(self, shapes: ScheduleCache) -> None:
        self.shapes = shapes
        self._terms: dict[tuple, StageTerms] = {}
        self._work: dict[tuple, tuple[np.ndarray, ...]] = {}  # per stage F and B (_work), by the key less placement
        self._messages: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (_messages), by placement and stages
        self._allreduce: dict[tuple, np.ndarray] = {}
        self._work_bounds: dict[tuple, float] = {}  # (work_bound)

    def lower_bound(self, sched: Schedule, costs: ConfigCosts, allreduce: bool = False) -> float:
        """A time no list of this configuration's shape can beat (the module docstring's terms); with
        ``allreduce``, the all-reduces a device cannot overlap count too, and the messages on the chains
        (computed once per stage placement, t, W and partition: a few cost-model calls per stage, so the search
        asks for it only for the candidates it reaches, :meth:`planner.search.Planner.refine`)."""
        cfg = costs.config
        terms = self.terms(costs, messages=allreduce)
        lb = 0.0
        if inflight_exact(cfg.schedule):
            # Little's law: a micro-batch is alive at least for its round trip through every stage, and the
            # lists never keep more than ``k`` alive at once (their stage-0 in-flight peaks, exact), so
            # N micro-batches take at least N * round_trip / k (tight for GEMS' two in flight)
            counts = self.shapes.inflight(cfg, sched)
            k = sum(counts.get((r, 0), 0) for r in range(sched.replicas))
            if k > 0:
                lb = sched.microbatches * terms.round_trip / k
        end, after = self.device_terms(sched, costs, allreduce)
        return max(lb, float((end + after).max()))

    def work_bound(self, costs: ConfigCosts) -> float:
        """A time no list of this configuration's shape can beat, from the layers' compute alone (the module
        docstring): the schedule's ``M`` micro-batches of ``b`` samples over its ``D`` devices, each micro-batch's
        forward (a doubled one: the cheaper of one and half of two) and backward (with recomputation, its recomputed
        forward) through every layer. Cached by what it reads: t, D, W, e and its tensor split (the profile as an
        expert-parallel rank holds it), the rank order where e > 1 (the all-to-alls' groups), the schedule's micro-batch
        size and count, recomputation and doubled forwards."""
        cfg, sched = costs.config, costs.schedule
        b = costs.base_b
        doubled = _doubles_forwards(cfg)
        key = (cfg.tensor, cfg.pipeline, cfg.data, cfg.expert, cfg.expert_tensor, cfg.order if cfg.expert > 1 else None,
               b, sched.microbatches, sched.devices, cfg.recompute, doubled)
        got = self._work_bounds.get(key)
        if got is not None:
            return got
        with costs.fastest_clock():
            f = costs.model_compute("fwd", b) + costs.model_ep_in("F")
            if doubled:
                f = min(f, (costs.model_compute("fwd", 2 * b) + costs.model_ep_in("F", 2)) / 2)
            bw = costs.model_compute("recompute" if cfg.recompute else "bwd", b) + costs.model_ep_in("B")
        got = self._work_bounds[key] = max(0.0, sched.microbatches * (f + bw) / sched.devices * (1.0 - WORK_MARGIN))
        return got

    def terms(self, costs: ConfigCosts, messages: bool = True) -> StageTerms:
        """:class:`StageTerms` of ``costs``, cached per (stage ranges, t, schedule micro-batch size,
        recomputation, doubled forwards, split backward) and, with ``messages`` (the bounds of the candidates the
        search reaches; without, every message counts 0: still a bound, a few cost-model calls per stage fewer for
        the thousands it never reaches), placement (schedule, D and the schedule's parameters: the messages on
        the chains); where a blocking runtime's F and B hold their sends, or every F and B gathers its sharded
        weights (:mod:`planner.fsdp`), per W too."""
        cfg = costs.config
        doubled = _doubles_forwards(cfg)
        split = splits_backward(cfg.schedule)
        # (an F or B holds its stage's expert-parallel all-to-alls, of e and of where the rank order puts the groups)
        key: tuple = (tuple(info.layers for info in costs.stages), costs.t, costs.base_b, cfg.recompute, doubled,
                      split, cfg.expert, cfg.expert_tensor, cfg.order if cfg.expert > 1 else None)
        if costs.blocking_p2p:  # the sends each F and B holds are of the configuration's placement too
            key += (cfg.schedule, cfg.pipeline, cfg.data, cfg.chunks, cfg.waves, cfg.pipelines, cfg.replication,
                    cfg.order)
        elif costs.fsdp_per_microbatch:  # each F and B gathers its weights among the W replicas (planner.fsdp)
            key += (cfg.pipeline, cfg.data, cfg.order)
        # the compute figures are shared by every placement of these stages; the messages on the chains are the
        # placement's (schedule, D and its parameters: the last part of the key; None: without messages)
        key += ((cfg.schedule, cfg.pipeline, cfg.chunks, cfg.waves, cfg.pipelines, cfg.replication, *link_key(cfg))
                if messages else None,)
        got = self._terms.get(key)
        if got is None:
            work = self._work.get(key[:-1])
            if work is None:
                with costs.fastest_clock():  # durations no clock the candidate may hold undercuts
                    work = self._work[key[:-1]] = _work(costs, doubled, split)
            if messages:
                mkey = key[-1] + (key[0], costs.t, costs.base_b, doubled)
                sent = self._messages.get(mkey)
                if sent is None:
                    sent = self._messages[mkey] = _messages(costs, doubled)
            else:
                sent = (np.zeros(len(work[0])), np.zeros(len(work[0])))
            got = self._terms[key] = StageTerms(work, sent, split)
        return got

    def allreduce_times(self, sched: Schedule, costs: ConfigCosts) -> np.ndarray:
        """Per stage, its gradient all-reduce (:meth:`ConfigCosts.allreduce`, which depends on the stage's
        holders, t, W, e, the rank order and the stage's parameters only), cached by those."""
        cfg = costs.config
        key = (cfg.schedule, cfg.pipeline, cfg.replication, cfg.waves, cfg.pipelines, cfg.chunks, costs.t,
               cfg.data, tuple(info.layers for info in costs.stages), costs.base_b, cfg.recompute, cfg.expert,
               cfg.expert_tensor, cfg.order)
        got = self._allreduce.get(key)
        if got is None:
            got = self._allreduce[key] = np.array([costs.allreduce(s, 0, sched.placement[0][s])
                                                   for s in range(sched.stages)])
        return got

    def allreduces_after(self, sched: Schedule, costs: ConfigCosts, st: np.ndarray) -> np.ndarray:
        """Per device (``st``: the layout's stages of each), the all-reduce time that certainly follows its last
        compute action. A stage not all-reduced eagerly is posted at the end of the device's list
        (:func:`planner.schedules.ir.allreduce_points`), and a device's collectives run one after the other
        (:class:`planner.schedules.timing.AllReduces`): all of those, once each. Some stage's gradient is
        completed by the last action, and an eager one is posted then: at least the smallest of the stages'.
        Where the eager stages are not known yet (Chimera's ``auto``, decided on the built lists), only that."""
        times = self.allreduce_times(sched, costs)
        least = times[st].min(axis=1)
        eager = sched.params.get("eager", "none")
        if isinstance(eager, str) and eager != "none":  # "all", or "auto" (decided on the built lists)
            return least
        posted_last = times.copy()
        if eager != "none":
            posted_last[[int(x) for x in eager]] = 0.0
        ordered = np.sort(st, axis=1)  # each stage once, where a device holds copies of it
        at_end = posted_last[ordered]
        at_end[:, 1:][ordered[:, 1:] == ordered[:, :-1]] = 0.0
        return np.maximum(least, at_end.sum(axis=1))

    def device_terms(self, sched: Schedule, costs: ConfigCosts, allreduce: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Per device, a lower bound of the end of its last compute action (``compute_end``: its head and
        work, and with ``allreduce`` its backward windows) and of what must follow it (``after``), the module
        docstring's."""
        cfg = costs.config
        terms = self.terms(costs, messages=allreduce)
        split = splits_backward(cfg.schedule)
        lay = self.shapes.layout(cfg, sched)
        st, n = lay.stage, lay.per_mb
        has = n > 0
        head = np.where(has, terms.head[st], np.inf).min(axis=1)
        head = np.where(np.isfinite(head), head, 0.0)
        end = head + (n * terms.work[st]).sum(axis=1)
        # the backward windows: every backward of pair q starts at T1(q) or later, and so do its forwards
        # beyond the K_q a list can hold before its first backward (exact counts only)
        late = n * terms.bwd[st]
        if inflight_exact(cfg.schedule) and cfg.schedule not in PROFILE_DRIVEN:
            late = late + np.maximum(n - lay.inflight, 0.0) * terms.fwd[st]
        if allreduce:
            t1 = terms.window[st]
            # (devices, h, h) products, a block of devices at a time: the same sums per device, memory
            # bounded (hundreds of MB at once for a few hundred stage copies per device)
            after_t1 = np.empty_like(t1)
            step = max(1, _BLOCK // (t1.shape[1] ** 2))
            for lo in range(0, len(t1), step):
                blk, lt = t1[lo:lo + step], late[lo:lo + step]
                after_t1[lo:lo + step] = (lt[:, None, :] * (blk[:, None, :] >= blk[:, :, None])).sum(axis=2)
            windows = np.where(after_t1 > 0, t1 + after_t1, 0.0).max(axis=1)
            end = np.maximum(end, windows)
        own = np.asarray(costs.step_per_stage())[st].sum(axis=1)
        if allreduce:
            own = own + self.allreduces_after(sched, costs, st)
        if split:
            return end, own
        tail = terms.down[st].min(axis=1)
        return end, np.maximum(own, tail + own.min())

    def release_bound(self, sched: Schedule, costs: ConfigCosts) -> float:
        """:meth:`lower_bound` with the all-reduces, raised by the single-machine bound of every device
        (Carlier 1982, the bound of 1|r_j, q_j|C_max; Jackson's rule): each action ``x`` on the device has a
        release ``r_x`` (it cannot start earlier: the chains of the module docstring), a duration ``p_x``
        and a delivery ``q_x`` (the least time from its end to the iteration's end: for a forward, its
        micro-batch's forwards beyond it, every backward down to stage 0 and the smallest all-reduce and
        step of any device, or its own backward and its device's all-reduce and step; for a backward, the
        backward chain below it and that smallest end, or its device's all-reduce and step). The device runs
        one action at a time, so for any set X of its actions the iteration takes at least
        ``min r + sum p + min q`` over X. The sets tried are those of the actions with ``r >= rho`` and
        ``q >= kappa`` for every (rho, kappa) among the actions' own; the actions come in classes per stage
        replica (forwards before the first backward, forwards after it -- released with the backwards, where
        the in-flight counts are exact --, backwards). With ``rho`` the head and ``kappa`` 0 this is
        :meth:`lower_bound`'s work term; with the backwards only, its windows; with the forwards of the
        last stage, the drain of a 1F1B pipeline (Megatron-LM 2.2.1's ``(p-1)(t_f+t_b)`` bubble)."""
        base = self.lower_bound(sched, costs, allreduce=True)
        cfg = costs.config
        terms = self.terms(costs, messages=True)
        lay = self.shapes.layout(cfg, sched)
        st, n = lay.stage, lay.per_mb
        q_f, q_b, own_c = self._deliveries(sched, costs)
        early = n
        if inflight_exact(cfg.schedule) and cfg.schedule not in PROFILE_DRIVEN:
            early = np.minimum(n, lay.inflight)
        t1 = terms.window[st]
        release = [terms.head[st], t1, t1]
        tail = [q_f, q_f, q_b]
        work = [early * terms.fwd[st], (n - early) * terms.fwd[st], n * terms.bwd[st]]
        if splits_backward(cfg.schedule):  # and its W, after its I, followed by the device's own end only
            q_b[:] = np.maximum(q_b, terms.weight[st] + own_c)
            release.append(t1 + terms.bwd[st] - terms.weight[st])
            tail.append(np.broadcast_to(own_c, st.shape))
            work[2] = n * (terms.bwd[st] - terms.weight[st])
            work.append(n * terms.weight[st])
        return max(base, _single_machine(*(np.concatenate(x, axis=1) for x in (release, tail, work))))

    def _deliveries(self, sched: Schedule, costs: ConfigCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (device, stage replica) of the layout, the delivery of a forward and of a backward (its I when
        split) (:meth:`release_bound`), and per device (a column) its own all-reduce and step."""
        terms = self.terms(costs, messages=True)
        st = self.shapes.layout(costs.config, sched).stage
        own = np.asarray(costs.step_per_stage())[st].sum(axis=1) + self.allreduces_after(sched, costs, st)
        last = own.min()  # the end of any micro-batch's chain: some device's all-reduce and step
        own_c = own[:, None]
        q_f = np.maximum(terms.drain[st] + last, terms.bwd[st] + own_c)
        q_b = np.maximum(terms.down[st] + last, own_c)
        return q_f, q_b, own_c

    def prefix_bound(self, costs: ConfigCosts, warmup: Warmup, allreduce: bool = False) -> float | None:
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
        with costs.fastest_clock():  # (as the stage terms: the clock the candidate holds is not known yet)
            res = simulate(part, costs, compiled=compiled)
        cfg = costs.config
        lay = self.shapes.layout(cfg, shape)
        work = (lay.per_mb * self.terms(costs, messages=allreduce).work[lay.stage]).sum(axis=1)
        _, after = self.device_terms(shape, costs, allreduce)
        bound = 0.0
        ends = np.zeros(len(res.devices))
        for d, st in enumerate(res.devices):
            done = st.busy - (st.step[1] - st.step[0])
            bound = max(bound, st.compute_end + max(0.0, work[d] - done) + after[d])
            ends[d] = st.compute_end
        if not allreduce or splits_backward(cfg.schedule):
            return bound
        # what is left to each device after its prefix, all of it after the prefix's end there: the
        # single-machine bound of release_bound on those forwards and backwards (released at the prefix's
        # end at the earliest), per stage replica -- its micro-batches less the prefix's, counted per (device,
        # stage) from the warm-up's arrays (a device holds a stage once: Chimera, Hanayo)
        terms = self.terms(costs, messages=True)
        rows = np.repeat(np.arange(len(warmup.lists)), warmup.stage.shape[1]).reshape(warmup.stage.shape)
        f_done = np.zeros((len(warmup.lists), shape.stages))
        b_done = np.zeros_like(f_done)
        np.add.at(f_done, (rows, warmup.stage), np.where(warmup.forward, warmup.coef, 0.0))
        np.add.at(b_done, (rows, warmup.stage), warmup.coef == -1.0)
        st, n = lay.stage, lay.per_mb
        at = (np.arange(len(st))[:, None], st)
        q_f, q_b, _ = self._deliveries(shape, costs)
        floor = ends[:, None]
        release = np.concatenate([np.maximum(terms.head[st], floor), np.maximum(terms.window[st], floor)], axis=1)
        tail = np.concatenate([q_f, q_b], axis=1)
        left = np.concatenate([np.maximum(n - f_done[at], 0.0) * terms.fwd[st],
                               np.maximum(n - b_done[at], 0.0) * terms.bwd[st]], axis=1)
        return max(bound, _single_machine(release, tail, left))


def _single_machine(release: np.ndarray, tail: np.ndarray, work: np.ndarray) -> float:
    """The largest ``min r + sum p + min q`` over the sets of a device's action classes with ``r >= rho`` and
    ``q >= kappa``, for every (rho, kappa) among the classes' own, over devices (Carlier's bound,
    :meth:`TimeBounds.release_bound`); ``(devices, classes)`` arrays: release, delivery, total duration of
    each class (classes without work take no part). The same float, bit for bit, as
    :func:`_single_machine_reference` (the formula as written, ``(devices, C, C)`` arrays: GBs for a few hundred
    stage copies per device), in ``(devices, C)`` memory and fewer passes:

    * the classes in order of release, latest first (ties in class order): the members of a set are among
      the first ``cnt(rho)`` of them, so one sweep over that order, adding each class's work to the running
      sum of every kappa it delivers at or after, has every set's total when it reaches the set's rho --
      the reference's running sums, the same additions in the same order (its added zeros skipped), so
      the same floats;
    * classes delivering the same kappa make the same sets: one running sum per distinct delivery;
    * each class tries its release with the kappas it delivers at or after, with the running sums as they
      stand after it: the set of such a pair holds the class (not empty: no check of it), and its total is
      at most that of the class's whole tie of releases (the work is not negative; rounding is monotone).
      The largest value is unchanged: a set with work is that of a pair (rho, kappa) where some class
      released at rho delivers at kappa or later (else rho up to its least release, the same set, a
      larger value), and the last such class of rho's tie has its whole total -- the classes after it in
      the tie do not deliver at kappa;
    * ``rho + total`` is maximised per kappa and kappa added last: ``x -> x + kappa`` rounds monotonically.

    Where a class with work has a negative or infinite release, delivery or work, or the result is not
    finite, it is the reference's (whose ``nan_to_num`` these cases need)."""
    keep = work > 0
    if not keep.any():
        return 0.0
    kept = np.concatenate([release[keep], tail[keep], work[keep]])
    if not (np.isfinite(kept).all() and kept.min() >= 0):
        return _single_machine_reference(release, tail, work)
    rel = np.where(keep, release, np.inf)  # classes without work first, and never tried (delivery -inf)
    order = np.argsort(-rel, axis=1, kind="stable")
    r_sorted = np.take_along_axis(rel, order, axis=1)
    t_sorted = np.take_along_axis(np.where(keep, tail, -np.inf), order, axis=1)
    w_sorted = np.take_along_axis(np.where(keep, work, 0.0), order, axis=1)
    D, C = rel.shape
    # the kappas of each device, ascending: its distinct deliveries of classes with work, padded with inf
    kappa = np.sort(np.where(keep, tail, np.inf), axis=1)
    kappa[:, 1:][kappa[:, 1:] == kappa[:, :-1]] = np.inf
    kappa = np.sort(kappa, axis=1)
    kappa = kappa[:, :int(np.isfinite(kappa).sum(axis=1).max())]
    best = 0.0
    step = max(1, _BLOCK // kappa.shape[1])
    for lo in range(0, D, step):
        hi = min(D, lo + step)
        kap, r, t, w = kappa[lo:hi], r_sorted[lo:hi], t_sorted[lo:hi], w_sorted[lo:hi]
        total = np.zeros(kap.shape)  # per (device, kappa): the running sum of the work delivering at kappa or later
        top = np.full(kap.shape, -np.inf)  # per (device, kappa): the largest rho + total tried
        member, value = np.empty(kap.shape, dtype=bool), np.empty(kap.shape)
        for j in range(int(np.isfinite(r).any(axis=0).argmax()), C):  # (from the first class with work)
            np.less_equal(kap, t[:, j, None], out=member)  # the kappas class j delivers at or after
            np.add(total, w[:, j, None], out=total, where=member)
            np.add(total, r[:, j, None], out=value)
            np.maximum(top, value, out=top, where=member)
        top += np.where(np.isfinite(kap), kap, 0.0)
        best = max(best, float(top.max()))
    if not np.isfinite(best):
        return _single_machine_reference(release, tail, work)
    return best


def _single_machine_reference(release: np.ndarray, tail: np.ndarray, work: np.ndarray) -> float:
    """:func:`_single_machine` as the formula reads (Carlier 1982's bound of 1|r_j, q_j|C_max over the sets
    ``r >= rho``, ``q >= kappa``): ``(devices, C, C)`` arrays, the check of the fast path.

    With the classes in order of release, latest first, the members of a set are among the first ``cnt(rho)``
    of them (those released at ``rho`` or later, ties included): per kappa, a running sum of the work of the
    classes delivering ``>= kappa`` in that order gives every rho's total at once -- (devices, C, C) arrays
    where trying each set alone takes (devices, C, C, C)."""
    keep = work > 0
    release, tail = np.where(keep, release, np.inf), np.where(keep, tail, np.inf)
    order = np.argsort(-release, axis=1, kind="stable")
    t_sorted = np.take_along_axis(tail, order, axis=1)
    w_sorted = np.take_along_axis(np.where(keep, work, 0.0), order, axis=1)
    # sums[d, b, j]: work of the first j+1 classes (latest release first) that deliver at tail[d, b] or later
    sums = np.cumsum(np.where(t_sorted[:, None, :] >= tail[:, :, None], w_sorted[:, None, :], 0.0), axis=2)
    cnt = (release[:, None, :] >= release[:, :, None]).sum(axis=2)  # cnt[d, a]: classes released at rho_a or later
    total = np.take_along_axis(sums, np.broadcast_to((cnt - 1)[:, None, :], sums.shape), axis=2)  # [d, b, a]
    value = np.where(total > 0, release[:, None, :] + total + tail[:, :, None], 0.0)
    return float(np.nan_to_num(value, nan=0.0, posinf=0.0).max())
