"""Request and response bodies (pydantic v2). Inputs are bounded so that no value can overflow a
database column or make the planner run forever."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from planner.cluster import Cluster
from planner.limits import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS_PER_NODE,
    MAX_ITERATIONS,
    MAX_LAYERS,
    MAX_PLAN_GPUS,
    MAX_SECONDS,
    MAX_TOP,
)
from planner.placement import RankOrder
from planner.profile import LayerProfile, ModelProfile
from planner.request import TrainingRequest

MAX_ID = 2**31 - 1
#: a stored row's id in a body: a JSON integer (not true, not 1.0, not "1": lax parsing read true as row 1)
Id = Annotated[StrictInt, Field(ge=1, le=MAX_ID)]


def plain_text(v: str) -> str:
    bad = sorted({f"U+{ord(c):04X}" for c in v if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"must not contain control characters (NUL, newline, tab...): found {', '.join(bad[:5])}")
    return v


Name = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(plain_text)]

# ---- what one plan may ask for (issue 14: one request must not take the host down): planner.limits, the bounds
# the command line's files hold to as well; the profile and cluster models carry them (planner.profile, .cluster)
#: nesting of the free-form JSON documents (a result's ``raw``): deeper ones are refused, not recursed
MAX_JSON_DEPTH = 32


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of a JSON value, counted without recursion and stopping past ``limit``."""
    stack, deepest = [(value, 1)], 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _shallow(value: Any, field: str) -> Any:
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"{field}: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


class Message(BaseModel):
    detail: str


# ---- profiles and clusters --------------------------------------------------------------------------

class LayerUpload(LayerProfile):
    """:class:`planner.profile.LayerProfile` with its names bounded (its numbers are: :mod:`planner.limits`)."""

    name: Name
    kind: Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(plain_text)]


class ProfileUpload(ModelProfile):
    """A model profile as ``POST /profiles`` takes it: :class:`planner.profile.ModelProfile` with at most
    ``MAX_LAYERS`` layers and bounded numbers and names."""

    name: Name
    device: Name
    dtype: Annotated[str, StringConstraints(min_length=1, max_length=32), AfterValidator(plain_text)]
    layers: list[LayerUpload] = Field(min_length=1, max_length=MAX_LAYERS,
                                      description=f"the model's layers in execution order (1..{MAX_LAYERS})")
    environment: dict[str, Annotated[str, StringConstraints(max_length=2000)]] = Field(default_factory=dict,
                                                                                       max_length=100)
    notes: Annotated[str, StringConstraints(max_length=20_000)] = ""


class ClusterUpload(Cluster):
    """A cluster as ``POST /clusters`` takes it: :class:`planner.cluster.Cluster` with its names and notes bounded
    (its numbers are: :mod:`planner.limits`)."""

    name: Name
    device: Name
    notes: Annotated[str, StringConstraints(max_length=20_000)] = ""


class ProfileOut(BaseModel):
    id: int
    content_hash: str
    name: str
    device: str
    dtype: str
    source: str
    num_layers: int
    total_params: float
    created_at: datetime


class HFProfileOut(ProfileOut):
    caveats: list[str] = Field(default_factory=list,
                               description="what reading the config left out or took as given (a multimodal model's "
                                           "vision tower, a sequence past its positions), also kept in the profile's "
                                           "notes")


class ProfileDetail(ProfileOut):
    profile: dict[str, Any]
    assumes: list[str] = Field(default_factory=list, description="what the profile's times assume of the kernels "
                                                                 "and the training runtime, in words "
                                                                 "(planner.profile.runtime_words)")


class ClusterOut(BaseModel):
    id: int
    content_hash: str
    name: str
    device: str
    gpus: int
    created_at: datetime
    version: int = 1
    base_id: int | None = None
    label: str = Field(default="", description="the name with its version and calibration, e.g. "
                                               "'dgx-a100-80gb v2, calibrated from 3 jobs'")
    calibration_jobs: int | None = Field(default=None, description="finished jobs its calibration was fitted to "
                                                                   "(null: not calibrated)")
    newest_id: int | None = Field(default=None, description="the newest version of this cluster (this id when "
                                                            "none is newer): later plans on any version use it")
    newest_version: int | None = None
    newest_label: str | None = None


class ClusterDetail(ClusterOut):
    cluster: dict[str, Any]


# ---- plans --------------------------------------------------------------------------------------------

class PlanCreate(TrainingRequest):
    """The TrainingRequest fields plus the stored profile and cluster to plan with."""

    profile_id: Id
    cluster_id: Id
    global_batch: StrictInt = Field(gt=0, le=MAX_GLOBAL_BATCH, description="samples per iteration (B^)")
    gpus: StrictInt | None = Field(default=None, gt=0, le=MAX_PLAN_GPUS,
                                   description="GPU budget (default: the cluster, which must then have at "
                                               f"most {MAX_PLAN_GPUS})")
    max_tensor: StrictInt | None = Field(default=None, gt=0, le=MAX_GPUS_PER_NODE, description="largest t")
    max_expert: StrictInt | None = Field(default=None, gt=0, le=MAX_PLAN_GPUS,
                                         description="largest expert-parallel size e of a mixture of experts: its "
                                                     "experts split over e of the W data-parallel replicas, or "
                                                     "over e of a stage's t W ranks in the rows that hold them "
                                                     "whole (expert_tensor 1: tried at t > 1 for a profile made "
                                                     "with sequence parallelism) (default: every e dividing both "
                                                     "its experts and W, or t W; 1: none)")
    rank_order: RankOrder | None = Field(
        default=None, description="rank order of every configuration, innermost first (planner.placement): "
                                  "tp-pp-dp (the pipeline inside data parallelism) or tp-dp-pp (the pipeline "
                                  "outermost: Megatron-LM's default, torchtitan's, DeepSpeed's); default: both, where "
                                  "they place groups on different nodes. Each candidate's 'order' and 'placement' say "
                                  "its own")
    micro_batches: list[Annotated[StrictInt, Field(ge=1, le=MAX_GLOBAL_BATCH)]] | None = Field(default=None,
                                                                                             max_length=64)
    schedules: list[Annotated[str, StringConstraints(max_length=40)]] | None = Field(default=None,
                                                                                     max_length=16)
    # strict floats: a JSON number (an integer is one), not "16" nor true
    bytes_per_param: float = Field(default=16.0, gt=0, le=1e6, allow_inf_nan=False, strict=True)
    optimizer_bytes_per_param: float | None = Field(
        default=None, ge=0, le=1e6, allow_inf_nan=False, strict=True,
        description="of bytes_per_param, the optimizer's state (default: Adam's 12, at most bytes_per_param)")
    shard_optimizer: StrictBool = Field(default=False, description="the optimizer state split over the W "
                                                                   "data-parallel replicas (ZeRO-1, Megatron's "
                                                                   "--use-distributed-optimizer)")
    shard_parameters: StrictBool = Field(default=False, description="the weights and gradients split over the W "
                                                                    "replicas too (ZeRO-3, FSDP as torchtitan "
                                                                    "runs it)")
    tensor_efficiency: float = Field(default=0.95, gt=0, le=1, allow_inf_nan=False, strict=True)
    memory_reserve_bytes: float | None = Field(default=None, ge=0, le=2**60, allow_inf_nan=False, strict=True,
                                               description="bytes per device (default: by the cluster's device "
                                                           "kind, planner.reserve)")
    top: StrictInt = Field(default=10, gt=0, le=MAX_TOP, description="candidates to keep")
    allow_async: StrictBool = False
    allow_recompute: StrictBool = True

    @field_validator("schedules")
    @classmethod
    def _some_schedule(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:  # an empty list would silently mean "all of them"
            raise ValueError("choose at least one schedule (leave the field out to allow all of them)")
        return v

    @field_validator("micro_batches")
    @classmethod
    def _some_size(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and not v:  # as schedules: [] would silently mean every size
            raise ValueError("choose at least one micro-batch size (leave the field out to try all of them)")
        return v

    def training_request(self) -> TrainingRequest:
        return TrainingRequest(**self.model_dump(exclude={"profile_id", "cluster_id"}))


PlanStatus = Literal["queued", "running", "done", "failed"]


class PlanSummary(BaseModel):
    id: int
    profile_id: int
    cluster_id: int
    status: PlanStatus
    request: dict[str, Any]
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    num_candidates: int


class PlanOut(PlanSummary):
    candidates: list[dict[str, Any]] = Field(description="ranked, best first (plan --json records)")
    infeasible: list[dict[str, Any]] = Field(default_factory=list)
    rejected: dict[str, int] = Field(default_factory=dict)
    evaluated: int | None = None
    simulated: int | None = None
    considered: int | None = None
    warnings: list[str] = Field(default_factory=list, description="e.g. the profile's device is not the cluster's")


# ---- jobs and workers ------------------------------------------------------------------------------

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan_id: Id
    # strict: JSON integers and booleans (lax parsing read "candidate_index": true as candidate 1)
    candidate_index: StrictInt = Field(default=0, ge=0, le=1000)
    model: Name | None = Field(default=None, description="model the executor builds: a preset of planner.model "
                                                         "(e.g. gpt-tiny); a real-compute job needs it, an emulated "
                                                         "one builds none (its messages are sized by the profile)")
    iterations: StrictInt = Field(default=10, ge=1, le=MAX_ITERATIONS)
    emulate: StrictBool = Field(default=False, description="run with the plan's profile emulated (--emulate)")
    max_attempts: StrictInt | None = Field(default=None, ge=1, le=100, description="claims before giving up")
    gpus_per_node: StrictInt | None = Field(default=None, ge=1, le=4096,
                                      description="processes per node G: the job takes ceil(t*D*W / G) node slots "
                                                  "(default: the plan's cluster's gpus_per_node; an emulated job: "
                                                  "one node)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | None) -> str | None:
        from planner.model import get_model

        if v is not None:
            get_model(v)  # ValueError naming the presets: refused here, not on the agent after a claim
        return v

    @model_validator(mode="after")
    def _model_for_real_compute(self) -> JobCreate:
        if self.model is None and not self.emulate:
            raise ValueError("model: a real-compute job builds a model: give a preset of planner.model (e.g. "
                             "gpt-tiny), or set emulate")
        return self


class JobOut(BaseModel):
    id: int
    plan_id: int
    candidate_index: int
    model: str = Field(description="the model the executor builds; empty for an emulated job that named none")
    iterations: int
    emulate: bool
    state: JobState
    attempts: int
    max_attempts: int
    worker_id: int | None
    lease_expires_at: datetime | None
    error: str | None
    log_tail: str | None
    history: list[dict[str, Any]]
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    has_result: bool = False
    device_type: str | None = Field(default=None, description="the device an agent must have (the plan's "
                                                              "cluster's; a CPU agent takes emulated jobs too)")
    nodes: int = Field(default=1, description="node slots: agents that run it together (a gang when > 1)")
    procs_per_node: int | None = Field(default=None, description="processes on each node (t*D*W / nodes)")
    slots: list[SlotOut] = Field(default_factory=list, description="the node slots of a multi-node job")
    waiting: str | None = Field(default=None, description="why a queued job is not running yet")
    predicted_iteration_time: float | None = Field(default=None, description="seconds: the candidate's prediction")
    measured_iteration_time: float | None = Field(default=None, description="seconds: the run's (null until it "
                                                                            "has a result)")
    measured_over_predicted: float | None = Field(default=None, description="measured / predicted iteration time")
    cluster_id: int | None = Field(default=None, description="the cluster version the job's plan was made on "
                                                          "(in GET answers; GET /clusters/{id} gives its label)")


class SlotOut(BaseModel):
    node_rank: int
    state: Literal["open", "held", "running", "done"]
    worker_id: int | None
    held_since: datetime | None
    lease_expires_at: datetime | None
    endpoint: str | None = Field(description="node rank 0: the rendezvous host:port its agent picked")


class WorkerRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    node: Name
    gpus: StrictInt = Field(default=0, ge=0, le=4096, description="GPUs of the node (a CPU agent: the gloo processes "
                                                             "it runs); 0: undeclared, single-node jobs only")
    device_type: Name = Field(default="cpu", description="the planner's device name, as a cluster JSON's "
                                                         "'device' (e.g. A100-SXM4-80GB); 'cpu' (or a name "
                                                         "starting 'cpu'): a CPU-only agent (CPU and emulated "
                                                         "plans)")
    host: Name | None = Field(default=None, description="the address other nodes reach this one at (the "
                                                        "rendezvous of gangs whose node rank 0 it runs)")


class WorkerDeclared(BaseModel):
    """What a heartbeat may update (each optional)."""

    model_config = ConfigDict(extra="forbid")

    gpus: StrictInt | None = Field(default=None, ge=0, le=4096)
    device_type: Name | None = None
    host: Name | None = None


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rdzv_port: StrictInt | None = Field(default=None, ge=1, le=65535,
                                  description="a free port on this agent's host: with it the agent also takes "
                                              "node slots of multi-node jobs (node rank 0 hosts the rendezvous "
                                              "there)")
    whole: StrictBool = Field(default=False, description="this agent places multi-node jobs on nodes itself (a Slurm "
                                                   "launcher): it is offered jobs of its device of any size, "
                                                   "whole, instead of node slots")


class WorkerOut(BaseModel):
    id: int
    name: str
    node: str
    host: str | None = None
    gpus: int
    device_type: str
    registered_at: datetime
    last_heartbeat: datetime
    alive: bool


class WorkerRegistered(WorkerOut):
    token: str | None = Field(description="this worker's own credential (send it as the bearer token of its "
                                          "heartbeats, claims, leases and results); shown once, null when "
                                          "the worker re-registered with its own credential")


class WorkerRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Id | None = Field(default=None, description="optional: the credential names the worker; a "
                                                           "different id here is refused (403)")


class JobClaim(BaseModel):
    job: JobOut
    slot: SlotOut | None = Field(default=None, description="the node slot held (a multi-node job): renew it "
                                                           "with POST /jobs/{id}/slots/{rank}/lease and start "
                                                           "when it answers 'start'")
    lease_seconds: float
    plan: dict[str, Any] = Field(description="plan --json shaped: {'candidates': [...]} (all candidates)")
    candidate: dict[str, Any]
    profile: dict[str, Any] | None = Field(description="the plan's model profile when the job emulates it")
    cluster: dict[str, Any] | None = Field(
        default=None, description="the plan's cluster (the version it was made on) when the job emulates it: "
                                  "the links whose predicted times an emulated run's messages take")


class SlotLeaseOut(BaseModel):
    job_id: int
    node_rank: int
    nodes: int
    procs_per_node: int | None
    state: str = Field(description="waiting (the gang forms), released (held alone too long: claim again), "
                                   "start (run with the rendezvous below), succeeded (let the run end), "
                                   "cancelled or failed (stop)")
    held: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    attempt: int | None = None


class LeaseOut(BaseModel):
    job_id: int
    lease_expires_at: datetime | None
    cancel: bool = Field(description="the job was cancelled: stop the run")


class DeviceFigures(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _shallow_extras(cls, v: Any) -> Any:
        return _shallow(v, "devices[]")

    busy: float = Field(ge=0, allow_inf_nan=False)
    idle: float = Field(ge=0, allow_inf_nan=False)
    peak_memory: float | None = Field(default=None, ge=0, allow_inf_nan=False,
                                      description="bytes the device's allocator held at most (None: not measured)")


class ResultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # strict: a number is a JSON number (not true, not "1"), as in PlanCreate
    worker_id: Id | None = Field(default=None, description="optional: must be the credential's worker")
    iteration_time: float = Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False, strict=True,
                                  description="measured seconds per iteration (a time is at most "
                                              f"{MAX_SECONDS:g} s, as everywhere: planner.limits)")
    bubble_ratio: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False, strict=True)
    devices: list[DeviceFigures] = Field(default_factory=list, max_length=65536)
    emulated: bool | None = Field(default=None, strict=True,
                                  description="whether the run emulated its compute (absent: as the job says)")
    trace: str | None = Field(default=None, max_length=50_000_000, description="trace file contents")
    raw: dict[str, Any] = Field(default_factory=dict, description="the executor's whole result.json "
                                                                  f"(nested at most {MAX_JSON_DEPTH} deep)")

    @field_validator("raw")
    @classmethod
    def _raw_shallow(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _shallow(v, "raw")


class FailureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Id | None = Field(default=None, description="optional: must be the credential's worker")
    error: Annotated[str, StringConstraints(max_length=10_000)]
    log_tail: Annotated[str, StringConstraints(max_length=200_000)] | None = None


class ResultOut(BaseModel):
    job_id: int
    worker_id: int | None
    iteration_time: float
    bubble_ratio: float | None
    emulated: bool
    devices: list[dict[str, Any]]
    trace: str | None
    raw: dict[str, Any]
    created_at: datetime


class FieldComparison(BaseModel):
    field: str
    predicted: float | None
    measured: float | None
    relative_error: float | None = Field(description="(measured - predicted) / predicted")


class Comparison(BaseModel):
    job_id: int
    plan_id: int
    candidate_index: int
    label: str
    state: JobState
    emulated: bool | None
    fields: list[FieldComparison]
    devices: list[dict[str, Any]]
    #: where what ran is not what was predicted (a sharded plan run unsharded by pipeplan's executor)
    note: str | None = None
