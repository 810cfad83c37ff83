"""The search: every valid configuration for a GPU budget, simulated under the cost model and ranked.

For ``P`` GPUs: every ``t`` dividing the GPUs per node (up to ``max_tensor``), ``D`` and ``W`` with
``t D W = P``, micro-batch sizes ``b`` (powers of two dividing ``B^/W``), ``N = B^/(W b)`` micro-batches,
every allowed schedule with its parameters valid for ``D`` and ``N`` (interleaved chunks ``v`` with
``N mod D = 0``; Chimera's ``f`` dividing ``D/2`` and, for ``N > D``, its three concatenations --
forward doubling with recomputation, backward halving without, Chimera 3.5; Hanayo's waves), with and
without recomputation. Chimera's greedy rule (the largest b that fits) is not used as a shortcut: every b
is evaluated.

Pruning, exact for the top ``k``: a configuration whose model state alone exceeds the device memory is
rejected before anything else, and one whose activations certainly overflow (in-flight counts, the forwards
every list runs before its first backward) before its lists exist; every other one gets a lower bound on its
iteration time (:mod:`planner.bounds`: per device its head, computation and backward windows, then its step;
until the search reaches it, the layers' work over the D devices stands in, :meth:`TimeBounds.work_bound`),
is visited in the order of that bound, and is simulated only while the bound is below the k-th best
simulated time. When reached it first gets the tighter bound (:meth:`Planner.refine`: the all-reduces and
the single-machine bound of every device, fill and drain included), and goes back in line if that raised it;
a merged schedule (Chimera, Hanayo) then has its warm-up merged, in rounds of S unit slots, to check its
memory and raise its bound, and the rounds stop once that bound exceeds the k-th best time. Stage costs,
partitions and the merged warm-ups (which depend on the schedule's structure only,
:class:`planner.shapes.Warmup`) are cached across configurations, by value. Deterministic: the same input
gives the same output.

The jobs, one module each: enumeration (:mod:`planner.enumeration`), the schedules and their shapes
(:mod:`planner.shapes`), the memory model (:mod:`planner.memory`), the bounds (:mod:`planner.bounds`),
simulation (:mod:`planner.simulate`), the explanation of a result (:mod:`planner.explain`) and the records
returned (:mod:`planner.candidate`); this module evaluates and ranks. On two cores a forked child ranks part of
the configurations and the parts are merged, exactly (:mod:`planner.split_search`; the command line's
default where a core is idle, one process elsewhere).
"""

from __future__ import annotations

import heapq
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.bounds import TimeBounds
from planner.candidate import Candidate, PlanResult, gib, reason_key
from planner.cluster import Cluster
from planner.cost import ConfigCosts, StageInfo
from planner.enumeration import enumerate_configs, schedule_variants
from planner.equivalence import TopDistinct, Twins, collapse, describe, schedule_label
from planner.expert_parallel import expert_count, expert_error, expert_view
from planner.explain import breakdown, closed_forms
from planner.fsdp import INCOMPATIBLE as FSDP_INCOMPATIBLE
from planner.gcpause import gc_paused
from planner.memory import MemoryModel
from planner.mismatch import device_warnings, size_warnings
from planner.model import tensor_split_error
from planner.partition import PartitionError, balance_by_cost
from planner.placement import DEFAULT_ORDER
from planner.profile import ModelProfile
from planner.replicated import ReplicatedPlans
from planner.request import ASYNC_SCHEDULES, Config, TrainingRequest
from planner.reserve import reserve_error, resolve_reserve
from planner.runspec import schedule_microbatches, schedule_samples
from planner.schedules import inflight_exact
from planner.schedules.ir import Schedule
from planner.shapes import ScheduleCache, Warmup, schedule_key
from planner.simulate import ScheduleError, simulate

__all__ = ["Candidate", "PlanResult", "Planner", "plan", "predict", "schedule_variants"]

#: a bound sums the durations the simulator adds, in another order, so it may exceed the simulated time it bounds
#: by rounding (``tests/test_bounds_tight.py`` allows 1e-9): the search prunes only what is past the k-th best time
#: by more than that, so a twin whose time is the k-th is simulated (and the row named) as evaluating everything does
ROUNDING = 1e-9


@dataclass
class ExpertView:
    """What a configuration of one expert-parallel size evaluates against (:meth:`Planner.view`): the profile as one
    EP rank holds and runs it, its memory model, and the running sums and stage infos its costs share."""

    profile: ModelProfile
    memory: MemoryModel
    layer_sums: dict
    stage_infos: dict


class Planner:
    """Evaluates and ranks the configurations of one (profile, cluster, request); holds its caches."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, request: TrainingRequest) -> None:
        # the reserve's default depends on the cluster's device kind (planner.reserve); resolved once here
        given = request.memory_reserve_bytes is not None
        request, self.reserve_source = resolve_reserve(request, cluster)
        if (why := reserve_error(request.memory_reserve_bytes or 0, cluster.memory_bytes, given)) is not None:
            raise ValueError(why)
        self.profile, self.cluster, self.request = profile, cluster, request
        self.heads = profile.attention_heads  # what t must divide (planner.model.tensor_split_error)
        self.tensor_problem = profile.tensor_split_problem  # why t > 1 is not modelled (None: it is)
        self.shapes = ScheduleCache()
        self.memory = MemoryModel(profile, cluster, request, self.shapes)
        self.bounds = TimeBounds(self.shapes)
        self._partitions: dict[tuple[int, float, bool], list[tuple[int, int]] | None] = {}
        self._layer_costs: dict[tuple[float, bool], list[float]] = {}
        self._layer_sums: dict[tuple[str, float], list[float]] = {}  # ConfigCosts' running sums, shared
        self._stage_infos: dict[tuple[int, int, int], StageInfo] = {}  # ConfigCosts' stage infos, shared
        self._alltoalls: dict[tuple, float] = {}  # ConfigCosts' expert-parallel all-to-all times, by placement
        self._shared: dict[tuple, dict] = {}  # (t, S, samples, recompute, e, etp[, partition]) -> ConfigCosts' caches
        #: per expert-parallel size e, what one EP rank holds and runs (planner.expert_parallel) and its caches
        #: whether some layer holds parameters whole on every tensor rank (views per t then: :meth:`view`)
        self._replicated = any(lay.replicated_params for lay in profile.layers)
        self._views: dict[tuple, ExpertView] = {
            (1, None): ExpertView(profile, self.memory, self._layer_sums, self._stage_infos)}
        # PipeDream's plans call back into the planner through a weak reference: no cycle, so a planner and
        # its caches are freed as soon as it is dropped (no cyclic collection to wait for, or to pay for)
        me = weakref.proxy(self)
        self.replicated = ReplicatedPlans(profile, cluster, request, lambda samples, rc: me.layer_costs(samples, rc),
                                          lambda stages, samples, rc: me._bottleneck(stages, samples, rc))

    def configs(self, rejected: Counter[str]) -> list[Config]:
        """:func:`planner.enumeration.enumerate_configs` for this model (PipeDream's replicated plans come
        on demand in the search: :meth:`planner.replicated.ReplicatedPlans.keys`)."""
        experts = expert_count(self.profile)
        whole = bool(experts) and self.profile.environment.get("sequence_parallel") == "true"
        return enumerate_configs(len(self.profile.layers), self.cluster, self.request, rejected, self.heads,
                                 tensor_parallel=self.tensor_problem is None, experts=experts, whole_experts=whole)

    def view(self, expert: int, whole_at: int | None = None, tensor: int = 1) -> ExpertView:
        """The profile as a rank of an expert-parallel group of ``expert`` holds and runs it (``whole_at``: with its
        experts whole at that t; :func:`planner.expert_parallel.expert_view`), and at tensor-parallel size ``tensor``
        where some of its parameters are held whole on every tensor rank (latent attention's down-projections), with
        its memory model and caches; made once per (e, whole_at[, t])."""
        key = (expert, whole_at, tensor) if tensor > 1 and self._replicated else (expert, whole_at)
        got = self._views.get(key)
        if got is None:
            profile = expert_view(self.profile, expert, whole_at, tensor if len(key) == 3 else None)
            memory = MemoryModel(profile, self.cluster, self.request, self.shapes)
            got = self._views[key] = ExpertView(profile, memory, {}, {})
        return got

    def view_of(self, config: Config) -> ExpertView:
        """:meth:`view` of ``config``'s expert-parallel size and expert tensor parallelism."""
        return self.view(config.expert, config.tensor if config.expert_tensor else None, config.tensor)

    def memory_of(self, config: Config) -> MemoryModel:
        """The memory model of ``config``'s expert-parallel size and expert tensor parallelism."""
        return self.view_of(config).memory

    def _bottleneck(self, stages: int, samples: float, recompute: bool) -> float | None:
        bounds = self.partition(stages, samples, recompute)
        if bounds is None:
            return None
        pc = self.layer_costs(samples, recompute)
        return max(sum(pc[i:j]) for i, j in bounds)

    # ---- the time-balanced partition --------------------------------------------------------------
    def layer_costs(self, samples: float, recompute: bool) -> list[float]:
        key = (samples, recompute)
        v = self._layer_costs.get(key)
        if v is None:
            kind = "recompute" if recompute else "bwd"
            v = [lay.time("fwd", samples) + lay.time(kind, samples) for lay in self.profile.layers]
            self._layer_costs[key] = v
        return v

    def partition(self, stages: int, samples: float, recompute: bool) -> list[tuple[int, int]] | None:
        """Balanced partition into ``stages`` stages by compute (tensor parallelism scales every
        transformer layer alike, so the partition does not depend on t)."""
        key = (stages, samples, recompute)
        if key not in self._partitions:
            try:
                self._partitions[key] = balance_by_cost(self.layer_costs(samples, recompute), stages).bounds
            except PartitionError:
                self._partitions[key] = None
        return self._partitions[key]

    def memory_partition(self, config: Config, sched: Schedule, samples: float) -> list[tuple[int, int]] | None:
        """:meth:`planner.memory.MemoryModel.partition_fitting` with this request's layer costs."""
        return self.memory_of(config).partition_fitting(config, sched, samples,
                                                        self.layer_costs(samples, config.recompute))

    # ---- evaluation ------------------------------------------------------------------------------
    def prepare(self, config: Config, lazy: bool = False) -> tuple[Candidate, ConfigCosts | None]:
        """Build schedule, partition and costs; reject what cannot work before simulating. ``lazy``: the
        candidate's ``lower_bound`` is :meth:`planner.bounds.TimeBounds.work_bound` (a few dictionary reads), and
        the search asks for the bound of its stages' terms once it reaches the candidate (:meth:`_rank`)."""
        req = self.request
        W, b = config.data, config.micro_batch
        N = req.global_batch // (W * b)
        cand = Candidate(config, N, memory_capacity=float(self.cluster.memory_bytes),
                         memory_reserve=float(req.memory_reserve_bytes or 0.0),
                         memory_reserve_source=self.reserve_source, global_batch=req.global_batch,
                         state_bytes_per_param=req.state_bytes_per_param(W), shard_optimizer=req.sharded_state,
                         shard_parameters=req.shard_parameters)
        if config.tensor > 1 and self.tensor_problem is not None:
            cand.reason = self.tensor_problem
            return cand, None
        if self.heads is not None and (why := tensor_split_error(self.heads, config.tensor)) is not None:
            cand.reason = why
            return cand, None
        if req.shard_parameters and config.schedule in FSDP_INCOMPATIBLE:
            cand.reason = (f"schedule: {config.schedule} keeps two copies or versions of a stage in a pipeline group; "
                           "its weights cannot be sharded over the data-parallel replicas (shard_parameters)")
            return cand, None
        if req.global_batch % (W * b):
            cand.reason = f"global batch {req.global_batch} is not a multiple of W*b = {W * b}"
            return cand, None
        if (why := expert_error(self.profile, config.expert, req.shard_parameters, config.expert_tensor)) is not None:
            cand.reason = why
            return cand, None
        n_sched = schedule_microbatches(config, N)
        try:
            sched = self.shapes.schedule(config, n_sched, full=False)
        except ValueError as e:
            cand.reason = f"schedule: {e}"
            return cand, None
        if req.shard_parameters and W > 1 and sched.devices == 1 and sched.stages > 1:
            cand.reason = (f"{config.schedule} at D = 1 with sharded weights: {sched.stages} stages on the one device "
                           "would each gather their layers apart, which no framework runs (D = 1 is plain FSDP: the "
                           "1f1b row)")
            return cand, None
        # the busiest device holds at least the average model state: reject before partitioning
        avg = self.memory_of(config).total_state(W) * sched.replicas / (config.tensor * config.pipeline)
        if avg + req.memory_reserve_bytes > self.cluster.memory_bytes:
            over = avg + req.memory_reserve_bytes - self.cluster.memory_bytes
            cand.reason = (f"weights, gradients and optimizer state do not fit: {sched.replicas} model "
                           f"copies over {config.tensor * config.pipeline} device(s) need {gib(avg)} per device on "
                           f"average + reserve, {gib(over)} over {gib(self.cluster.memory_bytes)}")
            return cand, None
        samples = schedule_samples(config)
        if config.replication is not None:  # PipeDream's partition comes with its replication
            bounds = self.replicated.partition(config)
        else:
            bounds = self.partition(sched.stages, samples, config.recompute)
        if bounds is None:
            cand.reason = f"{len(self.profile.layers)} layers cannot fill {sched.stages} stages"
            return cand, None
        costs = self._costs_fitting(cand, sched, bounds, (config.tensor, sched.stages, samples, config.recompute,
                                                          config.expert, config.expert_tensor))
        if costs is None:
            # the partition balancing time does not fit: one balancing time under the memory limit may
            mem_bounds = self.memory_partition(config, sched, samples)
            if mem_bounds is None or mem_bounds == bounds:
                return cand, None
            reason, memory = cand.reason, cand.memory
            costs = self._costs_fitting(cand, sched, mem_bounds, (config.tensor, sched.stages, samples,
                                                                  config.recompute, config.expert,
                                                                  config.expert_tensor, tuple(mem_bounds)))
            if costs is None:  # (the memory model said it fits: the check below it is the same)
                cand.reason, cand.memory = reason, memory
                return cand, None
            # it fits with this partition: the time-balanced one's rejection is not this candidate's reason
            cand.reason, cand.memory = "", []
        cand.lower_bound = self.bounds.work_bound(costs) if lazy else self.bounds.lower_bound(sched, costs)
        return cand, costs

    def _costs_fitting(self, cand: Candidate, sched: Schedule, bounds: list[tuple[int, int]],
                       ckey: tuple) -> ConfigCosts | None:
        """The costs of ``cand`` with partition ``bounds``, or None (``cand.reason`` says why) when its
        model state or its in-flight activations (exact, or a lower bound) do not fit. ``ckey`` names
        what the costs share with other configurations (t, stages, samples, recomputation, e, partition)."""
        config, req = cand.config, self.request
        cand.partition = [list(x) for x in bounds]
        shared = self._shared.setdefault(ckey, {})
        view = self.view_of(config)
        costs = ConfigCosts(view.profile, self.cluster, req, config, sched, bounds,
                            held=self.shapes.pairs(config, sched), shared=shared, layer_sums=view.layer_sums,
                            stage_cache=view.stage_infos, alltoalls=self._alltoalls)
        memory = view.memory
        state = cand.state = memory.device_state(config, sched, costs, ckey)
        worst = max(range(len(state)), key=lambda d: state[d])
        if state[worst] + req.memory_reserve_bytes > self.cluster.memory_bytes:
            over = state[worst] + req.memory_reserve_bytes - self.cluster.memory_bytes
            cand.reason = (f"weights, gradients and optimizer state do not fit: device {worst} needs "
                           f"{gib(state[worst])} + reserve, {gib(over)} over {gib(self.cluster.memory_bytes)}")
            cand.memory = [s + req.memory_reserve_bytes for s in state]
            return None
        # activations: the in-flight counts of the schedule (exact, or a lower bound), before any list exists
        act = shared.get("activation")
        if act is None:
            act = shared["activation"] = np.array([costs.activation(s) for s in range(sched.stages)])
        # per device, activations certainly alive at once (of the schedule's structure and these costs' figures)
        floors = shared.setdefault("floors", {})
        skey = schedule_key(config, sched.microbatches)
        floor = floors.get(skey)
        if floor is None:
            lay = self.shapes.layout(config, sched)
            alive = lay.inflight * act[lay.stage]
            if lay.held is not None:  # a split backward's I's hold output gradients too, where they peak
                alive = alive + lay.held * np.array([costs.held_grads(s) for s in range(sched.stages)])[lay.stage]
            floor = alive.max(axis=1)
            got = self.shapes.forwards_first(config, sched)
            if got is not None:  # the forwards every device's list runs before its first backward, all alive
                first, span = got
                if first.ndim == 1:  # a count of forwards in its first slots (merged lists)
                    floor = np.maximum(floor, span * memory.first_slots_floor(first, lay.stage, lay.per_mb,
                                                                                   act))
                else:  # per stage it holds
                    floor = np.maximum(floor, span * (first * act[lay.stage]).sum(axis=1))
            floor = floors[skey] = floor.tolist()
        if memory.too_big(cand, floor):
            return None
        return costs

    def refine(self, cand: Candidate, costs: ConfigCosts, kth: float = float("inf")) -> bool:
        """:meth:`_refine`. On a shared CPU host the bounds are of the work alone (core share 1): the share is a
        fixed point over the lists the candidate is timed with (:meth:`ConfigCosts.use_schedule`), which the
        partial lists bounded here are not, and every share is at least 1, so such bounds hold whatever it is.
        (Under a power limit the bounds read the fastest clock themselves: :mod:`planner.bounds`.)"""
        if costs.cluster.host is None:
            return self._refine(cand, costs, kth)
        with costs.unit_share():
            return self._refine(cand, costs, kth)

    def _refine(self, cand: Candidate, costs: ConfigCosts, kth: float = float("inf")) -> bool:
        """Raise ``cand.lower_bound`` before the candidate is simulated, cheapest first, and for merged
        schedules (Chimera, Hanayo) reject on the warm-up's memory before the whole merge (True).

        First the bound with the all-reduces no device can overlap (:meth:`TimeBounds.lower_bound` with
        ``allreduce``: a few cost-model calls per stage, paid only by the candidates the search reaches);
        a candidate it puts past ``kth`` (the search's k-th best time so far) goes no further: no merge,
        no memory check. Then, for merged schedules, the warm-up is merged in rounds of S unit slots
        (:meth:`MemoryModel.too_big_before_merge`) and the bound raised to that of the replayed warm-up
        (:meth:`TimeBounds.prefix_bound`); from the second round on, once that bound exceeds ``kth`` the
        rounds stop there: the candidate cannot be among the k best whatever the rest of the merge holds.
        The bound of any round is a true one: the merge runs an action only at a slot after its inputs have
        ended (:class:`planner.schedules.merge.ListScheduler`), so the first ``u`` slots of every device
        hold the inputs of everything in them -- a prefix closed under inputs, which is what
        :meth:`TimeBounds.prefix_bound` needs; the bounds of the rounds computed are combined by max.
        Exact for the top k; only a candidate that a later round (or the warm-up's memory) would have
        rejected on memory is then counted as pruned by its bound instead."""
        cand.refined = True
        cand.lower_bound = max(cand.lower_bound, self.bounds.release_bound(costs.schedule, costs))
        if inflight_exact(cand.config.schedule) or cand.lower_bound > kth:
            return False
        S = costs.schedule.stages
        bounded: list[Warmup] = []

        def enough(warmup: Warmup) -> bool:
            if kth == float("inf") or warmup.slots < 2 * S:
                return False
            self._raise_bound(cand, costs, warmup)
            bounded.append(warmup)
            return cand.lower_bound > kth

        rejected, warmup = self.memory_of(cand.config).too_big_before_merge(
            cand, costs, schedule_microbatches(cand.config, cand.microbatches), enough)
        if rejected:
            return True
        if warmup is not None and warmup not in bounded:
            self._raise_bound(cand, costs, warmup)
        return False

    def _raise_bound(self, cand: Candidate, costs: ConfigCosts, warmup: Warmup) -> None:
        bound = self.bounds.prefix_bound(costs, warmup, allreduce=True)
        if bound is not None:
            cand.lower_bound = max(cand.lower_bound, bound)

    def evaluate(self, cand: Candidate, costs: ConfigCosts) -> Candidate:
        """Simulate the full schedule and fill in time and memory (the breakdown comes with
        :meth:`explain`, for the candidates that are returned)."""
        cfg, req = cand.config, self.request
        cand.costs = costs
        exact = inflight_exact(cfg.schedule)
        if not exact and not cand.refined and self.refine(cand, costs):
            return cand
        sched = self.shapes.schedule(cfg, schedule_microbatches(cfg, cand.microbatches))
        costs.use_schedule(sched)
        if not exact:
            # activations before simulating: the in-flight counts depend on the list order alone, so the
            # largest single stage's peak is a lower bound of the device's peak (exact with one stage)
            memory = self.memory_of(cfg)
            counts = memory.list_inflight(cfg, sched)
            if memory.too_big(cand, [max((c * costs.activation(s) for s, c in counts[d].items()), default=0.0)
                                     for d in range(cfg.pipeline)]):
                return cand
        if self.out_of_memory(cand, costs, sched, exact):
            return cand
        try:
            compiled = self.shapes.compiled(cfg, sched)
            res = costs.hold_clock(simulate(sched, costs, compiled=compiled),
                                   lambda: simulate(sched, costs, compiled=compiled))
            cand.held_rate = costs.held_rate
        except ScheduleError as e:  # pragma: no cover - builders are validated by the tests
            cand.reason = f"schedule error: {e}"
            return cand
        cand.simulation = res
        cand.iteration_time = res.makespan
        cand.throughput = req.global_batch / res.makespan if res.makespan > 0 else 0.0
        cand.bubble_ratio = res.bubble_ratio
        mem = cand.memory = self.memory_of(cfg).simulated_memory(cand, costs, res)
        worst = max(range(len(mem)), key=lambda d: mem[d])
        cand.fits = mem[worst] <= self.cluster.memory_bytes
        if not cand.fits:
            over = mem[worst] - self.cluster.memory_bytes
            cand.reason = (f"out of memory: device {worst} needs {gib(mem[worst])}, "
                           f"{gib(over)} over {gib(self.cluster.memory_bytes)}")
        return cand

    def out_of_memory(self, cand: Candidate, costs: ConfigCosts, sched: Schedule, exact: bool) -> bool:
        """Reject, before simulating, what the simulation would find out of memory, where the checks before
        it may not have seen it: a device that holds several stages, or a split backward's I holding output
        gradients until W (zero-bubble; not in the in-flight counts). The simulated peak of a device's
        activations depends on its list's order alone (:meth:`planner.memory.MemoryModel.list_peaks` counts
        it as the simulator does), so the candidate gets the memory and the reason the simulation would give
        it (not its time). Without held gradients, counted only when the sum of its stages' own peaks -- at
        least the device's peak -- does not already fit."""
        lay = self.shapes.layout(cand.config, sched)
        memory = self.memory_of(cand.config)
        held = any(costs.held_grads(s) for s in range(sched.stages))
        cap = self.cluster.memory_bytes
        if not held:
            if lay.stage.shape[1] < 2:
                return False  # one stage per device: the in-flight check before it is the simulated peak
            if exact:
                per_stage = lay.inflight
            else:
                counts = memory.list_inflight(cand.config, sched)
                per_stage = np.array([[counts[d].get(s, 0) for s in row] for d, row in enumerate(lay.stage.tolist())],
                                     dtype=float)
            act = np.array([costs.activation(s) for s in range(sched.stages)])
            upper = (per_stage * act[lay.stage]).sum(axis=1).tolist()
            if max(memory.peak_memory(cand, costs, upper)) <= cap * (1 - 1e-9):
                return False
        mem = memory.peak_memory(cand, costs, memory.list_peaks(sched, costs))
        worst = max(range(len(mem)), key=lambda d: mem[d])
        if mem[worst] <= cap:
            return False
        cand.memory = mem
        cand.reason = (f"out of memory: device {worst} needs {gib(mem[worst])}, "
                       f"{gib(mem[worst] - cap)} over {gib(cap)}")
        return True

    def explain(self, cand: Candidate) -> Candidate:
        """Time breakdown and the papers' closed forms of a simulated candidate (:mod:`planner.explain`)."""
        if cand.simulation is not None and cand.costs is not None and not cand.breakdown:
            cand.breakdown = breakdown(cand.simulation, cand.costs)
            cand.closed_forms = closed_forms(cand.simulation, cand.costs, cand.microbatches)
        return cand

    # ---- ranking ---------------------------------------------------------------------------------
    def search(self, prune: bool = True, processes: int | None = 1) -> PlanResult:
        """Rank the configurations; ``prune=False`` simulates every one (the tests compare the two).
        ``processes=2`` searches on two cores where the search is large enough and ``os.fork`` exists
        (:mod:`planner.split_search`: the same result, exact); ``None``: so too where a core is idle
        (:func:`planner.split_search.spare_core`); the default is one process."""
        with gc_paused():
            return self._search(prune, processes)

    def _search(self, prune: bool, processes: int | None = 1) -> PlanResult:
        rejected: Counter[str] = Counter()
        configs = self.configs(rejected)
        # PipeDream's replicated plans (t, D, W, b, recomputation): decided over every configuration at once
        rr_keys = self.replicated.keys(configs, self.memory.total_state)  # (per W: the optimizer may be sharded)
        parts = None
        if prune and (processes is None or processes > 1):
            from planner.split_search import search_split

            parts = search_split(self, configs, rr_keys, auto=processes is None)
        if parts is None:
            parts = [self._rank(configs, rr_keys, prune)]
        return _merge(parts, rejected, self.request.top)

    def _rank(self, configs: list[Config], rr_keys: list[tuple[int, int, int, int, bool]], prune: bool,
              mine: Callable[[int, int], bool] | None = None,
              top: TopDistinct | None = None) -> Ranked:
        """The search over ``configs`` (and the replicated plans ``rr_keys``), or over the part of them whose
        (D, N) ``mine`` accepts; ``top``: the pruning threshold (default: this part's own)."""
        rejected: Counter[str] = Counter()
        k = self.request.top
        prepared: list[tuple[float, int, Candidate, ConfigCosts | None]] = []
        infeasible: list[Candidate] = []
        evaluated = 0
        #: the candidates in line under their work bound (prepare's ``lazy``): reached, each gets the bound of its
        #: stages' terms and goes back in line if that raised it -- candidates are refined and simulated in the order
        #: of the terms' bounds (or of the work bound, where it is the higher), with thousands fewer of those
        #: computed (Qwen3-30B-A3B on 64 H100s: 10,984 of 12,074 sit in (t, D, W, b, e) groups whose every
        #: bound exceeds the k-th best time)
        unbounded: set[int] = set()
        # what prepare rejects does not depend on the rank order (memory, shapes, sizes: only the times do), and the
        # enumeration puts a configuration's other order right after it: a twin of a rejected one is rejected alike
        refused: tuple[Config, str] | None = None
        for i, cfg in enumerate(configs):
            if mine is not None and not mine(cfg.pipeline, self.request.global_batch // (cfg.data * cfg.micro_batch)):
                continue
            evaluated += 1
            if refused is not None and cfg.order != DEFAULT_ORDER and \
                    refused[0] == cfg.model_copy(update={"order": DEFAULT_ORDER}):
                rejected[refused[1]] += 1
                continue
            cand, costs = self.prepare(cfg, lazy=prune)
            if costs is None:
                refused = (cfg, reason_key(cand.reason))
                rejected[refused[1]] += 1
                if cand.memory:
                    infeasible.append(cand)
                    _keep_best(infeasible, k)
                continue
            prepared.append((cand.lower_bound, i, cand, costs))
            if prune:
                unbounded.add(i)
        considered = len(prepared)
        # PipeDream's replicated plans: in line under their bound; the program runs when one comes up
        pending: dict[int, tuple[int, int, int, int, bool]] = {}
        for n, key in enumerate(rr_keys):
            t, D, W, b, rc = key
            if mine is not None and not mine(D, self.request.global_batch // (W * b)):
                continue
            evaluated += 1
            i = len(configs) + n
            pending[i] = key
            cfg = Config(tensor=t, pipeline=D, data=W, micro_batch=b, schedule="1f1b-rr", recompute=rc)
            cand = Candidate(cfg, self.request.global_batch // (W * b))
            cand.lower_bound = self.replicated.bound(*key)
            prepared.append((cand.lower_bound, i, cand, None))
        # best first: the candidate with the smallest bound next; a merged schedule's bound is first
        # refined with its warm-up and the candidate goes back in line, so the costly merge is paid only
        # once nothing with a smaller bound is left. Exact: whatever is skipped has a bound above the k-th
        # best time found, which only falls as the search goes on.
        heapq.heapify(prepared)
        ids = len(configs) + len(rr_keys)  # (a replicated plan's variant j > 0 goes in line as i + j * ids)
        top = top if top is not None else TopDistinct(k)  # k-th best time over configurations that differ
        results: list[Candidate] = []
        timed: list[tuple[float, int, Candidate]] = []  # max-heap by time of the results holding a timeline
        simulated = 0
        while prepared:
            lb, i, cand, maybe = heapq.heappop(prepared)
            if prune and lb > top.kth * (1 + ROUNDING):
                rejected["bound: cannot reach the top k"] += 1 + len(prepared)  # and every one after it
                break
            if maybe is None:  # a replicated plan's turn: run PipeDream's program, prepare, back in line
                rrs = self.replicated.configs(*pending[i])  # 1f1b-rr, and pipedream-rr under allow_async
                if not rrs:
                    rejected["1f1b-rr: replication cannot beat the uniform plans"] += 1
                for j, rr in enumerate(rrs):
                    cand, costs = self.prepare(rr)
                    if costs is None:
                        rejected[reason_key(cand.reason)] += 1
                        if cand.memory:
                            infeasible.append(cand)
                        continue
                    considered += 1
                    heapq.heappush(prepared, (cand.lower_bound, i + j * ids, cand, costs))
                continue
            costs = maybe
            if i in unbounded:
                unbounded.discard(i)
                cand.lower_bound = max(lb, self.bounds.lower_bound(costs.schedule, costs))
                if cand.lower_bound > lb:
                    heapq.heappush(prepared, (cand.lower_bound, i, cand, costs))
                    continue
            if prune and not cand.refined:
                if self.refine(cand, costs, top.kth * (1 + ROUNDING)):
                    rejected[reason_key(cand.reason)] += 1
                    infeasible.append(cand)
                    continue
                if cand.lower_bound > lb:
                    heapq.heappush(prepared, (cand.lower_bound, i, cand, costs))
                    continue
            self.evaluate(cand, costs)
            simulated += 1
            if cand.fits:
                results.append(cand)
                top.add(cand)
            else:
                rejected[reason_key(cand.reason)] += 1
                infeasible.append(cand)
            # memory that does not grow with the candidates simulated: a simulated timeline, and the action lists
            # it was simulated on, are kept only while the candidate can still be among the k returned or listed
            # as a twin of one (k-th best time over twins only falls; a twin compared later is rebuilt from its
            # run spec, :func:`planner.equivalence.full_schedule`), and only the k best infeasible candidates are
            # kept (gpt-tiny on the local 4-process cluster, B^ = 8192: 560 MB at most, 228 MB without the
            # lists; B^ = 32768 ran past the API's 1.5 GiB planner memory)
            if cand.fits and cand.simulation is not None:
                heapq.heappush(timed, (-cand.iteration_time, i, cand))
            while timed and -timed[0][0] > top.kth * (1 + ROUNDING):
                gone = heapq.heappop(timed)[2]
                gone.simulation = None
                if gone.costs is not None:
                    gone.costs.schedule = None
            _keep_best(infeasible, k)
        results.sort(key=_rank_key)
        rows = collapse(results, top.twins)[:k]
        infeasible.sort(key=_rank_key)
        del infeasible[k:]
        twin_of = _twin_indices(infeasible)  # twins that do not fit are one row too (collapsed in _merge)
        for c in rows + [c for c, j in zip(infeasible, twin_of, strict=True) if j is None]:
            self.explain(c)
        return Ranked(rows, infeasible, twin_of, rejected, evaluated, simulated, considered)


@dataclass
class Ranked:
    """What one search (or one part of a split search, :mod:`planner.split_search`) found: its ``k`` best
    rows (twins collapsed, named, explained), its ``k`` best candidates that do not fit, best first, with
    ``twin_of[j]``: the index of the earlier one that runs the same thing as ``infeasible[j]`` (None: a row
    of its own, named), and its counts. Twins never cross parts (:func:`planner.split_search.split_parts`)."""

    rows: list[Candidate]
    infeasible: list[Candidate]
    twin_of: list[int | None]
    rejected: Counter[str]
    evaluated: int
    simulated: int
    considered: int


def _twin_indices(cands: list[Candidate]) -> list[int | None]:
    """For ``cands`` (ranked, best first): per candidate, the index of the first earlier one running the same
    thing (:class:`planner.equivalence.Twins`), or None; those get their row's name (``describe``)."""
    twins = Twins()
    where: dict[int, int] = {}
    out: list[int | None] = []
    for j, cand in enumerate(cands):
        first = twins.add(cand)
        if first is cand:
            where[id(cand)] = j
            cand.name = describe(cand)
            out.append(None)
        else:
            out.append(where[id(first)])
    return out


def _merge(parts: list[Ranked], rejected: Counter[str], k: int) -> PlanResult:
    """The result of the whole search from its parts: the ``k`` best rows of all (exact when each part holds
    every row of its own that can be among the k best overall, and twins never cross parts), and the rows
    of the ``k`` best candidates that do not fit, their twins collapsed into the first (as
    :func:`planner.equivalence.collapse` does). ``rejected``: what the enumeration rejected (counted in
    ``evaluated`` too, with the configurations the parts evaluated).

    A row lists as ``alternatives`` the twins whose own time is within the k-th best row's (all of them while
    there are fewer than k rows): those, and only those, every search simulates whatever its order. A slower
    twin past it (Hanayo's waves at D = 1 add an all-reduce per stage to 1F1B's computation) is skipped by its
    bound or simulated depending on when the search reaches it -- in one process or two, pruned or not -- and
    listing it would make the same request's rows differ with the machine's load."""
    rows = list(heapq.merge(*(p.rows for p in parts), key=_rank_key))[:k]
    if len(rows) == k:
        kth = rows[-1].iteration_time * (1 + ROUNDING)
        for c in rows:
            kept = [(a, t) for a, t in zip(c.alternatives, c.alternative_times, strict=True) if t <= kth]
            c.alternatives, c.alternative_times = [a for a, _ in kept], [t for _, t in kept]
    tagged = heapq.merge(*([(c, p, j) for j, c in enumerate(p.infeasible)] for p in parts),
                         key=lambda x: _rank_key(x[0]))
    infeasible: list[Candidate] = []
    for c, p, j in list(tagged)[:k]:
        first = p.twin_of[j]
        if first is None:
            infeasible.append(c)
        else:
            p.infeasible[first].alternatives.append(schedule_label(c.config))
            p.infeasible[first].alternative_times.append(c.iteration_time)
    total = Counter(rejected)
    for p in parts:
        total.update(p.rejected)
    # the combinations the enumeration rejected count as tried: a plan whose every (t, D, b) is rejected there
    # has "6 rejected of 6 tried", not "of 0"
    return PlanResult(rows, infeasible, total, evaluated=sum(p.evaluated for p in parts) + sum(rejected.values()),
                      simulated=sum(p.simulated for p in parts), considered=sum(p.considered for p in parts))


def _rank_key(c: Candidate) -> tuple[float, str]:
    return (c.iteration_time, c.config.label())


def _keep_best(cands: list[Candidate], k: int) -> None:
    """Trim ``cands`` to its ``k`` best by :func:`_rank_key`: the list holds at most ``k + 1`` candidates
    whatever the number of configurations (a sort of ``k + 1`` per simulated candidate, small beside the
    simulation), and the ``k`` kept are the ones a full sort at the end would give."""
    if len(cands) > k:
        cands.sort(key=_rank_key)
        del cands[k:]


def plan(profile: ModelProfile, cluster: Cluster, request: TrainingRequest,
         processes: int | None = 1) -> PlanResult:
    """Rank every valid configuration (module docstring); ``processes``: 2 or None (where a core is idle) to
    search on two cores where the search is large enough (:meth:`Planner.search`). The planner (its caches)
    is dropped before the garbage collector resumes, so the collection that follows visits the results only."""
    with gc_paused():
        res = Planner(profile, cluster, request).search(processes=processes)
    res.warnings = device_warnings(profile, cluster, request) + size_warnings(
        profile, (c.config.micro_batch for c in res.candidates if c.fits))
    return res


def predict(profile: ModelProfile, cluster: Cluster, request: TrainingRequest, config: Config) -> Candidate:
    """The same record as :func:`plan` gives, for one configuration the user names."""
    if config.schedule in ASYNC_SCHEDULES and not request.allow_async:
        request = request.model_copy(update={"allow_async": True})
    planner = Planner(profile, cluster, request)
    cand, costs = planner.prepare(config)
    if costs is None:
        return cand
    return planner.explain(planner.evaluate(cand, costs))
