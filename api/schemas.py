"""Request and response bodies (pydantic v2). Inputs are bounded so that no value can overflow a
database column or make the planner run forever."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from planner.request import TrainingRequest

MAX_ID = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]*$")]


class Message(BaseModel):
    detail: str


# ---- profiles and clusters --------------------------------------------------------------------------

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


class ProfileDetail(ProfileOut):
    profile: dict[str, Any]


class ClusterOut(BaseModel):
    id: int
    content_hash: str
    name: str
    device: str
    gpus: int
    created_at: datetime
    version: int = 1
    base_id: int | None = None


class ClusterDetail(ClusterOut):
    cluster: dict[str, Any]


# ---- plans --------------------------------------------------------------------------------------------

class PlanCreate(TrainingRequest):
    """The TrainingRequest fields plus the stored profile and cluster to plan with."""

    profile_id: Id
    cluster_id: Id
    global_batch: int = Field(gt=0, le=2**24, description="samples per iteration (B^)")
    gpus: int | None = Field(default=None, gt=0, le=2**20, description="GPU budget (default: the cluster)")
    max_tensor: int | None = Field(default=None, gt=0, le=4096, description="largest t")
    micro_batches: list[Annotated[int, Field(ge=1, le=2**20)]] | None = Field(default=None, max_length=64)
    schedules: list[Annotated[str, StringConstraints(max_length=40)]] | None = Field(default=None,
                                                                                     max_length=16)
    bytes_per_param: float = Field(default=16.0, gt=0, le=1e6, allow_inf_nan=False)
    tensor_efficiency: float = Field(default=0.95, gt=0, le=1, allow_inf_nan=False)
    memory_reserve_bytes: float = Field(default=2 * 2**30, ge=0, le=2**60, allow_inf_nan=False)
    top: int = Field(default=10, gt=0, le=1000)

    @field_validator("schedules")
    @classmethod
    def _some_schedule(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:  # an empty list would silently mean "all of them"
            raise ValueError("choose at least one schedule (leave the field out to allow all of them)")
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
    candidate_index: int = Field(default=0, ge=0, le=1000)
    model: Name = Field(description="model the executor builds: a preset of planner.model (e.g. gpt-tiny)")
    iterations: int = Field(default=10, ge=1, le=1_000_000)
    emulate: bool = Field(default=False, description="run with the plan's profile emulated (--emulate)")
    max_attempts: int | None = Field(default=None, ge=1, le=100, description="claims before giving up")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        from planner.model import get_model

        get_model(v)  # ValueError naming the presets: refused here, not on the agent after a claim
        return v


class JobOut(BaseModel):
    id: int
    plan_id: int
    candidate_index: int
    model: str
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


class WorkerRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    node: Name
    gpus: int = Field(default=0, ge=0, le=4096)
    device_type: Name = "cpu"


class WorkerOut(BaseModel):
    id: int
    name: str
    node: str
    gpus: int
    device_type: str
    registered_at: datetime
    last_heartbeat: datetime
    alive: bool


class WorkerRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Id


class JobClaim(BaseModel):
    job: JobOut
    lease_seconds: float
    plan: dict[str, Any] = Field(description="plan --json shaped: {'candidates': [...]} (all candidates)")
    candidate: dict[str, Any]
    profile: dict[str, Any] | None = Field(description="the plan's model profile when the job emulates it")


class LeaseOut(BaseModel):
    job_id: int
    lease_expires_at: datetime | None
    cancel: bool = Field(description="the job was cancelled: stop the run")


class DeviceFigures(BaseModel):
    model_config = ConfigDict(extra="allow")

    busy: float = Field(ge=0, allow_inf_nan=False)
    idle: float = Field(ge=0, allow_inf_nan=False)


class ResultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Id
    iteration_time: float = Field(gt=0, allow_inf_nan=False, description="measured seconds per iteration")
    bubble_ratio: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    devices: list[DeviceFigures] = Field(default_factory=list, max_length=65536)
    emulated: bool = False
    trace: str | None = Field(default=None, max_length=50_000_000, description="trace file contents")
    raw: dict[str, Any] = Field(default_factory=dict, description="the executor's whole result.json")


class FailureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Id
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
