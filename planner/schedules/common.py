"""Helpers shared by the schedule builders."""

from __future__ import annotations

from typing import Any

from planner.jsondoc import integer
from planner.schedules.ir import Action, Schedule


def check_positive(**values: int) -> None:
    """Raise a ValueError naming the first parameter that is not a positive integer."""
    for name, v in values.items():
        if (integer(v) or 0) < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def no_lists(devices: int) -> list[list[Action]]:
    """Empty action lists: what a schedule's *shape* (placement and micro-batch assignment only) carries."""
    return [[] for _ in range(devices)]


def linear_schedule(name: str, devices: int, microbatches: int, acts: list[list[Action]],
                    params: dict[str, Any]) -> Schedule:
    """A one-replica schedule with stage ``s`` on device ``s``."""
    return Schedule(name, devices, devices, microbatches, [list(range(devices))], acts, params=params)
