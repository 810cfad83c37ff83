"""What the search returns: one :class:`Candidate` per configuration and the :class:`PlanResult` around
them, with their JSON documents (what the CLI prints and the API stores)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from planner.cost import ConfigCosts
from planner.placement import placement_text
from planner.request import Config
from planner.runspec import RunSpec, executor_refusal
from planner.schedules import pipedream_rr
from planner.simulate import SimResult


@dataclass
class Candidate:
    config: Config
    microbatches: int
    iteration_time: float = math.inf
    throughput: float = 0.0
    bubble_ratio: float = 1.0
    #: per device, bytes at its peak: model state + activations + ``memory_reserve`` (:mod:`planner.memory`);
    #: a candidate fits when the largest is at most ``memory_capacity``
    memory: list[float] = field(default_factory=list)
    memory_capacity: float = 0.0
    #: bytes per device set aside for the framework and workspace (the request's ``memory_reserve_bytes``),
    #: part of ``memory``: ``model_memory`` is the model's own share
    memory_reserve: float = 0.0
    #: which reserve applied: the request's value, or the default of the cluster's device kind (planner.reserve)
    memory_reserve_source: str = ""
    fits: bool = False
    reason: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)
    closed_forms: dict[str, float | None] = field(default_factory=dict)
    partition: list[list[int]] = field(default_factory=list)
    lower_bound: float = 0.0
    global_batch: int = 0
    #: model state per parameter a device holds (the request's ``bytes_per_param``, less the optimizer's share
    #: spread over the W replicas where ``shard_optimizer``: ZeRO-1, Megatron's distributed optimizer)
    state_bytes_per_param: float = 0.0
    shard_optimizer: bool = False  # (true with shard_parameters too: the optimizer state is sharded then as well)
    #: the weights and gradients are sharded too (ZeRO-3, FSDP: :mod:`planner.fsdp`); ``state_bytes_per_param``
    #: is then the shards' and ``state`` adds the gathered copies
    shard_parameters: bool = False
    #: per device, bytes of weights, gradients and optimizer state (:meth:`MemoryModel.device_state`)
    state: list[float] = field(default_factory=list, repr=False)
    #: its bound was raised with its merged warm-up (:meth:`planner.search.Planner.refine`)
    refined: bool = False
    #: what the row is (:func:`planner.equivalence.describe`) and the labels of the configurations that
    #: run the same thing (:func:`planner.equivalence.collapse`)
    name: str = ""
    alternatives: list[str] = field(default_factory=list)
    #: each alternative's own simulated time (:func:`planner.equivalence.collapse`): the search lists only the
    #: twins within the k-th best time (:func:`planner.search._merge`); not in the JSON
    alternative_times: list[float] = field(default_factory=list, repr=False)
    #: the matrix-engine rate, a fraction of the burst rate, a power-limited GPU holds in this step
    #: (:mod:`planner.power`); None where the device or profile has no power limit
    held_rate: float | None = None
    simulation: SimResult | None = field(default=None, repr=False)
    costs: ConfigCosts | None = field(default=None, repr=False)

    @property
    def model_memory(self) -> list[float]:
        """Per device, the model's own bytes at its peak (weights, gradients, optimizer state, activations):
        ``memory`` without the reserve."""
        return [max(m - self.memory_reserve, 0.0) for m in self.memory]

    @property
    def run_spec(self) -> RunSpec:
        """What the executor runs (:class:`planner.runspec.RunSpec`)."""
        return RunSpec(config=self.config, microbatches=self.microbatches,
                       partition=[(a, b) for a, b in self.partition])

    def label(self) -> str:
        """The configuration's label; a plan with replicated stages adds them, as PipeDream's partition
        gives them (layer ranges and replicas: ``stages 0-11 x2, 12-23 x1``), and for PipeDream's asynchronous
        variant the weight versions a replica of each stage stashes (``weight stashing (2,2,1 versions per
        stage)``, :mod:`planner.schedules.pipedream_rr`)."""
        c = self.config
        if not c.replication or not self.partition:
            return c.label()
        reps = [int(x) for x in c.replication.split(",")]
        parts = ", ".join(f"{a}-{b - 1} x{r}" for (a, b), r in zip(self.partition, reps, strict=False))
        if c.schedule == "pipedream-rr":  # asynchronous: the weight versions each stage's replicas stash
            versions = ",".join(map(str, pipedream_rr.weight_versions(reps, self.microbatches)))
            return f"{c.label()} stages {parts}, weight stashing ({versions} versions per stage)"
        return f"{c.label()} stages {parts}"

    @property
    def recompute_granularity(self) -> str | None:
        """Megatron-LM's name for what this candidate recomputes: ``"full"`` (``recompute``: every layer's
        forward again), ``"selective"`` (the profile's layers re-run their attention core: Korthikanti et al.
        2022 section 5, a property of the profile), ``"op"`` (what torchtitan's selective op checkpointing
        re-runs, also the profile's), ``"none"``; None when not costed."""
        if self.config.recompute:
            return "full"
        if self.costs is None:
            return None
        return self.costs.granularity

    @property
    def sequence_parallel(self) -> bool | None:
        """Whether the profile's times at this candidate's t assume Megatron's sequence parallelism (False at
        t = 1); None when not costed."""
        if self.costs is None:
            return None
        return bool(self.costs.sequence_parallel and self.config.tensor > 1)

    @property
    def kernels(self) -> str | None:
        """The kernels the profile's times assume: ``"eager"`` (PyTorch eager ops) or ``"fused"``
        (:mod:`planner.operators`, "Kernels"); None when not costed."""
        return self.costs.kernels if self.costs is not None else None

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        """The candidate document: ``run_spec`` (what to run) and, flat beside it for reading, the
        configuration's fields and the predicted figures."""
        c = self.config
        out: dict[str, Any] = {
            "run_spec": self.run_spec.model_dump(mode="json"),
            "tensor": c.tensor, "pipeline": c.pipeline, "data": c.data,
            **({"expert": c.expert} if c.expert > 1 else {}),
            **({"expert_tensor": c.expert_tensor} if c.expert_tensor else {}), "micro_batch": c.micro_batch,
            "schedule": c.schedule, "recompute": c.recompute, **c.schedule_params(),
            "microbatches": self.microbatches, "global_batch": self.global_batch, "label": self.label(),
            "name": self.name or self.label(), "alternatives": self.alternatives,
            "iteration_time": self.iteration_time, "throughput": self.throughput,
            "bubble_ratio": self.bubble_ratio, "memory": self.memory,
            "memory_capacity": self.memory_capacity, "peak_memory": max(self.memory, default=0.0),
            "memory_reserve": self.memory_reserve, "memory_reserve_source": self.memory_reserve_source,
            "model_memory": self.model_memory, "state_bytes_per_param": self.state_bytes_per_param,
            "shard_optimizer": self.shard_optimizer, "shard_parameters": self.shard_parameters,
            "model_peak_memory": max(self.model_memory, default=0.0),
            "fits": self.fits, "reason": self.reason, "breakdown": self.breakdown,
            "closed_forms": self.closed_forms, "partition": self.partition,
            "order": c.order, "placement": placement_text(c.order),
            "compute": self.costs.compute_source if self.costs is not None else None,
            "recompute_granularity": self.recompute_granularity, "kernels": self.kernels,
            "sequence_parallel": self.sequence_parallel, "held_rate": self.held_rate,
            # why pipeplan's executor does not run it (None: it does); the planner ranks for any runtime
            "executor_refusal": executor_refusal(c),
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
    #: what the user should know about the inputs (:func:`planner.mismatch.device_warnings`)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        return {
            "candidates": [c.to_dict(timeline) for c in self.candidates],
            "infeasible": [c.to_dict() for c in self.infeasible],
            "rejected": dict(sorted(self.rejected.items())),
            "evaluated": self.evaluated, "simulated": self.simulated, "considered": self.considered,
            "warnings": self.warnings,
        }


def reason_key(reason: str) -> str:
    """The counter key of a rejection reason: its text before the first colon."""
    return reason.split(":")[0] if reason else "unknown"


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"
