"""Schedule builders and the IR. ``build(name, devices=..., microbatches=..., **params)``.

The schedule names (:data:`BUILDERS`, :data:`ASYNC_SCHEDULES`) and the schedule parameters a configuration
may set (:data:`SCHEDULE_PARAMETERS`) are declared here, once, beside the builders: the request and
candidate fields, the CLI options, the API schema and the exports read them from here."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.limits import MAX_LAYERS, MAX_SCHEDULE_UNITS, MAX_STAGES
from planner.schedules import (
    chimera,
    gems,
    gpipe,
    hanayo,
    interleaved,
    one_f_one_b,
    one_f_one_b_rr,
    pipedream,
    pipedream_2bw,
    pipedream_rr,
    zb_h1,
)
from planner.schedules.ir import Action, Schedule, lower, parse_action

#: every schedule by name, in the order the planner enumerates them (synchronous first)
BUILDERS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe.build,
    "1f1b": one_f_one_b.build,
    "interleaved": interleaved.build,
    "chimera": chimera.build,
    "hanayo": hanayo.build,
    "zb-h1": zb_h1.build,
    "gems": gems.build,
    "1f1b-rr": one_f_one_b_rr.build,
    "pipedream": pipedream.build,
    "pipedream-2bw": pipedream_2bw.build,
    "pipedream-rr": pipedream_rr.build,
}
#: the asynchronous schedules (weight stashing or double buffering: they change the optimizer)
ASYNC_SCHEDULES: tuple[str, ...] = ("pipedream", "pipedream-2bw", "pipedream-rr")
SYNC_SCHEDULES: tuple[str, ...] = tuple(n for n in BUILDERS if n not in ASYNC_SCHEDULES)
ALL_SCHEDULES: tuple[str, ...] = tuple(BUILDERS)


@dataclass(frozen=True)
class ScheduleParameter:
    """A schedule parameter a configuration may set: its type and a one-line help (CLI, API schema)."""

    type: type
    help: str
    schedules: tuple[str, ...]


#: the parameters a configuration may set, each named as the builders' keyword argument (Chimera's
#: ``eager`` is the builder's own choice and not a configuration parameter)
SCHEDULE_PARAMETERS: dict[str, ScheduleParameter] = {
    "chunks": ScheduleParameter(int, "model chunks per device (interleaved)", ("interleaved",)),
    "waves": ScheduleParameter(int, "waves (hanayo)", ("hanayo",)),
    "pipelines": ScheduleParameter(int, "pipeline pairs f (chimera)", ("chimera",)),
    "concat": ScheduleParameter(str, "direct, forward-doubling or backward-halving (chimera)", ("chimera",)),
    "replication": ScheduleParameter(str, "replicas per stage, e.g. 2,1,1 (1f1b-rr, pipedream-rr: PipeDream's "
                                     "partition)", ("1f1b-rr", "pipedream-rr")),
}
#: schedules whose parameters come from the profile (PipeDream's A(j, m) partition), not from enumeration
PROFILE_DRIVEN: tuple[str, ...] = ("1f1b-rr", "pipedream-rr")
#: Chimera's concatenation (Chimera 3.5) running 2N micro-batches of b/2 (:mod:`planner.runspec`)
BACKWARD_HALVING = "backward-halving"


def parameters(name: str) -> list[str]:
    """The schedule-specific parameters of builder ``name`` (beyond devices and microbatches)."""
    return list(_parameters(name))


@functools.cache
def _parameters(name: str) -> tuple[str, ...]:
    """:func:`parameters`, read from the builder's signature once per name (the planner checks the
    parameters of every schedule it shapes: thousands of times per search)."""
    fn = _builder(name)
    return tuple(p for p in inspect.signature(fn).parameters if p not in ("devices", "microbatches"))


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
    allowed = _parameters(name)
    for key in params:
        if key not in allowed:
            takes = ", ".join(allowed) if allowed else "no parameters"
            raise ValueError(f"schedule {name!r} does not take '{key}' (it takes {takes})")


@functools.cache
def _module(name: str) -> Any:
    """The module of builder ``name`` (its ``shape``, ``inflight`` and flags), found once per name (the search
    asks for it thousands of times)."""
    return inspect.getmodule(_builder(name))


def shape(name: str, devices: int, microbatches: int, **params: Any) -> Schedule:
    """Placement and micro-batch assignment of ``name`` with empty action lists (what the planner needs to
    bound a configuration before building its lists). Same parameter checks as :func:`build`."""
    fn = getattr(_module(name), "shape", None)
    if fn is None:
        return build(name, devices, microbatches, **params)
    _check_params(name, params)
    return fn(devices, microbatches, **params)


def inflight(name: str, devices: int, microbatches: int, **params: Any) -> dict[tuple[int, int], int] | None:
    """Per (replica, stage), micro-batches whose activations are alive at once in ``name``'s lists --
    their exact peak where :func:`inflight_exact` says so, else a lower bound of it -- computed without
    building the lists; None when the builder has no such function."""
    fn = getattr(_module(name), "inflight", None)
    if fn is None:
        return None
    _check_params(name, params)
    return fn(devices, microbatches, **params)


#: how :func:`check_size` names its arguments by default: the command line's options
OPTION_NAMES = {"devices": "--devices", "microbatches": "--microbatches", "chunks": "--chunks", "waves": "--waves",
                "pipelines": "--pipelines"}


def check_size(devices: int, microbatches: int, chunks: int | None = None, waves: int | None = None,
               units: int = MAX_SCHEDULE_UNITS, pipelines: int | None = None,
               names: dict[str, str] | None = None) -> None:
    """Raise ValueError, naming the options, when a schedule of ``devices`` x ``microbatches`` would be too large
    to build (:mod:`planner.limits`): its pipeline of more than ``MAX_STAGES`` stages (``devices`` x ``chunks``,
    or x 2 ``waves``; with ``pipelines``, Chimera's stage replicas, ``devices`` x 2 ``pipelines``), or more than
    ``units`` stages x micro-batches. Arithmetic only, so sizes past any float are refused too. The command line
    checks what it is asked to build with it before building; a configuration (:class:`planner.request.Config`)
    holds its stages to it. ``names``: what the message calls the arguments (default :data:`OPTION_NAMES`)."""
    name = {**OPTION_NAMES, **(names or {})}

    def n(v: int) -> str:  # an integer as typed, or its order of magnitude when it is long
        return str(v) if abs(v) < 10**15 else f"about 10**{len(str(abs(v))) - 1}"

    replicas = not (chunks or waves) and bool(pipelines)  # Chimera's stage replicas
    per_device = chunks or (2 * waves if waves else (2 * pipelines if replicas else 1))
    stages = devices * per_device
    if stages > MAX_STAGES:
        how = "" if per_device == 1 else (f" x {name['chunks']} {n(chunks)}" if chunks else
                                          f" x 2 x {name['waves']} {n(waves)}" if waves else
                                          f" x 2 x {name['pipelines']} {n(pipelines)}")
        why = ("Chimera's stage replicas, whose lists grow with them" if replicas
               else f"each stage holds at least one layer of a model of at most {MAX_LAYERS}")
        raise ValueError(f"{name['devices']} {n(devices)}{how}: {n(stages)} pipeline stages; at most {MAX_STAGES} "
                         f"({why})")
    if stages * microbatches > units:
        raise ValueError(f"{name['microbatches']} {n(microbatches)} on {n(stages)} pipeline stages: "
                         f"{n(stages * microbatches)} stage passes, at most {units} (2**{units.bit_length() - 1}) "
                         "to build here")


def held_at_peak(name: str, devices: int, microbatches: int, **params: Any) -> dict[tuple[int, int], int] | None:
    """For a schedule that splits the backward (:func:`splits_backward`): per (replica, stage), the I's whose
    output gradients are held (until their W) at the point where the stage's alive activations peak -- a point
    where both are at their largest, so the stage's peak is exactly ``inflight * activation + held *
    held_grads`` (:func:`planner.schedules.zb_h1.held_at_peak`) --, computed without building the lists; None
    where the builder has no such function (nothing held, or not known before the lists exist)."""
    fn = getattr(_module(name), "held_at_peak", None)
    if fn is None:
        return None
    _check_params(name, params)
    return fn(devices, microbatches, **params)


def inflight_exact(name: str) -> bool:
    """Whether :func:`inflight` of ``name`` is the exact peak (else a lower bound: Chimera, Hanayo)."""
    return bool(getattr(_module(name), "INFLIGHT_EXACT", False))


def splits_backward(name: str) -> bool:
    """Whether ``name`` splits the backward into I and W (zero-bubble): a W, which nothing waits for,
    may then end a device's list."""
    return bool(getattr(_module(name), "SPLIT_BACKWARD", False))


__all__ = ["ALL_SCHEDULES", "ASYNC_SCHEDULES", "Action", "BACKWARD_HALVING", "BUILDERS", "PROFILE_DRIVEN",
           "SCHEDULE_PARAMETERS", "SYNC_SCHEDULES", "Schedule", "ScheduleParameter", "build", "check_size",
           "held_at_peak", "inflight", "inflight_exact", "lower", "parameters", "parse_action", "shape",
           "splits_backward"]
