"""Schedule builders and the IR. ``build(name, devices=..., microbatches=..., **params)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.schedules import (
    chimera,
    gems,
    gpipe,
    hanayo,
    interleaved,
    one_f_one_b,
    pipedream,
    pipedream_2bw,
    zb_h1,
)
from planner.schedules.ir import Action, Schedule, lower, parse_action

BUILDERS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe.build,
    "1f1b": one_f_one_b.build,
    "chimera": chimera.build,
    "hanayo": hanayo.build,
    "interleaved": interleaved.build,
    "zb-h1": zb_h1.build,
    "pipedream": pipedream.build,
    "pipedream-2bw": pipedream_2bw.build,
    "gems": gems.build,
}


def build(name: str, devices: int, microbatches: int, **params: Any) -> Schedule:
    """Build the compute-only schedule ``name``; unknown names and parameters raise ValueError."""
    try:
        fn = BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(sorted(BUILDERS))}") from None
    return fn(devices, microbatches, **params)


__all__ = ["Action", "BUILDERS", "Schedule", "build", "lower", "parse_action"]
