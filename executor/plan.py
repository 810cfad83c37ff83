"""The executor's input: a plan (schedule IR + layer partition + B, W, D, t, schedule parameters) and a
model of the zoo, loaded and checked *before* any process is launched.

A :class:`RunPlan` comes from

* a candidate of ``pipeplan plan --json`` (:meth:`RunPlan.from_candidate`; a file holding
  ``{"candidates": [...]}`` or a bare candidate object, :func:`load_plan_file`), or
* the direct form of ``pipeplan run`` (:meth:`RunPlan.direct`): schedule, D, N, W, b, parameters; the
  partition is then the balanced one (consecutive layers, as even as possible).

Micro-batches: ``microbatches`` is N per pipeline group, as the planner writes it, and
``global_batch = W * N * b``. Chimera's backward halving (Chimera 3.5) runs the same lists on ``2N``
micro-batches of ``b/2`` samples; forward doubling runs ``N`` micro-batches of ``b`` whose forwards go two
at a time (an ``F`` action with ``span = 2``). :attr:`RunPlan.schedule_microbatches` and
:attr:`RunPlan.rows` are the schedule's view.

:meth:`RunPlan.schedule` builds the compute-only schedule with the planner's builder and lowers it with
:func:`planner.schedules.ir.lower`: the executor runs exactly the lists the simulator times.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from executor.models import get_config
from executor.models.config import ModelConfig
from executor.models.source import ModuleSource, ZooSource
from planner.schedules import build, parameters
from planner.schedules.ir import Schedule, lower

SCHEDULE_PARAM_KEYS = ("chunks", "waves", "pipelines", "concat")
ASYNC = ("pipedream", "pipedream-2bw")


class PlanError(ValueError):
    """The plan cannot run (raised before anything is launched)."""


@dataclass
class RunPlan:
    model: str = "gpt-tiny"
    schedule_name: str = "1f1b"
    pipeline: int = 2  # D
    data: int = 1  # W
    tensor: int = 1  # t
    micro_batch: int = 1  # b
    microbatches: int = 2  # N per pipeline group
    global_batch: int = 0  # W * N * b (0: derive)
    recompute: bool = False
    params: dict[str, Any] = field(default_factory=dict)  # chunks / waves / pipelines / concat
    partition: list[list[int]] = field(default_factory=list)  # [start, end) per schedule stage
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields to change
    model_spec: dict[str, Any] | None = None  # a ModelSpec (e.g. from --hf-config) instead of the preset `model`
    module: str | None = None  # a user's factory (pkg.mod:build or file.py:build) instead of a zoo model
    iterations: int = 1
    warmup: int = 0
    seed: int = 0
    lr: float = 0.1
    dtype: str = "float64"
    emulate: str | None = None  # profile JSON: emulated compute (executor.emulate)
    cluster: str | None = None  # cluster JSON for emulated durations

    def __post_init__(self) -> None:
        if not self.global_batch:
            self.global_batch = self.data * self.microbatches * self.micro_batch

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_candidate(cls, cand: dict[str, Any], **overrides: Any) -> RunPlan:
        """A candidate of ``pipeplan plan --json`` (``Candidate.to_dict()``)."""
        missing = [k for k in ("tensor", "pipeline", "data", "micro_batch", "schedule", "microbatches")
                   if k not in cand]
        if missing:
            raise PlanError(f"plan candidate lacks the field(s) {', '.join(missing)}")
        params = {k: cand[k] for k in SCHEDULE_PARAM_KEYS if cand.get(k) is not None}
        plan = cls(schedule_name=str(cand["schedule"]), pipeline=int(cand["pipeline"]), data=int(cand["data"]),
                   tensor=int(cand["tensor"]), micro_batch=int(cand["micro_batch"]),
                   microbatches=int(cand["microbatches"]), global_batch=int(cand.get("global_batch") or 0),
                   recompute=bool(cand.get("recompute", False)), params=params,
                   partition=[list(map(int, p)) for p in cand.get("partition") or []])
        for k, v in overrides.items():
            if v is not None:
                setattr(plan, k, v)
        return plan

    @classmethod
    def direct(cls, schedule: str, devices: int, microbatches: int, **kw: Any) -> RunPlan:
        params = {k: kw.pop(k) for k in SCHEDULE_PARAM_KEYS if kw.get(k) is not None}
        for k in SCHEDULE_PARAM_KEYS:
            kw.pop(k, None)
        return cls(schedule_name=schedule, pipeline=devices, microbatches=microbatches, params=params, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPlan:
        return cls(**data)

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def config(self) -> ModelConfig:
        cfg = ModelConfig.model_validate(self.model_spec) if self.model_spec is not None else get_config(self.model)
        return cfg.with_(**self.model_overrides) if self.model_overrides else cfg

    def source(self) -> ZooSource | ModuleSource:
        """Where the layers and batches come from (:mod:`executor.models.source`)."""
        if self.module is not None:
            return ModuleSource(self.module)
        return ZooSource(self.config)

    @property
    def halving(self) -> bool:
        return self.params.get("concat") == "backward-halving"

    @property
    def schedule_microbatches(self) -> int:
        """Micro-batches of the schedule's lists (2N for backward halving)."""
        return 2 * self.microbatches if self.halving else self.microbatches

    @property
    def rows(self) -> int:
        """Samples of one schedule micro-batch (b/2 for backward halving)."""
        return self.micro_batch // 2 if self.halving else self.micro_batch

    @property
    def world_size(self) -> int:
        return self.pipeline * self.data * self.tensor

    @property
    def synchronous(self) -> bool:
        return self.schedule_name not in ASYNC

    def compute_schedule(self) -> Schedule:
        try:
            return build(self.schedule_name, self.pipeline, self.schedule_microbatches, **self.params)
        except ValueError as e:
            raise PlanError(f"schedule: {e}") from None

    def schedule(self) -> Schedule:
        """The lowered schedule every rank walks (same lowering as the simulator)."""
        sched = self.compute_schedule()
        eager = sched.params.get("eager", "none")
        if eager == "auto":
            eager = "none"
        return lower(sched, eager=eager)

    def num_layers(self) -> int:
        """Layers the partition covers: the model's, or the profile's in emulated mode."""
        if self.emulate:
            from planner.profile import load_profile

            try:
                return len(load_profile(self.emulate).layers)
            except Exception as e:  # noqa: BLE001 - any reading/validation error is a bad plan
                raise PlanError(f"cannot read the emulation profile {self.emulate}: {e}") from None
        if self.module is not None:
            try:
                return ModuleSource(self.module).num_layers
            except Exception as e:  # noqa: BLE001 - the user's code: any error makes the plan unrunnable
                raise PlanError(f"--module {self.module}: {type(e).__name__}: {e}") from None
        return self.config.num_profile_layers

    def bounds(self, stages: int, layers: int | None = None) -> list[tuple[int, int]]:
        if self.partition:
            return [(int(a), int(b)) for a, b in self.partition]
        return balanced_partition(layers if layers is not None else self.num_layers(), stages)

    # ---- validation --------------------------------------------------------------------------------
    def validate(self, world_size: int | None = None) -> Schedule:
        """Check everything that can be checked without processes; return the lowered schedule."""
        for name in ("pipeline", "data", "tensor", "micro_batch", "microbatches", "iterations"):
            if getattr(self, name) < 1:
                raise PlanError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.module is not None:
            if self.tensor > 1:
                raise PlanError("--module: tensor parallelism needs the zoo's blocks; a user model runs with t = 1")
        else:
            try:
                cfg = self.config
                cfg.family  # noqa: B018 - a shape no zoo family builds is refused here
            except (ValueError, TypeError) as e:
                raise PlanError(f"model: {e}") from None
        if self.schedule_name not in ("gpipe", "1f1b", "interleaved", "chimera", "hanayo", "zb-h1", "gems",
                                      "pipedream", "pipedream-2bw"):
            raise PlanError(f"unknown schedule {self.schedule_name!r}")
        allowed = parameters(self.schedule_name)
        for k in self.params:
            if k not in allowed:
                raise PlanError(f"schedule {self.schedule_name!r} does not take {k!r}")
        if world_size is not None and world_size != self.world_size:
            raise PlanError(f"the plan needs D*W*t = {self.pipeline}*{self.data}*{self.tensor} = "
                            f"{self.world_size} processes (devices), but the world size is {world_size}")
        if self.global_batch != self.data * self.microbatches * self.micro_batch:
            raise PlanError(f"micro-batches do not divide the batch: global batch {self.global_batch} != "
                            f"W*N*b = {self.data}*{self.microbatches}*{self.micro_batch}")
        if self.halving and self.micro_batch % 2:
            raise PlanError(f"backward halving needs an even micro-batch size, got b={self.micro_batch}")
        if self.module is None and self.tensor > 1 and (cfg.heads % self.tensor or cfg.ffn_hidden % self.tensor):
            raise PlanError(f"tensor parallelism t={self.tensor} must divide heads ({cfg.heads}) and the "
                            f"MLP width ({cfg.ffn_hidden})")
        if not self.synchronous and (self.data > 1 or self.tensor > 1):
            raise PlanError(f"{self.schedule_name}: the executor runs asynchronous schedules with W = t = 1 only")
        if self.dtype not in ("float32", "float64"):
            raise PlanError(f"dtype must be float32 or float64, got {self.dtype!r}")
        sched = self.schedule()
        L = self.num_layers()
        if not self.partition and sched.stages > L:
            raise PlanError(f"{sched.stages} stages but the model has only {L} layers" + (
                "" if self.module else f" (embedding, {cfg.layers} blocks, head)"))
        check_partition(self.bounds(sched.stages, L), sched.stages, L)
        if not self.synchronous and self.recompute:
            raise PlanError(f"{self.schedule_name}: recomputation with weight stashing is not supported")
        return sched


def balanced_partition(layers: int, stages: int) -> list[tuple[int, int]]:
    """Consecutive ranges, as even as possible, earlier stages larger."""
    q, r = divmod(layers, stages)
    out, i = [], 0
    for s in range(stages):
        n = q + (1 if s < r else 0)
        out.append((i, i + n))
        i += n
    return out


def check_partition(bounds: list[tuple[int, int]], stages: int, layers: int) -> None:
    if len(bounds) != stages:
        raise PlanError(f"partition has {len(bounds)} ranges but the schedule has {stages} stages")
    pos = 0
    for s, (a, b) in enumerate(bounds):
        if a != pos or b <= a:
            raise PlanError(f"partition does not cover the model: stage {s} is [{a}, {b}), expected to start "
                            f"at {pos} and be non-empty")
        pos = b
    if pos != layers:
        raise PlanError(f"partition does not cover the model: it ends at layer {pos}, the model has {layers} "
                        f"layers")


def load_plan_file(path: str | Path, candidate: int = 0, **overrides: Any) -> RunPlan:
    """``pipeplan plan --json`` output (``{"candidates": [...]}``) or a bare candidate object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"cannot read plan {path}: {e}") from None
    if isinstance(data, dict) and "candidates" in data:
        cands = data["candidates"]
        if not 0 <= candidate < len(cands):
            raise PlanError(f"plan {path} has {len(cands)} candidate(s); --candidate {candidate} is out of range")
        data = cands[candidate]
    if not isinstance(data, dict):
        raise PlanError(f"plan {path}: expected a candidate object or {{'candidates': [...]}}")
    return RunPlan.from_candidate(data, **overrides)
