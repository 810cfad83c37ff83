"""The executor's input: what to run (a :class:`planner.runspec.RunSpec`: configuration, micro-batches,
partition) with the run-time options (model of the zoo, iterations, seed, dtype, emulation), loaded and
checked *before* any process is launched.

A :class:`RunPlan` comes from

* a candidate of ``pipeplan plan --json`` (:meth:`RunPlan.from_candidate`: its ``run_spec``, or the flat
  fields of documents stored before it; a file holding ``{"candidates": [...]}`` or a bare candidate
  object, :func:`load_plan_file`), or
* the direct form of ``pipeplan run`` (:meth:`RunPlan.direct`): schedule, D, N, W, b, parameters; the
  partition is then :func:`even_layer_split` (consecutive layers, as even as possible).

Micro-batches: ``microbatches`` is N per pipeline group, as the planner writes it, and
``global_batch = W * N * b``; the schedule's own view (2N micro-batches of b/2 with Chimera's backward
halving) is the RunSpec's (:mod:`planner.runspec`).

:meth:`RunPlan.schedule` is :meth:`planner.runspec.RunSpec.lowered`: the executor runs exactly the lists
the simulator times.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from executor.models.config import ModelConfig, get_config
from planner.jsondoc import integer, unique_keys
from planner.placement import DEFAULT_ORDER
from planner.request import Config
from planner.runspec import RunSpec, executor_refusal, partition_error
from planner.schedules import ALL_SCHEDULES, ASYNC_SCHEDULES, SCHEDULE_PARAMETERS, parameters
from planner.schedules.ir import Schedule

if TYPE_CHECKING:
    from executor.models.source import ModuleSource, ZooSource


class PlanError(ValueError):
    """The plan cannot run (raised before anything is launched)."""


#: the model ``pipeplan run`` builds when none is named (``--model``, ``--hf-config`` or ``--module``)
DEFAULT_MODEL = "gpt-tiny"


def _errors_line(e: ValidationError, whole: str) -> str:
    """Pydantic's errors in one line, ``field: message; ...`` (``whole``: the name of an error of the whole
    object, which has no field)."""
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or whole}: {err['msg']}" for err in e.errors())


def _spec(make: Any, *args: Any, **kw: Any) -> RunSpec:
    """``make(*args, **kw)``, its validation errors as one PlanError naming the fields."""
    try:
        return make(*args, **kw)
    except ValidationError as e:
        whole = {"RunSpec": "run_spec", "Config": "config"}.get(e.title, e.title)  # (an error of the whole object)
        raise PlanError(f"plan: {_errors_line(e, whole)}") from None
    except KeyError as e:
        raise PlanError(f"plan candidate lacks the field {e}") from None


@dataclass
class RunPlan:
    spec: RunSpec
    model: str = DEFAULT_MODEL
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
    #: DeepSeek-V3's bias update speed (gamma, section 2.1.2; Megatron-Core's --moe-router-bias-update-rate): at each
    #: step's end every router with a bias (ModelSpec.router_bias) moves it by gamma sign(mean load - its expert's
    #: load), the loads summed over every copy (executor.models.llama.update_expert_bias); 0: the bias stays as set.
    #: Nothing to do for a model without router_bias.
    expert_bias_rate: float = 0.001

    # ---- construction ----------------------------------------------------------------------------
    @classmethod
    def from_candidate(cls, cand: dict[str, Any], **options: Any) -> RunPlan:
        """A candidate of ``pipeplan plan --json`` (``Candidate.to_dict()``) and run-time options."""
        if "run_spec" not in cand:
            missing = [k for k in ("tensor", "pipeline", "data", "micro_batch", "schedule", "microbatches")
                       if k not in cand]
            if missing:
                raise PlanError(f"plan candidate lacks the field(s) {', '.join(missing)}")
        spec = _spec(RunSpec.from_document, cand)
        stated = cand.get("global_batch")
        if stated is not None and ((n := integer(stated)) is None or n < 1):
            raise PlanError(f"plan candidate: global_batch: a positive integer (samples per iteration), got "
                            f"{json.dumps(stated)[:40]}")
        _check_global_batch(spec, stated or 0)
        return cls(spec, **{k: v for k, v in options.items() if v is not None})

    @classmethod
    def direct(cls, schedule: str, devices: int, microbatches: int, data: int = 1, tensor: int = 1,
               micro_batch: int = 1, recompute: bool = False, partition: list[list[int]] | None = None,
               global_batch: int = 0, expert: int = 1, order: str = DEFAULT_ORDER, **kw: Any) -> RunPlan:
        """From the schedule's name, D, N and the configuration's other fields (``expert``: the expert-parallel
        size e; ``order``: the rank order, :mod:`planner.placement`; schedule parameters among ``kw``, by their
        :data:`planner.schedules.SCHEDULE_PARAMETERS` names); the rest of ``kw`` are run-time options."""
        params = {k: kw.pop(k) for k in SCHEDULE_PARAMETERS if k in kw}
        params = {k: v for k, v in params.items() if v is not None}
        config = _spec(Config, tensor=tensor, pipeline=devices, data=data, micro_batch=micro_batch,
                       schedule=schedule, recompute=recompute, expert=expert, order=order, **params)
        spec = _spec(RunSpec, config=config, microbatches=microbatches,
                     partition=[tuple(map(int, p)) for p in partition or []])
        _check_global_batch(spec, global_batch)
        return cls(spec, **kw)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["spec"] = self.spec.model_dump(mode="json")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPlan:
        return cls(**{**data, "spec": RunSpec.model_validate(data["spec"])})

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def model_config(self) -> ModelConfig:
        cfg = ModelConfig.model_validate(self.model_spec) if self.model_spec is not None else get_config(self.model)
        return cfg.with_(**self.model_overrides) if self.model_overrides else cfg

    def source(self) -> ZooSource | ModuleSource:
        """Where the layers and batches come from (:mod:`executor.models.source`: torch, imported here so that
        validating a plan does not import it)."""
        from executor.models.source import ModuleSource, ZooSource

        if self.module is not None:
            return ModuleSource(self.module)
        return ZooSource(self.model_config)

    @property
    def rows(self) -> int:
        """Samples of one schedule micro-batch (b/2 for backward halving; validated to be whole)."""
        return int(self.spec.schedule_samples)

    @property
    def world_size(self) -> int:
        c = self.spec.config
        return c.pipeline * c.data * c.tensor

    @property
    def synchronous(self) -> bool:
        return self.spec.config.schedule not in ASYNC_SCHEDULES

    def compute_schedule(self) -> Schedule:
        try:
            return self.spec.schedule()
        except ValueError as e:
            raise PlanError(f"schedule: {e}") from None

    def schedule(self) -> Schedule:
        """The lowered schedule every rank walks (the simulator's lowering, :meth:`RunSpec.lowered`)."""
        return self.spec.lowered(self.compute_schedule())

    def num_layers(self) -> int:
        """Layers the partition covers: the model's, or the profile's in emulated mode."""
        if self.emulate:
            from planner.profile import load_profile

            try:
                return len(load_profile(self.emulate).layers)
            except Exception as e:  # noqa: BLE001 - any reading/validation error is a bad plan
                raise PlanError(f"cannot read the emulation profile {self.emulate}: {e}") from None
        if self.module is not None:
            from executor.models.source import ModuleSource

            try:
                return ModuleSource(self.module).num_layers
            except Exception as e:  # noqa: BLE001 - the user's code: any error makes the plan unrunnable
                raise PlanError(f"--module {self.module}: {type(e).__name__}: {e}") from None
        return self.model_config.num_profile_layers

    def bounds(self, stages: int, layers: int | None = None) -> list[tuple[int, int]]:
        if self.spec.partition:
            return [(int(a), int(b)) for a, b in self.spec.partition]
        return even_layer_split(layers if layers is not None else self.num_layers(), stages)

    # ---- validation --------------------------------------------------------------------------------
    def validate(self, world_size: int | None = None) -> Schedule:
        """Check everything that can be checked without processes; return the lowered schedule."""
        c = self.spec.config
        if self.iterations < 1:
            raise PlanError(f"iterations must be >= 1, got {self.iterations}")
        if self.warmup < 0:
            raise PlanError(f"warmup: warm-up iterations must be >= 0, got {self.warmup}")
        rate = self.expert_bias_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate < 0:
            raise PlanError("expert_bias_rate: the routers' bias update speed (DeepSeek-V3's gamma), a finite number "
                            f">= 0 (0: the bias stays as set), got {str(rate)[:40]}")
        # emulated compute builds no model: the profile's layers are the plan's (num_layers), the model unused
        model_checked = self.module is None and not self.emulate
        if self.module is not None:
            if c.tensor > 1:
                raise PlanError("--module: tensor parallelism needs the zoo's blocks; a user model runs with t = 1")
        elif model_checked:
            try:
                cfg = self.model_config
                cfg.family  # noqa: B018 - a shape no zoo family builds is refused here
            except ValidationError as e:
                raise PlanError(f"model: {_errors_line(e, 'model')}") from None
            except (ValueError, TypeError) as e:
                raise PlanError(f"model: {e}") from None
        if c.schedule not in ALL_SCHEDULES:
            raise PlanError(f"unknown schedule {c.schedule!r}")
        allowed = parameters(c.schedule)
        for k in c.schedule_params():
            if k not in allowed:
                raise PlanError(f"schedule {c.schedule!r} does not take {k!r}")
        if world_size is not None and world_size != self.world_size:
            raise PlanError(f"the plan needs D*W*t = {c.pipeline}*{c.data}*{c.tensor} = "
                            f"{self.world_size} processes (devices), but the world size is {world_size}")
        if self.spec.halves_backward and c.micro_batch % 2:
            raise PlanError(f"backward halving needs an even micro-batch size, got b={c.micro_batch}")
        # the MLPs split by columns: the dense one's width (a model without experts, or its dense_layers), each
        # expert's (f_e) and the shared expert's; a width no layer has (a MoE's ffn_hidden without dense layers) unused
        if model_checked and c.tensor > 1:
            widths = [("MLP width", cfg.f)] if cfg.moe_layers < cfg.layers else []
            if cfg.moe:
                widths.append(("experts' MLP width", cfg.f_e))
            if cfg.shared_expert_ffn_hidden is not None:
                widths.append(("shared expert's MLP width", cfg.shared_expert_ffn_hidden))
            wrong = [(what, n) for what, n in widths if n % c.tensor]
            if cfg.heads % c.tensor or wrong:
                what, n = (wrong or widths)[0]
                raise PlanError(f"tensor parallelism t={c.tensor} must divide heads ({cfg.heads}) and the {what} ({n})")
        refusal = executor_refusal(c)
        if refusal is not None:
            raise PlanError(refusal)
        if c.expert > 1:
            self._check_expert(cfg if model_checked else None)
        if self.dtype not in ("float32", "float64"):
            raise PlanError(f"dtype must be float32 or float64, got {self.dtype!r}")
        sched = self.schedule()
        L = self.num_layers()
        if not self.spec.partition and sched.stages > L:
            raise PlanError(f"{sched.stages} stages but the model has only {L} layers" + (
                f" (embedding, {cfg.layers} blocks, head)" if model_checked else ""))
        check_partition(self.bounds(sched.stages, L), sched.stages, L)
        return sched


    def _check_expert(self, cfg: ModelConfig | None) -> None:
        """Expert parallelism (``expert`` e > 1, :mod:`executor.expert_parallel`): a mixture of experts of the zoo
        (``cfg``: its config; None for a user's model or emulated compute) whose experts e divides, e dividing W."""
        e = self.spec.config.expert  # (that e divides W, the Config checked)
        if self.emulate:  # emulated compute: the profile's experts (their all-to-alls are waited for in F and B)
            from planner.expert_parallel import expert_error
            from planner.profile import load_profile

            if (why := expert_error(load_profile(self.emulate), e)) is not None:
                raise PlanError(why)
            return
        if self.module is not None:
            raise PlanError(f"expert: expert parallelism (e={e}) splits a mixture of experts' experts over the "
                            "data-parallel replicas; a user model (--module) has none the executor can split: run it "
                            "with expert = 1")
        assert cfg is not None
        if not cfg.moe:
            raise PlanError(f"expert: expert parallelism (e={e}) splits a mixture of experts' experts over the "
                            f"data-parallel replicas, and model {cfg.name!r} has no experts: run it with expert = 1")
        E = int(cfg.experts)  # type: ignore[arg-type]
        if E % e:
            raise PlanError(f"expert: the expert-parallel size e={e} must divide the experts per layer (E = {E}): each "
                            "expert-parallel rank holds E/e of them")


def _check_global_batch(spec: RunSpec, global_batch: int) -> None:
    """A stated global batch (0: none) must be W N b."""
    c = spec.config
    if global_batch and global_batch != spec.global_batch:
        raise PlanError(f"micro-batches do not divide the batch: global batch {global_batch} != "
                        f"W*N*b = {c.data}*{spec.microbatches}*{c.micro_batch}")


def even_layer_split(layers: int, stages: int) -> list[tuple[int, int]]:
    """Consecutive ranges of layers, as even in layer count as possible, earlier stages larger (the
    direct form's partition; the planner's balances compute: :func:`planner.partition.balance_by_cost`)."""
    q, r = divmod(layers, stages)
    out, i = [], 0
    for s in range(stages):
        n = q + (1 if s < r else 0)
        out.append((i, i + n))
        i += n
    return out


def check_partition(bounds: list[tuple[int, int]], stages: int, layers: int) -> None:
    """:func:`planner.runspec.partition_error` as a :class:`PlanError`."""
    if (why := partition_error(bounds, stages, layers)) is not None:
        raise PlanError(why)


def _read_plan(path: str | Path) -> Any:
    """The JSON document of a plan file (``pipeplan plan --json``'s, or a bare candidate object)."""
    try:
        return json.loads(Path(path).read_text(), object_pairs_hook=unique_keys)
    except (OSError, UnicodeDecodeError, ValueError) as e:  # (not JSON, or a key given twice: DuplicateKey)
        raise PlanError(f"cannot read plan {path}: {e}") from None


def _candidate_of(path: str | Path, candidate: int, data: Any = None) -> dict[str, Any]:
    """The ``candidate``-th candidate of a plan file (or the file's bare candidate object); ``data``: the file's
    document, when read already (:func:`_read_plan`)."""
    if data is None:
        data = _read_plan(path)
    if isinstance(data, dict) and "candidates" in data:
        cands = data["candidates"]
        if not isinstance(cands, list):
            raise PlanError(f"plan {path}: candidates must be a list (pipeplan plan --json writes one)")
        if not 0 <= candidate < len(cands):
            raise PlanError(f"plan {path} has {len(cands)} candidate(s); --candidate {candidate} is out of range")
        data = cands[candidate]
    if not isinstance(data, dict):
        raise PlanError(f"plan {path}: expected a candidate object or {{'candidates': [...]}}")
    return data


def load_plan_file(path: str | Path, candidate: int = 0, **overrides: Any) -> RunPlan:
    """``pipeplan plan --json`` output (``{"candidates": [...]}``) or a bare candidate object."""
    return RunPlan.from_candidate(_candidate_of(path, candidate), **overrides)


def planned_sharding(path: str | Path, candidate: int = 0) -> str | None:
    """:func:`planner.mismatch.unsharded_run_note` of the plan file's candidate: what its plan shards that this
    executor does not, or None."""
    from planner.mismatch import unsharded_run_note

    return unsharded_run_note(_candidate_of(path, candidate))


def planned_profile(path: str | Path, candidate: int = 0) -> str | None:
    """The name of the profile the plan file was made from (``"profile"`` of ``pipeplan plan --json``, or of
    the bare candidate ``predict --json`` writes), or None where it does not say (a hand-written candidate, the
    API's plan document)."""
    data = _read_plan(path)
    note = data.get("profile") if isinstance(data, dict) else None
    if note is None:
        note = _candidate_of(path, candidate, data).get("profile")
    name = note.get("name") if isinstance(note, dict) else None
    return name if isinstance(name, str) and name else None


def planned_iteration_time(path: str | Path, candidate: int = 0) -> float | None:
    """The iteration time the planner predicted for the candidate (its ``iteration_time``: the simulator
    with the plan's profile and cluster), or None when the file has none (a hand-written candidate)."""
    v = _candidate_of(path, candidate).get("iteration_time")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None
