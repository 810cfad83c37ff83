"""``pipeplan simulate`` and ``show``: a schedule built from options, simulated with unit stage costs."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from pipeplan.options import (
    ChunksOpt,
    ConcatOpt,
    DevicesOpt,
    MicroOpt,
    PipesOpt,
    ReplicationOpt,
    ScheduleOpt,
    WavesOpt,
    fail,
    schedule_from_options,
)
from planner.limits import MAX_SECONDS
from planner.render import grid, time_unit
from planner.simulate import ScheduleError, SimResult, UnitCosts, simulate

FwdOpt = Annotated[float, typer.Option(help="forward time of a stage")]
BwdOpt = Annotated[float, typer.Option(help="backward time of a stage")]
CommOpt = Annotated[float, typer.Option(help="time of one point-to-point message")]


def _run(schedule: str, devices: int, microbatches: int, chunks: int | None, waves: int | None,
         pipelines: int | None, concat: str | None, fwd: float, bwd: float, comm: float,
         replication: str | None = None) -> SimResult:
    for option, value in (("--fwd", fwd), ("--bwd", bwd), ("--comm", comm)):
        if not 0 <= value <= MAX_SECONDS:  # (NaN compares false: refused too)
            fail(f"{option}: a time from 0 to {MAX_SECONDS:g}, got {value:g}")
    try:
        sched = schedule_from_options(schedule, devices, microbatches, chunks, waves, pipelines, concat,
                                      replication)
        return simulate(sched, UnitCosts(fwd, bwd, comm))
    except (ValueError, ScheduleError) as e:
        fail(str(e))
        raise  # unreachable


def simulate_cmd(schedule: ScheduleOpt, devices: DevicesOpt, microbatches: MicroOpt,
                 chunks: ChunksOpt = None, waves: WavesOpt = None, pipelines: PipesOpt = None,
                 concat: ConcatOpt = None, fwd: FwdOpt = 1.0, bwd: BwdOpt = 2.0, comm: CommOpt = 0.0,
                 json_out: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
                 replication: ReplicationOpt = None) -> None:
    """Simulate a schedule with stage times FWD/BWD and message time COMM; print its figures."""
    res = _run(schedule, devices, microbatches, chunks, waves, pipelines, concat, fwd, bwd, comm, replication)
    if json_out:
        typer.echo(json.dumps(res.to_dict()))
        return
    typer.echo(f"makespan      {res.makespan:g}")
    typer.echo(f"bubble ratio  {res.bubble_ratio:.4f}")
    typer.echo(f"critical path C_f={res.critical_forward} C_b={res.critical_backward}")
    typer.echo("device  busy      idle      peak activations")
    for d, st in enumerate(res.devices):
        typer.echo(f"{d:<7} {st.busy:<9g} {st.idle:<9g} {st.peak_activations:g}")


_STYLES = {("F", 0): "black on green", ("F", 1): "black on bright_cyan",
           ("B", 0): "black on dark_orange", ("B", 1): "black on plum2",
           ("I", 0): "black on dark_orange", ("I", 1): "black on plum2",
           ("W", 0): "black on khaki1", ("W", 1): "black on light_pink1"}


def show_cmd(schedule: ScheduleOpt, devices: DevicesOpt, microbatches: MicroOpt,
             chunks: ChunksOpt = None, waves: WavesOpt = None, pipelines: PipesOpt = None,
             concat: ConcatOpt = None, fwd: FwdOpt = 1.0, bwd: BwdOpt = 2.0, comm: CommOpt = 0.0,
             color: Annotated[bool, typer.Option(help="colour the blocks")] = True,
             replication: ReplicationOpt = None) -> None:
    """Draw the timeline: one row per device, one cell per time unit, micro-batch numbers in the cells.
    Forward F, backward B (split: I input-grad, W weight-grad); lower case for Chimera's up pipelines
    (and colours per direction); '.' is idle."""
    for option, value in (("--fwd", fwd), ("--bwd", bwd)):  # an action of no time has no cell: --fwd 0 --bwd 0
        if value == 0:  # drew 'B3' alone on every row, makespan 0; --fwd 0 drew F1 and not F0
            fail(f"{option}: a timeline draws each action in cells of its time: give a time above 0, got 0")
    res = _run(schedule, devices, microbatches, chunks, waves, pipelines, concat, fwd, bwd, comm, replication)
    unit = time_unit(res)
    rows = grid(res, unit)
    w = max((len(c.label()) for row in rows for c in row), default=1)
    console = Console(no_color=not color, highlight=False, width=max(80, 6 + len(rows[0]) * (w + 1)))
    for d, row in enumerate(rows):
        line = Text(f"P{d:<3}")
        for c in row:
            style = _STYLES.get((c.kind, min(c.replica, 1)), "") if color and c.kind else ""
            line.append(c.label().rjust(w), style=style)
            line.append(" ")
        console.print(line)
    console.print(f"one cell = {unit:g} time unit{'' if unit == 1 else 's'}; makespan {res.makespan:g}, "
                  f"bubble ratio {res.bubble_ratio:.4f}")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("show")(show_cmd)
