"""``pipeplan export``: build a schedule and write it as torch's compute-only CSV, JSON or text.

``register(app)`` adds the command to a Typer application (the CLI module owns the application)::

    pipeplan export --schedule interleaved --devices 4 --microbatches 8 --chunks 2 --format torch-csv

Errors (unknown schedule, bad parameters, a schedule torch cannot express) print one line to stderr and
exit with code 2.
"""

from __future__ import annotations

import inspect
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from planner.schedules import BUILDERS, build
from planner.schedules.torch_csv import export_torch_csv


class ExportFormat(StrEnum):
    torch_csv = "torch-csv"
    json = "json"
    text = "text"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def export(
    schedule: Annotated[str, typer.Option("--schedule", help=f"one of: {', '.join(sorted(BUILDERS))}")],
    devices: Annotated[int, typer.Option("--devices", help="devices of one pipeline (D)")],
    microbatches: Annotated[int, typer.Option("--microbatches", help="micro-batches per iteration (N)")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="torch-csv, json or text")] = (
        ExportFormat.json),
    chunks: Annotated[int | None, typer.Option("--chunks", help="interleaved: chunks per device")] = None,
    waves: Annotated[int | None, typer.Option("--waves", help="hanayo: waves")] = None,
    pipelines: Annotated[int | None, typer.Option("--pipelines", help="chimera: pipeline pairs f")] = None,
    concat: Annotated[str | None, typer.Option("--concat", help="chimera: direct, forward-doubling, "
                                                                 "backward-halving")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
) -> None:
    """Build a schedule (compute-only form) and export it."""
    if schedule not in BUILDERS:
        _fail(f"unknown schedule {schedule!r}; known: {', '.join(sorted(BUILDERS))}")
    options = {"chunks": chunks, "waves": waves, "pipelines": pipelines, "concat": concat}
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    accepted = set(inspect.signature(BUILDERS[schedule]).parameters) - {"devices", "microbatches"}
    extra = sorted(set(given) - accepted)
    if extra:
        _fail(f"schedule {schedule!r} takes no {', '.join('--' + e for e in extra)}"
              f" (it takes: {', '.join('--' + a for a in sorted(accepted)) or 'no options'})")
    try:
        sched = build(schedule, devices, microbatches, **given)
        if fmt is ExportFormat.torch_csv:
            text = export_torch_csv(sched)
        elif fmt is ExportFormat.json:
            text = sched.to_json(indent=1) + "\n"
        else:
            text = sched.to_text() + "\n"
    except ValueError as exc:
        _fail(str(exc))
        return
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export)
