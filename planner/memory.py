"""The memory model of the search: what a device holds, checked before anything is simulated.

A device holds, for every (replica, stage) pair placed on it, the stage's weights, gradients and optimizer
state (``bytes_per_param`` per parameter over t; ZeRO, Rajbhandari et al. 2020, 3.1; with ``shard_optimizer``
the optimizer's share over the W replicas too: :meth:`planner.request.TrainingRequest.state_bytes_per_param`;
with ``shard_parameters`` all of it, plus the gathered weights and gradients :func:`planner.fsdp.unsharded_bytes`
counts; a
replicated stage of PipeDream's plans is counted as sharded over the W groups only, an upper bound), plus the
extra weight
versions of asynchronous schedules (PipeDream weight stashing, 2BW double buffering); the activations of
its in-flight micro-batches -- their whole stash, or with full recomputation what each checkpointed
layer keeps (its input) plus the stash of the layers that are not checkpointed (the embedding, the LM head),
:func:`planner.cost.recompute_kept_bytes` --, and a split backward's held output gradients (ZB-H1: from each I to
its W, :meth:`planner.cost.ConfigCosts.held_grads`; known before the lists exist where the builder says how many
are held where the activations peak, :func:`planner.schedules.held_at_peak`) -- plus the largest working set of
one layer at a time: recomputing,
the largest checkpointed layer's stash (the layer being recomputed), or what a layer holds beside its stash while
it runs (the loss's fp32 logits and gradients, :func:`planner.cost.layer_transient`), whichever is larger; and
the request's reserve. :meth:`MemoryModel.simulated_memory` counts exactly
that from a simulation; the checks before it use the schedule's in-flight counts (exact, or a lower bound)
or, for merged schedules, the replayed warm-up, and :meth:`MemoryModel.partition_fitting` finds a partition that fits
when the time-balanced one does not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from planner import fsdp
from planner.candidate import Candidate, gib
from planner.cluster import Cluster
from planner.cost import ConfigCosts, layer_held_grads, own_layer_params, stage_infos
from planner.dtypes import DTYPE_BYTES
from planner.expert_parallel import state_split
from planner.partition import PartitionError, balance_by_cost, prefix_sums
from planner.profile import ModelProfile, checkpointed
from planner.request import Config, TrainingRequest
from planner.schedules import inflight_exact
from planner.schedules.ir import Schedule
from planner.shapes import ScheduleCache, Warmup, schedule_key
from planner.simulate import SimResult


class MemoryModel:
    """Per-device memory of the configurations of one (profile, cluster, request); caches by value."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, request: TrainingRequest,
                 shapes: ScheduleCache) -> None:
        self.profile, self.cluster, self.request, self.shapes = profile, cluster, request, shapes
        self.total_params = profile.total_params
        self._stage_states: dict[tuple, list[float]] = {}
        self._device_states: dict[tuple, list[float]] = {}
        self._partitions: dict[tuple, list[tuple[int, int]] | None] = {}
        self._single_layers: dict[int, list[Any]] = {}
        self._layer_mem: dict[tuple[int, float], tuple[np.ndarray, ...]] = {}
        self._held_spans: dict[tuple[int, bool], np.ndarray] = {}
        self._list_inflight: dict[tuple, list[dict[int, float]]] = {}

    # ---- model state ---------------------------------------------------------------------------
    def total_state(self, data: int) -> float:
        """All model state of one model copy with ``data`` (W) data-parallel replicas, bytes."""
        return self.total_params * self.request.state_bytes_per_param(data)

    def stage_state(self, costs: ConfigCosts) -> list[float]:
        """Weights, gradients and optimizer state of one replica of each stage, plus the extra weight versions
        of asynchronous schedules, cached per (stage ranges, t, weight versions); a device holds the sum
        over its stage replicas."""
        sched = costs.schedule
        versions = tuple(sched.weight_versions) if not sched.synchronous else ()
        per_param = self.request.state_bytes_per_param(costs.config.data)
        # a mixture of experts' experts: state sharded over the W/e replicas holding them (planner.expert_parallel)
        expert_per_param = self.request.state_bytes_per_param(costs.config.expert_data)
        # sharded weights: the gathered copies beside the shards depend on whether a pipeline keeps them
        gathered = (fsdp.reshards_after_forward(sched.devices),) if costs.fsdp else ()
        key = (tuple(info.layers for info in costs.stages), costs.t, versions, per_param, gathered, expert_per_param)
        got = self._stage_states.get(key)
        if got is None:
            got = []
            for s, info in enumerate(costs.stages):
                v = state_split(info.params - self._tied_in_stage(info), info.expert_params, per_param,
                                expert_per_param) / costs.t
                if versions:
                    v += (versions[s] - 1) * info.param_bytes / costs.t
                if gathered:
                    v += fsdp.unsharded_bytes(own_layer_params(self.profile, info), costs.el, costs.t, sched.devices)
                got.append(v)
            self._stage_states[key] = got
        return got

    def _tied_in_stage(self, info: Any) -> float:
        """A tied LM head in the same stage as the embedding it copies is not a second copy."""
        i, j = info.layers
        kinds = {lay.kind for lay in self.profile.layers[i:j]}
        return info.tied_params if "embedding" in kinds else 0.0

    def device_state(self, config: Config, sched: Schedule, costs: ConfigCosts, costs_key: tuple) -> list[float]:
        """Per device of ``sched``, the model state of the stage replicas it holds; ``costs_key`` names what
        ``costs``' figures depend on (t, stages, samples, recomputation, partition)."""
        key = (schedule_key(config, sched.microbatches), self.request.state_bytes_per_param(config.data), config.expert,
               config.expert_tensor, *costs_key)
        got = self._device_states.get(key)
        if got is None:
            lay = self.shapes.layout(config, sched)
            got = self._device_states[key] = np.asarray(self.stage_state(costs))[lay.stage].sum(axis=1).tolist()
        return got

    # ---- checks before simulating --------------------------------------------------------------
    def too_big(self, cand: Candidate, activations: list[float]) -> bool:
        """Reject before simulating when a lower bound of some device's activations already overflows its
        memory; the candidate keeps those lower bounds as its per-device memory."""
        cap = self.cluster.memory_bytes
        reserve = self.request.memory_reserve_bytes
        need = [state + act + reserve for state, act in zip(cand.state, activations, strict=True)]
        worst = max(range(len(need)), key=lambda d: need[d])
        if need[worst] <= cap:
            return False
        cand.memory = need
        cand.reason = (f"out of memory: device {worst} needs at least {gib(need[worst])}, "
                       f"{gib(need[worst] - cap)} over {gib(cap)} (activations counted from the schedule, "
                       "not simulated)")
        return True

    def too_big_before_merge(self, cand: Candidate, costs: ConfigCosts, n_sched: int,
                             enough: Callable[[Warmup], bool] | None = None) -> tuple[bool, Warmup | None]:
        """Chimera and Hanayo (whose in-flight counts before merging are only lower bounds): reject on
        memory with the merged warm-up before merging everything. Returns (rejected, the last warm-up
        merged). ``enough(warmup)``, asked after each round that fits, may end the rounds there (the
        planner's time bound on that warm-up already excludes the candidate)."""
        cfg = cand.config
        # the warm-up holds the most activations: merge only its first slots (a prefix of the full lists, so
        # its peak is a lower bound of the device's peak) and reject what already does not fit; S, 2S, then
        # 3S slots (the merge goes on from where it stopped, and the full build after it too). The prefixes
        # are the structure's, shared by the configurations with the same one (planner.shapes.Warmup)
        S = costs.schedule.stages
        act = np.array([costs.activation(s) for s in range(S)], dtype=float)
        warmup: Warmup | None = None
        for slots in (S, 2 * S, 3 * S):
            warmup = self.shapes.warmup(cfg, n_sched, slots)
            if warmup is None:
                return False, None
            if self.too_big(cand, warmup.peaks(act)):
                return True, None
            if enough is not None and enough(warmup):
                break
        return False, warmup

    @staticmethod
    def first_slots_floor(first: np.ndarray, stage: np.ndarray, per_mb: np.ndarray, act: np.ndarray) -> np.ndarray:
        """Per device, the activations alive after the ``first[d]`` forwards a merged list runs in its unit
        slots ``0 .. first[d]-1``, one per slot, before any backward (:func:`planner.schedules.merge.
        forwards_first`): the forward of slot ``j`` is one of a stage ``s <= j`` it holds (a forward of stage
        ``s`` comes after ``s`` forwards of one slot each), so it adds at least the smallest activation of
        those stages. ``stage``, ``per_mb``: the layout's (devices, pairs) arrays; pairs without
        micro-batches run nothing."""
        order = np.argsort(stage, axis=1, kind="stable")
        arrive = np.take_along_axis(stage, order, axis=1).astype(float)
        a = np.where(np.take_along_axis(per_mb, order, axis=1) > 0, act[np.take_along_axis(stage, order, axis=1)],
                     np.inf)
        low = np.minimum.accumulate(a, axis=1)  # the smallest activation among the stages arrived so far
        upto = np.minimum(np.concatenate([arrive[:, 1:], np.full((len(stage), 1), np.inf)], axis=1), first[:, None])
        slots = np.maximum(upto - arrive, 0.0)
        return np.where(slots > 0, slots * np.where(np.isfinite(low), low, 0.0), 0.0).sum(axis=1)

    def list_inflight(self, config: Config, sched: Schedule) -> list[dict[int, float]]:
        """Per device and stage of the full schedule ``sched``, the most micro-batches whose activations are
        alive at once, counted in list order as the simulator counts them (a forward adds its
        micro-batches, B or W frees one: a split backward's W still needs them)."""
        key = schedule_key(config, sched.microbatches)
        got = self._list_inflight.get(key)
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
                    elif a.kind in ("B", "W"):
                        alive[a.stage] = alive.get(a.stage, 0) - 1
                got.append(peak)
            self._list_inflight[key] = got
        return got

    def simulated_memory(self, cand: Candidate, costs: ConfigCosts, res: SimResult) -> list[float]:
        """Per device, what it needs at its peak in simulation ``res``: model state, the peak of its
        activations, the reserve, and -- recomputing -- one checkpointed layer's stash materialised again."""
        return self.peak_memory(cand, costs, [d.peak_activations for d in res.devices])

    def list_peaks(self, sched: Schedule, costs: ConfigCosts) -> list[float]:
        """Per device, the peak of its alive activations in the full lists of ``sched``, as the simulator
        counts them (:func:`planner.schedules.encoded.replay_encoded`: in list order, a forward adds its
        micro-batches times the stage's :meth:`activation`, a B takes one away, a split backward's I adds the
        stage's :meth:`planner.cost.ConfigCosts.held_grads` and its W takes both away, the peak is taken after
        forwards and I's; the same additions in the same order, so the same numbers). It depends on the
        order of the lists only, not on any time: the simulated memory is known before simulating. The
        count is :meth:`planner.shapes.Warmup.peaks`', on the whole lists (slots 0: not a prefix)."""
        act = np.array([costs.activation(s) for s in range(sched.stages)], dtype=float)
        held = np.array([costs.held_grads(s) for s in range(sched.stages)], dtype=float)
        return Warmup(sched, sched.actions, 0).peaks(act, held)

    def peak_memory(self, cand: Candidate, costs: ConfigCosts, peaks: list[float]) -> list[float]:
        """:meth:`simulated_memory` from the per-device activation peaks (:meth:`list_peaks`), plus the largest
        working set of one layer at a time: a recomputed layer's stash materialised again, or what a layer
        holds beside the stash while it runs (the loss's logits and gradients: :func:`planner.cost.
        layer_transient`), the larger of the two (they are not held at once)."""
        mem = []
        for d in range(cand.config.pipeline):
            m = cand.state[d] + peaks[d] + self.request.memory_reserve_bytes
            work = max(costs.stages[s].transient_bytes for _, s in costs.held[d])
            if cand.config.recompute:  # recomputing a layer materialises its stash once
                work = max(work, max(costs.stages[s].recompute_working_bytes for _, s in costs.held[d]))
            mem.append(m + work * costs.base_b)
        return mem

    # ---- a partition that fits ------------------------------------------------------------------
    def partition_fitting(self, config: Config, sched: Schedule, samples: float,
                          layer_costs: list[float]) -> list[tuple[int, int]] | None:
        """For schedules with one stage per device and exact in-flight counts (GPipe, 1F1B, ZB-H1,
        PipeDream, 2BW): the partition balancing ``layer_costs`` among those whose every device fits its
        memory (the module docstring's terms: what :meth:`simulated_memory` counts, ZB-H1's held output
        gradients included). None when none fits."""
        if not (sched.replicas == 1 and sched.stages == sched.devices > 1 and inflight_exact(config.schedule)):
            return None
        counts = self.shapes.inflight(config, sched)
        versions = sched.weight_versions if not sched.synchronous else []
        t, S = config.tensor, sched.stages
        per_param = self.request.state_bytes_per_param(config.data)
        if self.request.shard_parameters and config.data > 1:  # pipelined: gathered weights, whole gradients
            per_param += fsdp.gathered_bytes_per_param(DTYPE_BYTES.get(self.profile.dtype.lower(), 2))
        # (expert parallelism is not planned with sharded weights: planner.expert_parallel.expert_error)
        expert_per_param = (per_param if config.expert_data == config.data
                            else self.request.state_bytes_per_param(config.expert_data))
        # what the memory model depends on: configurations that differ only in N beyond D share it
        # a split backward's I's hold output gradients where the activations peak (ZB-H1), on a stage that splits
        holds = self.shapes.held(config, sched)
        held = tuple(holds.get((0, k), 0) for k in range(S))
        key = (tuple(counts.get((0, k), 0) for k in range(S)), tuple(versions), t, samples, config.recompute,
               per_param, held, expert_per_param)
        if key in self._partitions:
            return self._partitions[key]
        cap = self.cluster.memory_bytes - self.request.memory_reserve_bytes
        state, weights, stash, kept, biggest, transient = self._layer_memory(t, per_param, expert_per_param)
        work = np.maximum(biggest, transient) if config.recompute else transient
        # per sample and micro-batch in flight, running sums of what a stage keeps (stash_bytes or
        # recompute_kept_bytes of planner.cost.stage_infos, summed layer by layer)
        per_mb = kept if config.recompute else stash
        # per sample and held I, what a stage of layers [i, j) holds for its W (0 where it does not split)
        grads = self._held_grads(t, config.recompute) if any(held) else None
        # necessary (and cheap): packing the layers greedily, each stage as far as its memory allows, covers
        # the model. Memory only grows as a stage takes more layers, so the greedy packing is the most any
        # partition can cover.
        L, start = len(self.profile.layers), 0
        for k in range(S):
            live = counts.get((0, k), 0) * samples
            need = state[start:] - state[start] + (versions[k] - 1 if versions else 0) * (
                weights[start:] - weights[start]) + live * (per_mb[start:] - per_mb[start])
            need = need + work[start, start:] * samples
            # (the held gradients only without recomputation: with it a checkpointed layer stops the split, so they
            # do not grow with the stage; left out, the check stays a necessary one)
            if grads is not None and not config.recompute:
                need = need + held[k] * samples * grads[start, start:]
            room = np.nonzero(need[1:L - start - (S - k - 1) + 1] <= cap)[0]  # leave a layer per later stage
            if room.size == 0:
                break
            start += int(room[-1]) + 1
        if start < L:
            self._partitions[key] = None
            return None

        # the stage-independent terms once (the same additions in the same order as per stage: same figures)
        state_span = state[None, :] - state[:, None]
        weight_span = weights[None, :] - weights[:, None] if versions else None
        per_mb_span, working = per_mb[None, :] - per_mb[:, None], work * samples
        seen: dict[tuple[float, float, int], np.ndarray] = {}  # stages of equal terms fit alike

        def fits(k: int) -> np.ndarray:
            live, extra = counts.get((0, k), 0) * samples, (versions[k] - 1 if versions else 0)
            got = seen.get((live, extra, held[k]))
            if got is None:
                need = state_span
                if weight_span is not None:
                    need = need + extra * weight_span
                need = need + live * per_mb_span
                if grads is not None and held[k]:
                    need = need + held[k] * samples * grads
                got = seen[(live, extra, held[k])] = need + working <= cap
            return got

        try:
            bounds = balance_by_cost(layer_costs, S, fits=fits).bounds
        except PartitionError:
            bounds = None
        self._partitions[key] = bounds
        return bounds

    def _layer_memory(self, t: int, per_param: float, expert_per_param: float) -> tuple[np.ndarray, ...]:
        """Per-layer memory figures for :meth:`partition_fitting`, cached per (t, model state per parameter, per
        expert parameter):
        running sums of model state, weights, stashed activations per sample and what full recomputation
        keeps per sample (:func:`planner.cost.recompute_kept_bytes`), the recomputation working set (the
        largest checkpointed layer's stash per sample) and the largest transient per sample
        (:func:`planner.cost.layer_transient`) of every layer range."""
        got = self._layer_mem.get((t, per_param, expert_per_param))
        if got is None:
            layers = self._layer_infos(t)
            got = self._layer_mem[(t, per_param, expert_per_param)] = (
                prefix_sums([state_split(info.params, info.expert_params, per_param, expert_per_param) / t
                             for info in layers]),
                prefix_sums([info.param_bytes / t for info in layers]),
                prefix_sums([info.stash_bytes for info in layers]),
                prefix_sums([info.recompute_kept_bytes for info in layers]),
                _range_max([info.recompute_working_bytes for info in layers]),
                _range_max([info.transient_bytes for info in layers]))
        return got

    def _held_grads(self, t: int, recompute: bool) -> np.ndarray:
        """``[i, j]``: per sample, the output gradients a stage of layers ``[i, j)`` holds per I until its W
        (:func:`planner.cost.layer_held_grads`, summed), 0 where the stage does not split its backward
        (:func:`planner.profile.stage_splits_backward`: under full recomputation, a checkpointed layer in it)."""
        key = (t, recompute)
        got = self._held_spans.get(key)
        if got is None:
            layers = self.profile.layers
            sums = prefix_sums([layer_held_grads(lay, t) for lay in layers])
            got = sums[None, :] - sums[:, None]
            if recompute:
                marks = prefix_sums([float(checkpointed(lay.kind)) for lay in layers])
                got = np.where(marks[None, :] - marks[:, None] > 0, 0.0, got)
            got = self._held_spans[key] = got
        return got

    def _layer_infos(self, t: int) -> list[Any]:
        """:func:`planner.cost.stage_infos` of every single layer (what a stage's figures are sums of)."""
        got = self._single_layers.get(t)
        if got is None:
            got = self._single_layers[t] = stage_infos(self.profile, [(i, i + 1) for i in
                                                                      range(len(self.profile.layers))], t)
        return got


def _range_max(xs: list[float]) -> np.ndarray:
    """``out[i, j]``: the largest of ``xs[i:j]`` (0 where ``j <= i``)."""
    n = len(xs)
    out = np.zeros((n + 1, n + 1))
    arr = np.asarray(xs, dtype=float)
    for i in range(n):
        out[i, i + 1:] = np.maximum.accumulate(arr[i:])
    return out
