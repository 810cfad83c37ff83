"""``pipeplan export``: build a schedule and write it as torch's compute-only CSV, JSON or text.

``register(app)`` adds the command to a Typer application (the CLI module owns the application)::

    pipeplan export --schedule interleaved --devices 4 --microbatches 8 --chunks 2 --format torch-csv

Errors (unknown schedule, bad parameters, a schedule torch cannot express) print one line to stderr and
exit with code 2.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

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
from planner.schedules.torch_csv import export_torch_csv


class ExportFormat(StrEnum):
    torch_csv = "torch-csv"
    json = "json"
    text = "text"


def export(
    schedule: ScheduleOpt,
    devices: DevicesOpt,
    microbatches: MicroOpt,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="torch-csv, json or text")] = (
        ExportFormat.json),
    chunks: ChunksOpt = None,
    waves: WavesOpt = None,
    pipelines: PipesOpt = None,
    concat: ConcatOpt = None,
    replication: ReplicationOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
) -> None:
    """Build a schedule (compute-only form) and export it."""
    try:
        sched = schedule_from_options(schedule, devices, microbatches, chunks, waves, pipelines, concat,
                                      replication)
        if fmt is ExportFormat.torch_csv:
            text = export_torch_csv(sched)
        elif fmt is ExportFormat.json:
            text = sched.to_json(indent=1) + "\n"
        else:
            text = sched.to_text() + "\n"
    except ValueError as exc:
        fail(str(exc))
        return
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export)
