"""What to run: one configuration, its micro-batch count and its layer partition -- the typed record the
planner ranks (a candidate carries it), the API stores (inside the candidate document) and the executor
runs (:class:`executor.plan.RunPlan` adds only run-time options). Torch-free.

The rules planner, service and executor must agree on are written here and nowhere else:

* **Backward halving** (Chimera 3.5, concatenating more than D micro-batches): the same lists run on
  ``2N`` micro-batches of ``b/2`` samples (:func:`halves_backward`, :func:`schedule_microbatches`,
  :func:`schedule_samples`). Forward doubling keeps ``N`` micro-batches of ``b`` (its forwards go two at
  a time, an ``F`` with ``span = 2``).
* **Which all-reduces are eager** when the compute-only schedule is lowered: the builder's choice
  (:func:`planner.schedules.ir.builder_eager`, kept in the schedule IR so that the validator and the
  simulator, below this module, read the same), applied by :meth:`RunSpec.lowered`.
* **What pipeplan's executor runs** of what the planner ranks (:func:`executor_refusal`): the planner ranks
  configurations for any runtime (its exports go to Megatron-LM, torchtitan, DeepSpeed), the service refuses
  to queue a job its executor would refuse (``POST /jobs``: 422), and the executor checks the same before it
  starts processes (:meth:`executor.plan.RunPlan.validate`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.limits import MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_STAGES
from planner.model import tensor_split_error
from planner.request import Config
from planner.schedules import ASYNC_SCHEDULES, BACKWARD_HALVING, build
from planner.schedules.ir import Schedule, builder_eager, lower


def halves_backward(config: Config) -> bool:
    """Whether ``config`` runs Chimera's backward halving (2N micro-batches of b/2, Chimera 3.5)."""
    return config.concat == BACKWARD_HALVING


def schedule_microbatches(config: Config, microbatches: int) -> int:
    """Micro-batches of the schedule's lists for ``microbatches`` (N) per pipeline group: 2N with backward
    halving, else N."""
    return 2 * microbatches if halves_backward(config) else microbatches


def schedule_samples(config: Config) -> float:
    """Samples of one micro-batch of the schedule's lists: b/2 with backward halving, else b."""
    return config.micro_batch / 2 if halves_backward(config) else config.micro_batch


def executor_refusal(config: Config) -> str | None:
    """Why pipeplan's executor does not run ``config`` (None: it does). Its asynchronous schedules (PipeDream's
    weight stashing, 2BW's double buffering) keep one stage copy per device with its versions: no data or
    tensor parallelism beside them, and no recomputation (a recomputed forward would have to run on the
    version its micro-batch stashed). It splits a mixture of experts' experts over t (expert tensor parallelism t:
    :mod:`executor.expert_parallel`), not whole on each rank."""
    if config.expert_tensor is not None:
        return ("expert_tensor: the executor splits the experts over t (expert tensor parallelism t); whole experts "
                "(etp = 1) run under Megatron-Core (--expert-tensor-parallel-size 1: the Megatron export)")
    if config.schedule not in ASYNC_SCHEDULES:
        return None
    if config.data > 1 or config.tensor > 1:
        return f"{config.schedule}: the executor runs asynchronous schedules with W = t = 1 only"
    if config.recompute:
        return f"{config.schedule}: recomputation with weight stashing is not supported"
    return None


def config_of(doc: dict[str, Any]) -> Config:
    """The configuration of a candidate document (``Candidate.to_dict()``): its ``run_spec``'s, or -- for a
    document stored before it existed, or a run listed by hand -- its flat configuration fields (PipeDream's
    ``replication`` among them)."""
    if "run_spec" in doc:
        spec = doc["run_spec"]
        if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict):
            raise ValueError("run_spec: an object {config: {...}, microbatches, partition} (as pipeplan plan --json "
                             "writes it)")
        return Config.model_validate(spec["config"])
    return Config.model_validate({k: doc[k] for k in Config.model_fields if doc.get(k) is not None})


#: a layer boundary of a partition: 0..MAX_LAYERS
LayerIndex = Annotated[int, Field(ge=0, le=MAX_LAYERS)]


def partition_error(bounds: list[tuple[int, int]], stages: int, layers: int | None) -> str | None:
    """Why ``bounds`` is no partition of a model of ``layers`` layers (None: not known) into ``stages``
    schedule stages, or None when it is one: one ``[start, end)`` range per stage, in stage order, each
    non-empty and starting where the one before ends, the first at 0 and the last at ``layers``. One rule for
    the executor (:meth:`executor.plan.RunPlan.schedule`) and for what reads a hand-written candidate
    (:meth:`RunSpec.check`)."""
    if len(bounds) != stages:
        return f"partition has {len(bounds)} ranges but the schedule has {stages} stages"
    pos = 0
    for s, (a, b) in enumerate(bounds):
        if a != pos or b <= a:
            return (f"partition does not cover the model: stage {s} is [{a}, {b}), expected to start at {pos} and "
                    "be non-empty")
        pos = b
    if layers is not None and pos != layers:
        return f"partition does not cover the model: it ends at layer {pos}, the model has {layers} layers"
    return None


class RunSpec(BaseModel):
    """One configuration to run: ``config`` (t, D, W, b, schedule and its parameters, recomputation),
    ``microbatches`` N per pipeline group (``global_batch = W N b``) and ``partition``, the ``[start, end)``
    layer range of every schedule stage (empty: the executor splits the layers evenly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: Config
    microbatches: int = Field(gt=0, le=MAX_GLOBAL_BATCH, description="micro-batches per pipeline group (N)")
    partition: list[tuple[LayerIndex, LayerIndex]] = Field(default_factory=list, max_length=MAX_STAGES,
                                                           description="[start, end) layers of every schedule stage")

    @model_validator(mode="after")
    def _global_batch(self) -> RunSpec:
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise ValueError(f"data {self.config.data} x microbatches {self.microbatches} x micro_batch "
                             f"{self.config.micro_batch}: {self.global_batch} samples per iteration, at most "
                             f"{MAX_GLOBAL_BATCH}")
        return self

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> RunSpec:
        """From a candidate document (``Candidate.to_dict()``): its ``run_spec``, or -- for documents
        stored before it existed -- its flat configuration fields, ``microbatches`` and ``partition``."""
        if "run_spec" in doc:
            return cls.model_validate(doc["run_spec"])
        config = config_of(doc)
        return cls.model_validate({"config": config, "partition": doc.get("partition") or [],
                                   **({"microbatches": doc["microbatches"]} if "microbatches" in doc else {})})

    @property
    def global_batch(self) -> int:
        return self.config.data * self.microbatches * self.config.micro_batch

    @property
    def halves_backward(self) -> bool:
        return halves_backward(self.config)

    @property
    def schedule_microbatches(self) -> int:
        """Micro-batches of the schedule's lists (2N with backward halving)."""
        return schedule_microbatches(self.config, self.microbatches)

    @property
    def schedule_samples(self) -> float:
        """Samples of one micro-batch of the schedule's lists (b/2 with backward halving)."""
        return schedule_samples(self.config)

    def schedule(self) -> Schedule:
        """The compute-only schedule (:func:`planner.schedules.build`); ValueError when it cannot be built."""
        c = self.config
        return build(c.schedule, c.pipeline, self.schedule_microbatches, **c.schedule_params())

    def check(self, layers: int | None = None, heads: int | None = None) -> Schedule:
        """The compute-only schedule, after checking what a hand-edited document may get wrong and the typed
        fields cannot see alone: the schedule can be built from the configuration (its parameters fit its D
        and N), ``partition`` (when given) is one of :func:`partition_error` for its stages and the model's
        ``layers``, and ``t`` splits the model's ``heads`` (:func:`planner.model.tensor_split_error`); a
        ValueError names the field."""
        c = self.config
        if heads is not None and (why := tensor_split_error(heads, c.tensor)) is not None:
            raise ValueError(why)
        try:
            sched = self.schedule()
        except ValueError as e:
            raise ValueError(f"schedule: {c.label()} with N = {self.microbatches}: {e}") from None
        if self.partition and (why := partition_error(list(self.partition), sched.stages, layers)) is not None:
            raise ValueError(why)
        if layers is not None and not self.partition and sched.stages > layers:
            raise ValueError(f"schedule: {sched.stages} stages but the model has only {layers} layers")
        return sched

    def lowered(self, schedule: Schedule | None = None) -> Schedule:
        """The lowered schedule (communication, all-reduces, step) that the simulator times and every rank
        walks; ``schedule`` is :meth:`schedule`'s result when the caller has it already."""
        sched = schedule if schedule is not None else self.schedule()
        return lower(sched, eager=builder_eager(sched))
