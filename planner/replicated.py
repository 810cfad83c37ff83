"""PipeDream's plans for the search: for a configuration's ``D`` devices per pipeline group (t, W, b and
recomputation given), the A(j, m) partition (Harlap et al., SOSP'19, section 3.2;
:func:`planner.partition.pipedream_partition_arrays`) with this cluster's costs, as a ``1f1b-rr``
configuration (:mod:`planner.schedules.one_f_one_b_rr`) competing with the rest, and under ``allow_async`` as
its asynchronous twin ``pipedream-rr`` (weight stashing, :mod:`planner.schedules.pipedream_rr`; the same
partition, its stashed weight versions costed in memory by :mod:`planner.memory`).

The program's inputs, PipeDream's symbols mapped to ours:

* ``T_l`` -- layer ``l``'s forward + backward at the micro-batch size (the profile, interpolated), over
  ``t`` and the tensor-parallel efficiency (its tensor-parallel all-reduces left out: they scale every
  transformer layer alike);
* ``C_l`` -- the boundary activation after layer ``l`` (``b`` samples, ``1/t`` of it per tensor rank) sent on the
  pipeline's link (intra-node when the group's ``D t`` GPUs fit in a node, else inter-node;
  :func:`planner.cost.collective_time` ``p2p``);
* memory -- a stage whose model state (``bytes_per_param`` per parameter over ``t``) and the reserve do not
  fit a device is left out of the program (PipeDream's has no memory term); with a sharded optimizer
  (``shard_optimizer``) the gates on computation alone (:meth:`ReplicatedPlans.can_differ`) keep the whole
  state, the program and the bound shard it over the W groups (not over a stage's m replicas: an upper bound);
* ``W^m`` -- the weight synchronisation of a stage replicated ``m`` times: with a flush it is one gradient
  all-reduce per iteration among the ``m W`` copies (:func:`planner.cost.allreduce_time`, on the ranks the
  placement gives: the stage's ``m`` devices in each of the W groups, in the default rank order, the one these
  configurations are planned in: :mod:`planner.placement`) and the optimizer step, once per
  iteration after the last backward: they add to the computation instead of overlapping it (PipeDream's
  ``max``), ``T(i -> j, m) = (sum T_l + m (AR + step) / N) / m`` per micro-batch.

Only where replication can differ from uniform plans: a replicated stage of ``m`` devices does at best ``1/m`` of
its layers' work per micro-batch, so no plan beats ``sum T_l / D`` per device, and the uniform plans with ``D'``
stages (``D'`` dividing ``D``, every stage ``D / D'`` times, which the search enumerates as ``W D / D'`` copies;
those whose average model state fits a device) reach ``U(D') D' / D`` with ``U`` the balanced partition's slowest
stage. When one of them is within :data:`BALANCED` of the ideal, replication cannot improve the compute balance and
the program is not run (uniform transformer stacks: balanced for some ``D'``). Nor when the program on computation
alone, with every replica holding its stage's state (:meth:`ReplicatedPlans.balance_with_memory`, run once per
t and recomputation in a search), comes within :data:`BALANCED` of the best uniform
plan (GPT-3 175B: a device holds few blocks, so replicas cannot take the extra blocks off the slowest stage); nor
when its answer replicates every stage alike (that plan is a uniform one).

The search puts each remaining (t, D, W, b, recomputation) in line under a bound of its own
(:meth:`ReplicatedPlans.bound`: computation and step spread evenly over the devices) and runs
the program only when its turn comes, so it is bounded like the rest."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from planner.cluster import Cluster
from planner.cost import allreduce_time, collective_time
from planner.enumeration import divisors
from planner.partition import (
    PartitionError,
    PipeDreamPlan,
    pipedream_partition_arrays,
    pipedream_slowest,
    prefix_sums,
    weighted_partition,
)
from planner.placement import DEFAULT_ORDER, global_rank
from planner.profile import ModelProfile
from planner.request import Config, TrainingRequest
from planner.runspec import schedule_samples
from planner.schedules.ir import Schedule
from planner.schedules.one_f_one_b_rr import parse_replication, replication_label

#: how close to the ideal per-device compute a uniform plan must come for replication to be skipped
BALANCED = 0.05


class ReplicatedPlans:
    """PipeDream's partitions of one search, cached per (t, D, W, b, recomputation, N)."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, request: TrainingRequest,
                 layer_costs: Callable[[float, bool], list[float]],
                 uniform_bottleneck: Callable[[int, float, bool], float | None]) -> None:
        self.profile, self.cluster, self.request = profile, cluster, request
        self.layer_costs, self.uniform_bottleneck = layer_costs, uniform_bottleneck
        self._plans: dict[tuple, PipeDreamPlan | None] = {}
        self._bounds_of: dict[Config, list[tuple[int, int]]] = {}  # a 1f1b-rr configuration's layer ranges
        self._balance: dict[tuple, np.ndarray] = {}
        self._fit: dict[int, np.ndarray] = {}

    # ---- what the search asks ---------------------------------------------------------------------
    def keys(self, configs: list[Config], total_state: Callable[[int], float]) -> list[tuple[int, int, int, int, bool]]:
        """The (t, D, W, b, recomputation) of ``configs`` for which PipeDream's replicated plan can differ
        from the uniform ones (:meth:`can_differ`) and whose average model state (``total_state(W)`` bytes:
        :meth:`planner.memory.MemoryModel.total_state`) fits: the search bounds each (:meth:`bound`) before
        running the program (:meth:`config`)."""
        if not self.variants():
            return []
        room = self.cluster.memory_bytes - self.request.memory_reserve_bytes
        keys = list(dict.fromkeys((c.tensor, c.pipeline, c.data, c.micro_batch, c.recompute) for c in configs))
        keys = [k for k in keys if total_state(k[2]) / (k[0] * k[1]) <= room]
        # a gate, decided once per (t, D, recomputation) at the smallest b (how the layers' times compare
        # barely moves with b), the largest D first (the program on computation alone for D answers every
        # smaller D)
        gate: dict[tuple[int, int, bool], bool] = {}
        for t, D, _, b, rc in sorted(keys, key=lambda k: (-k[1], k[3])):
            if (t, D, rc) not in gate:
                gate[(t, D, rc)] = self.can_differ(t, D, b, rc)
        return [k for k in keys if gate[(k[0], k[1], k[4])]]

    def bound(self, t: int, D: int, W: int, b: int, recompute: bool) -> float:
        """A time no replicated plan of (t, D, W, b) beats: the ``N`` micro-batches' computation and the
        optimizer step spread evenly over the ``D`` devices (the busiest device does at least the average;
        the step as :meth:`planner.cost.ConfigCosts.step`: the model state read and written once)."""
        N = self.request.global_batch // (W * b)
        eff = 1.0 if t == 1 else self.request.tensor_efficiency
        step = self.profile.total_params * 2 * self.request.state_bytes_per_param(W) / self.cluster.memory_bandwidth
        return (N * sum(self.layer_costs(b, recompute)) / eff + step) / (t * D)

    def variants(self) -> list[str]:
        """The replicated schedules the request allows: ``1f1b-rr`` (synchronous, a flush) and, under
        ``allow_async``, ``pipedream-rr`` (weight stashing, :mod:`planner.schedules.pipedream_rr`); both take
        the same A(j, m) partition (one weight synchronisation per iteration or window in either)."""
        allowed = self.request.allowed()
        return [n for n in ("1f1b-rr", "pipedream-rr") if n in allowed]

    def configs(self, t: int, D: int, W: int, b: int, recompute: bool) -> list[Config]:
        """:meth:`config` in every allowed variant (:meth:`variants`); empty where replication cannot
        differ from a uniform plan."""
        cfg = self.config(t, D, W, b, recompute)
        if cfg is None:
            return []
        out = []
        for name in self.variants():
            c = cfg if name == cfg.schedule else cfg.model_copy(update={"schedule": name})
            self._bounds_of[c] = self._bounds_of[cfg]
            out.append(c)
        return out

    def config(self, t: int, D: int, W: int, b: int, recompute: bool) -> Config | None:
        """The ``1f1b-rr`` configuration of PipeDream's A(j, m) partition on ``D`` devices (None where it
        cannot differ from a uniform plan); its layer ranges are kept for :meth:`partition`."""
        N = self.request.global_batch // (W * b)
        got = self.plan(t, D, W, b, recompute, N)
        if got is None:
            return None
        cfg = Config(tensor=t, pipeline=D, data=W, micro_batch=b, schedule="1f1b-rr", recompute=recompute,
                     replication=replication_label(got.replicas))
        self._bounds_of[cfg] = got.bounds
        return cfg

    def partition(self, config: Config) -> list[tuple[int, int]] | None:
        """Layer ranges of a ``1f1b-rr`` configuration: PipeDream's when its replication is the program's
        (also for one the user names, :func:`planner.search.predict`), else balanced across the stages by
        compute per replica (:func:`planner.partition.weighted_partition`)."""
        if config in self._bounds_of:
            return self._bounds_of[config]
        cfg = self.config(config.tensor, config.pipeline, config.data, config.micro_batch, config.recompute)
        if cfg is not None and cfg.replication == config.replication:
            return self._bounds_of[cfg]
        reps = parse_replication(config.replication or "", config.pipeline)
        if len(reps) > len(self.profile.layers):
            return None
        return weighted_partition(self.layer_costs(schedule_samples(config), config.recompute), reps)

    def can_differ(self, t: int, D: int, samples: float, recompute: bool) -> bool:
        """Whether some replicated plan can balance compute better than every uniform one whose average
        model state fits a device (module docstring)."""
        if D < 2:
            return False
        ideal = sum(self.layer_costs(samples, recompute)) / D
        state = self.profile.total_params * self.request.bytes_per_param
        room = self.cluster.memory_bytes - self.request.memory_reserve_bytes
        uniform = math.inf
        for d in divisors(D):
            if state / (t * d) > room:
                continue  # (the search rejects these uniform plans before partitioning)
            u = self.uniform_bottleneck(d, samples, recompute)
            if u is not None:
                uniform = min(uniform, u * d / D)
        if uniform <= ideal * (1 + BALANCED):
            return False
        # the best compute balance a replicated plan reaches where each replica holds its stage's state
        return self.balance_with_memory(t, D, samples, recompute) * (1 + BALANCED) < uniform

    def balance_with_memory(self, t: int, D: int, samples: float, recompute: bool) -> float:
        """A(L, D) of the program on computation alone, the stages whose state does not fit left out: the
        slowest replica's work per micro-batch of the best-balanced replicated plan. A gate, so computed
        once per (t, recomputation) on the layer costs of the first micro-batch size asked, as shares of
        the model's total (how the layers' times compare barely moves with b), and scaled to ``samples``'
        total; one run for the largest D answers every smaller D (the search asks the largest first)."""
        total = sum(self.layer_costs(samples, recompute))
        if total <= 0:
            return 0.0
        key = (t, recompute)
        got = self._balance.get(key)
        if got is None or len(got) <= D:
            costs = np.asarray(self.layer_costs(samples, recompute), dtype=float) / total
            got = self._balance[key] = pipedream_slowest(costs, [0.0] * len(costs), D, self._fits(t))
        return float(got[D]) * total

    def _fits(self, t: int) -> np.ndarray:
        """``[i, j]``: whether a stage of layers ``[i, j)`` keeps its model state and the reserve in memory."""
        got = self._fit.get(t)
        if got is None:
            state = prefix_sums([lay.params * self.request.bytes_per_param / t for lay in self.profile.layers])
            got = self._fit[t] = (state[None, :] - state[:, None]) + self.request.memory_reserve_bytes \
                <= self.cluster.memory_bytes
        return got

    def plan(self, t: int, D: int, W: int, b: int, recompute: bool, N: int) -> PipeDreamPlan | None:
        """The A(j, m) partition of ``D`` devices, or None when it is not worth a candidate (module
        docstring)."""
        key = (t, D, W, b, recompute, N)
        if key in self._plans:
            return self._plans[key]
        got: PipeDreamPlan | None = None
        if self.can_differ(t, D, b, recompute):
            got = self._program(t, D, W, b, recompute, N)
            if got is not None and len(set(got.replicas)) == 1:
                got = None
        self._plans[key] = got
        return got

    def _program(self, t: int, D: int, W: int, b: int, recompute: bool, N: int) -> PipeDreamPlan | None:
        cl, prof = self.cluster, self.profile
        eff = 1.0 if t == 1 else self.request.tensor_efficiency
        layer_time = [c / (t * eff) for c in self.layer_costs(b, recompute)]
        which = "intra" if D * t <= cl.gpus_per_node else "inter"
        comm = [collective_time(cl, which, "p2p", 2, lay.output_bytes_per_sample * b / t) for lay in prof.layers]
        L = len(prof.layers)
        pw = prefix_sums([lay.param_bytes / t for lay in prof.layers])
        grad_bytes = pw[None, :] - pw[:, None]  # [i, j]
        # per iteration, after the last backward: the all-reduce among the stage's m W copies and the step
        # (model state read and written at the memory bandwidth, as planner.cost's step); per micro-batch
        # of the stage (T's m in the denominator) that is m (AR + step) / N
        pp = prefix_sums([lay.params / t for lay in prof.layers])
        step = (pp[None, :] - pp[:, None]) * 2 * self.request.state_bytes_per_param(W) / cl.memory_bandwidth
        sync = np.zeros((D + 1, L + 1, L + 1))
        for m in range(1, D + 1):
            ranks = [global_rank(DEFAULT_ORDER, d, w, 0, D, W, t) for w in range(W) for d in range(m)]
            one = allreduce_time(cl, ranks, 1.0)
            slope = (allreduce_time(cl, ranks, 2.0**30) - one) / (2.0**30 - 1.0)
            ar = np.where(grad_bytes > 0, one - slope + slope * grad_bytes, 0.0) if len(ranks) > 1 else 0.0
            sync[m] = (ar + step) * m / N
        try:  # (stages whose model state does not fit left out; activations: the search checks them)
            return pipedream_partition_arrays(layer_time, comm, D, sync, self._fits(t), sync_adds=True)
        except PartitionError:
            return None


def replica_rows(schedule: Schedule) -> tuple[list[str], list[int]] | None:
    """For a plan with replicated stages (``1f1b-rr``, ``pipedream-rr``): each device's row label, ``S{stage}
    r{replica} · P{device}`` (``S{stage} · P{device}`` for a stage on one device), and the stage of each row,
    so that a timeline shows one row per replica grouped by stage (devices are numbered stage by stage,
    :mod:`planner.schedules.one_f_one_b_rr`); None for any other schedule."""
    replication = schedule.params.get("replication")
    if not replication:
        return None
    reps = parse_replication(str(replication), schedule.devices)
    labels, stages = [], []
    for s, r in enumerate(reps):
        for k in range(r):
            d = len(labels)
            labels.append(f"S{s} r{k} · P{d}" if r > 1 else f"S{s} · P{d}")
            stages.append(s)
    return labels, stages
