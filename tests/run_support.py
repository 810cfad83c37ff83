"""The executor's multi-process ``--check`` runs the model tests share: plans of one spec, launched in groups by
world size (gloo, float64), their results by name."""

from __future__ import annotations

from typing import Any

from executor.plan import RunPlan
from planner.model import ModelSpec


def direct(spec: ModelSpec, schedule: str, D: int, N: int, **kw: Any) -> RunPlan:
    """A run of ``spec`` with ``schedule`` on ``D`` stages and ``N`` micro-batches, two iterations (``kw``: tensor,
    data, expert, ...)."""
    return RunPlan.direct(schedule, D, N, model=spec.name, model_spec=spec.model_dump(), iterations=2, **kw)


def launched(groups: list[tuple[dict[str, RunPlan], int]], timeout: float = 180) -> dict[str, Any]:
    """Each group's plans launched with ``--check`` on its world size; every run's result under its name."""
    from executor.launch import launch

    out: dict[str, Any] = {}
    for plans, world in groups:
        res = launch(list(plans.values()), world, check=True, timeout=timeout)
        out |= dict(zip(plans, res["runs"], strict=True))
    return out
