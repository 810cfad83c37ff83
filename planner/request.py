"""What the user asks for: the training request and one configuration."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from planner.fsdp import INCOMPATIBLE as FSDP_INCOMPATIBLE
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_KEPT, MAX_SIZES, MAX_STAGES
from planner.placement import DEFAULT_ORDER, RankOrder, experts_placeable
from planner.schedules import ALL_SCHEDULES, ASYNC_SCHEDULES, SCHEDULE_PARAMETERS, SYNC_SCHEDULES, check_size

__all__ = ["ALL_SCHEDULES", "ASYNC_SCHEDULES", "SYNC_SCHEDULES", "Config", "TrainingRequest"]


#: mixed-precision Adam's optimizer state per parameter: fp32 master weight, momentum and variance (ZeRO 3.1's K)
ADAM_OPTIMIZER_BYTES = 12.0


class TrainingRequest(BaseModel):
    """A plan request. ``bytes_per_param`` is all model state per parameter: mixed-precision Adam keeps
    16 bytes (2 weights + 2 gradients + 12 optimizer: fp32 master, momentum, variance; ZeRO, Rajbhandari
    et al. 2020, section 3.1), ``optimizer_bytes_per_param`` of them the optimizer's (12, ``K Psi`` with
    ``K = 12`` there). ``shard_optimizer``: the optimizer state is split over the ``W`` data-parallel replicas
    (ZeRO stage 1, ``P_os``, section 5.1: ``4 Psi + K Psi / N_d``; Megatron-LM's
    ``--use-distributed-optimizer``; DeepSpeed's ``zero_optimization.stage = 1``):
    :meth:`state_bytes_per_param`. Its gradient reduce-scatter and parameter all-gather move the bytes the
    all-reduce moved (section 7.2.1); the cost model times them as NCCL's rings
    (:func:`planner.cost.sharded_collective_time`) and steps only the shard. pipeplan's executor runs plain SGD
    (no optimizer state): the request describes the training the plan is for. ``shard_parameters``: the
    weights and gradients are split over the ``W`` replicas too (ZeRO stage 3, PyTorch FSDP2 as torchtitan runs
    it: :mod:`planner.fsdp`), all the state then ``bytes_per_param / W`` per parameter beside the gathered
    copies the memory model adds."""

    model_config = ConfigDict(extra="forbid")

    # bounded (planner.limits), as the API's PlanCreate: what one plan may ask for; counts strict, as there (a
    # library caller's True or "8" was read as 1 and 8)
    global_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH, strict=True, description="samples per iteration (B^)")
    gpus: int | None = Field(default=None, gt=0, le=MAX_GPUS, strict=True,
                             description="GPU budget P (default: the whole cluster)")
    bytes_per_param: float = Field(default=16.0, gt=0, le=1e6, allow_inf_nan=False)
    optimizer_bytes_per_param: float | None = Field(
        default=None, ge=0, le=1e6, allow_inf_nan=False,
        description="of bytes_per_param, the optimizer's state (what shard_optimizer splits; default: Adam's 12, at "
                    "most bytes_per_param)")
    shard_optimizer: bool = Field(default=False, description="split the optimizer state over the data-parallel "
                                                             "replicas (ZeRO-1, Megatron's distributed optimizer)")
    shard_parameters: bool = Field(default=False, description="split the weights and gradients over the data-parallel "
                                   "replicas too (ZeRO-3, PyTorch FSDP2 as torchtitan runs it: planner.fsdp)")
    schedules: list[str] | None = Field(default=None, description="allowed schedules (default: all)")
    allow_async: bool = Field(default=False, description="show PipeDream/2BW (they change the optimizer)")
    allow_recompute: bool = True
    max_tensor: int | None = Field(default=None, gt=0, le=MAX_GPUS_PER_NODE, strict=True,
                                   description="largest t (default: GPUs per node)")
    micro_batches: list[StrictInt] | None = Field(default=None, max_length=MAX_SIZES,
                                                  description="micro-batch sizes to try")
    max_expert: int | None = Field(default=None, gt=0, le=MAX_GPUS, strict=True,
                                   description="largest expert-parallel size e of a mixture of experts (default: "
                                               "every divisor of both the experts and W)")
    rank_order: RankOrder | None = Field(
        default=None,
        description="rank order of every configuration (planner.placement): tp-pp-dp (the pipeline inside data "
                    "parallelism) or tp-dp-pp (the pipeline outermost: Megatron-LM's default, torchtitan's, "
                    "DeepSpeed's); default: both, where they place groups differently")
    tensor_efficiency: float = Field(default=0.95, ge=0.1, le=1, allow_inf_nan=False,
                                     description="compute efficiency of a t-way split GEMM vs t=1 (at least 0.1: "
                                                 "1e-300 predicted 1e298 s)")
    memory_reserve_bytes: float | None = Field(
        default=None, ge=0, le=2**60, allow_inf_nan=False,
        description="framework/workspace reserve per device, bytes (default: by the cluster's device kind, "
                    "planner.reserve: 2 GiB on GPUs, 320 MiB on CPUs)")
    top: int = Field(default=10, gt=0, le=MAX_KEPT, strict=True)

    @model_validator(mode="after")
    def _check(self) -> TrainingRequest:
        if self.optimizer_bytes_per_param is not None and self.optimizer_bytes_per_param > self.bytes_per_param:
            raise ValueError(f"optimizer_bytes_per_param: {self.optimizer_bytes_per_param:g} is more than "
                             f"bytes_per_param ({self.bytes_per_param:g}), the model state it is part of")
        for s in self.schedules or []:
            if s not in ALL_SCHEDULES:
                raise ValueError(f"schedules: unknown schedule {s!r}; known: {', '.join(ALL_SCHEDULES)}")
        for field in ("schedules", "micro_batches"):  # (each was planned once per time it was named: 3x the work)
            given = getattr(self, field) or []
            if len(set(given)) < len(given):
                twice = next(x for i, x in enumerate(given) if x in given[:i])
                raise ValueError(f"{field}: {twice} is given twice")
        for b in self.micro_batches or []:
            if not 1 <= b <= MAX_GLOBAL_BATCH:
                raise ValueError(f"micro_batches: sizes must be between 1 and {MAX_GLOBAL_BATCH}, got {b}")
        if self.micro_batches and all(self.global_batch % b for b in self.micro_batches):
            # (each data-parallel replica runs global_batch / W samples as whole micro-batches: B = W b N)
            raise ValueError(f"micro_batches: none of {', '.join(map(str, self.micro_batches))} divides global_batch "
                             f"{self.global_batch} (B = W b N: every size left would plan nothing)")
        if self.shard_parameters and self.schedules and all(s in FSDP_INCOMPATIBLE for s in self.schedules):
            raise ValueError(f"schedules: none of {', '.join(self.schedules)} can shard its weights "
                             f"(shard_parameters): they keep two copies or versions of a stage; name another")
        if self.schedules and not self.allow_async and all(s in ASYNC_SCHEDULES for s in self.schedules):
            # allowed() would leave none of them: an empty plan that says nothing (the UI refuses it too)
            raise ValueError(f"schedules: only asynchronous ones are named ({', '.join(self.schedules)}); set "
                             f"allow_async (pipeplan plan --allow-async) to plan them")
        return self

    def state_bytes_per_param(self, data: int) -> float:
        """Model state a device keeps per parameter it holds, with ``data`` (W) data-parallel replicas:
        ``bytes_per_param``, or with ``shard_optimizer`` the optimizer's share of it divided by ``data``, or with
        ``shard_parameters`` all of it divided by ``data``."""
        if self.shard_parameters and data > 1:
            return self.bytes_per_param / data
        if not self.shard_optimizer or data <= 1:
            return self.bytes_per_param
        return self.bytes_per_param - self.optimizer_bytes() * (1.0 - 1.0 / data)

    @property
    def sharded_state(self) -> bool:
        """The optimizer state is split over the replicas (``shard_optimizer`` or ``shard_parameters``): each
        steps only its shard."""
        return self.shard_optimizer or self.shard_parameters

    def optimizer_bytes(self) -> float:
        """``optimizer_bytes_per_param``, by default Adam's 12 (at most ``bytes_per_param``)."""
        if self.optimizer_bytes_per_param is not None:
            return self.optimizer_bytes_per_param
        return min(ADAM_OPTIMIZER_BYTES, self.bytes_per_param)

    def allowed(self) -> list[str]:
        """The schedules the search plans: those named (default: all), the asynchronous ones only with
        ``allow_async``, less :meth:`unshardable`."""
        left_out = set(self.unshardable())
        return [n for n in self._named() if n not in left_out]

    def unshardable(self) -> list[str]:
        """Of the schedules otherwise allowed, those that cannot shard their weights (``shard_parameters``: they
        keep two copies or versions of a stage, :data:`planner.fsdp.INCOMPATIBLE`); empty without it."""
        return [n for n in self._named() if n in FSDP_INCOMPATIBLE] if self.shard_parameters else []

    def _named(self) -> list[str]:
        names = list(self.schedules) if self.schedules else list(ALL_SCHEDULES)
        return names if self.allow_async else [n for n in names if n not in ASYNC_SCHEDULES]


class Config(BaseModel):
    """One configuration: tensor t, pipeline D, data W, micro-batch b, schedule and its parameters (one
    field per :data:`planner.schedules.SCHEDULE_PARAMETERS` entry; a test checks they agree)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # bounded (planner.limits): a configuration read from a file or a request holds no size past any cluster's
    tensor: int = Field(gt=0, le=MAX_GPUS)
    pipeline: int = Field(gt=0, le=MAX_STAGES)
    data: int = Field(gt=0, le=MAX_GPUS)
    micro_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH)
    schedule: str = Field(max_length=64)
    recompute: bool = False
    chunks: int | None = Field(default=None, ge=1, le=MAX_STAGES)
    waves: int | None = Field(default=None, ge=1, le=MAX_STAGES)
    pipelines: int | None = Field(default=None, ge=1, le=MAX_STAGES)
    concat: str | None = Field(default=None, max_length=64)
    replication: str | None = Field(default=None, max_length=8 * MAX_STAGES)
    #: expert-parallel size ``e`` (:mod:`planner.expert_parallel`): a mixture of experts' experts split over ``e`` of
    #: the ``W`` data-parallel replicas (absent from the record at 1, so configurations without it read as before)
    expert: int = Field(default=1, ge=1, le=MAX_GPUS, exclude_if=lambda v: v == 1)
    #: rank order (:mod:`planner.placement`): ``"tp-pp-dp"``, the pipeline inside data parallelism, or
    #: ``"tp-dp-pp"``, the pipeline outermost (Megatron-LM's default); absent from the record at the first
    order: RankOrder = Field(default=DEFAULT_ORDER, exclude_if=lambda v: v == DEFAULT_ORDER)
    #: expert tensor-parallel size (:mod:`planner.expert_parallel`, "Expert tensor parallelism"): None, the experts
    #: split over ``t`` as the dense MLP; 1, whole on each rank (Megatron-Core's ``--expert-tensor-parallel-size 1``),
    #: expert parallelism then over ``e`` of the ``t W`` ranks of a stage; absent from the record when None
    expert_tensor: int | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _stages(self) -> Config:
        """At most ``MAX_STAGES`` pipeline stages (D x chunks, or x 2 waves): :func:`planner.schedules.check_size`'s
        rule, worded with the fields."""
        check_size(self.pipeline, 1, self.chunks, self.waves,
                   names={"devices": "pipeline", "chunks": "chunks", "waves": "waves"})
        if self.expert_tensor is not None and self.expert_tensor != 1:
            raise ValueError(f"expert_tensor: 1 (the experts whole on each rank) or absent (split over t as the dense "
                             f"MLP), got {self.expert_tensor}")
        if self.expert_tensor is not None and self.tensor == 1:
            raise ValueError("expert_tensor: 1 only with t > 1 (at t = 1 the experts are whole already)")
        if self.expert_tensor is None and self.data % self.expert:
            raise ValueError(f"expert: the expert-parallel size {self.expert} must divide data (W = {self.data}): "
                             "each expert-parallel group is made of data-parallel replicas")
        if self.expert_tensor is not None:
            if (self.tensor * self.data) % self.expert:
                raise ValueError(f"expert: the expert-parallel size {self.expert} must divide t W = "
                                 f"{self.tensor * self.data} with expert_tensor 1 (the group's ranks are a stage's)")
            if not experts_placeable(self.order, self.pipeline, self.data, self.expert_data):
                raise ValueError("expert_tensor: experts whole with the pipeline inside data parallelism (order "
                                 "tp-pp-dp) at D > 1 and W > 1 need e = t (Megatron-Core: 'When not using pp-last rank "
                                 "ordering, the data parallel size of the attention and moe layers must be the "
                                 "same'); use order tp-dp-pp")
        return self

    @property
    def etp(self) -> int:
        """The expert tensor-parallel size: ``expert_tensor``, else ``t``."""
        return self.expert_tensor or self.tensor

    @property
    def expert_data(self) -> int:
        """How many ranks of a stage hold the same experts (the experts' data parallelism): ``t W / (e etp)``, the
        ``W/e`` replicas where the experts are split over ``t`` (:mod:`planner.expert_parallel`)."""
        return self.tensor * self.data // (self.expert * self.etp)

    def schedule_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in SCHEDULE_PARAMETERS:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out

    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.schedule_params().items())
        rc = " +rc" if self.recompute else ""
        ep = (f" e={self.expert}" if self.expert > 1 else "") + (" etp=1" if self.expert_tensor else "")
        order = f" ranks={self.order}" if self.order != DEFAULT_ORDER else ""
        return (f"t={self.tensor} D={self.pipeline} W={self.data}{ep} b={self.micro_batch} "
                f"{self.schedule}{'(' + extra + ')' if extra else ''}{rc}{order}")
