"""The search: every valid configuration for a GPU budget, simulated under the cost model and ranked.

For ``P`` GPUs: every ``t`` dividing the GPUs per node (up to ``max_tensor``), ``D`` and ``W`` with
``t D W = P``, micro-batch sizes ``b`` (powers of two dividing ``B^/W``), ``N = B^/(W b)`` micro-batches,
every allowed schedule with its parameters valid for ``D`` and ``N`` (interleaved chunks ``v`` with
``N mod D = 0``; Chimera's ``f`` dividing ``D/2`` and, for ``N > D``, its three concatenations --
forward doubling with recomputation, backward halving without, Chimera 3.5; Hanayo's waves), with and
without recomputation. Chimera's greedy rule (the largest b that fits) is not used as a shortcut: every b
is evaluated.

Pruning, exact for the top ``k``: a configuration whose model state alone exceeds the device memory is
rejected before anything else; every other one gets a lower bound on its iteration time (the busiest
device's compute plus its optimizer step, no bubbles, no communication), is visited in the order of
that bound, and is simulated only while the bound is below the k-th best simulated time. Stage costs and
partitions are cached across configurations. Deterministic: the same input gives the same output.
"""

from __future__ import annotations

import gc
import heapq
import math
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.cluster import Cluster
from planner.cost import ConfigCosts, chimera_eq1, megatron_closed_form, stage_infos
from planner.partition import PartitionError, balanced_partition, prefix_sums
from planner.profile import ModelProfile
from planner.request import ASYNC_SCHEDULES, Config, TrainingRequest
from planner.schedules import BUILDERS, build, inflight, inflight_exact, shape, splits_backward
from planner.schedules.ir import Action, Schedule
from planner.simulate import ScheduleError, SimResult, compile_schedule, simulate


@dataclass
class Candidate:
    config: Config
    microbatches: int
    iteration_time: float = math.inf
    throughput: float = 0.0
    bubble_ratio: float = 1.0
    memory: list[float] = field(default_factory=list)
    memory_capacity: float = 0.0
    fits: bool = False
    reason: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)
    closed_forms: dict[str, float | None] = field(default_factory=dict)
    partition: list[list[int]] = field(default_factory=list)
    lower_bound: float = 0.0
    global_batch: int = 0
    #: per device, bytes of weights, gradients and optimizer state (:meth:`Planner._stage_state`)
    state: list[float] = field(default_factory=list, repr=False)
    #: its bound was raised with its merged warm-up (:meth:`Planner.refine`)
    refined: bool = False
    simulation: SimResult | None = field(default=None, repr=False)
    costs: ConfigCosts | None = field(default=None, repr=False)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {
            "tensor": c.tensor, "pipeline": c.pipeline, "data": c.data, "micro_batch": c.micro_batch,
            "schedule": c.schedule, "recompute": c.recompute, **c.schedule_params(),
            "microbatches": self.microbatches, "global_batch": self.global_batch, "label": c.label(),
            "iteration_time": self.iteration_time, "throughput": self.throughput,
            "bubble_ratio": self.bubble_ratio, "memory": self.memory,
            "memory_capacity": self.memory_capacity, "peak_memory": max(self.memory, default=0.0),
            "fits": self.fits, "reason": self.reason, "breakdown": self.breakdown,
            "closed_forms": self.closed_forms, "partition": self.partition,
            "placement": "ranks: tensor innermost, then pipeline, then data parallel (Megatron-LM)",
            "compute": self.costs.compute_source if self.costs is not None else None,
        }
        if timeline and self.simulation is not None:
            out["timeline"] = [[[str(a), s, e] for a, s, e in row if a.kind in "FBIW"]
                               for row in self.simulation.timeline]
        return out


@dataclass
class PlanResult:
    candidates: list[Candidate]
    infeasible: list[Candidate]
    rejected: Counter[str]
    evaluated: int
    simulated: int
    considered: int

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        return {
            "candidates": [c.to_dict(timeline) for c in self.candidates],
            "infeasible": [c.to_dict() for c in self.infeasible],
            "rejected": dict(sorted(self.rejected.items())),
            "evaluated": self.evaluated, "simulated": self.simulated, "considered": self.considered,
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two_dividing(n: int) -> list[int]:
    out, b = [], 1
    while n % b == 0:
        out.append(b)
        b *= 2
    return out


def schedule_variants(name: str, D: int, N: int, b: int, layers: int, recompute: bool) -> list[dict[str, Any]]:
    """The parameter sets of schedule ``name`` that are valid for D, N (empty: none)."""
    if name == "interleaved":
        if D < 2 or N % D:
            return []
        return [{"chunks": v} for v in (2, 4, 8) if D * v <= layers]
    if name == "chimera":
        if D % 2:
            return []
        out = []
        for f in _divisors(D // 2):
            if N <= D:
                out.append({"pipelines": f, "concat": "direct"})
                continue
            out.append({"pipelines": f, "concat": "direct"})
            if recompute:
                out.append({"pipelines": f, "concat": "forward-doubling"})
            elif b % 2 == 0:
                out.append({"pipelines": f, "concat": "backward-halving"})
        return out
    if name == "hanayo":
        return [{"waves": w} for w in (1, 2, 4) if 2 * w * D <= layers]
    if name == "gems" and D < 2:
        return []
    if name == "pipedream-2bw" and N < D:
        return []
    return [{}]


@dataclass
class _Layout:
    """Which (replica, stage) pairs each device of a schedule's shape holds, as ``(devices, h)`` arrays
    (every builder gives each device the same number ``h`` of pairs), with the micro-batches per replica
    and the in-flight counts per pair: what the per-device memory and time bounds are computed from."""

    stage: np.ndarray
    per_mb: np.ndarray  # micro-batches of each pair's replica
    floor: np.ndarray  # in-flight micro-batches of each pair (exact or a lower bound)


class Planner:
    """Holds the caches of one (profile, cluster, request)."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, request: TrainingRequest) -> None:
        self.profile, self.cluster, self.request = profile, cluster, request
        self._partitions: dict[tuple[int, float, bool], list[tuple[int, int]] | None] = {}
        self._layer_costs: dict[tuple[float, bool], list[float]] = {}
        self._schedules: dict[tuple[str, int, int, tuple], Schedule] = {}
        self._shapes: dict[tuple[str, int, int, tuple], Schedule] = {}
        self._compiled: dict[int, Any] = {}  # id(schedule) -> compile_schedule(schedule)
        self._inflight: dict[int, list[dict[int, float]]] = {}  # id(schedule) -> per device, stage -> peak
        self._floors: dict[int, dict[tuple[int, int], int]] = {}  # id(shape) -> in flight per (replica, stage)
        self._stage_states: dict[tuple, list[float]] = {}
        self._bound_terms: dict[tuple, tuple[list[float], list[float], list[float], float]] = {}
        self._layer_sums: dict[tuple[str, float], list[float]] = {}  # ConfigCosts' running sums, shared
        self._mem_partitions: dict[tuple, list[tuple[int, int]] | None] = {}
        self._single_layers: dict[int, list[Any]] = {}
        self._layer_mem: dict[int, tuple[np.ndarray, ...]] = {}
        self._layouts: dict[int, _Layout] = {}  # id(shape) -> its layout
        self._held: dict[int, list[list[tuple[int, int]]]] = {}  # id(shape) -> stages held per device
        self._total_state = profile.total_params * request.bytes_per_param
        self._shared: dict[tuple, dict] = {}  # (t, S, samples, recompute) -> ConfigCosts' shared caches
        self._state: dict[tuple, list[float]] = {}  # (id(shape), t, S, samples, recompute) -> model state

    def schedule(self, config: Config, microbatches: int, full: bool = True) -> Schedule:
        """The schedule of ``config``, built once per (name, D, N, parameters): t, W, b and recomputation
        do not change the lists. ``full=False`` may leave the action lists empty (placement and
        micro-batch assignment only, :func:`planner.schedules.shape`)."""
        params = config.schedule_params()
        key = (config.schedule, config.pipeline, microbatches, tuple(sorted(params.items())))
        sched = self._schedules.get(key)
        if sched is None and not full:
            sched = self._shapes.get(key)
            if sched is None:
                sched = self._shapes[key] = shape(config.schedule, config.pipeline, microbatches, **params)
        elif sched is None:
            sched = self._schedules[key] = build(config.schedule, config.pipeline, microbatches, **params)
        return sched

    # ---- building blocks -----------------------------------------------------------------------
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
                self._partitions[key] = balanced_partition(self.layer_costs(samples, recompute), stages).bounds
            except PartitionError:
                self._partitions[key] = None
        return self._partitions[key]

    def _stage_state(self, costs: ConfigCosts) -> list[float]:
        """Weights, gradients and optimizer state of one replica of each stage, plus the extra weight versions
        of asynchronous schedules (PipeDream weight stashing, 2BW double buffering), cached per (stage
        infos, weight versions); a device holds the sum over its stage replicas."""
        sched = costs.schedule
        versions = tuple(sched.weight_versions) if not sched.synchronous else ()
        key = (id(costs.stages), costs.t, versions)
        got = self._stage_states.get(key)
        if got is None:
            got = []
            for s, info in enumerate(costs.stages):
                v = (info.params - self._tied_in_stage(info)) * self.request.bytes_per_param / costs.t
                if versions:
                    v += (versions[s] - 1) * info.param_bytes / costs.t
                got.append(v)
            self._stage_states[key] = got
        return got

    def _tied_in_stage(self, info: Any) -> float:
        """A tied LM head in the same stage as the embedding it copies is not a second copy."""
        i, j = info.layers
        kinds = {lay.kind for lay in self.profile.layers[i:j]}
        return info.tied_params if "embedding" in kinds else 0.0

    def prepare(self, config: Config) -> tuple[Candidate, ConfigCosts | None]:
        """Build schedule, partition and costs; reject what cannot work before simulating."""
        req = self.request
        W, b = config.data, config.micro_batch
        N = req.global_batch // (W * b)
        cand = Candidate(config, N, memory_capacity=float(self.cluster.memory_bytes),
                         global_batch=req.global_batch)
        if req.global_batch % (W * b):
            cand.reason = f"global batch {req.global_batch} is not a multiple of W*b = {W * b}"
            return cand, None
        n_sched = 2 * N if config.concat == "backward-halving" else N
        try:
            sched = self.schedule(config, n_sched, full=False)
        except ValueError as e:
            cand.reason = f"schedule: {e}"
            return cand, None
        # the busiest device holds at least the average model state: reject before partitioning
        avg = self._total_state * sched.replicas / (config.tensor * config.pipeline)
        if avg + req.memory_reserve_bytes > self.cluster.memory_bytes:
            over = avg + req.memory_reserve_bytes - self.cluster.memory_bytes
            cand.reason = (f"weights, gradients and optimizer state do not fit: {sched.replicas} model "
                           f"copies over {config.tensor * config.pipeline} GPUs need {_gib(avg)} per device on "
                           f"average + reserve, {_gib(over)} over {_gib(self.cluster.memory_bytes)}")
            return cand, None
        samples = b / 2 if config.concat == "backward-halving" else b
        bounds = self.partition(sched.stages, samples, config.recompute)
        if bounds is None:
            cand.reason = f"{len(self.profile.layers)} layers cannot fill {sched.stages} stages"
            return cand, None
        costs = self._costs_fitting(cand, sched, samples, bounds, (config.tensor, sched.stages, samples,
                                                                   config.recompute))
        if costs is None:
            # the partition balancing time does not fit: one balancing time under the memory limit may
            mem_bounds = self.memory_partition(config, sched, samples)
            if mem_bounds is None or mem_bounds == bounds:
                return cand, None
            reason, memory = cand.reason, cand.memory
            costs = self._costs_fitting(cand, sched, samples, mem_bounds, (config.tensor, sched.stages, samples,
                                                                           config.recompute, tuple(mem_bounds)))
            if costs is None:  # (the memory model said it fits: the check below it is the same)
                cand.reason, cand.memory = reason, memory
                return cand, None
        cand.lower_bound = self.lower_bound(sched, costs)
        return cand, costs

    def _costs_fitting(self, cand: Candidate, sched: Schedule, samples: float, bounds: list[tuple[int, int]],
                       ckey: tuple) -> ConfigCosts | None:
        """The costs of ``cand`` with partition ``bounds``, or None (``cand.reason`` says why) when its
        model state or its in-flight activations (exact, or a lower bound) do not fit. ``ckey`` names
        what the costs share with other configurations (t, stages, samples, recomputation, partition)."""
        config, req = cand.config, self.request
        cand.partition = [list(x) for x in bounds]
        shared = self._shared.setdefault(ckey, {})
        costs = ConfigCosts(self.profile, self.cluster, req, config, sched, bounds, held=self.held(sched),
                            shared=shared, layer_sums=self._layer_sums)
        lay = self.layout(config, sched)
        skey = (id(sched), *ckey)
        state = self._state.get(skey)
        if state is None:
            state = self._state[skey] = np.asarray(self._stage_state(costs))[lay.stage].sum(axis=1).tolist()
        cand.state = state
        worst = max(range(len(state)), key=lambda d: state[d])
        if state[worst] + req.memory_reserve_bytes > self.cluster.memory_bytes:
            over = state[worst] + req.memory_reserve_bytes - self.cluster.memory_bytes
            cand.reason = (f"weights, gradients and optimizer state do not fit: device {worst} needs "
                           f"{_gib(state[worst])} + reserve, {_gib(over)} over {_gib(self.cluster.memory_bytes)}")
            cand.memory = [s + req.memory_reserve_bytes for s in state]
            return None
        # activations: the in-flight counts of the schedule (exact, or a lower bound), before any list exists
        act = shared.get("activation")
        if act is None:
            act = shared["activation"] = np.array([costs.activation(s) for s in range(sched.stages)])
        if self._too_big(cand, costs, (lay.floor * act[lay.stage]).max(axis=1).tolist()):
            return None
        return costs

    def memory_partition(self, config: Config, sched: Schedule, samples: float) -> list[tuple[int, int]] | None:
        """For schedules with one stage per device and exact in-flight counts (GPipe, 1F1B, ZB-H1,
        PipeDream, 2BW): the partition balancing time among those whose every device fits its memory --
        weights, gradients and optimizer state (and the extra weight versions of asynchronous schedules),
        its in-flight micro-batches' activations (their stage input only with recomputation, plus one
        layer's working set), and the reserve: what :meth:`evaluate` counts. None when none fits."""
        if not (sched.replicas == 1 and sched.stages == sched.devices > 1 and inflight_exact(config.schedule)):
            return None
        floor = self.floor(config, sched)
        versions = sched.weight_versions if not sched.synchronous else []
        t, S = config.tensor, sched.stages
        # what the memory model depends on: configurations that differ only in N beyond D share it
        key = (tuple(floor.get((0, k), 0) for k in range(S)), tuple(versions), t, samples, config.recompute)
        if key in self._mem_partitions:
            return self._mem_partitions[key]
        cap = self.cluster.memory_bytes - self.request.memory_reserve_bytes
        state, weights, stash, first_input, biggest = self._layer_memory(t)
        # necessary (and cheap): packing the layers greedily, each stage as far as its memory allows
        # (with recomputation counting the smallest stage input), covers the model. Memory only grows as a
        # stage takes more layers, so the greedy packing is the most any partition can cover.
        L, start = len(self.profile.layers), 0
        min_input = float(first_input.min())
        for k in range(S):
            live = floor.get((0, k), 0) * samples
            need = state[start:] - state[start] + (versions[k] - 1 if versions else 0) * (
                weights[start:] - weights[start])
            if config.recompute:
                need = need + live * min_input + biggest[start, start:] * samples
            else:
                need = need + live * (stash[start:] - stash[start])
            room = np.nonzero(need[1:L - start - (S - k - 1) + 1] <= cap)[0]  # leave a layer per later stage
            if room.size == 0:
                break
            start += int(room[-1]) + 1
        if start < L:
            self._mem_partitions[key] = None
            return None

        def fits(k: int) -> np.ndarray:
            need = state[None, :] - state[:, None]
            if versions:
                need = need + (versions[k] - 1) * (weights[None, :] - weights[:, None])
            live = floor.get((0, k), 0) * samples
            if config.recompute:
                need = need + live * first_input + biggest * samples
            else:
                need = need + live * (stash[None, :] - stash[:, None])
            return need <= cap

        try:
            bounds = balanced_partition(self.layer_costs(samples, config.recompute), S, fits=fits).bounds
        except PartitionError:
            bounds = None
        self._mem_partitions[key] = bounds
        return bounds

    def _layer_memory(self, t: int) -> tuple[np.ndarray, ...]:
        """Per-layer memory figures for :meth:`memory_partition`, cached per t: running sums of model
        state, weights and stashed activations per sample, each layer's input per sample (a column),
        and the largest single-layer stash per sample of every layer range."""
        got = self._layer_mem.get(t)
        if got is None:
            layers = self._layer_infos(t)
            got = self._layer_mem[t] = (
                prefix_sums([info.params * self.request.bytes_per_param / t for info in layers]),
                prefix_sums([info.param_bytes / t for info in layers]),
                prefix_sums([info.stash_bytes for info in layers]),
                np.array([info.input_bytes for info in layers] + [0.0])[:, None],
                _range_max([info.max_layer_stash for info in layers]))
        return got

    def _layer_infos(self, t: int) -> list[Any]:
        """:func:`planner.cost.stage_infos` of every single layer (what a stage's figures are sums of)."""
        got = self._single_layers.get(t)
        if got is None:
            got = self._single_layers[t] = stage_infos(self.profile, [(i, i + 1) for i in
                                                                      range(len(self.profile.layers))], t)
        return got

    def held(self, sched: Schedule) -> list[list[tuple[int, int]]]:
        """Per device of ``sched``'s shape, the (replica, stage) pairs it holds, cached."""
        got = self._held.get(id(sched))
        if got is None:
            got = self._held[id(sched)] = sched.stages_by_device()
        return got

    def layout(self, config: Config, sched: Schedule) -> _Layout:
        """:class:`_Layout` of ``sched``'s shape, cached."""
        got = self._layouts.get(id(sched))
        if got is None:
            held = self.held(sched)
            h = len(held[0])
            if any(len(row) != h for row in held) or h == 0:
                raise ValueError(f"{sched.name}: devices hold different numbers of stages")
            floor = self.floor(config, sched)
            per_mb = Counter(sched.mb_replica)
            got = self._layouts[id(sched)] = _Layout(
                np.array([[s for _, s in row] for row in held], dtype=np.int64),
                np.array([[per_mb[r] for r, _ in row] for row in held], dtype=float),
                np.array([[floor.get(pair, 0) for pair in row] for row in held], dtype=float))
        return got

    def floor(self, config: Config, sched: Schedule) -> dict[tuple[int, int], int]:
        """:func:`planner.schedules.inflight` of ``sched``'s shape, cached."""
        got = self._floors.get(id(sched))
        if got is None:
            got = self._floors[id(sched)] = inflight(config.schedule, sched.devices, sched.microbatches,
                                                     **config.schedule_params()) or {}
        return got

    def _too_big(self, cand: Candidate, costs: ConfigCosts, activations: list[float]) -> bool:
        """Reject before simulating when a lower bound of some device's activations already overflows its
        memory; the candidate keeps those lower bounds as its per-device memory."""
        cap = self.cluster.memory_bytes
        reserve = self.request.memory_reserve_bytes
        need = [state + act + reserve for state, act in zip(cand.state, activations, strict=True)]
        worst = max(range(len(need)), key=lambda d: need[d])
        if need[worst] <= cap:
            return False
        cand.memory = need
        cand.reason = (f"out of memory: device {worst} needs at least {_gib(need[worst])}, "
                       f"{_gib(need[worst] - cap)} over {_gib(cap)} (activations counted from the schedule, "
                       "not simulated)")
        return True

    def too_big_before_merge(self, cand: Candidate, costs: ConfigCosts, n_sched: int
                             ) -> tuple[bool, list[list[Action]] | None]:
        """Chimera and Hanayo (whose in-flight counts before merging are only lower bounds): reject on
        memory with the merged warm-up before merging everything. Returns (rejected, the warm-up's
        lists when it was merged)."""
        cfg = cand.config
        module = sys.modules[BUILDERS[cfg.schedule].__module__]
        # the warm-up holds the most activations: merge only its first slots (a prefix of the full lists, so
        # its peak is a lower bound of the device's peak) and reject what already does not fit; S, 2S, then
        # 3S slots (the merge goes on from where it stopped, and the full build after it too)
        prefix_fn = getattr(module, "prefix", None)
        if prefix_fn is None:
            return False, None
        D, S = cfg.pipeline, costs.schedule.stages
        act = [costs.activation(s) for s in range(S)]
        alive, peaks, seen = [0.0] * D, [0.0] * D, [0] * D
        lists: list[list[Action]] = []
        for slots in (S, 2 * S, 3 * S):
            lists = prefix_fn(D, n_sched, slots, **cfg.schedule_params())
            for d, row in enumerate(lists):
                a_d, p_d = alive[d], peaks[d]
                for a in row[seen[d]:]:
                    if a.kind == "F":
                        a_d += a.span * act[a.stage]
                        if a_d > p_d:
                            p_d = a_d
                    elif a.kind in ("B", "I"):
                        a_d -= act[a.stage]
                alive[d], peaks[d], seen[d] = a_d, p_d, len(row)
            if self._too_big(cand, costs, peaks):
                return True, None
        return False, lists

    def prefix_bound(self, cand: Candidate, costs: ConfigCosts, lists: list[list[Action]]) -> float | None:
        """A lower bound of the iteration time from the merged warm-up ``lists`` (a prefix of every
        device's list, closed under inputs): its actions take in the full schedule exactly the times
        they take when the prefix alone is replayed (without eager all-reduces, which could only delay
        them), so device ``d`` cannot finish before the prefix's end on it plus the computation left to it
        (its total at least :meth:`lower_bound`'s) plus its step or the gradient's way down. None when
        the prefix is the whole schedule (then simulating it is simulating the schedule)."""
        shape = costs.schedule
        if sum(a.kind in ("B", "I") for row in lists for a in row) >= shape.microbatches * shape.stages:
            return None
        part = Schedule(shape.name, shape.devices, shape.stages, shape.microbatches, shape.placement, lists,
                        shape.mb_replica, {**shape.params, "eager": "none"}, shape.weight_versions,
                        shape.synchronous)
        res = simulate(part, costs)
        work, after = self._device_terms(shape, costs)
        bound = 0.0
        for d, st in enumerate(res.devices):
            done = st.busy - (st.step[1] - st.step[0])
            bound = max(bound, st.compute_end + max(0.0, work[d] - done) + after[d])
        return bound

    def inflight(self, sched: Schedule) -> list[dict[int, float]]:
        """Per device and stage, the most micro-batches whose activations are alive at once, counted in
        list order as the simulator counts them (a forward adds its micro-batches, B or I frees one)."""
        got = self._inflight.get(id(sched))
        if got is None:
            got = []
            for row in sched.actions:
                alive: dict[int, float] = {}
                peak: dict[int, float] = {}
                for a in row:
                    if a.kind == "F":
                        alive[a.stage] = alive.get(a.stage, 0) + a.span
                        if alive[a.stage] > peak.get(a.stage, 0):
                            peak[a.stage] = alive[a.stage]
                    elif a.kind in ("B", "I"):
                        alive[a.stage] = alive.get(a.stage, 0) - 1
                got.append(peak)
            self._inflight[id(sched)] = got
        return got

    def lower_bound(self, sched: Schedule, costs: ConfigCosts) -> float:
        """A time no schedule of this configuration can beat: for every device, the first forward
        reaching one of its stages (the forwards of the stages before it), its own computation, and then
        its own optimizer step or -- unless backwards are split, when a weight-gradient pass may come
        last -- the gradient of its last backward travelling down the stages before it followed by the
        smallest step of any device, whichever is longer."""
        cfg = costs.config
        _, pre_f, _, round_trip = self._terms(costs)
        lb = 0.0
        if inflight_exact(cfg.schedule):
            # Little's law: a micro-batch is alive at least for its round trip through every stage, and the
            # lists never keep more than ``k`` alive at once (their stage-0 in-flight peaks, exact), so
            # N micro-batches take at least N * round_trip / k (tight for GEMS' two in flight)
            floor = self.floor(cfg, sched)
            k = sum(floor.get((r, 0), 0) for r in range(sched.replicas))
            if k > 0:
                lb = sched.microbatches * round_trip / k
        work, after = self._device_terms(sched, costs)
        head = pre_f[self.layout(cfg, sched).stage].min(axis=1)
        return max(lb, float((head + work + after).max()))

    def _terms(self, costs: ConfigCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Per stage, the least F + B of one micro-batch, the forwards and the backwards of the stages before
        it (running sums), and a micro-batch's round trip (with a split backward, forwards and
        input-gradient passes: an I frees what its F stored); cached per stage infos and schedule kind."""
        cfg = costs.config
        doubled = cfg.concat in ("forward-doubling", "backward-halving")
        split = splits_backward(cfg.schedule)
        key = (id(costs.stages), doubled, split)
        got = self._bound_terms.get(key)
        if got is None:
            S = len(costs.stages)
            f = [min(costs.fwd(s, 1), costs.fwd(s, 2) / 2) if doubled else costs.fwd(s, 1) for s in range(S)]
            bw = [costs.bwd(s) for s in range(S)]
            chain = [costs.compute("I", s, 1, 0) for s in range(S)] if split else bw
            got = self._bound_terms[key] = (np.add(f, bw), prefix_sums(f)[:-1], prefix_sums(bw)[:-1],
                                            sum(f) + sum(chain))
        return got

    def _device_terms(self, sched: Schedule, costs: ConfigCosts) -> tuple[np.ndarray, np.ndarray]:
        """Per device, a lower bound of its computation (:meth:`lower_bound`'s per-micro-batch F + B of
        the stage replicas it holds) and of what must follow its last computation: its optimizer step,
        or -- unless backwards are split -- the gradient travelling down the stages before its stages
        and then the smallest step of any device."""
        cfg = costs.config
        work_of, _, pre_b, _ = self._terms(costs)
        split = splits_backward(cfg.schedule)
        lay = self.layout(cfg, sched)
        steps = np.asarray(costs.step_per_stage())[lay.stage].sum(axis=1)
        work = (lay.per_mb * work_of[lay.stage]).sum(axis=1)
        tail = np.zeros(len(steps)) if split else pre_b[lay.stage].min(axis=1)
        return work, np.maximum(steps, tail + steps.min())

    def refine(self, cand: Candidate, costs: ConfigCosts) -> bool:
        """Merged schedules (Chimera, Hanayo), before the whole merge: reject on the warm-up's memory (True)
        or raise ``cand.lower_bound`` to the bound of the replayed warm-up (:meth:`prefix_bound`)."""
        n_sched = 2 * cand.microbatches if cand.config.concat == "backward-halving" else cand.microbatches
        cand.refined = True
        rejected, warmup = self.too_big_before_merge(cand, costs, n_sched)
        if rejected:
            return True
        if warmup is not None:
            bound = self.prefix_bound(cand, costs, warmup)
            if bound is not None:
                cand.lower_bound = max(cand.lower_bound, bound)
        return False

    def evaluate(self, cand: Candidate, costs: ConfigCosts) -> Candidate:
        """Simulate the full schedule and fill in time and memory (the breakdown comes with
        :meth:`explain`, for the candidates that are returned)."""
        cfg, req = cand.config, self.request
        n_sched = 2 * cand.microbatches if cfg.concat == "backward-halving" else cand.microbatches
        cand.costs = costs
        exact = inflight_exact(cfg.schedule)
        if not exact and not cand.refined and self.refine(cand, costs):
            return cand
        sched = costs.schedule = self.schedule(cfg, n_sched)
        if not exact:
            # activations before simulating: the in-flight counts depend on the list order alone, so the
            # largest single stage's peak is a lower bound of the device's peak (exact with one stage)
            counts = self.inflight(sched)
            if self._too_big(cand, costs, [max((c * costs.activation(s) for s, c in counts[d].items()),
                                                default=0.0) for d in range(cfg.pipeline)]):
                return cand
        key = id(sched)
        if key not in self._compiled:
            self._compiled[key] = compile_schedule(sched)
        try:
            res = simulate(sched, costs, compiled=self._compiled[key])
        except ScheduleError as e:  # pragma: no cover - builders are validated by the tests
            cand.reason = f"schedule error: {e}"
            return cand
        cand.simulation = res
        cand.iteration_time = res.makespan
        cand.throughput = req.global_batch / res.makespan if res.makespan > 0 else 0.0
        cand.bubble_ratio = res.bubble_ratio
        mem = []
        for d in range(cfg.pipeline):
            m = cand.state[d] + res.devices[d].peak_activations + req.memory_reserve_bytes
            if cfg.recompute:  # recomputing a layer materialises its activations once
                m += max(costs.stages[s].max_layer_stash for _, s in costs.held[d]) * costs.base_b
            mem.append(m)
        cand.memory = mem
        worst = max(range(len(mem)), key=lambda d: mem[d])
        cand.fits = mem[worst] <= self.cluster.memory_bytes
        if not cand.fits:
            over = mem[worst] - self.cluster.memory_bytes
            cand.reason = (f"out of memory: device {worst} needs {_gib(mem[worst])}, "
                           f"{_gib(over)} over {_gib(self.cluster.memory_bytes)}")
        return cand

    def explain(self, cand: Candidate) -> Candidate:
        """Time breakdown and the papers' closed forms of a simulated candidate."""
        if cand.simulation is not None and cand.costs is not None and not cand.breakdown:
            cand.breakdown = self.breakdown(cand.simulation, cand.costs)
            cand.closed_forms = self.closed_forms(cand.simulation, cand.costs, cand.microbatches)
        return cand

    def breakdown(self, res: SimResult, costs: ConfigCosts) -> dict[str, float]:
        """Where the time of the device that finishes last goes: its compute, its exposed all-reduce
        (between its last computation and its optimizer step), the step, and bubble (the rest:
        waiting for inputs, exposed p2p included). ``comm_busy`` is the busy time of its communication
        streams (sends and all-reduces), mostly overlapped."""
        d = max(range(len(res.devices)), key=lambda i: res.devices[i].step[1])
        st = res.devices[d]
        step_start, step_end = st.step
        compute = st.busy - (step_end - step_start)
        exposed_ar = max(0.0, step_start - st.compute_end)
        return {"compute": compute, "allreduce_exposed": exposed_ar, "step": step_end - step_start,
                "bubble": max(0.0, res.makespan - compute - exposed_ar - (step_end - step_start)),
                "comm_busy": st.comm}

    def closed_forms(self, res: SimResult, costs: ConfigCosts, N: int) -> dict[str, float | None]:
        cfg = costs.config
        S = costs.schedule.stages
        f_t = max(costs.fwd(s) for s in range(S))
        b_t = max(costs.bwd(s) for s in range(S))
        sample_p2p = costs.p2p("SEND_F", 0, 1, 0, 1) if S > 1 and cfg.pipeline > 1 else 0.0
        unoverlapped = 0.0
        eager = set(costs.schedule.params.get("eager") or []) if isinstance(
            costs.schedule.params.get("eager"), list) else set()
        for d in range(cfg.pipeline):
            late = sum(costs.allreduce(s, r, d) for r, s in costs.schedule.stages_on(d) if s not in eager)
            unoverlapped = max(unoverlapped, late)
        per_dev = S // cfg.pipeline if S % cfg.pipeline == 0 else 1
        return {
            "chimera_eq1": chimera_eq1(f_t, b_t, sample_p2p, res.critical_forward, res.critical_backward,
                                       unoverlapped),
            "megatron": megatron_closed_form(cfg.schedule, cfg.pipeline, N, f_t * per_dev, b_t * per_dev,
                                             cfg.chunks or 1),
        }

    # ---- enumeration -----------------------------------------------------------------------------
    def configs(self, rejected: Counter[str]) -> list[Config]:
        req, cl = self.request, self.cluster
        P = req.gpus or cl.gpus
        if P > cl.gpus:
            raise ValueError(f"gpus: budget {P} exceeds the cluster's {cl.gpus} GPUs")
        max_t = req.max_tensor or cl.gpus_per_node
        L = len(self.profile.layers)
        names = [n for n in req.allowed() if n in BUILDERS]
        out: list[Config] = []
        for t in _divisors(P):
            if t > max_t or (t <= cl.gpus_per_node and cl.gpus_per_node % t):
                continue
            for D in _divisors(P // t):
                W = P // (t * D)
                if D > L:
                    rejected["more pipeline stages than layers"] += 1
                    continue
                if req.global_batch % W:
                    rejected["global batch not divisible by W"] += 1
                    continue
                sizes = req.micro_batches or _powers_of_two_dividing(req.global_batch // W)
                for b in sizes:
                    if (req.global_batch // W) % b:
                        rejected["micro-batch does not divide B^/W"] += 1
                        continue
                    N = req.global_batch // (W * b)
                    for rc in ((False, True) if req.allow_recompute else (False,)):
                        for name in names:
                            variants = schedule_variants(name, D, N, b, L, rc)
                            if not variants:
                                rejected[f"{name}: not valid for this D and N"] += 1
                            for params in variants:
                                out.append(Config(tensor=t, pipeline=D, data=W, micro_batch=b,
                                                  schedule=name, recompute=rc, **params))
        return out

    def search(self, prune: bool = True) -> PlanResult:
        """Rank the configurations; ``prune=False`` simulates every one (the tests compare the two)."""
        with _gc_paused():
            return self._search(prune)

    def _search(self, prune: bool) -> PlanResult:
        rejected: Counter[str] = Counter()
        configs = self.configs(rejected)
        k = self.request.top
        prepared: list[tuple[float, int, Candidate, ConfigCosts]] = []
        infeasible: list[Candidate] = []
        for i, cfg in enumerate(configs):
            cand, costs = self.prepare(cfg)
            if costs is None:
                rejected[_reason_key(cand.reason)] += 1
                if cand.memory:
                    infeasible.append(cand)
                continue
            prepared.append((cand.lower_bound, i, cand, costs))
        considered = len(prepared)
        # best first: the candidate with the smallest bound next; a merged schedule's bound is first
        # refined with its warm-up and the candidate goes back in line, so the costly merge is paid only
        # once nothing with a smaller bound is left. Exact: whatever is skipped has a bound above the k-th
        # best time found, which only falls as the search goes on.
        heapq.heapify(prepared)
        best: list[tuple[float, int]] = []  # max-heap of (-time, -index) of the k best fitting
        results: list[Candidate] = []
        simulated = 0
        while prepared:
            lb, i, cand, costs = heapq.heappop(prepared)
            if prune and len(best) >= k and lb > -best[0][0]:
                rejected["bound: cannot reach the top k"] += 1 + len(prepared)  # and every one after it
                break
            if prune and not cand.refined and not inflight_exact(cand.config.schedule):
                if self.refine(cand, costs):
                    rejected[_reason_key(cand.reason)] += 1
                    infeasible.append(cand)
                    continue
                if cand.lower_bound > lb:
                    heapq.heappush(prepared, (cand.lower_bound, i, cand, costs))
                    continue
            self.evaluate(cand, costs)
            simulated += 1
            if cand.fits:
                results.append(cand)
                heapq.heappush(best, (-cand.iteration_time, -i))
                if len(best) > k:
                    heapq.heappop(best)
            else:
                rejected[_reason_key(cand.reason)] += 1
                infeasible.append(cand)
        results.sort(key=lambda c: (c.iteration_time, c.config.label()))
        infeasible.sort(key=lambda c: (c.iteration_time, c.config.label()))
        for c in results[:k] + infeasible[:k]:
            self.explain(c)
        return PlanResult(results[:k], infeasible[:k], rejected, evaluated=len(configs),
                          simulated=simulated, considered=considered)


def _range_max(xs: list[float]) -> np.ndarray:
    """``out[i, j]``: the largest of ``xs[i:j]`` (0 where ``j <= i``)."""
    n = len(xs)
    out = np.zeros((n + 1, n + 1))
    arr = np.asarray(xs, dtype=float)
    for i in range(n):
        out[i, i + 1:] = np.maximum.accumulate(arr[i:])
    return out


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The search allocates millions of small, acyclic objects (actions, heap entries) that the cyclic
    garbage collector would traverse again and again with every cached schedule alive (measured: a
    third of the search time); pause it, and leave its state as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _reason_key(reason: str) -> str:
    return reason.split(":")[0] if reason else "unknown"


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def plan(profile: ModelProfile, cluster: Cluster, request: TrainingRequest) -> PlanResult:
    """Rank every valid configuration (module docstring)."""
    return Planner(profile, cluster, request).search()


def predict(profile: ModelProfile, cluster: Cluster, request: TrainingRequest, config: Config) -> Candidate:
    """The same record as :func:`plan` gives, for one configuration the user names."""
    if config.schedule in ASYNC_SCHEDULES and not request.allow_async:
        request = request.model_copy(update={"allow_async": True})
    planner = Planner(profile, cluster, request)
    cand, costs = planner.prepare(config)
    if costs is None:
        return cand
    return planner.explain(planner.evaluate(cand, costs))
