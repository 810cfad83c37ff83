"""Schedule builders and the IR. ``build(name, devices=..., microbatches=..., **params)``."""

from __future__ import annotations

import inspect
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


def parameters(name: str) -> list[str]:
    """The schedule-specific parameters of builder ``name`` (beyond devices and microbatches)."""
    fn = _builder(name)
    return [p for p in inspect.signature(fn).parameters if p not in ("devices", "microbatches")]


def _builder(name: str) -> Callable[..., Schedule]:
    try:
        return BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(sorted(BUILDERS))}") from None


def build(name: str, devices: int, microbatches: int, **params: Any) -> Schedule:
    """Build the compute-only schedule ``name``; unknown names and parameters raise ValueError."""
    fn = _builder(name)
    _check_params(name, params)
    return fn(devices, microbatches, **params)


def _check_params(name: str, params: dict[str, Any]) -> None:
    allowed = parameters(name)
    for key in params:
        if key not in allowed:
            takes = ", ".join(allowed) if allowed else "no parameters"
            raise ValueError(f"schedule {name!r} does not take '{key}' (it takes {takes})")


def shape(name: str, devices: int, microbatches: int, **params: Any) -> Schedule:
    """Placement and micro-batch assignment of ``name`` without necessarily its action lists (empty
    lists where building them is costly: Chimera's and Hanayo's merges). Same parameter checks."""
    build_fn = _builder(name)
    module = inspect.getmodule(build_fn)
    fn = getattr(module, "shape", None)
    if fn is None:
        return build(name, devices, microbatches, **params)
    _check_params(name, params)
    return fn(devices, microbatches, **params)


__all__ = ["Action", "BUILDERS", "Schedule", "build", "lower", "parameters", "parse_action", "shape"]
