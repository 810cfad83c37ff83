"""What to run: one configuration, its micro-batch count and its layer partition -- the typed record the
planner ranks (a candidate carries it), the API stores (inside the candidate document) and the executor
runs (:class:`executor.plan.RunPlan` adds only run-time options). Torch-free.

Two rules planner and executor must agree on are written here and nowhere else:

* **Backward halving** (Chimera 3.5, concatenating more than D micro-batches): the same lists run on
  ``2N`` micro-batches of ``b/2`` samples (:func:`halves_backward`, :func:`schedule_microbatches`,
  :func:`schedule_samples`). Forward doubling keeps ``N`` micro-batches of ``b`` (its forwards go two at
  a time, an ``F`` with ``span = 2``).
* **Which all-reduces are eager** when the compute-only schedule is lowered: the builder's choice
  (:func:`planner.schedules.ir.builder_eager`, kept in the schedule IR so that the validator and the
  simulator, below this module, read the same), applied by :meth:`RunSpec.lowered`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from planner.request import Config
from planner.schedules import BACKWARD_HALVING, build
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


class RunSpec(BaseModel):
    """One configuration to run: ``config`` (t, D, W, b, schedule and its parameters, recomputation),
    ``microbatches`` N per pipeline group (``global_batch = W N b``) and ``partition``, the ``[start, end)``
    layer range of every schedule stage (empty: the executor splits the layers evenly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: Config
    microbatches: int = Field(gt=0, description="micro-batches per pipeline group (N)")
    partition: list[tuple[int, int]] = Field(default_factory=list,
                                             description="[start, end) layers of every schedule stage")

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> RunSpec:
        """From a candidate document (``Candidate.to_dict()``): its ``run_spec``, or -- for documents
        stored before it existed -- its flat configuration fields, ``microbatches`` and ``partition``."""
        if "run_spec" in doc:
            return cls.model_validate(doc["run_spec"])
        config = Config.model_validate({k: doc[k] for k in Config.model_fields if doc.get(k) is not None})
        return cls(config=config, microbatches=doc["microbatches"], partition=doc.get("partition") or [])

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

    def lowered(self, schedule: Schedule | None = None) -> Schedule:
        """The lowered schedule (communication, all-reduces, step) that the simulator times and every rank
        walks; ``schedule`` is :meth:`schedule`'s result when the caller has it already."""
        sched = schedule if schedule is not None else self.schedule()
        return lower(sched, eager=builder_eager(sched))
