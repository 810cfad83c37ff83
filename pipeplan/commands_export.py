"""``pipeplan export``: build a schedule and write it as torch's compute-only CSV, JSON or text.

``register(app)`` adds the command to a Typer application (the CLI module owns the application)::

    pipeplan export --schedule interleaved --devices 4 --microbatches 8 --chunks 2 --format torch-csv
    pipeplan export --plan plan.json --candidate 0 --format slurm --gpus-per-node 8 --option partition=gpu

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
    PipesOpt,
    ReplicationOpt,
    WavesOpt,
    fail,
    schedule_from_options,
)
from planner.schedules.ir import Schedule
from planner.schedules.torch_csv import export_torch_csv


class ExportFormat(StrEnum):
    torch_csv = "torch-csv"
    json = "json"
    text = "text"
    slurm = "slurm"  # of a --plan candidate: the sbatch script (pipeplan.commands_export_slurm)


def export(
    schedule: Annotated[str | None, typer.Option("--schedule", "-s", help="the schedule (not with --plan)")] = None,
    devices: Annotated[int | None, typer.Option("--devices", "-D", help="devices of one pipeline (D)")] = None,
    microbatches: Annotated[int | None, typer.Option("--microbatches", "-N", help="micro-batches (N)")] = None,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="torch-csv, json or text; slurm with --plan")] = (
        ExportFormat.json),
    chunks: ChunksOpt = None,
    waves: WavesOpt = None,
    pipelines: PipesOpt = None,
    concat: ConcatOpt = None,
    replication: ReplicationOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
    plan: Annotated[Path | None, typer.Option(help="--format slurm: a plan (pipeplan plan --json)")] = None,
    candidate: Annotated[int, typer.Option(help="--format slurm: the plan's candidate")] = 0,
    gpus_per_node: Annotated[int | None, typer.Option(help="--format slurm: devices per node")] = None,
    cluster: Annotated[Path | None, typer.Option(help="--format slurm: GPUs per node from this cluster")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="--format slurm: KEY=VALUE (repeat)")] = None,
) -> None:
    """Build a schedule (compute-only form) and export it."""
    try:
        if fmt is ExportFormat.slurm or plan is not None:
            from pipeplan.commands_export_slurm import export_slurm

            if plan is None or fmt is not ExportFormat.slurm or schedule is not None:
                raise ValueError("--format slurm exports a --plan candidate (and --plan takes --format slurm)")
            text = export_slurm(plan, candidate, gpus_per_node, cluster, option or [])
        elif schedule is None or devices is None or microbatches is None:
            raise ValueError("give --schedule, --devices and --microbatches (or --plan with --format slurm)")
        else:
            text = _schedule_text(schedule_from_options(schedule, devices, microbatches, chunks, waves, pipelines,
                                                        concat, replication), fmt)
    except ValueError as exc:
        fail(str(exc))
        return
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


def _schedule_text(sched: Schedule, fmt: ExportFormat) -> str:
    if fmt is ExportFormat.torch_csv:
        return export_torch_csv(sched)
    if fmt is ExportFormat.json:
        return sched.to_json(indent=1) + "\n"
    return sched.to_text() + "\n"


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export)
